"""A benchmark run: build, warm up, time, check and write the record -- on one process, or on
every rank of an MPI job with gradients reduced through a backend (the same code path)."""

from __future__ import annotations

import functools
import gc
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpcdl import metrics
from hpcdl.errors import HpcdlError, SpecError
from hpcdl.measure import hdf5 as h5data
from hpcdl.measure.config import RunConfig
from hpcdl.measure.data import device_pool
from hpcdl.measure.device import (
    device_name,
    peak_memory,
    reset_peak_memory,
    resolve_device,
)
from hpcdl.measure.fit import Fit, estimated_batch, fit_batch, rank_memory
from hpcdl.measure.loop import BatchSource, Trainer
from hpcdl.measure.measurement import RankMeasurement
from hpcdl.measure.peaks import gemm_ceiling, theoretical_peak
from hpcdl.measure.telemetry import TelemetrySampler
from hpcdl.parallel.backends import Backend, gradient_bytes, make_backend, resolve_backend_name
from hpcdl.parallel.checks import one_step_equivalence, parameter_digest
from hpcdl.parallel.commbench import backend_time
from hpcdl.parallel.placement import full_parameters, spread
from hpcdl.parallel.world import World, init_world
from hpcdl.records.build import build_record
from hpcdl.records.store import file_sha256, seal, write_record, write_steps
from hpcdl.records.views import Result, read_result
from hpcdl.workloads import moe
from hpcdl.workloads.spec import Spec

Progress = Callable[[str], None]
CALIBRATION_STEPS = 5  # backward timed without reduction where the backend can (DDP)
SLOW_RANK_VAR = "HPCDL_TEST_SLOW_RANK"
"""``RANK:SECONDS``: that rank sleeps this long before every forward pass. For tests of the
straggler attribution only: a record made with it says so in ``metrics.flags``."""


@dataclass(frozen=True)
class RunResult:
    """A finished run: its record (a plain dict, as written) and where it was written."""

    record: dict[str, Any]
    path: Path | None
    steps_path: Path | None

    @property
    def result(self) -> Result:
        """The record's typed view."""
        return read_result(self.record)

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.record["metrics"])

    @property
    def passed(self) -> bool:
        return self.result.validity.passed


@functools.cache
def measured_ceiling(device: torch.device, precision: str, threads: int) -> float:
    """This rank's GEMM ceiling, once per device, precision and thread count in a process."""
    return gemm_ceiling(device, precision)


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
    moe.check_ranks(spec, world.size)
    have = rank_memory(device, world)
    if cfg.fit_fraction > 0:
        estimated_batch(spec, cfg.optimizer, cfg.fit_fraction, have)  # refuses what cannot fit
        return device
    count = spec.count()
    need = metrics.memory_estimate(
        count.params, count.activation_bytes(spec.precision), spec.batch_size, cfg.optimizer
    )
    if need > have:
        raise SpecError(
            f"{spec.family}.batch_size",
            spec.batch_size,
            f"estimated memory {need / 2**30:.1f} GiB exceeds the {have / 2**30:.1f} GiB "
            f"available to a rank on {device}; lower batch_size or the model's size",
        )
    return device


def make_optimizer(params: Iterable[torch.nn.Parameter], cfg: RunConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=cfg.lr)


def make_source(spec: Spec, cfg: RunConfig, device: torch.device, world: World) -> tuple[BatchSource, dict]:
    """This rank's batch source and, for HDF5, the I/O figures measured while preparing it.
    Each rank draws its own data stream (its shard); HDF5 shards are written by rank 0."""
    if cfg.data != "hdf5":
        learnable = cfg.data == "learnable"
        return device_pool(spec, device, cfg.pool_batches, learnable=learnable, stream=world.rank), {}
    io: dict[str, Any] = {}
    if world.rank == 0 and not h5data.has_shards(spec, cfg.data_dir):
        batches = max(cfg.pool_batches, 2) * world.size  # every rank gets its own batches
        io["write"] = h5data.write_shards(spec, cfg.data_dir, batches=batches).to_dict()
    world.barrier()
    io["read"] = h5data.read_throughput(
        cfg.data_dir, cfg.data_workers, rank=world.rank, ranks=world.size
    ).to_dict()
    return h5data.HDF5Source(cfg.data_dir, device, cfg.data_workers, world.rank, world.size), io


def slow_rank_delay(rank: int) -> float:
    """Seconds this rank sleeps before each forward pass (``HPCDL_TEST_SLOW_RANK``), else 0."""
    text = os.environ.get(SLOW_RANK_VAR, "")
    if not text:
        return 0.0
    try:
        who, seconds = text.split(":")
        delay = float(seconds)
    except ValueError:
        raise HpcdlError(f"{SLOW_RANK_VAR}={text!r} is invalid: expected RANK:SECONDS, like 1:0.05") from None
    return delay if int(who) == rank else 0.0


