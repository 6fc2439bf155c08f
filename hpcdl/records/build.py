"""Assembling the result record of a run from every rank's measurements (rank 0's job).
The record's blocks are the views of ``records.views``; every formula is in ``metrics`` and
documented in METRICS.md."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import torch

from hpcdl import metrics
from hpcdl.measure.checks import parameters_identical
from hpcdl.measure.config import RunConfig
from hpcdl.measure.environment import environment
from hpcdl.measure.fit import Fit
from hpcdl.measure.loop import StepLog
from hpcdl.measure.measurement import RankMeasurement
from hpcdl.measure.peaks import Peak, raised_to_ceiling
from hpcdl.parallel.backends import BACKENDS, Backend
from hpcdl.parallel.layout import Layout, fit_layout, parse_layout, tp_crosses_nodes
from hpcdl.parallel.tensor import rank_count
from hpcdl.records import schema, validity
from hpcdl.records.views import (
    Check,
    Collective,
    Communication,
    Counts,
    Energy,
    Metrics,
    PipelineFigures,
    PipelineRank,
    RankRow,
    Settings,
    Stats,
    Straggler,
    Target,
    compute_times,
    to_json,
)
from hpcdl.workloads.spec import Spec


def stats(values: Sequence[float]) -> Stats:
    s = metrics.summarize(values)
    return Stats(s["median"], s["p10"], s["p90"], s["mean"], s["min"], s["max"], int(s["n"]))


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


def host_peak(r: RankMeasurement, ranks: Sequence[RankMeasurement]) -> Peak:
    """Rank ``r``'s CPU peak, raised to the clock that its host's GEMM ceiling implies where
    that exceeds the estimate (``peaks.raised_to_ceiling``): the estimate's clock is then
    demonstrably low. The host's ceiling is the sum of its ``ranks``' (each measured with its
    own threads) over the CPUs they may run on together: ranks that share their CPUs (no
    binding) each measured a share of them, not all of them."""
    assert r.peak is not None
    cpus = {c for x in ranks for c in x.cpus}
    per_cpu = sum(x.gemm_ceiling_flops for x in ranks) / max(len(cpus), 1)
    return raised_to_ceiling(r.peak, per_cpu * max(len(r.cpus), 1))


def memory_split(spec: Spec, cfg: RunConfig, ranks: Sequence[RankMeasurement]) -> dict[str, Any]:
    """Where a rank's memory goes: the estimate's parts at the batch that ran, and what the
    device measured (its peak: on a CPU the process's resident set, which also holds the
    interpreter and libraries, so its parts cannot be told apart there)."""
    estimated = spec.memory_parts(spec.batch_size, cfg.optimizer)
    return {
        "estimated": {**estimated, "total": sum(estimated.values())},
        "measured": {
            "peak_bytes": max(r.peak_memory_bytes for r in ranks),
            "kind": ranks[0].peak_memory_kind,
        },
    }


def unknown_peak_reason(device: torch.device, name: str) -> str:
    if device.type == "cuda":
        return f"unknown: no datasheet peak for {name!r} in hpcdl; give --peak-flops"
    return "unknown: the CPU's clock could not be read; give --peak-flops"


def implausible(mfu: float, fraction: float, ceiling: float, peak: Peak | None) -> list[str]:
    """Figures that cannot be true, each with its likely cause: they are flagged, never shown
    plain (METRICS.md, "Peaks and MFU")."""
    flags = []
    low_inputs = "the peak figure is too low for this device"
    if peak is not None and peak.kind == "estimate":
        low_inputs = (
            "the peak is the measured GEMM ceiling (the estimate was below it), which this "
            "workload's kernels outrun"
            if "estimated_flops" in peak.inputs
            else f"the estimated peak's inputs are low (clock from {peak.inputs.get('clock_source')})"
        )
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


def compute_only(r: RankMeasurement, rules: type[Backend]) -> float | None:
    """The rank's median computation per step without waiting for the others (the backend's
    rule over its phases, in-step collectives taken out)."""
    if r.pipeline is not None:  # a step of stages, not a forward and a backward
        return None
    local = metrics.summarize(r.local_backward_s)["median"] if r.local_backward_s else None
    return rules.compute_only_s(r.own_phase_s("forward"), r.own_phase_s("backward"), local)


def slowed_on_purpose(ranks: Sequence[RankMeasurement]) -> list[str]:
    """A flag for each rank a test slowed down (``HPCDL_TEST_SLOW_RANK``)."""
    return [
        f"rank {r.rank} slept {r.injected_delay_s * 1e3:.3g} ms before every forward pass on purpose "
        "(HPCDL_TEST_SLOW_RANK, a test of the straggler attribution)"
        for r in ranks
        if r.injected_delay_s
    ]


def rank_row(spec: Spec, r: RankMeasurement, rules: type[Backend]) -> RankRow:
    log = r.log
    return RankRow(
        rank=r.rank,
        host=r.host,
        node=r.node,
        local_rank=r.local_rank,
        samples_per_s=metrics.throughput(spec.samples_per_step * len(log.step_s), log.window_s),
        step_time_median_s=metrics.summarize(log.step_s)["median"],
        compute_median_s=metrics.summarize(r.forward_backward_s())["median"],
        timed_steps=len(log.step_s),
        timed_window_s=log.window_s,
        peak_memory_bytes=r.peak_memory_bytes,
        torch_threads=r.threads,
        compute_only_s=compute_only(r, rules),
        on_cpu_s=r.on_cpu_s,
        descheduled_s=r.descheduled_s,
    )


def straggler(rows: Sequence[RankRow], rules: type[Backend]) -> Straggler | None:
    """The rank whose computation alone is slowest, with its host and its excess over the
    median rank; None for one rank."""
    if len(rows) < 2:
        return None
    timed = [(r.compute_only_s, r) for r in rows if r.compute_only_s is not None]
    if len(timed) < len(rows):
        return Straggler(None, None, None, None, None, rules.compute_only_method)
    t, slow = max(timed, key=lambda x: x[0])
    median = metrics.summarize([x for x, _ in timed])["median"]
    return Straggler(slow.rank, slow.host, t, median, t / median - 1, rules.compute_only_method)


def checks_of(cfg: RunConfig, ranks: Sequence[RankMeasurement]) -> list[Check]:
    """The validity checks of the run (METRICS.md, "Validity")."""
    logs = [r.log for r in ranks]
    checks = [
        validity.loss_finite([v for g in logs for v in g.losses]),
        validity.min_duration(min(g.window_s for g in logs), cfg.min_duration_s),
    ]
    if cfg.data in ("learnable", "hdf5"):
        checks.append(validity.loss_falls(logs[0].losses))
    if len(ranks) > 1:
        checks += ranks[0].checks
        checks.append(parameters_identical([r.digest for r in ranks]))
    return checks


def collectives_of(ranks: Sequence[RankMeasurement], layout: Layout) -> dict[str, Collective]:
    """Every collective of a step: the backend's, each timed after training as one blocking
    call of its bytes per step, and the in-step ones (the experts' all-to-all), timed as they
    ran; each the slowest rank's median. Under a layout that splits the model, a collective
    named ``DIM.KIND`` (``tp.allreduce``) runs among the ranks of one ``DIM`` group, the others
    among the dp replicas; each says how many ranks it ran among. The bytes and calls are rank
    0's: a pipeline's first stage holds the most blocks (``pipeline.stage_layers``)."""
    n, out = len(ranks), {}
    for t in ranks[0].traffic:
        seconds = max(r.collective_s[t.collective] for r in ranks)
        dim, _, kind = t.collective.rpartition(".")
        if layout.model_parallel:
            group = getattr(layout, dim or "dp")
            timing = f"after training, its calls of one step among the {group} ranks of a {dim or 'dp'} group"
            out[t.collective] = collective(kind, t.bytes, t.calls, seconds, group, timing, group)
            continue
        out[t.collective] = collective(
            t.collective, t.bytes, t.calls, seconds, n, "one blocking call after training"
        )
    log = ranks[0].log
    if log.in_step_calls:
        per_step = [metrics.summarize(r.log.in_step_per_step())["median"] for r in ranks]
        out["all_to_all"] = collective(
            "all_to_all", log.in_step_bytes, log.in_step_calls, max(per_step), n, "in the step, as it ran"
        )
    return out


def collective(
    name: str, nbytes: int, calls: int, seconds: float, ranks: int, timing: str, group: int | None = None
) -> Collective:
    algbw = metrics.algbw(nbytes, seconds)
    return Collective(nbytes, calls, seconds, algbw, metrics.busbw(algbw, ranks, name), timing, group)


def communication(
    backend: str, ranks: Sequence[RankMeasurement], phases: dict[str, Stats], layout: Layout
) -> Communication:
    """Communication figures: every collective of a step (the slowest rank sets the pace), the
    allreduce of data parallelism also in the fields it always had, and the communication left
    exposed, by the backend's own rule."""
    grad_bytes = ranks[0].grad_bytes
    if len(ranks) == 1:
        return Communication(grad_bytes_per_step=grad_bytes)
    local = [t for r in ranks for t in r.local_backward_s]
    rules = BACKENDS.get(backend)
    if ranks[0].pipeline is not None:  # its point-to-point traffic is in the pipeline block
        exposed = phases["allreduce"].median if grad_bytes else None  # the dp replicas' alone
        return Communication(
            grad_bytes_per_step=grad_bytes,
            exposed_s=exposed,
            exposed_method=rules.exposed_method,
            collectives=collectives_of(ranks, layout),  # tp x pp: the stages' tp allreduces
        )
    exposed = rules.exposed_s(
        phases["backward"].median,
        metrics.summarize(local)["median"] if local else None,
        phases["allreduce"].median,
    )
    collectives = collectives_of(ranks, layout)
    allreduce = collectives.get("allreduce")
    return Communication(
        grad_bytes_per_step=grad_bytes,
        allreduce_s=allreduce.seconds_per_step if allreduce else None,
        algbw_bytes_per_s=allreduce.algbw_bytes_per_s if allreduce else None,
        busbw_bytes_per_s=allreduce.busbw_bytes_per_s if allreduce else None,
        exposed_s=exposed,
        exposed_method=rules.exposed_method,
        collectives=collectives,
    )


def energy_of(ranks: Sequence[RankMeasurement], train_flops: int, samples: int, window_s: float) -> Energy:
    """Energy of the whole job: each GPU once, and each node's CPU packages once (RAPL is per
    node, so only local rank 0's reading counts). Ranks on MIG devices of one GPU all read the
    parent GPU's energy: readings are told apart by the GPU's UUID, counted once. A part that
    any rank could not measure is None, never 0."""
    by_gpu: dict[tuple[str, str | int], dict[str, Any]] = {}
    for r in ranks:
        reading = r.energy["gpu"]
        by_gpu.setdefault((r.host, reading.get("device_uuid") or r.rank), reading)
    gpus = list(by_gpu.values())
    cpus = [r.energy["cpu_rapl"] for r in ranks if r.local_rank == 0]

    def total(parts: list[dict[str, Any]]) -> float | None:
        known = [float(p["energy_j"]) for p in parts if p.get("energy_j") is not None]
        return sum(known) if parts and len(known) == len(parts) else None

    gpu_j, cpu_j = total(gpus), total(cpus)
    parts = [e for e in (gpu_j, cpu_j) if e is not None]
    energy = sum(parts) if parts else None
    measured = "+".join(n for n, e in (("gpu", gpu_j), ("cpu_rapl", cpu_j)) if e is not None)
    return Energy(
        gpu_energy_j=gpu_j,
        cpu_energy_j=cpu_j,
        measured=measured or "unavailable",
        avg_power_w=metrics.average_power(energy, window_s),
        **metrics.energy_figures(energy, window_s, samples, train_flops),
        per_rank=[r.energy for r in ranks],
    )


def target_of(cfg: RunConfig, logs: Sequence[StepLog], samples: int) -> Target | None:
    """Time to target: reached when every rank's last timed steps meet the stop rule (measured
    from the first timed step's loss, as the loop stops)."""
    fraction, window = cfg.target_loss_fraction, cfg.pool_batches
    if not fraction:
        return None
    timed = [g.losses[cfg.warmup_steps :] for g in logs]
    reached = all(metrics.reached_target(t[0], t[-window:], fraction) for t in timed)
    return Target(
        fraction=fraction,
        window_steps=window,
        loss_first=timed[0][0],
        loss_final=float(np.mean(timed[0][-window:])),
        reached=reached,
        time_to_target_s=max(g.window_s for g in logs) if reached else None,
        samples_to_target=samples if reached else None,
    )


def rank_counts(spec: Spec, layout: Layout) -> dict[str, int]:
    """One rank's share of the work under tensor parallelism alone (``Counts.rank_*``), else
    none (a pipeline's ranks: the parameters each holds are its pipeline block's ``per_rank``)."""
    if layout.tp == 1 or layout.pp > 1:
        return {}
    mine = rank_count(spec, layout.tp)
    return {
        "rank_params": mine.params,
        "rank_forward_flops_per_sample": mine.forward_flops,
        "rank_train_flops_per_sample": mine.train_flops,
    }


def pipeline_of(spec: Spec, ranks: Sequence[RankMeasurement], layout: Layout) -> PipelineFigures | None:
    """The pipeline block: the schedule, the bubble measured beside the theoretical one, and
    the point-to-point bytes of a step (one pipeline's: all ranks' over the dp replicas)."""
    if ranks[0].pipeline is None:
        return None
    rows = []
    for r in ranks:
        s = r.pipeline
        assert s is not None
        rows.append(
            PipelineRank(
                rank=r.rank,
                pp_rank=s.pp_rank,
                stages=s.stages,
                params=s.params,
                busy_s=metrics.summarize(s.busy_s)["median"],
                span_s=metrics.summarize(s.span_s)["median"],
                bubble=s.bubble,
                sent_bytes_per_step=s.sent_bytes,
            )
        )
    virtual = len(rows[0].stages)
    return PipelineFigures(
        schedule=layout.schedule,
        stages=layout.pp,
        stages_per_rank=virtual,
        microbatches=layout.chunks,
        microbatch_size=spec.batch_size // layout.chunks,
        bubble_theoretical=metrics.theoretical_bubble(layout.pp, layout.chunks, virtual),
        bubble_measured=float(np.mean([row.bubble for row in rows])),
        p2p_bytes_per_step=sum(row.sent_bytes_per_step for row in rows) // layout.dp,
        p2p_sends_per_step=sum(r.pipeline.sends for r in ranks if r.pipeline) // layout.dp,
        per_rank=rows,
    )


def build_record(
    spec: Spec,
    cfg: RunConfig,
    device: torch.device,
    ranks: Sequence[RankMeasurement],
    backend: str,
    name: str,
    fit: Fit | None = None,
) -> dict[str, Any]:
    """The result record (see METRICS.md) from every rank's measurements (rank 0 first), as
    the JSON object to seal; the steps file's name and hash are added by the writer."""
    env = environment(device)
    count = spec.count()
    n = len(ranks)
    layout = fit_layout(parse_layout(cfg.layout), n)
    logs = [r.log for r in ranks]
    lead = logs[0]
    # the ranks of a tensor-parallel group (or a pipeline) train on the same samples: each
    # sample once, however many ranks share its work
    samples = [spec.samples_per_step * len(g.step_s) for g in logs]
    distinct = sum(samples) // (layout.tp * layout.pp)  # every rank times as many steps
    window = max(g.window_s for g in logs)
    samples_per_s = metrics.aggregate_throughput([distinct], [g.window_s for g in logs])
    ai_ops = metrics.ai_ops_per_s(count.train_flops, samples_per_s)
    peak = job_peak(device, cfg.peak_flops, ranks)
    ceiling = float(sum(r.gemm_ceiling_flops for r in ranks))
    mfu = metrics.mfu(ai_ops, peak.flops) if peak else float("nan")
    fraction = metrics.mfu(ai_ops, ceiling)
    phases = {p: stats([t for g in logs for t in g.phases_s[p]]) for p in lead.phases_s}
    rules = BACKENDS.get(backend)
    rows = [rank_row(spec, r, rules) for r in ranks]
    checks = checks_of(cfg, ranks)
    hosts = sorted({r.host for r in ranks})
    settings = Settings(
        precision=spec.precision,
        batch_per_rank=spec.batch_size,
        world_size=n,
        global_batch=spec.samples_per_step * layout.dp,
        backend=backend,
        device=str(device),
        nodes=len(hosts),
        hosts=hosts,
        accumulation_steps=spec.accumulation_steps,
        layout=str(layout) if layout.model_parallel else None,
        tp_crosses_nodes=tp_crosses_nodes(layout, [r.node for r in ranks]) if layout.tp > 1 else None,
    )
    counts = Counts(
        params=count.params,
        forward_flops_per_sample=count.forward_flops,
        train_flops_per_sample=count.train_flops,
        activation_bytes_per_sample=count.activation_bytes(spec.precision),
        memory_bytes_per_sample=spec.memory_per_sample(),
        **rank_counts(spec, layout),
    )
    figures = Metrics(
        samples_per_s=samples_per_s,
        ai_ops_per_s=ai_ops,
        train_flops_per_sample=count.train_flops,
        step_time_s=stats([t for g in logs for t in g.step_s]),
        phases_s=phases,
        timed_steps=len(lead.step_s),
        timed_window_s=window,
        per_rank=rows,
        slowest_rank_samples_per_s=min(r.samples_per_s for r in rows),
        straggler_spread=metrics.spread(compute_times(rows)),
        communication=communication(backend, ranks, phases, layout),
        peak_memory_bytes=max(r.peak_memory_bytes for r in ranks),
        peak_memory_kind=ranks[0].peak_memory_kind,
        peak_flops=peak.flops if peak else float("nan"),
        peak_source=peak.source if peak else unknown_peak_reason(device, env["device_name"]),
        peak_kind=peak.kind if peak else "unknown",
        peak_inputs=peak.inputs if peak else {},
        measured_matmul_flops=ceiling,
        mfu=mfu,
        fraction_of_measured_matmul=fraction,
        flags=implausible(mfu, fraction, ceiling, peak) + slowed_on_purpose(ranks),
        loss_first=lead.losses[0] if lead.losses else None,
        loss_last=lead.losses[-1] if lead.losses else None,
        io=ranks[0].io,
        energy=energy_of(ranks, count.train_flops, distinct, window),
        fit=dataclasses.asdict(fit) if fit else None,
        memory=memory_split(spec, cfg, ranks),
        target=target_of(cfg, logs, distinct),
        window_start_unix=min(g.start_unix for g in logs),
        window_end_unix=max(g.start_unix + g.window_s for g in logs),
        straggler=straggler(rows, rules),
        pipeline=pipeline_of(spec, ranks, layout),
    )
    return {
        "schema": schema.RESULT,
        "schema_version": schema.RESULT_VERSION,
        "id": uuid.uuid4().hex,
        "name": name,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "spec": spec.to_dict(),
        "run": cfg.to_dict(),
        "settings": to_json(settings),
        "environment": env,
        "counts": to_json(counts),
        "metrics": to_json(figures),
        "validity": to_json(validity.block(checks)),
    }
