"""Assembling the result record of a run from every rank's measurements (rank 0's job).
The record's blocks are the views of ``records.views``; every formula is in ``metrics`` and
documented in docs/metrics.md."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import torch

from hpcdl import metrics
from hpcdl.device import malloc_library
from hpcdl.measure.checks import parameters_identical
from hpcdl.measure.config import RunConfig
from hpcdl.measure.environment import environment
from hpcdl.measure.fit import Fit
from hpcdl.measure.loop import StepLog
from hpcdl.measure.measurement import RankMeasurement
from hpcdl.parallel.backends import BACKENDS, Backend
from hpcdl.parallel.layout import fit_layout, parse_layout, tp_crosses_nodes
from hpcdl.records import schema, validity
from hpcdl.records.parallel import communication, pipeline_of, rank_counts
from hpcdl.records.peak import implausible, job_ceiling, job_peak, unknown_peak_reason
from hpcdl.records.typed import parse, to_json
from hpcdl.records.views import (
    EAGER,
    Check,
    Compiled,
    Counts,
    Energy,
    ExecutionSettings,
    FitFigures,
    Io,
    MeasuredMemory,
    Memory,
    MemoryEstimate,
    Metrics,
    Operators,
    RankRow,
    Settings,
    Stats,
    Straggler,
    Target,
    compute_times,
)
from hpcdl.workloads.spec import Spec


def stats(values: Sequence[float]) -> Stats:
    s = metrics.summarize(values)
    return Stats(s["median"], s["p10"], s["p90"], s["mean"], s["min"], s["max"], int(s["n"]))


def memory_split(
    spec: Spec,
    cfg: RunConfig,
    device: torch.device,
    ranks: Sequence[RankMeasurement],
    kept_grads: bool = False,
) -> Memory:
    """Where a rank's memory goes: the estimate's parts at the batch that ran, and what the
    device measured (its peak: on a CPU the process's resident set, which also holds the
    interpreter and libraries, so its parts cannot be told apart there), under the ``malloc`` this
    process calls, as the ranks' (``environment.malloc``); ``kept_grads``: the backend keeps every
    gradient allocated (``Backend.keeps_gradients``)."""
    parts = spec.memory_parts(
        spec.batch_size, cfg.optimizer, device.type, cfg.pool_batches, malloc_library(), kept_grads
    )
    return Memory(
        estimated=MemoryEstimate(**parts, total=sum(parts.values())),
        measured=MeasuredMemory(max(r.peak_memory_bytes for r in ranks), ranks[0].peak_memory_kind),
    )


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
    """The validity checks of the run (docs/metrics.md, "Validity")."""
    logs = [r.log for r in ranks]
    checks = [
        validity.loss_finite([v for g in logs for v in g.losses]),
        validity.min_duration(min(g.window_s for g in logs), cfg.min_duration_s),
    ]
    if cfg.data in ("learnable", "hdf5"):
        checks.append(validity.loss_falls(logs[0].losses))
    waited = waits(ranks)
    checks.append(validity.quiet_machine(waited))
    checks.append(validity.steady_steps(logs[0].step_s, max((w.own_share for w in waited), default=0.0)))
    if len(ranks) > 1:
        checks += ranks[0].checks
        checks.append(parameters_identical([r.digest for r in ranks]))
    return checks


def waits(ranks: Sequence[RankMeasurement]) -> list[validity.Waited]:
    """Each rank's wait for a CPU in its window, beside the share its own run explains: more
    threads of the run's ranks on a machine (a kernel; a node where unknown), a communication
    thread each where there are several, than the CPUs they may run on (their affinities)."""
    machines: dict[str, list[RankMeasurement]] = {}
    for r in ranks:
        machines.setdefault(r.kernel or f"node {r.node}", []).append(r)
    # a rank of several runs its backend's communication on a thread of its own (gloo's and
    # NCCL's workers, Horovod's background loop), busy while the main thread waits for it
    comm = 1 if len(ranks) > 1 else 0
    out = []
    for r in ranks:
        if r.descheduled_s is None:
            return []  # no scheduler statistics somewhere: not judged
        peers = machines[r.kernel or f"node {r.node}"]
        threads = sum(max(p.threads, 1) + p.co_runner_threads + comm for p in peers)
        cpus = len({c for p in peers for c in p.cpus}) or threads
        own = max(0.0, 1.0 - cpus / threads)
        out.append(validity.Waited(r.rank, r.host, r.descheduled_s, r.log.window_s, own))
    return out


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


def build_record(
    spec: Spec,
    cfg: RunConfig,
    device: torch.device,
    ranks: Sequence[RankMeasurement],
    backend: str,
    name: str,
    fit: Fit | None = None,
) -> dict[str, Any]:
    """The result record (docs/reference/record.md) from every rank's measurements (rank 0 first), as
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
    ceiling = job_ceiling(device, ranks)  # never a sum over ranks that share a host's cores
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
        execution=ExecutionSettings(**ranks[0].execution) if ranks[0].execution else EAGER,
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
        io=parse(Io, ranks[0].io, "metrics.io"),
        energy=energy_of(ranks, count.train_flops, distinct, window),
        fit=parse(FitFigures, dataclasses.asdict(fit), "metrics.fit") if fit else None,
        memory=memory_split(spec, cfg, device, ranks, rules.keeps_gradients),
        target=target_of(cfg, logs, distinct),
        window_start_unix=min(g.start_unix for g in logs),
        window_end_unix=max(g.start_unix + g.window_s for g in logs),
        straggler=straggler(rows, rules),
        pipeline=pipeline_of(spec, ranks, layout),
        time_to_first_step_s=max(g.warmup_s[0] for g in logs) if all(g.warmup_s for g in logs) else None,
        compiled=Compiled(**ranks[0].compiled) if ranks[0].compiled else None,
        operators=parse(Operators, ranks[0].operators, "operators") if ranks[0].operators else None,
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
