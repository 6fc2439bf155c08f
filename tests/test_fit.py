"""Auto-fit by measurement: the search reaches the target from either side of the estimate,
refuses what would not fit before running it, and a real trial in a child process measures a
peak, is stopped by its parent past the limit, and reports a failure that is not memory."""

from __future__ import annotations

import ctypes.util
import os
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
import torch

from hpcdl.cli.run import fit_text
from hpcdl.device import JEMALLOC_CONF, rank_threads
from hpcdl.errors import RunFailed
from hpcdl.measure.fit import WINDOW, estimated_batch, search
from hpcdl.measure.trial import Shard, Trial, cpu_trial
from hpcdl.records.views import FitFigures
from hpcdl.workloads.registry import spec_from_dict
from hpcdl.workloads.sampling import sample_spec

MB = 1 << 20


def line(fixed: float, per_sample: float, wobble: float = 0.0, ceiling: float = float("inf")):  # type: ignore[no-untyped-def]
    """A measured peak that grows linearly with the batch, give or take the allocator's
    granularity (``wobble``, alternating in sign), and is too large past ``ceiling``."""
    calls: list[int] = []

    def measure(batch: int) -> Trial:
        calls.append(batch)
        peak = fixed + per_sample * batch + (wobble if len(calls) % 2 else -wobble)
        return Trial(batch, None if peak > ceiling else int(peak))

    return measure, calls


