"""A benchmark run: build, warm up, time, check and write the record -- on one process, or on
every rank of an MPI job with gradients reduced through a backend (the same code path)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hpcdl import metrics
from hpcdl.device import (
    device_name,
    ieee_fp32,
    peak_memory,
    pin_mmap_threshold,
    rank_threads,
    reset_peak_memory,
    resolve_device,
)
from hpcdl.errors import HpcdlError, InputError, SpecError
from hpcdl.harness.compose import crossing_note, run_layout
from hpcdl.harness.parts import Hooks, Progress, Reporter, Ticks, gpu_identity, measured_ceiling
from hpcdl.harness.plan import BackendPlan, Plan
from hpcdl.measure import hdf5 as h5data
from hpcdl.measure.config import RunConfig
from hpcdl.measure.execution import Execution, compiled_graphs, resolve
from hpcdl.measure.fit import Fit, estimated_batch, fit_batch, rank_memory
from hpcdl.measure.measurement import RankMeasurement
from hpcdl.measure.peaks import theoretical_peak
from hpcdl.measure.profiled import profile_steps
from hpcdl.measure.schedstat import Descheduled, kernel_id, together
from hpcdl.measure.telemetry import TelemetrySampler
from hpcdl.measure.trial import Shard, warm_base
from hpcdl.measure.watchdog import Watchdog, heartbeat_dir, remove_heartbeats
from hpcdl.parallel.backends import Backend, resolve_backend_name
from hpcdl.parallel.backends.choose import backend_class, start_backend
from hpcdl.parallel.launch import not_stopped
from hpcdl.parallel.layout import Layout, parse_layout
from hpcdl.parallel.tensor import rank_count
from hpcdl.parallel.world import World, init_world, others_wait
from hpcdl.records.build import build_record
from hpcdl.records.store import check_name, check_output, seal, write_pair
from hpcdl.records.views import Result, read_result
from hpcdl.workloads import moe
from hpcdl.workloads.spec import Spec

CALIBRATION_STEPS = 5  # backward timed without reduction where the backend can (DDP)
SLOW_RANK_VAR = "HPCDL_TEST_SLOW_RANK"
"""``RANK:SECONDS``: that rank sleeps this long before every forward pass. For tests of the
straggler attribution only: a record made with it says so in ``metrics.flags``."""


@dataclass(frozen=True)
class RunResult:
    """A finished run: its record (a plain dict, as written), its typed view and where it was
    written."""

    record: dict[str, Any]
    path: Path | None
    steps_path: Path | None
    result: Result = field(init=False, compare=False, repr=False)
    """the record's typed view, parsed once here (a run's summary reads it many times)"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "result", read_result(self.record))

    @property
    def passed(self) -> bool:
        return self.result.validity.passed


