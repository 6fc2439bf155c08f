"""Execution modes and the headline window: every family compiled trains as it does eagerly
(the same math), a compiled run records what ran and how long its first step took, rankings keep
modes apart, settings a device cannot run are one line; and a run on a disturbed machine is
flagged, kept out of rankings with its reason, while a quiet one is not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from hpcdl_cli import hpcdl, one_line
from tiny import TINY  # beside this file, on pytest's path

import hpcdl as api
from hpcdl.measure import execution
from hpcdl.measure.config import RunConfig
from hpcdl.measure.data import device_pool
from hpcdl.measure.execution import Execution, compiled, inputs, prepare, resolve
from hpcdl.measure.loop import Trainer
from hpcdl.records import validity
from hpcdl.records.audit import audit
from hpcdl.records.loader import read_record
from hpcdl.records.store import load_record, seal, write_record
from hpcdl.results import ranking
from hpcdl.results.score import suite_workload
from hpcdl.workloads.registry import FAMILIES

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "reference_results" / "cpu-epyc-2core-2026-11-22"
STEPS = 20
FP32_AGREEMENT = 1e-4 if tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 9) else 1e-2
"""eager and compiled losses of the same fp32 training, relative: inductor reorders reductions
(measured: at most 3e-7 over 20 steps on torch 2.13, docs/validation/2026-12-02-fast-path.md;
6.3e-3 for the attention family on torch 2.6, whose inductor computes its backward otherwise:
the first step's losses agree exactly, docs/validation/2026-12-07-portability.md)"""


def trained(spec: api.Spec, execution: Execution, weights: dict) -> tuple[list[float], Trainer]:
    """``STEPS`` steps of ``spec`` from ``weights`` on its learnable data, as a run builds them."""
    model = prepare(spec.build(), execution)
    model.load_state_dict(weights)
    pool = device_pool(spec, CPU, 4, learnable=True)
    pool.batches[:] = [(inputs(x, execution), y) for x, y in pool.batches]
    trainer = Trainer(
        model=compiled(model, execution),
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
        source=pool,
        device=CPU,
        precision=spec.precision,
    )
    for _ in range(STEPS):
        trainer.step()
    return [float(x) for x in trainer._losses], trainer


def test_every_family_has_a_tiny_spec_here() -> None:
    assert set(TINY) >= set(FAMILIES.names()) - {"tiny", "faulty"}  # plugins' families aside


@pytest.mark.parametrize("family", sorted(TINY))
def test_every_family_compiled_trains_as_it_does_eagerly(family: str) -> None:
    spec = api.spec_from_dict({"family": family, **TINY[family]})
    weights = spec.build().state_dict()
    eager, _ = trained(spec, resolve("eager", False, "auto", "auto", spec, CPU), weights)
    comp, _ = trained(spec, resolve("compile", False, "auto", "auto", spec, CPU), weights)
    drift = max(abs(a - b) / abs(a) for a, b in zip(eager, comp, strict=True))
    assert drift <= FP32_AGREEMENT, (eager, comp)
    assert eager[-1] < eager[0]  # it trained: the agreement is not that of two idle runs


def test_a_compiled_run_records_what_ran_and_its_first_step(tmp_path: Path) -> None:
    knobs = [f"{k}={v}" for k, v in TINY["mlp"].items()]
    args = ["run", "--workload", "mlp", *knobs, "--steps", "20", "--min-duration", "0"]
    eager = hpcdl(*args, "--eager", "-o", str(tmp_path / "e"), "--name", "e")
    comp = hpcdl(*args, "--compile", "-o", str(tmp_path / "c"), "--name", "c")
    assert eager.returncode == 0 and comp.returncode == 0, comp.stderr[-2000:]
    e, c = load_record(tmp_path / "e" / "e.json"), load_record(tmp_path / "c" / "c.json")
    assert e["settings"]["execution"]["mode"] == "eager" and "compiled" not in e["metrics"]
    assert c["settings"]["execution"] == {
        "mode": "compile",
        "graphs": False,
        "fused_optimizer": execution.CPU_FUSED_OPTIMIZER,  # auto: the CPU's measured choice
        "memory_format": "contiguous",  # an MLP has no convolutions
        "cudnn_benchmark": False,
    }
    assert c["metrics"]["compiled"]["graphs"] >= 1 and c["metrics"]["compiled"]["graph_breaks"] == 0
    # the wait for compilation is in the first step, apart from the timed window
    first = c["metrics"]["time_to_first_step_s"]
    assert first > 10 * c["metrics"]["step_time_s"]["median"]
    assert first > c["metrics"]["timed_window_s"] / 20  # more than a step of the window
    assert c["counts"] == e["counts"] and c["validity"]["passed"], c["validity"]
    assert audit(read_record(tmp_path / "c" / "c.json")).problems == ()  # its figures follow from its steps
    assert "compiling" in comp.stderr


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--graphs"], "run.graphs=True is invalid: CUDA graphs need a CUDA device"),
        (["--compile", "--layout", "pp=2"], "run.mode='compile' is invalid: not with pipeline parallelism"),
        (["--memory-format", "channels_last"], "run.memory_format='channels_last' is invalid"),
        (["--fused-optimizer", "sometimes"], "run.fused_optimizer='sometimes' is invalid"),
        (["--compile", "--eager"], "not allowed with argument"),
    ],
)
def test_a_mode_that_cannot_run_is_one_line(args: list[str], field: str, tmp_path: Path) -> None:
    line = one_line(hpcdl("run", "--workload", "mlp", *args, "-o", str(tmp_path / "never")))
    assert field in line, line
    assert not (tmp_path / "never").exists()


