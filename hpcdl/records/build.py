"""Assembling the result record of a run from every rank's measurements (rank 0's job).
The record's schema and every formula it uses are in METRICS.md."""

from __future__ import annotations

import uuid
import warnings
from datetime import UTC, datetime
from typing import Any

import torch

from hpcdl import metrics
from hpcdl.measure.config import RunConfig
from hpcdl.measure.environment import environment
from hpcdl.measure.loop import StepLog
from hpcdl.measure.peaks import Peak, datasheet_peak
from hpcdl.parallel.backends import BACKENDS
from hpcdl.parallel.checks import parameters_identical
from hpcdl.records import schema, validity
from hpcdl.workloads.spec import Spec


def job_peak(
    device: torch.device, name: str, precision: str, override: float, ranks: list[dict[str, Any]]
) -> tuple[Peak, float]:
    """(the peak FLOP/s of the whole job MFU is computed against, the job's measured probe).

    The peak is the user's or the datasheet's per-device figure times the devices in use
    (GPUs; for CPU runs, nodes), else the probe. The probe is the sum of every rank's matmul
    probe, all ranks probing at once with their share of the node, as they train.
    """
    probe = float(sum(r["probe"] for r in ranks))
    devices = len(ranks) if device.type == "cuda" else len({r["host"] for r in ranks})
    times = f" x {devices} devices" if devices > 1 else ""
    if override > 0:
        return Peak(override * devices, "user" + times), probe
    sheet = datasheet_peak(name, precision)
    if sheet is not None:
        return Peak(sheet.flops * devices, sheet.source + times), probe
    if device.type == "cuda":
        warnings.warn(f"no datasheet peak for {name!r}; MFU uses the measured matmul probe", stacklevel=2)
    return Peak(probe, "measured matmul probe" + (f", {len(ranks)} ranks" if len(ranks) > 1 else "")), probe


def per_rank_row(spec: Spec, r: dict[str, Any]) -> dict[str, Any]:
    log: StepLog = r["log"]
    return {
        "rank": r["rank"],
        "host": r["host"],
        "node": r["node"],
        "local_rank": r["local_rank"],
        "samples_per_s": metrics.throughput(spec.batch_size * len(log.step_s), log.window_s),
        "step_time_median_s": metrics.summarize(log.step_s)["median"],
        "compute_median_s": metrics.summarize(
            [f + b for f, b in zip(log.phases_s["forward"], log.phases_s["backward"], strict=True)]
        )["median"],
        "timed_steps": len(log.step_s),
        "timed_window_s": log.window_s,
        "peak_memory_bytes": r["peak_memory"][0],
        "torch_threads": r["threads"],
    }


