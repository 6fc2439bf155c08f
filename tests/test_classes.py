"""Size classes: their workloads match the published figures of the models they mimic, the
memory estimate that --fit relies on is checked against measured memory, and the command line
runs, refuses and fits classes as documented."""

from __future__ import annotations

import ctypes.util
import json
import os
from pathlib import Path

import pytest
import torch
from hpcdl_cli import hpcdl, hpcdl_process, unwrapped  # beside this file, on pytest's path
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hpcdl.device import JEMALLOC_CONF, memory_capacity
from hpcdl.measure.fit import MAX_TRIALS, RANK_PROCESS_BYTES, WINDOW
from hpcdl.measure.trial import cpu_trial
from hpcdl.results.text import si
from hpcdl.workloads import recipes
from hpcdl.workloads.crosscheck import decomposed
from hpcdl.workloads.sampling import sample_spec

PUBLISHED = [
    (size_class, name, figures)
    for size_class in recipes.size_classes()
    for name, figures in recipes.suite(size_class).published.items()
]


def test_every_class_lists_its_workloads_with_published_figures_for_m_and_l() -> None:
    assert recipes.size_classes() == ["S", "M", "L"]
    for size_class in ("M", "L"):
        suite = recipes.suite(size_class)
        assert set(suite.published) == set(suite.workloads) - {"mlp-wide"}  # a wide MLP mimics no model
        assert all(f.get("source") for f in suite.published.values())


@pytest.mark.parametrize(
    ("size_class", "name", "figures"), PUBLISHED, ids=[f"{c}-{n}" for c, n, _ in PUBLISHED]
)
def test_class_workloads_match_their_published_figures(size_class: str, name: str, figures: dict) -> None:
    spec = recipes.suite(size_class).specs()[name]
    count = spec.count()
    if "params" in figures:
        assert count.params == pytest.approx(figures["params"], rel=0.02), figures["source"]
    if "forward_macs" in figures:
        assert count.forward_flops / 2 == pytest.approx(figures["forward_macs"], rel=0.02), figures["source"]