def measure_rank(
    spec: Spec, cfg: RunConfig, device: torch.device, world: World, backend: Backend, say: Progress
) -> RankMeasurement:
    """This rank's part of a run: checks, warm-up, timed steps; returns what rank 0 gathers."""
    checks = []
    if world.size > 1:
        say("checking that N ranks step like one process")
        checks.append(one_step_equivalence(spec, world, backend, device))
    world.barrier()  # every rank probes at once, sharing the node as in training
    ceiling = measured_ceiling(device, spec.precision, torch.get_num_threads())
    say(f"building {spec.family} model and {cfg.data} data")
    model = spec.build().to(device)
    in_step = spread(model, world.rank, world.size, backend, device)
    traffic, grad_bytes = backend.traffic(model), gradient_bytes(model)
    source, io = make_source(spec, cfg, device, world)
    inner = model  # the module itself: backends wrap it (DDP) or shard it in place (FSDP)
    model, optimizer = backend.wrap(model, lambda params: make_optimizer(params, cfg))
    delay = slow_rank_delay(world.rank)
    trainer = Trainer(
        model, optimizer, source, device, spec.precision, cfg.phase_sync, backend, in_step, delay
    )
    # The check's models and the weights FSDP replaced are garbage in reference cycles (module
    # hooks): freed only now, they would count in the peak (FSDP's per rank: 2.0 -> 1.5 GiB)
    gc.collect()
    reset_peak_memory(device)
    say(f"warm-up {cfg.warmup_steps} steps, then timing")
    local_backward = trainer.local_backward_s(CALIBRATION_STEPS)
    sampler = TelemetrySampler(device)
    log = trainer.run(
        cfg.warmup_steps,
        cfg.steps,
        cfg.duration_s,
        progress=lambda n, s: say(f"timed {n} steps in {s:.1f} s"),
        window=sampler,
        agree=world.all_true,  # the window ends when every rank's clock says so
    )
    mem_bytes, mem_kind = peak_memory(device)  # before the collectives below allocate theirs
    several = world.size > 1
    return RankMeasurement(
        rank=world.rank,
        host=world.hostname,
        node=world.node,
        local_rank=world.local_rank,
        log=log,
        device_index=device.index if device.type == "cuda" else None,
        cpus=sorted(os.sched_getaffinity(0)),
        peak=theoretical_peak(device, device_name(device), spec.precision),
        gemm_ceiling_flops=ceiling,
        grad_bytes=grad_bytes,
        traffic=traffic,
        peak_memory_bytes=mem_bytes,
        peak_memory_kind=mem_kind,
        threads=torch.get_num_threads(),
        energy=sampler.summary(),
        power_trace=sampler.trace(),
        io=io,
        checks=checks,
        local_backward_s=local_backward,
        injected_delay_s=delay,
        digest=parameter_digest(full_parameters(inner, backend)) if several else "",
        collective_s={
            t.collective: backend_time(world, backend, device, t.collective, t.bytes)[0]
            for t in traffic
            if several
        },
    )


def set_threads(world: World) -> None:
    """Share the cores among the ranks of a node (torch would otherwise pick on its own),
    unless the user chose a thread count with OMP_NUM_THREADS."""
    if world.local_size > 1 and "OMP_NUM_THREADS" not in os.environ:
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
    fit = None
    if cfg.fit_fraction > 0:
        spec, fit = fit_batch(spec, cfg, device, world)
        if progress and world.rank == 0:
            gib = fit.capacity_bytes / 2**30
            progress(f"fitted batch {spec.batch_size}/rank to {cfg.fit_fraction:g} of {gib:.1f} GiB")
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
        result = finish(spec, cfg, device, ranks, backend_name, name, output_dir, fit)
    return world.bcast(result)


def finish(
    spec: Spec,
    cfg: RunConfig,
    device: torch.device,
    ranks: list[RankMeasurement],
    backend: str,
    name: str,
    output_dir: str | Path | None,
    fit: Fit | None = None,
) -> RunResult:
    """Rank 0: build, seal and write the record and the per-step file (rank 0's steps)."""
    record = build_record(spec, cfg, device, ranks, backend, name, fit)
    if output_dir is None:
        return RunResult(seal(record), None, None)
    out = Path(output_dir)
    log = ranks[0].log
    trace = {f"gpu_{k}": v for k, v in ranks[0].power_trace.items() if v}  # rank 0's GPU, if any
    columns = {
        "step_s": log.step_s,
        **{f"{p}_s": v for p, v in log.phases_s.items()},
        "loss": log.losses,
        **trace,
    }
    steps_path = write_steps(columns, out / f"{name}.steps.h5")
    record["steps_file"] = steps_path.name
    record["steps_sha256"] = file_sha256(steps_path)
    record = seal(record)
    return RunResult(record, write_record(record, out / f"{name}.json"), steps_path)
