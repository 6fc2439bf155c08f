"""A benchmark run: build, warm up, time, check and write the record -- on one process, or on
every rank of an MPI job with gradients reduced through a backend (the same code path)."""

from __future__ import annotations

import functools
import os
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from hpcdl import h5data, metrics, validity
from hpcdl.config import RunConfig
from hpcdl.data import device_pool
from hpcdl.device import (
    memory_capacity,
    peak_memory,
    reset_peak_memory,
    resolve_device,
    synchronize,
)
from hpcdl.dist.backend import Backend, make_backend, resolve_backend_name
from hpcdl.dist.checks import one_step_equivalence, parameter_digest, parameters_identical
from hpcdl.dist.world import World, init_world
from hpcdl.environment import environment
from hpcdl.errors import SpecError
from hpcdl.loop import BatchSource, StepLog, Trainer
from hpcdl.peaks import Peak, datasheet_peak, matmul_probe
from hpcdl.records import SCHEMA, SCHEMA_VERSION, seal, write_record, write_steps
from hpcdl.spec import Spec
from hpcdl.telemetry import TelemetrySampler, energy_figures

Progress = Callable[[str], None]
CALIBRATION_STEPS = 5  # DDP backward timed without reduction, to tell its exposed allreduce


@dataclass(frozen=True)
class RunResult:
    """A finished run: its record (a plain dict, as written) and where it was written."""

    record: dict[str, Any]
    path: Path | None
    steps_path: Path | None

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.record["metrics"])

    @property
    def passed(self) -> bool:
        return bool(self.record["validity"]["passed"])


@functools.cache
def measured_peak(device: torch.device, precision: str) -> float:
    """The matmul probe, once per device and precision in a process. On a CPU the probe uses
    every core: the peak of the node, whatever share of it this rank has."""
    if device.type != "cpu":
        return matmul_probe(device, precision)
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or threads)
    try:
        return matmul_probe(device, precision)
    finally:
        torch.set_num_threads(threads)


def reference_peak(device: torch.device, name: str, precision: str, override: float) -> Peak:
    """The peak MFU is computed against: the user's, else the datasheet's, else the probe's."""
    if override > 0:
        return Peak(override, "user")
    sheet = datasheet_peak(name, precision)
    if sheet is not None:
        return sheet
    if device.type == "cuda":
        warnings.warn(f"no datasheet peak for {name!r}; MFU uses the measured matmul probe", stacklevel=2)
    return Peak(measured_peak(device, precision), "measured matmul probe")


def rank_device(cfg: RunConfig, world: World) -> torch.device:
    """This rank's device: with ``auto`` or ``cuda`` and several ranks on a node, GPU local_rank."""
    device = resolve_device(cfg.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", world.local_rank % max(torch.cuda.device_count(), 1))
    return device


def preflight(spec: Spec, cfg: RunConfig, world: World | None = None) -> torch.device:
    """Everything that can refuse a run before it starts: device, backend, memory estimate."""
    world = world or World()
    device = rank_device(cfg, world)
    resolve_backend_name(cfg.backend, world.size)
    count = spec.count()
    need = metrics.memory_estimate(
        count.params, count.activation_bytes(spec.precision), spec.batch_size, cfg.optimizer
    )
    have = memory_capacity(device) // (world.local_size if device.type == "cpu" else 1)
    if need > have:
        raise SpecError(
            f"{spec.family}.batch_size",
            spec.batch_size,
            f"estimated memory {need / 2**30:.1f} GiB exceeds the {have / 2**30:.1f} GiB "
            f"available to a rank on {device}; lower batch_size or the model's size",
        )
    return device


def make_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr)


def make_source(spec: Spec, cfg: RunConfig, device: torch.device, world: World) -> tuple[BatchSource, dict]:
    """This rank's batch source and, for HDF5, the I/O figures measured while preparing it.
    Each rank draws its own data stream (its shard); HDF5 shards are written by rank 0."""
    if cfg.data != "hdf5":
        learnable = cfg.data == "learnable"
        return device_pool(spec, device, cfg.pool_batches, learnable=learnable, stream=world.rank), {}
    io: dict[str, Any] = {}
    if world.rank == 0 and not h5data.has_shards(spec, cfg.data_dir):
        io["write"] = h5data.write_shards(spec, cfg.data_dir, batches=max(cfg.pool_batches, 2)).to_dict()
    world.barrier()
    io["read"] = h5data.read_throughput(cfg.data_dir, cfg.data_workers).to_dict()
    return h5data.HDF5Source(cfg.data_dir, device, cfg.data_workers), io