class PublishedDeepSpeech2(nn.Module):
    """Deep Speech 2 as deepspeech.pytorch builds it (PLOS Biol 21(12) e3002366, Table 5):
    convs with biases and batch norms, 5 bidirectional LSTMs whose directions are summed, a
    sequence-wise batch norm before every LSTM but the first, a batch norm and a bias-free
    classifier; written here from that table, independently of hpcdl's speech family."""

    def __init__(self, frames_in: int) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(1, 32, (41, 11), stride=(2, 2), padding=(20, 5)),
            nn.BatchNorm2d(32),
            nn.Hardtanh(0, 20),
            nn.Conv2d(32, 32, (21, 11), stride=(2, 1), padding=(10, 5)),
            nn.BatchNorm2d(32),
            nn.Hardtanh(0, 20),
        )
        self.rnns = nn.ModuleList(
            nn.LSTM(1312 if i == 0 else 1024, 1024, bidirectional=True) for i in range(5)
        )
        self.norms = nn.ModuleList(nn.BatchNorm1d(1024) for _ in range(4))
        self.head = nn.Sequential(nn.BatchNorm1d(1024), nn.Linear(1024, 29, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.convs(x).flatten(1, 2).permute(2, 0, 1)  # (time, batch, features)
        for i, rnn in enumerate(self.rnns):
            if i:
                x = self.norms[i - 1](x.permute(1, 2, 0)).permute(2, 0, 1)
            x, _ = rnn(x)
            x = x[..., :1024] + x[..., 1024:]
        return self.head[1](self.head[0](x.permute(1, 2, 0)).permute(0, 2, 1))


def test_deepspeech2_matches_the_published_architecture_built_independently() -> None:
    frames = 20  # FLOPs grow linearly with frames in both: a short input keeps the test quick
    ours = recipes.suite("M").specs()["deepspeech2"].replace(frames=frames)
    real = PublishedDeepSpeech2(frames)
    assert ours.count().params == pytest.approx(sum(p.numel() for p in real.parameters()), rel=0.02)
    x = torch.randn(1, 1, 161, frames)
    with decomposed(), FlopCounterMode(display=False) as counter:
        real(x)
    assert ours.count().forward_flops == pytest.approx(counter.get_total_flops(), rel=0.02)


MEMORY_SPECS = [
    ("mlp", 0, "fp32"),
    ("mlp", 0, "bf16"),  # autocast's weight copies are gone by the optimizer step, its peak
    ("cnn", 2, "fp32"),
    ("rnn", 4, "fp32"),
    ("attention", 0, "fp32"),
    ("attention", 8, "fp32"),  # weights 3/4 of the peak: only the head's gradient as backward begins
    ("speech", 2, "fp32"),
]


@pytest.mark.slow(reason="a trial in a child process per spec, seven specs")
@pytest.mark.parametrize(("family", "seed", "precision"), MEMORY_SPECS)
def test_memory_estimate_against_measured_memory(family: str, seed: int, precision: str) -> None:
    """The estimate behind --fit against a real training step's memory, measured as auto-fit
    measures it (a trial in a child process; benchmarks/bench_memory.py reports the spread over
    many specs, docs/validation/2026-11-26-memory-estimate.md quotes it): within 0.85-1.2x for a
    spec of 60 MB or more (these read 0.93-1.09 in the benchmark; the margin is for a loaded CI
    machine's noise)."""
    batch = 32
    spec = sample_spec(family, seed, batch_size=batch, precision=precision)
    estimate = spec.memory_estimate(batch, "adamw")
    assert 60 << 20 < estimate < 400 << 20, "a spec above the libraries' noise, and small"
    measured = cpu_trial(spec, "adamw", 1, 2 << 30).peak_bytes
    assert measured is not None and 0.85 <= measured / estimate <= 1.2, (measured, estimate)


def test_classes_are_refused_up_front_when_they_cannot_fit(tmp_path: Path) -> None:
    bad = hpcdl("run", "--class", "XL", "-o", str(tmp_path))
    assert bad.returncode == 2 and "class='XL' is invalid: allowed: S, M, L" in bad.stderr
    big = hpcdl("run", "--class", "L", "--fit", "-o", str(tmp_path))
    # one line, also on a CPU without bf16 arithmetic (whose note that the class runs in fp32
    # there would follow only input found good)
    assert big.returncode == 2 and len(big.stderr.strip().splitlines()) == 1, big.stderr
    assert "even batch 1 needs an estimated" in big.stderr
    for fraction in ("0", "1.5", "nan"):
        p = hpcdl("run", "--class", "M", "--fit", fraction, "-o", str(tmp_path))
        assert p.returncode == 2 and f"fit='{fraction}' is invalid" in p.stderr, p.stderr
    assert not any(tmp_path.iterdir())  # nothing ran, nothing written


@pytest.mark.slow(reason="a fit's trials in child processes: about a minute per allocator")
@pytest.mark.parametrize("preload", ["", "jemalloc"])  # glibc's malloc, or jemalloc's preloaded
def test_fit_measures_the_batch_that_fills_the_target_and_records_how(tmp_path: Path, preload: str) -> None:
    jemalloc = ctypes.util.find_library("jemalloc")
    if preload and not jemalloc:
        pytest.skip("no libjemalloc: bash scripts/setup.sh --test installs it")
    # jemalloc as advised: freed blocks from glibc's 1 MiB given back at once (device.JEMALLOC_CONF)
    env = {**os.environ, "LD_PRELOAD": str(jemalloc) if preload else "", "MALLOC_CONF": JEMALLOC_CONF}
    knobs = ["--workload", "cnn", "image_size=32", "stages=2", "base_width=8", "classes=10"]
    available = (
        int(next(line for line in open("/proc/meminfo") if line.startswith("MemAvailable")).split()[1]) * 1024
    )
    # a 160 MiB target: trials of a few seconds, and the run's few MB of its own (threads, the
    # telemetry) a small share: at 80 MiB one run of eight here went past the 5 % below (1.07x)
    fraction = (160 << 20) / (available - RANK_PROCESS_BYTES)
    p = hpcdl_process(  # a process of its own: its malloc, and the threshold a fit fixes
        "run",
        *knobs,
        "--fit",
        f"{fraction:.8f}",
        "--steps",
        "2",
        "--min-duration",
        "0",
        "-o",
        str(tmp_path),
        env=env,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    (record,) = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
    fit = record["metrics"]["fit"]
    batch = record["settings"]["batch_per_rank"]
    assert batch == record["spec"]["batch_size"] == fit["batch"] and record["run"]["fit_fraction"] > 0
    assert (
        len(fit["trials"]) >= 2
        and {"batch": batch, "peak_bytes": fit["measured_peak_bytes"]} in fit["trials"]
    )
    # the fraction as the command line gave it (8 decimals), not the float it was printed from
    given = record["run"]["fit_fraction"]
    assert fit["target_bytes"] == pytest.approx(given * fit["capacity_bytes"], rel=1e-6)
    # within the target, found before the search ran out of trials, and either within 5 % below
    # the target or the largest batch that fits: batch + 1 measured above it (a CPU's peak steps
    # with the batch, and a step may jump past the 5 %)
    assert fit["measured_peak_bytes"] <= fit["target_bytes"]
    assert len(fit["trials"]) < MAX_TRIALS, fit["trials"]
    above = [t for t in fit["trials"] if t["batch"] == batch + 1]
    largest = bool(above) and (above[0]["peak_bytes"] is None or above[0]["peak_bytes"] > fit["target_bytes"])
    assert fit["measured_peak_bytes"] >= 0.95 * fit["target_bytes"] or largest, fit["trials"]
    assert fit["estimate_bytes"] > 0 and fit["estimated_batch"] >= 1
    out = unwrapped(p.stdout)  # the fit's note is wrapped below the table
    assert f"batch {batch}/rank (the estimate chose {fit['estimated_batch']})" in out  # said once
    # said while it fits (issue 45): the header says it fits, each trial run its batch and peak
    assert "batch per rank: fitting to" in p.stderr and "fit: trial 1 at batch" in p.stderr
    for t in fit["trials"]:
        if t["peak_bytes"] is not None:
            assert f"at batch {t['batch']}: measured peak {t['peak_bytes'] / 2**30:.2f} GiB" in p.stderr
    # the run's own peak, beside its trial's, from a base taken as a trial's (after a one-sample
    # step) and with glibc's threshold fixed as in the trials: within the target's 5 % (0.97-0.99x
    # at 160 MiB, 0.98-1.01x at 80 but for that one run; from a base before any step it rose
    # 20-25 MiB more, ``memory_rss.py base``, and it was 1.76x with the threshold left dynamic too)
    run_peak = fit["run_peak_bytes"]
    assert 0.5 * fit["measured_peak_bytes"] < run_peak <= (1 + WINDOW) * fit["target_bytes"], (run_peak, fit)
    assert f"the run's own peak {si(run_peak, 'B')}" in out
    # the trials inherit the run's malloc; glibc's threshold is fixed only where it is glibc's
    assert fit["allocator"] == (preload or "glibc")
    assert fit["mmap_threshold_bytes"] == (None if preload else 1 << 20)
    assert fit["oversize_threshold_bytes"] == (1 << 20 if preload else None)
    assert ("malloc: jemalloc, freed blocks given back from 1 MiB" in out) == bool(preload)


@pytest.mark.slow(reason="two ranks fitted by trials per backend: about a minute each")
@pytest.mark.parametrize("how", ["--backend=torch", "--backend=horovod", "--backend=fsdp", "--layout=tp=2"])
def test_a_fitted_run_of_two_ranks_stays_within_its_target(how: str, tmp_path: Path) -> None:
    """Two ranks of a 10.4 M-parameter MLP fitted to about 330 MiB each: their own peak (the
    larger, from a base taken as a trial's) within the target's 5 %. DDP keeps every gradient in
    its buckets all run, as its trials and estimate do (``kept_grads``); glibc's mmap threshold
    is fixed before the run's checks allocate; a rank of FSDP or of tensor parallelism trains
    only its share in its trials (``fit.shard``). Before, torch's ranks peaked at 1.36-1.43x a
    232 MB target and at 1.19x this one (2026-11-28); now at 0.95-0.96x, Horovod's at 0.98x;
    FSDP's and tp's at 0.85x and 0.79x of a 348 MB target with trials of the whole model, and
    0.95x and 0.94x with trials of their share (2026-11-29)."""
    # the two ranks share this machine: each may take half its memory less a rank process
    fraction = (330 << 20) / (memory_capacity(torch.device("cpu")) // 2 - RANK_PROCESS_BYTES)
    big = ["--workload", "mlp", "layers=2", "width=2048", "input_size=2048", "output_size=1000"]
    p = hpcdl_process(
        "run", *big, "--np", "2", how, "--fit", f"{fraction:.8f}", "--steps", "3",
        "--min-duration", "0", "-o", str(tmp_path), timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    (record,) = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
    fit = record["metrics"]["fit"]
    assert fit["kept_grads"] == (how == "--backend=torch")
    sharded = {"--backend=fsdp": "fsdp", "--layout=tp=2": "tensor"}.get(how)
    assert fit["shard"]["ranks"] == 2 and fit["shard"]["backend"] == sharded, fit["shard"]
    # (the search may run out of trials below the window: the run then stays below the target too)
    assert 0.5 * fit["target_bytes"] < fit["run_peak_bytes"] <= (1 + WINDOW) * fit["target_bytes"], fit
    assert "(!" not in p.stdout


def test_list_shows_every_class_with_its_figures() -> None:
    p = hpcdl("list")
    assert p.returncode == 0
    for size_class in ("S", "M", "L"):
        assert f"class {size_class} (v1" in p.stdout
    assert "gpt2-xl" in p.stdout and "1.56 G" in p.stdout  # parameters, as hpcdl list prints them


def test_a_class_sets_a_workloads_learning_rate_unless_the_command_line_does() -> None:
    """Classes M and L train their BERTs at 1e-4 (at the run's default 1e-3 their loss rose, on an
    H200 and on this CPU); --lr still wins, and the other workloads keep the default."""
    from hpcdl.harness.classes import workload_settings as class_settings
    from hpcdl.measure.config import RunConfig
    from hpcdl.parallel.world import World

    m = recipes.suite("M")
    assert m.settings == {"bert-base": {"lr": 1e-4}}
    assert recipes.suite("L").settings == {"bert-large": {"lr": 1e-4}}  # post-norm too
    cfg, one = RunConfig(suite_class="M", suite_version=m.version), World(size=1, local_size=1)
    assert class_settings(cfg, "bert-base", one).lr == 1e-4
    assert class_settings(cfg.replace(lr=3e-4), "bert-base", one, lr_given=True).lr == 3e-4
    assert class_settings(cfg, "gpt2-small", one).lr == RunConfig().lr == 1e-3
    assert class_settings(RunConfig(), "bert-base", one).lr == 1e-3  # not a class run
