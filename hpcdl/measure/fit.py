"""Auto-fit, hpcdl's version of HPL's N: the per-rank batch that fills a stated fraction of the
device's memory, found by measurement. The analytic estimate (``metrics.memory_estimate``)
picks the starting batch; trial steps (``measure.trial``) at two smaller batches measure the
fixed part and the per-sample slope of the peak; the batch is extrapolated to the target and
confirmed by a trial of its own, bracketing until a trial lands within ``WINDOW`` below the
target. The batch moves up as well as down from the estimate's; the chosen batch is always one
whose trial stayed within the target. The record keeps the target, the estimate, every trial,
the measured peak of the chosen batch and the run's own peak (``Fit.with_run_peak``): on a CPU
the run keeps glibc's mmap threshold fixed as the trials did, so that it holds what they measured.

Trials run before the ranks communicate on purpose: an out-of-memory error inside a collective
would leave the other ranks waiting for the failed one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from hpcdl.device import (
    MMAP_THRESHOLD_BYTES,
    jemalloc_oversize_threshold,
    malloc_library,
    memory_capacity,
    rank_threads,
)
from hpcdl.errors import InputError, SpecError
from hpcdl.measure.config import RunConfig
from hpcdl.measure.measurement import RankMeasurement
from hpcdl.measure.trial import Shard, Trial, cpu_trial, cuda_trial
from hpcdl.parallel.world import World
from hpcdl.workloads.spec import Spec

WINDOW = 0.05
"""a trial whose peak is within this fraction below the target ends the search"""
SPAN = 0.1
"""the line's two trials are at least this fraction of the larger batch apart"""
MAX_TRIALS = 8
"""trials per rank at most; the best batch within the target found so far is then taken"""
MAX_GROWTH = 8
"""an extrapolated batch is at most this multiple of the largest batch measured so far: a slope
read from small trials may be noise"""
NO_BATCH_ABOVE = 2**31
"""the search's upper end of its bracket until a batch above the target is measured"""


RANK_PROCESS_BYTES = 384 << 20
"""what a rank process takes on a CPU before its model: Python, torch, mpi4py, Horovod and what a
first training step loads (the kernels' code, the libraries' buffers), as a fitted run takes its
base (``trial.warm_base``): each rank's ``peak_memory_bytes`` less ``fit.run_peak_bytes``,
measured in docs/validation/2026-11-26-auto-fit.md, step 5, and rounded up."""