@pytest.mark.parametrize("start", [40, 400, 4000])  # the estimate 5x too high, about right, 5x too low
def test_the_search_lands_within_the_window_below_the_target_from_either_side(start: int) -> None:
    measure, calls = line(100 * MB, 1 * MB, wobble=0.5 * MB)
    target = 600 * MB  # batch 500 fills it
    batch, trials, fixed, slope = search(measure, start, target, 2 * target, 1 * MB)
    peak = next(t.peak_bytes for t in trials if t.batch == batch)
    assert peak is not None and (1 - WINDOW) * target <= peak <= target, trials
    assert len(calls) <= 5 and calls[0] == max(1, start // 4)  # two trials, then the line's batch
    assert fixed == pytest.approx(100 * MB, rel=0.05) and slope == pytest.approx(MB, rel=0.05)


def test_the_search_lands_in_the_window_through_trial_noise() -> None:
    """Each batch's peak off the line by up to 3 %, adjacent batches unrelated (a CPU trial's
    heap: an RNN's batches 175..178 measured 0.948, 0.917, 0.944 and 1.03 of its target): over
    200 seeded noise patterns and three starts the search lands in the window nearly always
    (aiming at the window's top with a slope from the two largest trials: 97.8 %)."""

    def noisy(seed: int) -> Callable[[int], Trial]:
        noise: dict[int, float] = {}
        rng = random.Random(seed)

        def measure(batch: int) -> Trial:
            off = noise.setdefault(batch, rng.uniform(-0.03, 0.03))
            return Trial(batch, int((50 * MB + 1 * MB * batch) * (1 + off)))

        return measure

    landed = 0
    for seed in range(200):
        measure = noisy(seed)
        for start in (50, 200, 800):
            target = 250 * MB
            batch, trials, _, _ = search(measure, start, target, 2 * target, 1 * MB)
            peak = next(t.peak_bytes for t in trials if t.batch == batch)
            landed += peak is not None and (1 - WINDOW) * target <= peak <= target
    assert landed >= 0.99 * 600


def test_a_peak_that_flattens_above_the_target_does_not_hold_the_search_below_it() -> None:
    """An Elman RNN's trials on a Zen 5 (rnn seed 0, fp32, 300 MiB: ``bench_memory.py --seeds 0``)
    rose steeply between batches 212 and 262 and flatly above: a line through the two largest
    trials, both above the target, aimed one batch above the largest within it at a time (212,
    213, 214, 215: 0.80 of the target after 8 trials). A line from trials inside the bracket
    lands in the window."""
    batches, fractions = [72, 145, 212, 262, 293], [0.335, 0.546, 0.774, 1.043, 1.086]
    target = 300 * MB
    calls: list[int] = []

    def measure(batch: int) -> Trial:
        calls.append(batch)
        return Trial(batch, int(np.interp(batch, batches, fractions) * target))

    batch, trials, _, _ = search(measure, 290, target, 2 * target, 1 * MB)
    peak = next(t.peak_bytes for t in trials if t.batch == batch)
    assert peak is not None and (1 - WINDOW) * target <= peak <= target, trials
    assert len(calls) <= 6


def test_a_line_that_aims_just_above_the_lower_end_of_the_bracket_still_closes_it() -> None:
    """Two FSDP ranks' trials (``hpcdl run --workload mlp layers=2 width=2048 input_size=2048
    output_size=1000 --np 2 --backend fsdp --fit 0.03``, Zen 5): 3281-3284 read 0.92 of the
    target, 3485 read 1.015. The line through 1601 and 3485 aimed at 3283, one batch above the
    largest within the target, trial after trial (0.92 after 8 trials). Each batch at least a
    quarter of the bracket in from its ends lands in the window."""
    batches, peaks = [800, 1601, 3281, 3284, 3485, 3892], [184.5, 224.6, 321.0, 321.0, 353.3, 364.3]
    target = 348.2e6

    def measure(batch: int) -> Trial:
        return Trial(batch, int(np.interp(batch, batches, peaks) * 1e6))

    batch, trials, _, _ = search(measure, 3202, target, 2 * target, 0.07e6)
    peak = next(t.peak_bytes for t in trials if t.batch == batch)
    assert peak is not None and (1 - WINDOW) * target <= peak <= target, trials
    assert len(trials) <= 6


def test_a_batch_the_line_puts_past_the_limit_is_refused_before_it_runs() -> None:
    measure, calls = line(0, 1 * MB)
    # the line says 2000 fits the target, but the watchdog's limit is lower: never run above it
    batch, trials, _, _ = search(measure, 100, 2000 * MB, 500 * MB, 1 * MB)
    assert max(calls) <= 500 and 0 < batch <= 500
    assert any(t.peak_bytes is None and t.batch not in calls for t in trials)  # refused, not run


def test_too_large_trials_move_the_batch_down_and_batch_one_over_the_target_gives_zero() -> None:
    measure, calls = line(50 * MB, 10 * MB, ceiling=300 * MB)  # a trial past 300 MB is stopped
    batch, trials, _, _ = search(measure, 400, 280 * MB, 300 * MB, 1 * MB)
    assert 21 <= batch <= 23 and any(t.too_large for t in trials)
    nothing, _, _, _ = search(line(500 * MB, 1 * MB)[0], 8, 100 * MB, 1000 * MB, 1 * MB)
    assert nothing == 0


SMALL = {"family": "mlp", "layers": 1, "width": 256, "input_size": 256, "output_size": 10}


def test_a_real_trial_measures_its_peak_and_is_stopped_past_its_limit() -> None:
    spec = spec_from_dict({**SMALL, "batch_size": 64})
    t = cpu_trial(spec, "adamw", 1, 8 << 30, threads=1)
    assert t.threads == 1  # the run's threads, not the parent's
    params = 256 * 256 + 256 + 256 * 10 + 10
    assert t.peak_bytes is not None and 0 < t.peak_bytes < 200 * MB
    assert t.peak_bytes >= 12 * params  # weights' gradients and AdamW's two moments at least
    # a limit below what the interpreter and torch take: the parent ends the child itself
    assert cpu_trial(spec, "adamw", 1, 64 * MB).too_large


@pytest.mark.slow(
    reason="six memory trials in child processes, at sizes whose shares differ measurably: about 20 s"
)
def test_a_ranks_trial_trains_only_its_share_of_a_model_its_run_divides() -> None:
    """A rank of a sharded run holds less than the whole model, and its trial trains that share
    under torch's fake process group (``trial.Shard``): FSDP's quarter of the state and its
    gathered units; tensor parallelism's half of every linear; half of the experts. Measured
    on a Zen 5 (10.4 M parameters, 159 MiB of weights, gradients and AdamW's moments, batch 8),
    twice: the whole model 195-196 MiB; rank 0 of four FSDP ranks 96, of two tp ranks 122; an
    attention layer with 8 experts, 106-107 whole and 62-63 with half of them. A trial of the
    whole model held FSDP and tp runs at 85 % and 79 % of their target
    (docs/validation/2026-11-26-auto-fit.md, step 8)."""
    wide = spec_from_dict({**SMALL, "layers": 2, "width": 2048, "input_size": 2048, "output_size": 1000})
    moe = {"family": "attention", "layers": 1, "width": 256, "heads": 4, "seq_len": 16, "vocab": 1000}
    experts = spec_from_dict({**moe, "experts": 8, "expert_parallel": True, "batch_size": 2})
    for spec, share, kept_grads in (
        (wide.replace(batch_size=8), Shard(0, 4, "fsdp"), False),
        (wide.replace(batch_size=8), Shard(0, 2, "tensor", tp=2, dp=1), False),
        (experts, Shard(0, 2), True),  # DDP's ranks: no backend shards the model, the experts spread
    ):
        whole = cpu_trial(spec, "adamw", 1, 8 << 30, kept_grads=kept_grads).peak_bytes
        mine = cpu_trial(spec, "adamw", 1, 8 << 30, kept_grads=kept_grads, shard=share).peak_bytes
        assert whole is not None and mine is not None and mine < 0.85 * whole, (share, mine, whole)


def test_the_estimate_counts_the_run_s_pool_of_input_batches() -> None:
    """A run keeps ``pool_batches`` batches of inputs on the device; where inputs dominate (an
    H200's class M mlp-wide: 128 KiB of them a sample beside 119 KiB of the step's) an estimate
    without them was 2.1x low. Here a narrow MLP on 8,192 features, 4 batches of 4,096: 512 MiB
    of inputs, a few MiB of model."""
    spec = spec_from_dict(
        {"family": "mlp", "layers": 1, "width": 16, "input_size": 8192, "output_size": 10, "batch_size": 4096}
    )
    peak = cpu_trial(spec, "adamw", 4, 8 << 30, threads=1).peak_bytes
    assert peak is not None
    pooled = spec.memory_estimate(4096, "adamw", "cpu", pool_batches=4)
    assert 0.9 < peak / pooled < 1.1, (peak, pooled)
    assert peak / spec.memory_estimate(4096, "adamw", "cpu") > 2.5  # one batch counted: 4x low
    assert estimated_batch(spec, "adamw", 1.0, pooled, "cpu", pool_batches=4) == pytest.approx(4096, rel=0.01)


@pytest.mark.slow(reason="three memory trials of a language model whose gradients are 78 MB: about 20 s")
def test_later_micro_batches_and_ddps_buckets_keep_every_gradient_in_the_estimate_and_the_trial() -> None:
    """From a step's second micro-batch on every gradient exists beside the activations: a
    language model's peak, its loss's backward, rises by its weights' gradients (attention seed
    11 in fp32: 78 MB, the allocator's peak 697.2 -> 775.4 MB). The estimate and the trials had
    counted one micro-batch, so a fitted run with accumulation would have passed its target.
    Measured: 706 and 808 MB, 1.005 and 1.035 of the estimates. DDP's buckets keep every gradient
    from the first micro-batch (``kept_grads``): its trial zeroes them in place instead of
    freeing them, and holds them as a second micro-batch does."""
    one = sample_spec("attention", 11, batch_size=32, precision="fp32")
    two = one.replace(accumulation_steps=2)
    grads = 4 * one.count().params
    assert two.memory_estimate(32, "adamw") - one.memory_estimate(32, "adamw") == grads
    assert one.memory_estimate(32, "adamw", kept_grads=True) == two.memory_estimate(32, "adamw")
    trials = [(one, False), (two, False), (one, True)]
    peaks = [cpu_trial(s, "adamw", 1, 8 << 30, threads=1, kept_grads=k).peak_bytes or 0 for s, k in trials]
    assert peaks[1] - peaks[0] > 0.9 * grads, (peaks, grads)  # the trial trains both micro-batches
    assert peaks[2] - peaks[0] > 0.9 * grads, (peaks, grads)  # the gradients outlive the step
    for (spec, kept), peak in zip(trials, peaks, strict=True):
        estimate = spec.memory_estimate(32, "adamw", kept_grads=kept)
        assert 0.95 < peak / estimate < 1.1, (peak, spec.accumulation_steps, kept)


def test_a_trial_that_fails_for_another_reason_ends_the_run_with_it() -> None:
    spec = spec_from_dict({**SMALL, "batch_size": 4})
    with pytest.raises(RunFailed, match="trial step at batch 4 failed: ValueError: optimizer 'lamb'"):
        cpu_trial(spec, "lamb", 1, 8 << 30)  # not memory: no smaller batch is tried


def test_a_rank_trains_with_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert rank_threads(4) == 2  # what the run sets when 4 ranks share a node's 8 cores
    assert rank_threads(16) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's count, which torch already has
    assert rank_threads(4) == torch.get_num_threads()


def test_a_gpus_capacity_counts_what_the_caching_allocator_holds_for_no_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen on an H200: the class M suite's second workload was fitted to 30.6 of 139 GiB, since
    CUDA's free memory does not count the first workload's cache, which this process can reuse.
    The CUDA calls are faked (no GPU here); the live tensors' bytes stay out."""
    from hpcdl.device import memory_capacity

    GiB = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (30 * GiB, 140 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 105 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 2 * GiB)
    assert memory_capacity(torch.device("cuda")) == (30 + 105 - 2) * GiB


JEMALLOC = ctypes.util.find_library("jemalloc")
_FREED = """
import torch
from hpcdl.device import jemalloc_oversize_threshold, malloc_trim, status_bytes
from hpcdl.measure.environment import environment
before = status_bytes("VmRSS")
blocks = [torch.ones(20_000) for _ in range(5_000)]  # 400 MB in blocks of 80 kB, under glibc's threshold
del blocks
malloc_trim()
print(environment(torch.device("cpu"))["malloc"], (status_bytes("VmRSS") - before) >> 20,
      jemalloc_oversize_threshold())
"""


@pytest.mark.skipif(not JEMALLOC, reason="no libjemalloc: bash scripts/setup.sh --test installs it")
@pytest.mark.parametrize("preload", ["", "jemalloc"])
def test_the_allocator_is_named_and_its_free_pages_are_given_back(preload: str) -> None:
    """With jemalloc preloaded (an operator's choice: docs/validation/2026-11-26-auto-fit.md,
    step 6) the record names it and its oversize threshold, and a run's peak still starts from what is live:
    jemalloc's freed pages are purged as glibc's are."""
    env = {**os.environ, "LD_PRELOAD": JEMALLOC if preload else "", "MALLOC_CONF": JEMALLOC_CONF}
    p = subprocess.run([sys.executable, "-c", _FREED], capture_output=True, text=True, env=env, check=True)
    name, kept, oversize = p.stdout.split()
    assert name == (preload or "glibc") and int(kept) < 40, p.stdout  # of 400 MB freed
    assert oversize == ("1048576" if preload else "None")  # jemalloc read MALLOC_CONF; glibc has none


def test_the_fit_line_names_jemalloc_and_how_to_give_its_pages_back_as_glibc_does() -> None:
    fit = FitFigures(
        fraction=0.5, capacity_bytes=200, target_bytes=100, estimated_batch=9, batch=8, estimate_bytes=90,
        measured_peak_bytes=None, fixed_bytes=None, per_sample_bytes=None, trials=[], measured_by="trials",
        mmap_threshold_bytes=None, allocator="jemalloc", oversize_threshold_bytes=None, kept_grads=False,
        shard=None, run_peak_bytes=None,
    )  # fmt: skip
    default = fit_text(replace(fit, oversize_threshold_bytes=8 << 20))
    assert default.endswith(
        "; malloc: jemalloc, freed blocks given back from 8 MiB (MALLOC_CONF=oversize_threshold:1048576: "
        "from 1 MiB, as glibc)"
    ), default
    assert fit_text(replace(fit, oversize_threshold_bytes=1 << 20)).endswith("given back from 1 MiB")
    assert "malloc" not in fit_text(replace(fit, allocator="glibc"))
    # a run past its target names what its one-process trials cannot hold: a backend's buffers
    # (two DDP ranks of a 10.4 M-parameter MLP: 143 % of a target their trials met at 98 %) and,
    # under glibc, a heap that keeps growing over a recurrent run's steps (speech seed 16 at batch
    # 257: 302 MiB after 2 steps, 393 after 30; jemalloc at 1 MiB 264/264)
    over = replace(fit, run_peak_bytes=120)
    assert fit_text(replace(over, allocator="glibc")).endswith(
        "= 120.0% (!: past its one-process trials: a backend's buffers, or glibc's heap over the steps "
        "(LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF=oversize_threshold:1048576))"
    )
    assert fit_text(replace(over, oversize_threshold_bytes=1 << 20)).endswith(
        "= 120.0% (!: past its one-process trials: a backend's buffers); malloc: jemalloc, freed blocks "
        "given back from 1 MiB"
    )