def test_a_class_runs_in_its_mode_unless_the_command_line_says() -> None:
    from hpcdl.harness.classes import workload_settings as class_settings
    from hpcdl.parallel.world import World
    from hpcdl.workloads import recipes

    one = World(size=1, local_size=1)
    for size_class in recipes.size_classes():
        cfg = RunConfig(suite_class=size_class)
        mode = recipes.suite(size_class).mode
        assert mode in ("eager", "compile")
        assert class_settings(cfg, "x", one).mode == mode
        other = "eager" if mode == "compile" else "compile"
        assert class_settings(cfg.replace(mode=other), "x", one, mode_given=True).mode == other


def as_compiled(src: Path, dest: Path) -> Path:
    """The class S records of ``src`` as if compiled: each resealed with ``settings.execution``
    saying so (a new id: another run's record)."""
    dest.mkdir(parents=True)
    for path in src.rglob("*.json"):
        rec = json.loads(path.read_text())
        if rec.get("schema") != "hpcdl.result" or suite_workload(rec["spec"]) is None:
            continue
        shutil.copy(path.parent / rec["steps_file"], dest / rec["steps_file"])
        rec = {k: v for k, v in rec.items() if k != "digest"}
        rec["id"] = uuid.uuid4().hex
        rec["settings"]["execution"] = {"mode": "compile", "graphs": False}
        write_record(seal(rec), dest / path.name)
    return dest


def test_rank_keeps_modes_apart(tmp_path: Path) -> None:
    both = tmp_path / "sys"
    shutil.copytree(REF, both / "eager")
    as_compiled(REF, both / "compiled")
    r = ranking.rank([("sys", both)])
    assert r.rejected == [], r.rejected
    assert list(r.lists)[:2] == ["S", "S/compile"]
    eager, comp = r.lists["S"][0], r.lists["S/compile"][0]
    assert eager.mode == "eager" and comp.mode == "compile"
    assert eager.score == pytest.approx(comp.score) and eager.score is not None  # the same records
    # each list's records are its mode's only
    assert all("/compiled/" not in w["record"] for w in eager.workloads.values())
    assert all("/compiled/" in w["record"] for w in comp.workloads.values())
    text = ranking.terminal_table(r)
    assert "compile runs" in text and text.count("Class S (suite version") == 2