def allreduce_time(backend: Backend, nbytes: int, device: torch.device, reps: int = 5) -> float:
    """Median seconds of a blocking allreduce of ``nbytes`` (the gradients' size) through the
    backend, after one warm-up."""
    buf = torch.ones(max(nbytes // 4, 1), device=device)
    backend.allreduce(buf)
    times = []
    for _ in range(reps):
        synchronize(device)
        t0 = time.perf_counter()
        backend.allreduce(buf)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return float(metrics.summarize(times)["median"])


def measure_rank(
    spec: Spec, cfg: RunConfig, device: torch.device, world: World, backend: Backend, say: Progress
) -> dict[str, Any]:
    """This rank's part of a run: checks, warm-up, timed steps; returns what rank 0 gathers."""
    checks = []
    if world.size > 1:
        say("checking that N ranks step like one process")
        checks.append(one_step_equivalence(spec, world, backend, device))
    say(f"building {spec.family} model and {cfg.data} data")
    model = spec.build().to(device)
    source, io = make_source(spec, cfg, device, world)
    model, optimizer = backend.wrap(model, make_optimizer(model, cfg))
    trainer = Trainer(model, optimizer, source, device, spec.precision, cfg.phase_sync, backend)
    reset_peak_memory(device)
    say(f"warm-up {cfg.warmup_steps} steps, then timing")
    local_backward = trainer.local_backward_s(CALIBRATION_STEPS) if backend.name == "torch" else []
    sampler = TelemetrySampler(device)
    log = trainer.run(
        cfg.warmup_steps,
        cfg.steps,
        cfg.duration_s,
        progress=lambda n, s: say(f"timed {n} steps in {s:.1f} s"),
        window=sampler,
    )
    grad_bytes = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    mem_bytes, mem_kind = peak_memory(device)
    return {
        "rank": world.rank,
        "host": world.hostname,
        "node": world.node,
        "local_rank": world.local_rank,
        "log": log,
        "io": io,
        "checks": checks,
        "local_backward_s": local_backward,
        "digest": parameter_digest(model) if world.size > 1 else "",
        "allreduce_s": allreduce_time(backend, grad_bytes, device) if world.size > 1 else 0.0,
        "energy": sampler.summary(),
        "power_trace": sampler.trace(),
        "grad_bytes": grad_bytes,
        "peak_memory": (mem_bytes, mem_kind),
        "threads": torch.get_num_threads(),
    }


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
    # the peak of one device (a GPU, or a node's CPU) times the devices in use: the job's MFU
    devices = n if device.type == "cuda" else len({r["host"] for r in ranks})
    peak = reference_peak(device, env["device_name"], spec.precision, cfg.peak_flops)
    probe = measured_peak(device, spec.precision) if peak.source != "measured matmul probe" else peak.flops
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
                "exposed_s": exposed_allreduce(backend, ranks, phases),
                "exposed_method": {
                    "horovod": "allreduce phase: optimizer.synchronize() after backward",
                    "torch": "median backward with DDP minus median backward under no_sync()",
                }.get(backend, "none"),
            }
        )
    mem = max(r["peak_memory"][0] for r in ranks)
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
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
            "peak_flops": peak.flops * devices,
            "peak_source": peak.source + (f" x {devices} devices" if devices > 1 else ""),
            "measured_matmul_flops": probe * devices,
            "mfu": metrics.mfu(ai_ops, peak.flops * devices),
            "fraction_of_measured_matmul": metrics.mfu(ai_ops, probe * devices),
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
        **energy_figures(energy, window_s, samples, train_flops),
        "per_rank": [r["energy"] for r in ranks],
    }


def exposed_allreduce(
    backend: str, ranks: list[dict[str, Any]], phases: dict[str, dict[str, float]]
) -> float:
    """Median communication time not hidden behind backward (see METRICS.md)."""
    if backend == "torch":
        local = [t for r in ranks for t in r["local_backward_s"]]
        return max(0.0, phases["backward"]["median"] - metrics.summarize(local)["median"]) if local else 0.0
    return phases["allreduce"]["median"]


def set_threads(world: World) -> None:
    """Share the cores among the ranks of a node (torch would otherwise pick on its own)."""
    if world.local_size > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world.local_size))


def run(
    spec: Spec,
    config: RunConfig | None = None,
    *,
    output_dir: str | Path | None = "results",
    name: str | None = None,
    progress: Progress | None = None,
    world: World | None = None,
) -> RunResult:
    """Measure one workload and write its record (unless ``output_dir`` is None).

    Under an MPI launcher every rank calls this; gradients are reduced through
    ``config.backend``, every rank's timings are gathered, and rank 0 writes the record (every
    rank returns it). Raises :class:`hpcdl.errors.SpecError` before running anything when the
    spec cannot fit the device or the backend is unavailable.
    """
    cfg = config or RunConfig()
    world = world or init_world()
    device = preflight(spec, cfg, world)
    set_threads(world)
    backend_name = resolve_backend_name(cfg.backend, world.size)
    say = (progress or (lambda _m: None)) if world.rank == 0 else (lambda _m: None)
    backend = make_backend(backend_name, world, device)
    try:
        mine = measure_rank(spec, cfg, device, world, backend, say)
    finally:
        backend.close()
    ranks = world.gather(mine)
    name = name or f"{time.strftime('%Y%m%d-%H%M%S')}-{spec.family}"
    result = RunResult({}, None, None)
    if ranks is not None:  # rank 0
        result = finish(spec, cfg, device, ranks, backend_name, name, output_dir)
    return world.bcast(result)


def finish(
    spec: Spec,
    cfg: RunConfig,
    device: torch.device,
    ranks: list[dict[str, Any]],
    backend: str,
    name: str,
    output_dir: str | Path | None,
) -> RunResult:
    """Rank 0: build, seal and write the record and the per-step file (rank 0's steps)."""
    record = build_record(spec, cfg, device, ranks, backend, name)
    if output_dir is None:
        return RunResult(seal(record), None, None)
    out = Path(output_dir)
    log: StepLog = ranks[0]["log"]
    trace = {f"gpu_{k}": v for k, v in ranks[0]["power_trace"].items() if v}  # rank 0's GPU, if any
    columns = {
        "step_s": log.step_s,
        **{f"{p}_s": v for p, v in log.phases_s.items()},
        "loss": log.losses,
        **trace,
    }
    steps_path = write_steps(columns, out / f"{name}.steps.h5")
    record["steps_file"] = steps_path.name
    record = seal(record)
    return RunResult(record, write_record(record, out / f"{name}.json"), steps_path)
