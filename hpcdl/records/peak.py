"""The peak FLOP/s a record's MFU divides by, for the whole job, and the figures that cannot be
true (docs/metrics.md, `peak_flops` and `flags`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hpcdl.measure.measurement import RankMeasurement
from hpcdl.measure.peaks import Peak, raised_to_ceiling


def job_peak(device: torch.device, override: float, ranks: Sequence[RankMeasurement]) -> Peak | None:
    """The theoretical peak FLOP/s of the hardware the whole job ran on (MFU's denominator).

    GPUs: each device the ranks drive, counted once (told apart by UUID: with
    CUDA_VISIBLE_DEVICES set per rank, every rank's device is ``cuda:0``). CPUs: each host's
    cores the ranks may run on (the union of their affinities), at the peak per core of that
    host's estimate. The user's figure is per device (per GPU, or per node on CPUs). None where
    any part has no known peak: a partial sum would overstate MFU.
    """
    gpu = device.type == "cuda"
    units = {(r.host, (r.device_uuid or r.device_index) if gpu else None): r for r in ranks}
    per = "GPU" if gpu else "node"
    if override > 0:
        source = f"user: {override:.4g} FLOP/s per {per} x {len(units)}"
        return Peak(override * len(units), source, kind="user")
    total, first = 0.0, None
    for (host, _), r in units.items():
        if r.peak is None:
            return None
        peak, share = r.peak, 1.0
        if not gpu:  # this host's cores of every rank, against the one rank's
            cpus = {c for x in ranks if x.host == host for c in x.cpus}
            share = len(cpus) / max(len(r.cpus), 1)
            peak = host_peak(r, [x for x in ranks if x.host == host])
        total += peak.flops * share
        first = first or peak
    assert first is not None
    times = f" x {len(units)} {per}s" if len(units) > 1 else ""
    return Peak(total, first.source + times, kind=first.kind, inputs=first.inputs)


def job_ceiling(device: torch.device, ranks: Sequence[RankMeasurement]) -> float:
    """The measured GEMM ceiling of the hardware the job ran on (``metrics.measured_matmul_flops``):
    on GPUs each rank's (one device each), summed; on CPUs each host's (:func:`host_ceiling`),
    summed over hosts, never over ranks that share a host's cores."""
    if device.type == "cuda":
        return float(sum(r.gemm_ceiling_flops for r in ranks))
    hosts = {r.host for r in ranks}
    return sum(host_ceiling([r for r in ranks if r.host == h]) for h in hosts)


def per_cpu_ceiling(ranks: Sequence[RankMeasurement]) -> float:
    """What one CPU of a host can do: the best any of its ranks showed per CPU its threads could
    occupy at once (its ceiling over the fewer of its threads and its CPUs)."""
    return max(x.gemm_ceiling_flops / max(min(x.threads, len(x.cpus)), 1) for x in ranks)


def host_ceiling(ranks: Sequence[RankMeasurement]) -> float:
    """A host's ceiling from its ``ranks``: one CPU's best times the CPUs they may run on."""
    return per_cpu_ceiling(ranks) * max(len({c for x in ranks for c in x.cpus}), 1)


def host_peak(r: RankMeasurement, ranks: Sequence[RankMeasurement]) -> Peak:
    """Rank ``r``'s CPU peak, raised to the clock that its host's GEMM ceiling implies where
    that exceeds the estimate (``peaks.raised_to_ceiling``): the estimate's clock is then
    demonstrably low. What one CPU of the host can do is the best any rank showed per CPU its
    threads could occupy at once (its ceiling over the fewer of its threads and its CPUs),
    never a sum over ranks: ranks that share CPUs (more ranks than cores, or no binding) may
    each have measured with the cores to itself, and their sum would credit the cores with
    several times what they can do. A peak from the store (one per machine) is not raised."""
    assert r.peak is not None
    return raised_to_ceiling(r.peak, per_cpu_ceiling(ranks) * max(len(r.cpus), 1))


def unknown_peak_reason(device: torch.device, name: str) -> str:
    if device.type == "cuda":
        return f"unknown: no datasheet peak for {name!r} in hpcdl; give --peak-flops"
    return "unknown: the CPU's clock could not be read; give --peak-flops"


def implausible(mfu: float, fraction: float, ceiling: float, peak: Peak | None) -> list[str]:
    """Figures that cannot be true, each with its likely cause: they are flagged, never shown
    plain (docs/metrics.md, `peak_flops` and `flags`)."""
    flags = []
    low_inputs = "the peak figure is too low for this device"
    if peak is not None and peak.kind == "estimate":
        low_inputs = (
            "the peak is the measured GEMM ceiling (the estimate was below it), which this "
            "workload's kernels outrun"
            if "estimated_flops" in peak.inputs
            else f"the estimated peak's inputs are low (clock from {peak.inputs.get('clock_source')})"
        )
        if "stored" in peak.inputs:
            low_inputs = "the machine's stored peak is low (hpcdl info --probe measures and stores it again)"
    if mfu > 1:
        flags.append(
            f"MFU {mfu:.1%} > 100%: {low_inputs}, or kernels do fewer FLOPs than counted "
            "(Winograd or FFT convolutions, fused or skipped work)"
        )
    if peak is not None and ceiling > peak.flops:
        flags.append(
            f"the measured GEMM ceiling is {ceiling / peak.flops:.0%} of the theoretical peak: {low_inputs}"
        )
    if fraction > 1:
        flags.append(
            f"the achieved rate is {fraction:.0%} of the measured GEMM ceiling: the ceiling was "
            "measured under load, or this workload's kernels (oneDNN convolutions, fused ops) run "
            "faster than the probe's matrix products or do fewer FLOPs than counted"
        )
    return flags