def test_a_compiled_class_run_is_scored_in_its_own_mode(tmp_path: Path) -> None:
    """What ``run --class S --compile`` (and class M, compiled by default) prints at its end:
    the score of its records in their mode, as ``rank`` lists them, not "incomplete"."""
    from hpcdl.results.verdict import judge

    comp = as_compiled(REF, tmp_path / "compiled")
    v = judge(sorted(comp.glob("*.json")), "S")
    assert v.score.mode == "compile" and v.score.score is not None and v.rankable, v.lines()
    assert v.lines()[0].startswith("class S/compile v1 score: ")
    eager = judge(sorted(REF.rglob("*.json")), "S")  # other files there are "not counted"
    assert eager.score.mode == "eager" and eager.score.score == pytest.approx(v.score.score)


# --- the headline window and a disturbed machine ----------------------------------------------


def test_one_wait_for_the_device_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timed loop waits for the device once a step (its phases from marks that do not wait):
    counted by replacing the wait the loop calls."""
    import hpcdl.measure.loop as loop

    waits = []
    monkeypatch.setattr(loop, "synchronize", lambda device: waits.append(device))
    spec = api.spec_from_dict({"family": "mlp", **TINY["mlp"], "accumulation_steps": 3})
    model = spec.build()
    trainer = Trainer(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        source=device_pool(spec, CPU, 2, learnable=True),
        device=CPU,
        precision="fp32",
        accumulation_steps=3,
    )
    log = trainer.run(warmup=2, steps=5, duration_s=0)
    assert len(waits) == 2 + 1 + 5  # a step each, and one after warm-up
    assert all(sum(p[i] for p in log.phases_s.values()) <= s for i, s in enumerate(log.step_s))


def waited(share: float, own: float = 0.0, window: float = 10.0) -> validity.Waited:
    return validity.Waited(0, "h1", share * window, window, own)


def test_waiting_for_a_cpu_beyond_the_runs_own_share_fails_the_run() -> None:
    assert validity.quiet_machine([waited(0.05)]).passed
    hog = validity.quiet_machine([waited(0.0), waited(0.63)])
    assert not hog.passed and "waited for a CPU 6.3 s of its 10.0 s window (63%" in hog.detail
    # four ranks of one thread on two cores wait for each other: not judged, and said so
    own = validity.quiet_machine([waited(0.75, own=0.5)])
    assert own.passed and "not judged: the run's own threads wait 50%" in own.detail
    assert validity.quiet_machine([waited(0.9, window=0.5)]).passed  # too short to judge
    assert "not judged" in validity.quiet_machine([]).detail


def test_steps_that_wander_fail_the_run() -> None:
    steady = [0.1 + 0.001 * (i % 5) for i in range(40)]
    assert validity.steady_steps(steady).passed
    wander = [0.14 if i % 2 else 1.1 for i in range(40)]
    check = validity.steady_steps(wander)
    assert not check.passed and "p90/p10 of 40 steps" in check.detail
    assert validity.steady_steps([0.001 if i % 3 else 0.004 for i in range(40)]).passed  # ms: jitter
    assert validity.steady_steps(wander[:20]).passed  # too few to judge
    assert validity.steady_steps(wander, own_share=0.5).passed  # its own threads make it wander


HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def test_a_run_beside_a_cpu_hog_is_flagged_and_kept_out_of_rank(tmp_path: Path) -> None:
    """Two processes spin on this machine's two CPUs while a one-thread run times 2.5 s: its
    main thread waits for a CPU about half the window. The record says so in one line, the
    run's table marks it not valid, and rank keeps it out with that line."""
    cpus = sorted(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", HOG, str(c)]) for c in cpus]
    try:
        time.sleep(0.5)
        knobs = [f"{k}={v}" for k, v in TINY["mlp"].items()]
        p = hpcdl(
            "run", "--workload", "mlp", *knobs, "--duration", "2.5", "--name", "hog", "-o", str(tmp_path),
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert p.returncode == 1, p.stderr[-2000:]  # a run that completed but failed its checks
    rec = load_record(tmp_path / "hog.json")
    (quiet,) = [c for c in rec["validity"]["checks"] if c["name"] == "quiet_machine"]
    assert not quiet["passed"] and quiet["detail"].startswith("rank 0 on "), quiet
    assert " NO" in p.stdout  # the summary's valid column
    (rejected,) = ranking.rank([("sys", tmp_path)]).rejected
    assert "quiet_machine (rank 0 on" in rejected.reason and "waited for a CPU" in rejected.reason


def test_every_anchor_is_a_class_m_workload_listed_with_its_source() -> None:
    from hpcdl.workloads import recipes

    text = (ROOT / "docs" / "metrics.md").read_text()
    section = text.split("## Anchors", 1)[1].split("\n## ", 1)[0]
    for name, anchor in recipes.anchors().items():
        assert name in recipes.suite("M").workloads
        assert f"| `{name}` |" in section and anchor["device"] in section
        assert ("samples_per_s" in anchor) != ("mfu" in anchor) and anchor["source"]


@pytest.mark.mpi
@pytest.mark.parametrize(
    "backend",
    [
        "torch",
        pytest.param("horovod", marks=pytest.mark.slow(reason="the same compiled run under Horovod")),
        pytest.param(
            "fsdp", marks=pytest.mark.slow(reason="the same compiled run with FSDP's blocks compiled")
        ),
    ],
)
def test_ranks_compiled_step_like_one_process(backend: str, tmp_path: Path, on_cluster: object) -> None:
    """Two ranks, each compiling its model (DDP around it; FSDP around each compiled block):
    the run checks that they step like one process and end with identical parameters."""
    knobs = [f"{k}={v}" for k, v in TINY["mlp"].items()]
    p = hpcdl(
        "run", "--workload", "mlp", *knobs, "--np", "2", "--backend", backend, "--compile", "--steps", "8",
        "--min-duration", "0", "--name", "c", "-o", str(tmp_path), timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    rec = load_record(tmp_path / "c.json")
    checks = {c["name"]: c["passed"] for c in rec["validity"]["checks"]}
    assert checks["one_step_equivalence"] and checks["parameters_identical"] and rec["validity"]["passed"]
    assert rec["settings"]["execution"]["mode"] == "compile" and rec["metrics"]["compiled"]["graphs"] >= 1


def test_the_mode_options_set_the_execution_mode_and_nothing_else() -> None:
    from hpcdl.cli import build_parser

    p = build_parser()
    for command in (["run"], ["sweep", "--np", "1,2"], ["capacity", "--instances", "2"]):
        assert p.parse_args([*command, "--compile"]).execution_mode == "compile"
        assert p.parse_args([*command, "--eager"]).execution_mode == "eager"
        assert p.parse_args(command).execution_mode is None  # the class's, else eager
    # The sweep's own --mode (weak or strong scaling) is untouched by --eager/--compile.
    assert p.parse_args(["sweep", "--np", "1,2", "--eager"]).mode is None
    assert p.parse_args(["sweep", "--np", "1,2", "--mode", "strong", "--compile"]).mode == "strong"


def test_the_ranks_digest_reads_channels_last_weights_as_their_values() -> None:
    """A 1×1 convolution's channels-last weight counts as contiguous with a last stride that is
    not 1; the digest that checks ranks hold the same parameters must read it all the same."""
    from hpcdl.measure.checks import parameter_digest

    w = torch.randn(8, 4, 1, 1)
    last = w.to(memory_format=torch.channels_last)
    assert last.stride(-1) != 1 and last.is_contiguous()
    assert parameter_digest([("w", last)]) == parameter_digest([("w", w)])
    assert parameter_digest([("w", last)]) != parameter_digest([("w", w + 1)])


def test_sharded_parameters_run_the_per_parameter_optimizer_on_a_cpu() -> None:
    """torch's fused AdamW on a CPU refuses DTensors (FSDP, tp > 1): auto leaves it off there,
    and asking for it is one line naming the option."""
    spec = api.spec_from_dict({"family": "mlp", **TINY["mlp"]})
    cpu = torch.device("cpu")
    assert resolve("eager", False, "auto", "auto", spec, cpu).fused_optimizer == execution.CPU_FUSED_OPTIMIZER
    assert not resolve("eager", False, "auto", "auto", spec, cpu, dtensors=True).fused_optimizer
    with pytest.raises(api.SpecError, match=r"^run\.fused_optimizer='on' is invalid: off or auto on a CPU"):
        resolve("eager", False, "on", "auto", spec, cpu, dtensors=True)