def rank_device(cfg: RunConfig, world: World) -> torch.device:
    """This rank's device: with ``auto`` or ``cuda`` and several ranks on a node, GPU local_rank."""
    device = resolve_device(cfg.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", world.local_rank % max(torch.cuda.device_count(), 1))
    return device


def preflight(spec: Spec, cfg: RunConfig, world: World | None = None) -> torch.device:
    """Everything that can refuse a run before it starts: device, backend, layout, memory
    estimate."""
    world = world or World()
    device = rank_device(cfg, world)
    execution_of(spec, cfg, device)
    backend_name = resolve_backend_name(cfg.backend, world.size)
    layout = run_layout(spec, cfg, world.size)
    if cfg.data == "hdf5":
        h5data.has_shards(spec, cfg.data_dir)  # refuses a file, damaged or foreign shards
    moe.check_ranks(spec, world.size)
    have = rank_memory(device, world)
    if cfg.fit_fraction > 0:
        kept = backend_class(backend_name, layout).keeps_gradients  # below: refuses what cannot fit
        estimated_batch(spec, cfg.optimizer, cfg.fit_fraction, have, kept_grads=kept)
        return device
    need = rank_need(spec, cfg.optimizer, layout)
    if need > have:
        raise SpecError(
            f"{spec.family}.batch_size",
            spec.batch_size,
            f"estimated memory {need / 2**30:.1f} GiB exceeds the {have / 2**30:.1f} GiB "
            f"available to a rank on {device}; lower batch_size or the model's size",
        )
    return device


def rank_need(spec: Spec, optimizer: str, layout: Layout) -> int:
    """Estimated bytes one rank of ``layout`` needs: its shard of the weights (tp: its exact
    count; pp: its stages', taken as an even split) and, conservatively, a whole sample's
    activations (a model that fits only when split is not refused)."""
    params = rank_count(spec, layout.tp).params
    return metrics.memory_estimate(
        math.ceil(params / layout.pp), spec.memory_per_sample(), spec.batch_size, optimizer
    )


def distinct_gpus(device: torch.device, world: World) -> None:
    """Refuse two ranks on one GPU (NCCL cannot run them; figures would halve), compared by the
    GPUs' UUIDs, which hold also where each rank sees only its own GPU as cuda:0."""
    if device.type != "cuda" or world.size == 1:
        return
    mine = (world.hostname, gpu_identity(device))
    taken = world.allgather(mine)
    if len(set(taken)) < len(taken):
        raise InputError("run.device", str(device), "one GPU per rank: several ranks of this run share a GPU")


def execution_of(spec: Spec, cfg: RunConfig, device: torch.device) -> Execution:
    """The run's execution (``measure.execution``), refused in one line where the device, the
    layout or the host cannot run it."""
    layout = parse_layout(cfg.layout) if cfg.layout else None
    pipeline = layout is not None and layout.pp > 1
    dtensors = cfg.backend == "fsdp" or (layout is not None and layout.tp > 1)
    return resolve(
        cfg.mode, cfg.graphs, cfg.fused_optimizer, cfg.memory_format, spec, device, pipeline, dtensors
    )


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
    spec: Spec,
    cfg: RunConfig,
    device: torch.device,
    world: World,
    plan: Plan,
    report: Reporter,
    heartbeats: Path | None = None,
    before_window: Callable[[], None] | None = None,
) -> RankMeasurement:
    """This rank's part of a run, whatever its parallelism (``plan``: what its strategy does its
    own way): checks, build, warm-up, timed steps, the step's traffic timed after training;
    returns what rank 0 gathers. With several ranks and ``heartbeats`` (a directory they
    share), the stall watchdog guards the steps."""
    checks = []
    if world.size > 1:
        report.say(f"checking that {world.size} ranks{plan.shape} step like one process")
        checks.append(plan.check(spec, world, device))
    world.barrier()  # every rank probes at once, sharing the node as in training
    ceiling = measured_ceiling(device, spec.precision, torch.get_num_threads())
    report.say(f"building {spec.family} model{plan.shape} and {cfg.data} data")
    held = warm_base(spec, cfg.optimizer, device) if cfg.fit_fraction > 0 else None  # only a fit compares
    execution = execution_of(spec, cfg, device)
    guard: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    on_step = None
    if heartbeats is not None and world.size > 1 and cfg.stall_s > 0:
        watchdog = Watchdog(heartbeats, world, cfg.stall_s)
        guard, on_step = watchdog, watchdog.step_done
    target = (cfg.target_loss_fraction, cfg.pool_batches) if cfg.target_loss_fraction else None
    hooks = Hooks(on_step, before_window, slow_rank_delay(world.rank), target)
    trainer, io = plan.build(spec, cfg, device, world, execution, hooks)
    # a fitted run keeps glibc's mmap threshold where its trials fixed it, or the heap keeps what
    # they did not (docs/validation/2026-11-26-auto-fit.md)
    reset_peak_memory(device, pin=cfg.fit_fraction > 0)
    compiling = ", compiling" if execution.mode == "compile" else ""
    report.say(f"warm-up {cfg.warmup_steps} steps{compiling}, then timing")
    local_backward = trainer.local_backward_s(CALIBRATION_STEPS)
    sampler, descheduled = TelemetrySampler(device), Descheduled()
    with guard:
        log = trainer.run(
            cfg.warmup_steps,
            cfg.steps,
            cfg.duration_s,
            progress=lambda n, s: report.tick(n, s, n * spec.samples_per_step * plan.streams),
            window=together(sampler, descheduled),
            agree=world.all_true,  # the window ends when every rank's clock says so
        )
    graphs = compiled_graphs() if execution.mode == "compile" else {}
    mem_bytes, mem_kind = peak_memory(device)  # before the collectives below allocate theirs
    # after the window and its memory peak: extra steps, never timed ones (hpcdl run --profile)
    operators = None
    if cfg.profile_steps:
        medians = {p: metrics.summarize(v)["median"] for p, v in log.phases_s.items()}
        operators = profile_steps(trainer, cfg.profile_steps, device, medians)
    several = world.size > 1
    traffic = plan.traffic()
    return RankMeasurement(
        rank=world.rank,
        host=world.hostname,
        node=world.node,
        local_rank=world.local_rank,
        log=log,
        device_index=device.index if device.type == "cuda" else None,
        device_uuid=gpu_identity(device),
        cpus=sorted(os.sched_getaffinity(0)),
        peak=theoretical_peak(device, device_name(device), spec.precision),
        gemm_ceiling_flops=ceiling,
        grad_bytes=plan.reduced_bytes(),
        traffic=traffic,
        peak_memory_bytes=mem_bytes,
        peak_memory_kind=mem_kind,
        held_before_model_bytes=held,
        threads=torch.get_num_threads(),
        energy=sampler.summary(),
        power_trace=sampler.trace(),
        io=io,
        checks=checks,
        local_backward_s=local_backward,
        injected_delay_s=hooks.delay_s,
        on_cpu_s=descheduled.ran_s,
        descheduled_s=descheduled.waited_s,
        kernel=kernel_id(),
        digest=plan.digest(world) if several else "",
        # each collective of a step timed after training, by name: over every rank, or, under a
        # layout, over the group of its dimension
        collective_s=plan.time_traffic(traffic, world, device) if several else {},
        execution=execution.to_dict(),
        compiled=graphs,
        operators=operators,
        pipeline=plan.stage_log(len(log.step_s)),
    )