def build_record(
    spec: Spec, cfg: RunConfig, device: torch.device, ranks: list[dict[str, Any]], backend: str, name: str
) -> dict[str, Any]:
    """The result record (see METRICS.md) from every rank's measurements (rank 0 first)."""
    env = environment(device)
    count = spec.count()
    n = len(ranks)
    logs: list[StepLog] = [r["log"] for r in ranks]
    lead = logs[0]
    samples_per_s = metrics.aggregate_throughput(
        [spec.batch_size * len(g.step_s) for g in logs], [g.window_s for g in logs]
    )
    ai_ops = metrics.ai_ops_per_s(count.train_flops, samples_per_s)
    peak, probe = job_peak(device, env["device_name"], spec.precision, cfg.peak_flops, ranks)
    all_steps = [t for g in logs for t in g.step_s]
    phases = {p: metrics.summarize([t for g in logs for t in g.phases_s[p]]) for p in lead.phases_s}
    rows = [per_rank_row(spec, r) for r in ranks]
    checks = [
        validity.loss_finite([v for g in logs for v in g.losses]),
        validity.min_duration(min(g.window_s for g in logs), cfg.min_duration_s),
    ]
    if cfg.data in ("learnable", "hdf5"):
        checks.append(validity.loss_falls(lead.losses))
    if n > 1:
        checks += ranks[0]["checks"]
        checks.append(parameters_identical([r["digest"] for r in ranks]))
    grad_bytes = ranks[0]["grad_bytes"]
    comm: dict[str, Any] = {"grad_bytes_per_step": grad_bytes}
    if n > 1:
        t_ar = max(r["allreduce_s"] for r in ranks)  # the slowest rank sets the pace
        comm.update(
            {
                "allreduce_s": t_ar,
                "algbw_bytes_per_s": metrics.algbw(grad_bytes, t_ar),
                "busbw_bytes_per_s": metrics.busbw(metrics.algbw(grad_bytes, t_ar), n),
                "exposed_s": exposed_communication(backend, ranks, phases),
                "exposed_method": BACKENDS.get(backend).exposed_method,
            }
        )
    mem = max(r["peak_memory"][0] for r in ranks)
    record: dict[str, Any] = {
        "schema": schema.RESULT,
        "schema_version": schema.RESULT_VERSION,
        "id": uuid.uuid4().hex,
        "name": name,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "spec": spec.to_dict(),
        "run": cfg.to_dict(),
        "settings": {
            "precision": spec.precision,
            "batch_per_rank": spec.batch_size,
            "world_size": n,
            "global_batch": spec.batch_size * n,
            "backend": backend,
            "device": str(device),
            "nodes": len({r["host"] for r in ranks}),
            "hosts": sorted({r["host"] for r in ranks}),
        },
        "environment": env,
        "counts": {
            "params": count.params,
            "forward_flops_per_sample": count.forward_flops,
            "train_flops_per_sample": count.train_flops,
            "activation_bytes_per_sample": count.activation_bytes(spec.precision),
        },
        "metrics": {
            "samples_per_s": samples_per_s,
            "ai_ops_per_s": ai_ops,
            "train_flops_per_sample": count.train_flops,
            "step_time_s": metrics.summarize(all_steps),
            "phases_s": phases,
            "timed_steps": len(lead.step_s),
            "timed_window_s": max(g.window_s for g in logs),
            "per_rank": rows,
            "slowest_rank_samples_per_s": min(r["samples_per_s"] for r in rows),
            "straggler_spread": metrics.spread([r["compute_median_s"] for r in rows]),
            "communication": comm,
            "peak_memory_bytes": mem,
            "peak_memory_kind": ranks[0]["peak_memory"][1],
            "peak_flops": peak.flops,
            "peak_source": peak.source,
            "measured_matmul_flops": probe,
            "mfu": metrics.mfu(ai_ops, peak.flops),
            "fraction_of_measured_matmul": metrics.mfu(ai_ops, probe),
            "loss_first": lead.losses[0] if lead.losses else None,
            "loss_last": lead.losses[-1] if lead.losses else None,
            "io": ranks[0]["io"],
            "energy": energy_block(
                ranks,
                count.train_flops,
                sum(spec.batch_size * len(g.step_s) for g in logs),
                max(g.window_s for g in logs),
            ),
        },
    }
    record["validity"] = validity.block(checks)
    return record


def energy_block(
    ranks: list[dict[str, Any]], train_flops: int, samples: int, window_s: float
) -> dict[str, Any]:
    """Energy of the whole job: every rank's GPU, and each node's CPU packages once (RAPL is
    per node, so only local rank 0's reading counts). A part that any rank could not measure
    is None, never 0."""
    gpus = [r["energy"]["gpu"] for r in ranks]
    cpus = [r["energy"]["cpu_rapl"] for r in ranks if r["local_rank"] == 0]

    def total(parts: list[dict[str, Any]]) -> float | None:
        known = [float(p["energy_j"]) for p in parts if p.get("energy_j") is not None]
        return sum(known) if parts and len(known) == len(parts) else None

    gpu_j, cpu_j = total(gpus), total(cpus)
    parts = [e for e in (gpu_j, cpu_j) if e is not None]
    energy = sum(parts) if parts else None
    return {
        "gpu_energy_j": gpu_j,
        "cpu_energy_j": cpu_j,
        "measured": "+".join(n for n, e in (("gpu", gpu_j), ("cpu_rapl", cpu_j)) if e is not None)
        or "unavailable",
        "avg_power_w": metrics.average_power(energy, window_s),
        **metrics.energy_figures(energy, window_s, samples, train_flops),
        "per_rank": [r["energy"] for r in ranks],
    }


def exposed_communication(
    backend: str, ranks: list[dict[str, Any]], phases: dict[str, dict[str, float]]
) -> float:
    """Median communication time not hidden behind backward, by the backend's own rule."""
    local = [t for r in ranks for t in r["local_backward_s"]]
    return BACKENDS.get(backend).exposed_s(
        phases["backward"]["median"],
        metrics.summarize(local)["median"] if local else None,
        phases["allreduce"]["median"],
    )