def rank_memory(device: torch.device, world: World) -> int:
    """Bytes one rank may give its model: its GPU's memory, or on a CPU its share of the host's
    available memory less what the rank process itself takes; one line when a host cannot
    even hold its ranks' processes (``--np 10000``)."""
    if device.type == "cuda":
        return memory_capacity(device)
    available = memory_capacity(device)
    share = available // world.local_size - RANK_PROCESS_BYTES
    if share <= 0:
        most = max(1, available // (RANK_PROCESS_BYTES + (64 << 20)))
        raise InputError(
            "np",
            world.local_size,
            f"at most about {most} ranks fit in the {available / 2**30:.1f} GiB available on "
            f"{world.hostname} (a rank process takes about {RANK_PROCESS_BYTES >> 20} MiB before its model)",
        )
    return share


@dataclass(frozen=True)
class Fit:
    """How a batch was fitted (the record's ``metrics.fit``)."""

    fraction: float
    capacity_bytes: int
    """memory of one rank for its model (the smallest over ranks)"""
    target_bytes: int
    """``fraction x capacity_bytes``: what the chosen batch's measured peak should reach"""
    estimated_batch: int
    """the batch the analytic estimate chose (the search's start)"""
    batch: int
    """the batch that ran"""
    estimate_bytes: int
    """the analytic estimate at ``batch``"""
    measured_peak_bytes: int | None
    """the peak this rank's trial at ``batch`` measured (None: another rank's search chose it)"""
    fixed_bytes: float | None = None
    """the peak's fixed part, from the search's last line (``search``)"""
    per_sample_bytes: float | None = None
    """the peak's slope per sample, from the same line"""
    trials: list[dict[str, int | None]] = field(default_factory=list)
    """rank 0's trials in order: ``batch`` and ``peak_bytes`` (None: too large, stopped)"""
    measured_by: str = "cpu child process peak RSS"
    """how a trial's peak was measured"""
    mmap_threshold_bytes: int | None = None
    """CPU: glibc's mmap threshold that the trials and the run fixed (``device.pin_mmap_threshold``),
    at some cost in step time against a dynamic one (docs/validation/2026-11-26-auto-fit.md, step 5);
    None on a GPU, or where glibc's ``malloc`` is not the one called"""
    allocator: str | None = None
    """CPU: whose ``malloc`` the trials and the run called (``device.malloc_library``): glibc, or
    jemalloc or tcmalloc preloaded into the run (``LD_PRELOAD``, which its trials inherit); None
    on a GPU"""
    oversize_threshold_bytes: int | None = None
    """CPU under jemalloc: its ``opt.oversize_threshold`` (``device.jemalloc_oversize_threshold``),
    from which freed blocks are given back at once; None otherwise"""
    kept_grads: bool = False
    """the estimate and the trials kept every gradient allocated between steps, as the run's
    backend does (``Backend.keeps_gradients``: DDP's buckets)"""
    shard: dict[str, Any] | None = None
    """CPU, several ranks: the share of the model each trial trained (``trial.Shard``: this rank
    of the run's ranks, the experts it keeps, and the backend that shards the model, if any); None
    where the trials trained the whole model"""
    run_peak_bytes: int | None = None
    """the run's own peak above what its rank held before the model, its base taken as a trial's
    (``trial.warm_base``), the largest over ranks: what the trials promised to keep within
    ``target_bytes``. On a CPU it holds what a run's longer life adds (glibc's heap over more
    steps); None where a rank could not say"""

    def with_run_peak(self, ranks: list[RankMeasurement]) -> Fit:
        """This fit with the run's own peak, from each rank's peak and what it held before its model."""
        held = [r.held_before_model_bytes for r in ranks]
        rises = [r.peak_memory_bytes - h for r, h in zip(ranks, held, strict=True) if h is not None]
        return replace(self, run_peak_bytes=max(rises)) if len(rises) == len(ranks) else self


def estimate_line(
    spec: Spec,
    optimizer: str,
    device_type: str,
    pool_batches: int,
    malloc: str = "glibc",
    kept_grads: bool = False,
) -> tuple[int, int]:
    """(fixed bytes, bytes per sample) of the estimate's line where backward is the peak, read off
    ``Spec.memory_estimate`` at two far batches: the step's per-sample bytes and the sample's
    inputs in each of the ``pool_batches`` batches kept on the device, from the one formula."""
    far = 1 << 40
    at = [
        spec.memory_estimate(b, optimizer, device_type, pool_batches, malloc, kept_grads)
        for b in (far, 2 * far)
    ]
    per_sample = max((at[1] - at[0]) // far, 1)
    return at[0] - far * per_sample, per_sample


def estimated_batch(
    spec: Spec,
    optimizer: str,
    fraction: float,
    capacity: int,
    device_type: str = "cpu",
    pool_batches: int = 1,
    malloc: str = "glibc",
    kept_grads: bool = False,
) -> int:
    """The largest batch whose estimated memory, with ``pool_batches`` batches of inputs on the
    device (on a CPU, ``malloc`` the allocator its steps call; ``kept_grads``, the gradients a
    backend keeps allocated: ``Spec.memory_parts``), is within
    ``fraction`` of ``capacity``; a one-line error when even one sample does not fit. The estimate
    is the larger of a fixed optimizer step and a backward that grows with the batch
    (``metrics.memory_parts``), so the batch follows the backward's line."""

    def estimate(batch: int) -> int:
        return spec.memory_estimate(batch, optimizer, device_type, pool_batches, malloc, kept_grads)

    target = fraction * capacity
    need = estimate(1)
    if need > target:
        raise SpecError(
            f"{spec.family}.batch_size",
            "fit",
            f"even batch 1 needs an estimated {need / 2**30:.2f} GiB, more than {fraction:g} of the "
            f"{capacity / 2**30:.2f} GiB of a rank; this workload needs a larger device (or more ranks "
            "sharding it)",
        )
    fixed, per_sample = estimate_line(spec, optimizer, device_type, pool_batches, malloc, kept_grads)
    batch = max(1, math.floor((target - fixed) / per_sample))
    if estimate(batch) <= target:
        return batch
    # the line, read at far batches, leaves out what only small batches hold (per-step states in
    # glibc's heap, ``Spec._in_heap``); below the line's batch the estimate grows with the batch
    lo, hi = 1, batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if estimate(mid) <= target else (lo, mid)
    return lo


def search(
    measure: Callable[[int], Trial], start: int, target: float, limit: float, fallback_slope: float
) -> tuple[int, list[Trial], float | None, float | None]:
    """The largest batch whose measured peak is within ``target``, found with few ``measure``
    calls: trials at a quarter and half of ``start``, then the batch where a line (fixed part +
    slope x batch) meets the middle of the window below the target, kept between the largest
    batch within the target (``lo``) and the smallest above it (``hi``), once both are measured
    at least a quarter of their distance in from each, until a trial lands in the window or the
    two meet. The line runs through the largest measured trial no larger
    than ``hi`` and the largest one at least ``SPAN`` below it in batch. Aiming at the window's
    middle and reading the slope from trials apart leave room for a trial's own noise (a few %
    between adjacent batches on a CPU). A batch the line puts above ``limit`` is refused without
    running. ``fallback_slope`` stands in for a slope that noise made zero or negative. Returns
    (batch, trials, fixed part, slope); batch 0 when even batch 1 is above the target."""
    trials: list[Trial] = []
    fixed: float | None = None
    slope: float | None = None
    lo, hi = 0, NO_BATCH_ABOVE
    first = max(1, start // 4)
    queue = [first, max(first + 1, start // 2)]
    aim = (1 - WINDOW / 2) * target
    while len(trials) < MAX_TRIALS and hi - lo > 1:
        # the line from trials inside the bracket: beyond ``hi`` the peak can bend (glibc's heap),
        # and a flatter slope there aims a batch above ``lo`` at a time (rnn seed 0, fp32)
        if pair := _line_points([t for t in trials if t.peak_bytes is not None and t.batch <= hi]):
            (b0, p0), (b1, p1) = pair
            slope = (p1 - p0) / (b1 - b0)
            slope = slope if slope > 0 else fallback_slope
            fixed = p1 - slope * b1
        if queue:
            batch = queue.pop(0)
        elif fixed is not None and slope is not None:
            batch = math.floor((aim - fixed) / slope)
            if lo and hi < NO_BATCH_ABOVE:  # a quarter of the bracket in from either end at least: a line
                # through a noisy trial can aim just above ``lo`` time after time (FSDP, 2 ranks)
                quarter = (hi - lo) // 4
                batch = min(max(batch, lo + quarter), hi - quarter)
        else:  # no line yet: double up from the last batch within the target, or halve down
            batch = 2 * lo if lo else max(1, min(t.batch for t in trials) // 4)
        batch = min(max(batch, lo + 1), hi - 1, MAX_GROWTH * lo if lo else hi - 1)
        if any(t.batch == batch for t in trials):
            batch = (lo + hi) // 2 if hi < NO_BATCH_ABOVE else 2 * lo  # inside the bracket, not tried yet
            if batch <= lo or batch >= hi or any(t.batch == batch for t in trials):
                break
        if fixed is not None and slope is not None and fixed + slope * batch > limit:
            trials.append(Trial(batch, None))  # refused before it runs: it would not fit
            hi = batch
            continue
        trial = measure(batch)
        trials.append(trial)
        if trial.peak_bytes is not None and trial.peak_bytes <= target:
            lo = batch
            if trial.peak_bytes >= (1 - WINDOW) * target:
                break
        else:
            hi = batch
            queue = [q for q in queue if q < batch]
    return lo, trials, fixed, slope


def _line_points(measured: list[Trial]) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(batch, peak) of the largest measured trial and of the largest one at least ``SPAN``
    below it in batch (adjacent batches' peaks differ by their noise more than by their slope),
    or None."""
    if not measured:
        return None
    top = max(measured, key=lambda t: t.batch)
    below = [t for t in measured if t.batch <= (1 - SPAN) * top.batch]
    if not below:
        return None
    low = max(below, key=lambda t: t.batch)
    return (low.batch, low.peak_bytes or 0), (top.batch, top.peak_bytes or 0)


def fit_batch(
    spec: Spec,
    cfg: RunConfig,
    device: torch.device,
    world: World,
    kept_grads: bool = False,
    shard: Shard | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[Spec, Fit]:
    """``spec`` with the batch whose measured peak fills ``cfg.fit_fraction`` of every rank's
    memory; a one-line error when even batch 1 does not fit, and the trial's reason when a
    trial fails otherwise. ``kept_grads``: the run's backend keeps every gradient allocated
    (``Backend.keeps_gradients``), and so do the estimate and the trials. ``shard``: this rank's
    share of the model, which its CPU trials train (a GPU's trial, in the run's process, trains
    the whole model: its peak is then above the rank's). The estimate, which picks the first
    trials' batches, is the whole model's. ``say`` hears each trial, its batch and measured
    peak, as the search goes (a fit of a large model takes minutes)."""
    capacity = min(world.allgather(rank_memory(device, world)))
    target = cfg.fit_fraction * capacity
    gpu = device.type == "cuda"
    allocator = None if gpu else malloc_library()
    malloc = allocator or "glibc"  # a GPU's step: the estimate has no heap term there
    start = estimated_batch(
        spec, cfg.optimizer, cfg.fit_fraction, capacity, device.type, cfg.pool_batches, malloc, kept_grads
    )
    # a CPU trial is stopped when its process passes the rank's whole share of the host; it
    # trains with the threads the run will (the run sets them only after the trials)
    limit = capacity + RANK_PROCESS_BYTES
    threads = rank_threads(world.local_size)

    tried: list[Trial] = []

    def measure(batch: int) -> Trial:
        s = spec.replace(batch_size=batch)
        if say:
            say(f"fit: trial {len(tried) + 1} at batch {batch} (target peak {target / 2**30:.2f} GiB)")
        if gpu:
            trial = cuda_trial(s, cfg.optimizer, cfg.pool_batches, device, kept_grads)
        else:
            trial = cpu_trial(s, cfg.optimizer, cfg.pool_batches, limit, threads, kept_grads, shard)
        tried.append(trial)
        if say:
            peak = (
                "too large (stopped)" if trial.peak_bytes is None else f"{trial.peak_bytes / 2**30:.2f} GiB"
            )
            say(f"fit: trial {len(tried)} at batch {batch}: measured peak {peak}")
        return trial

    line = estimate_line(spec, cfg.optimizer, device.type, cfg.pool_batches, malloc, kept_grads)
    slope_guess = float(line[1])
    batch, trials, fixed, slope = search(measure, start, target, capacity, slope_guess)
    batch = min(world.allgather(batch))
    if batch < 1:
        smallest = min((t for t in trials if t.peak_bytes is not None), key=lambda t: t.batch, default=None)
        took = (
            f"measured {smallest.peak_bytes / 2**30:.2f} GiB"
            if smallest and smallest.peak_bytes
            else "ran out"
        )
        raise SpecError(
            f"{spec.family}.batch_size",
            "fit",
            f"even batch 1 {took}, more than {cfg.fit_fraction:g} of the {capacity / 2**30:.2f} GiB of a "
            "rank; this workload needs a larger device (or more ranks sharding it)",
        )
    fitted = spec.replace(batch_size=batch)
    estimate = fitted.memory_estimate(batch, cfg.optimizer, device.type, cfg.pool_batches, malloc, kept_grads)
    peak = next((t.peak_bytes for t in trials if t.batch == batch), None)
    return fitted, Fit(
        fraction=cfg.fit_fraction,
        capacity_bytes=capacity,
        target_bytes=int(target),
        estimated_batch=start,
        batch=batch,
        estimate_bytes=estimate,
        measured_peak_bytes=peak,
        fixed_bytes=fixed,
        per_sample_bytes=slope,
        trials=[{"batch": t.batch, "peak_bytes": t.peak_bytes} for t in trials],
        measured_by="torch.cuda.max_memory_reserved" if gpu else "peak RSS of a child process",
        mmap_threshold_bytes=MMAP_THRESHOLD_BYTES if allocator == "glibc" else None,
        allocator=allocator,
        oversize_threshold_bytes=None if gpu else jemalloc_oversize_threshold(),
        kept_grads=kept_grads,
        shard=asdict(shard) if shard and not gpu else None,
    )