def plan_for(layout: Layout, backend: Backend, world: World, device: torch.device) -> Plan:
    """The strategy of a run: the pipeline's for a layout with stages, else its backend's."""
    if layout.pp > 1:  # torch's pipelining takes seconds to import: only pipelines do
        from hpcdl.harness.pipelined import PipelinePlan

        return PipelinePlan(layout, world, device)
    return BackendPlan(backend, world)


def set_threads(world: World) -> None:
    """Share the cores among the ranks of a node (torch would otherwise pick on its own),
    unless the user chose a thread count with OMP_NUM_THREADS (the rule the fit's trials use)."""
    torch.set_num_threads(rank_threads(world.local_size))


def run(
    spec: Spec,
    config: RunConfig | None = None,
    *,
    output_dir: str | Path | None = "results",
    name: str | None = None,
    progress: Progress | None = None,
    world: World | None = None,
    ticks: Ticks | None = None,
    before_window: Callable[[], None] | None = None,
    co_runners: int = 0,
) -> RunResult:
    """Measure one workload and write its record (unless ``output_dir`` is None).

    Under an MPI launcher every rank calls this; gradients are reduced through
    ``config.backend``, every rank's timings are gathered, and rank 0 writes the record (every
    rank returns it). Raises :class:`hpcdl.errors.SpecError` before running anything when the
    spec cannot fit the device or the backend is unavailable. ``before_window`` is called on
    every rank after warm-up, just before timing (concurrent instances start their windows
    together); ``co_runners``: threads of other runs of the same job on this rank's CPUs (those
    instances), whose waits for a CPU are the job's own, not a disturbance.
    """
    cfg = config or RunConfig()
    world = world or init_world()
    if output_dir is not None:  # a record that could not be written is refused before measuring
        verdict = None  # (field, value, allowed): an exception of this kind does not pickle
        if world.rank == 0:
            try:
                check_output(output_dir)
                check_name(name or "x")
            except InputError as e:
                verdict = (e.field, e.value, e.allowed)
        verdict = world.bcast(verdict)
        if verdict is not None:
            raise InputError(*verdict)
    device = preflight(spec, cfg, world)
    distinct_gpus(device, world)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # also for one process: DataLoader pinning and NVML follow it
        ieee_fp32()
    fit = None
    backend_name = resolve_backend_name(cfg.backend, world.size)
    if cfg.fit_fraction > 0:
        # fixed from the start, as in the trials: large tensors the checks and probes below freed
        # under the dynamic threshold left chunks in the heap that later steps reused, resident
        # (docs/validation/2026-11-26-auto-fit.md, step 7)
        if device.type == "cpu":
            pin_mmap_threshold()
        layout = run_layout(spec, cfg, world.size)
        rules = backend_class(backend_name, layout)
        shards = rules.shards_state or layout.tp > 1  # FSDP; tensor parallelism (a pipeline: no fit)
        shard = (
            Shard(world.rank, world.size, rules.name if shards else None, layout.tp, layout.dp)
            if world.size > 1
            else None
        )
        say = progress if world.rank == 0 else None
        spec, fit = fit_batch(spec, cfg, device, world, rules.keeps_gradients, shard, say)
        if progress and world.rank == 0:
            gib = fit.capacity_bytes / 2**30
            progress(f"fitted batch {spec.batch_size}/rank to {cfg.fit_fraction:g} of {gib:.1f} GiB")
    set_threads(world)
    report = Reporter(progress or (lambda _m: None), ticks) if world.rank == 0 else Reporter()
    layout = run_layout(spec, cfg, world.size)
    note = crossing_note(layout, world.allgather(world.node))
    if note and world.rank == 0:
        print(f"hpcdl: {note}", file=sys.stderr, flush=True)
    backend = start_backend(backend_name, layout, world, device, spec)
    backend_name = backend.name
    heartbeats = heartbeat_dir(output_dir, world)
    try:
        plan = plan_for(layout, backend, world, device)
        mine = measure_rank(spec, cfg, device, world, plan, report, heartbeats, before_window)
        mine.co_runner_threads = co_runners
    finally:
        backend.close()
        if world.rank == 0 and heartbeats is not None:
            remove_heartbeats(heartbeats)
    ranks = world.gather(mine)
    name = name or f"{time.strftime('%Y%m%d-%H%M%S')}-{spec.family}"
    result = None
    if ranks is not None:  # rank 0; the others wait for its result
        with others_wait(world):
            result = finish(spec, cfg, device, ranks, backend_name, name, output_dir, fit)
    done: RunResult = world.bcast(result)
    return done


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
    """Rank 0: build, seal and write the record and the per-step file (rank 0's steps), unless
    the run's launcher no longer wants it (``launch.not_stopped``, checked at the last moment)."""
    if fit is not None:
        fit = fit.with_run_peak(ranks)
    record = build_record(spec, cfg, device, ranks, backend, name, fit)
    if output_dir is None:
        return RunResult(seal(record), None, None)
    log = ranks[0].log
    trace = {f"gpu_{k}": v for k, v in ranks[0].power_trace.items() if v}  # rank 0's GPU, if any
    columns = {
        "step_s": log.step_s,
        **{f"{p}_s": v for p, v in log.phases_s.items()},
        "loss": log.losses,
        **trace,
    }
    try:
        sealed, path, steps_path = write_pair(record, columns, output_dir, name, not_stopped)
    except OSError as e:
        rate = read_result(record).metrics.samples_per_s
        raise HpcdlError(
            f"the record of {name} ({rate:.1f} samples/s) could not be written to {output_dir}: "
            f"{e.strerror or e}; nothing was written"
        ) from None
    return RunResult(sealed, path, steps_path)
