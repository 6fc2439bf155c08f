"""Capacity: M independent instances of a workload at once, each of S ranks, in one MPI job
(``hpcdl capacity``, or a job file's ``instances`` in one allocation), in the spirit of MLPerf
HPC's throughput metric.

The job's M·S ranks split into one communicator per instance (ranks i·S … i·S+S−1 are instance
i); every instance is a run of its own (``harness.runner.run`` on its communicator) with its own
seed (the spec's + i) and record (``NAME-iI``). First instance 0 runs alone on the devices it
will have (``NAME-alone``) while the others wait without spinning, then all M run together,
starting their timed windows at one barrier after their warm-ups (a window of seconds would
otherwise be shifted by each instance's start-up); global rank 0 writes the summary
(``NAME-capacity.json``, docs/metrics.md "Summaries").

Placement, per node, before anything touches a GPU: the K = ``per_device`` instances of a group
(instances g·K … g·K+K−1) share devices, rank r of the group's instances on the group's r-th
device. On CPUs a device is a share of the node's cores (the cores of every rank on the node,
split evenly among the devices); the K instances on it share those cores, each with cores/K
threads. On GPUs a device is a GPU, shared by its K instances (time-sliced), or, where its MIG
mode is on, one MIG device of it per instance: each rank sees only its own (CUDA_VISIBLE_DEVICES
set to the UUID), found through NVML.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from hpcdl import metrics
from hpcdl.errors import HpcdlError, InputError
from hpcdl.harness.runner import RunResult, run
from hpcdl.measure.config import RunConfig
from hpcdl.measure.limits import nvml
from hpcdl.parallel.launch import not_stopped
from hpcdl.parallel.world import World, end_all_ranks, init_world, world_of
from hpcdl.records import schema
from hpcdl.records.store import write_record
from hpcdl.records.views import Result
from hpcdl.workloads.registry import spec_from_dict
from hpcdl.workloads.spec import Spec

Say = Callable[[str], None]


@dataclass(frozen=True)
class Layout:
    """M instances of S ranks, K of them per device."""

    instances: int
    ranks_per_instance: int
    per_device: int = 1

    def __post_init__(self) -> None:
        for name, value in (("instances", self.instances), ("ranks-per-instance", self.ranks_per_instance)):
            if value < 1:
                raise InputError(name, value, "an integer >= 1")
        if not 1 <= self.per_device <= self.instances or self.instances % self.per_device:
            raise InputError(
                "per-device",
                self.per_device,
                f"instances per device: a divisor of --instances {self.instances}",
            )

    @property
    def ranks(self) -> int:
        return self.instances * self.ranks_per_instance

    def instance(self, rank: int) -> int:
        return rank // self.ranks_per_instance

    def slot(self, rank: int) -> tuple[int, int]:
        """The device a rank uses, as (group of co-located instances, rank within its instance)."""
        return self.instance(rank) // self.per_device, rank % self.ranks_per_instance


@dataclass(frozen=True)
class Gpu:
    """A GPU as NVML sees it: its UUID, and its MIG devices' UUIDs where MIG is on."""

    uuid: str
    mig: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: its cores and threads, or the one GPU or MIG device it sees."""

    rank: int
    instance: int
    host: str
    cpus: list[int] = field(default_factory=list)
    threads: int = 0
    visible: str | None = None
    """the CUDA_VISIBLE_DEVICES of the rank (a GPU's or MIG device's UUID); None on CPUs"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_inventory(lib: Any) -> list[Gpu]:
    """This node's GPUs through NVML (``nvmlDeviceGetMigMode``, ``nvmlDeviceGetMaxMigDeviceCount``,
    ``nvmlDeviceGetMigDeviceHandleByIndex``), limited to CUDA_VISIBLE_DEVICES when it names GPUs."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    gpus = []
    for i in range(lib.nvmlDeviceGetCount()):
        handle = lib.nvmlDeviceGetHandleByIndex(i)
        uuid = _text(lib.nvmlDeviceGetUUID(handle))
        if visible and str(i) not in visible and uuid not in visible:
            continue
        try:
            mig_on = lib.nvmlDeviceGetMigMode(handle)[0] == 1  # NVML_DEVICE_MIG_ENABLE
        except Exception:  # NOT_SUPPORTED before Ampere
            mig_on = False
        migs = []
        for k in range(lib.nvmlDeviceGetMaxMigDeviceCount(handle) if mig_on else 0):
            try:
                migs.append(_text(lib.nvmlDeviceGetUUID(lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, k))))
            except Exception:  # NOT_FOUND: no MIG device at this index
                continue
        gpus.append(Gpu(uuid, tuple(migs)))
    return gpus


def place_node(
    layout: Layout, ranks: Sequence[int], host: str, cpus: Sequence[int], gpus: Sequence[Gpu] | None
) -> list[Placement]:
    """The placement of the ranks of one node (``gpus`` None: a CPU run); InputError when they
    do not fit its cores or GPUs."""
    slots = list(dict.fromkeys(layout.slot(r) for r in ranks))
    k = layout.per_device
    if gpus is None:
        if len(cpus) < len(slots):
            raise InputError(
                "instances",
                layout.instances,
                f"{len(slots)} devices of cores needed on {host} ({len(ranks)} ranks, {k} per device), "
                f"{len(cpus)} cores there",
            )
        size = len(cpus) // len(slots)
        groups = [sorted(cpus)[i * size : (i + 1) * size] for i in range(len(slots))]
        return [
            Placement(r, layout.instance(r), host, groups[slots.index(layout.slot(r))], max(1, size // k))
            for r in ranks
        ]
    if len(gpus) < len(slots):
        raise InputError(
            "instances",
            layout.instances,
            f"{len(slots)} GPUs needed on {host} ({k} instances each), {len(gpus)} there",
        )
    out = []
    for r in ranks:
        gpu = gpus[slots.index(layout.slot(r))]
        member = layout.instance(r) % k
        if gpu.mig and len(gpu.mig) < k:
            raise InputError("per-device", k, f"GPU {gpu.uuid} on {host} has {len(gpu.mig)} MIG devices")
        out.append(Placement(r, layout.instance(r), host, visible=gpu.mig[member] if gpu.mig else gpu.uuid))
    return out


def mig_note(gpus: Sequence[Gpu] | None, per_device: int) -> str:
    """What co-location means here, in words (said, and kept in the summary)."""
    if gpus is None:
        return f"CPU: {per_device} instance(s) per share of the cores, their threads dividing it"
    if all(g.mig for g in gpus):
        return f"MIG: each instance on a MIG device of its own ({per_device} per GPU)"
    if per_device == 1:
        return "one instance per GPU"
    return f"MIG is absent: {per_device} instances share each GPU (time-sliced)"


def place(world: World, layout: Layout, cuda: bool) -> tuple[Placement, str]:
    """This rank's placement, agreed over the whole job, and applied: cores and threads, or the
    one device CUDA may see (before anything initialises CUDA in this process)."""
    gpus = gpu_inventory(nvml()) if cuda else None
    mine = (world.hostname, world.rank, sorted(os.sched_getaffinity(0)))
    everyone = world.allgather(mine)
    on_node = [(rank, cpus) for host, rank, cpus in everyone if host == world.hostname]
    cores = sorted({c for _, cpus in on_node for c in cpus})
    placed = place_node(layout, [r for r, _ in on_node], world.hostname, cores, gpus)
    me = next(p for p in placed if p.rank == world.rank)
    if me.visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = me.visible
    else:
        os.sched_setaffinity(0, me.cpus)
        os.environ["OMP_NUM_THREADS"] = str(me.threads)  # the runner then keeps this count
        torch.set_num_threads(me.threads)
    return me, mig_note(gpus, layout.per_device)


def on_gpus(device: str) -> bool:
    """Whether the run's device is a GPU, without initialising CUDA (``device_count`` asks NVML
    first): CUDA_VISIBLE_DEVICES must still be settable afterwards."""
    if device == "auto":
        return torch.cuda.device_count() > 0
    return device.startswith("cuda")


def idle_barrier(world: World, poll_s: float = 0.05) -> None:
    """A barrier that sleeps instead of spinning: waiting ranks leave the cores to the instance
    measured alone."""
    if world.comm is None:
        return
    request = world.comm.Ibarrier()
    while not request.Test():
        time.sleep(poll_s)


def run_capacity(
    spec: Spec,
    cfg: RunConfig,
    layout: Layout,
    out: Path,
    name: str,
    say: Say = print,
    world: World | None = None,
) -> dict[str, Any] | None:
    """Every rank of the job: place, measure instance 0 alone, then all instances together;
    the summary on global rank 0 (None elsewhere). Any rank's failure ends every rank: the
    instances share one MPI job."""
    world = world or init_world()
    if world.size != layout.ranks:
        raise HpcdlError(
            f"capacity: {world.size} ranks started, {layout.instances} x {layout.ranks_per_instance} needed"
        )
    try:
        me, note = place(world, layout, on_gpus(cfg.device))
        everyone = world.allgather(me)
        placements = everyone if world.rank == 0 else None
        shared = set(me.cpus)
        co_runners = sum(
            p.threads
            for p in everyone
            if p.instance != me.instance and p.host == me.host and shared & set(p.cpus)
        )
        instance = world_of(world.comm.Split(me.instance, world.rank)) if world.comm is not None else world
        mine = spec.replace(seed=spec.seed + me.instance)
        lead = world.rank == 0
        alone: RunResult | None = None
        if me.instance == 0:
            progress = say if lead else None
            alone = run(mine, cfg, output_dir=out, name=f"{name}-alone", world=instance, progress=progress)
        idle_barrier(world)
        if lead:
            say(f"capacity: {layout.instances} instances together ({note})")
        together = run(
            mine,
            cfg,
            output_dir=out,
            name=f"{name}-i{me.instance}",
            world=instance,
            before_window=lambda: idle_barrier(world),  # every instance times the same span
            co_runners=co_runners,
        )
        records = world.gather(together.result if instance.rank == 0 else None)
    except HpcdlError as e:
        end_all_ranks(e, e.exit_code)  # the other instances would wait for this one forever
        raise
    if records is None or alone is None or placements is None:
        return None
    views = [r for r in records if r is not None]
    summary = summarize(name, spec, layout, alone.result, views, placements, note)
    not_stopped()  # as each instance's record: only while the launcher still wants it
    write_record(summary, out / f"{name}-capacity.json")
    return summary


def summarize(
    name: str,
    spec: Spec,
    layout: Layout,
    alone: Result,
    instances: Sequence[Result],
    placements: Sequence[Placement],
    note: str,
) -> dict[str, Any]:
    """The capacity summary: every instance's samples over the wall time from the earliest
    window start to the latest window end, the spread over instances and each one's slowdown
    against instance 0 alone."""
    samples = [round(v.metrics.samples_per_s * v.metrics.timed_window_s) for v in instances]
    flops = [v.metrics.train_flops_per_sample * n for v, n in zip(instances, samples, strict=True)]
    starts = [v.metrics.window_start_unix or 0.0 for v in instances]
    ends = [v.metrics.window_end_unix or 0.0 for v in instances]
    figures = metrics.capacity(samples, flops, starts, ends)
    rates = [v.metrics.samples_per_s for v in instances]
    return {
        "schema": schema.CAPACITY,
        "name": name,
        "spec": spec.to_dict(),
        "layout": {**asdict(layout), "ranks": layout.ranks, "co_location": note},
        "placement": [asdict(p) for p in placements],
        "alone": {"record": alone.name, "samples_per_s": alone.metrics.samples_per_s},
        "instances": [
            {
                "instance": i,
                "record": v.name,
                "seed": spec_from_dict(v.spec).seed,
                "samples": n,
                "samples_per_s": v.metrics.samples_per_s,
                "window_start_unix": t0,
                "window_end_unix": t1,
                "slowdown": metrics.slowdown(alone.metrics.samples_per_s, v.metrics.samples_per_s),
                "passed": v.validity.passed,
            }
            for i, (v, n, t0, t1) in enumerate(zip(instances, samples, starts, ends, strict=True))
        ],
        **figures,
        "instance_spread": metrics.spread(rates),
        "passed": all(v.validity.passed for v in [alone, *instances]),
    }
