"""What differs between kinds of parallelism in a rank's part of a run, one object per strategy.

The driver (``runner.measure_rank``) checks, builds, warms up, times and reports every run the
same way and asks its :class:`Plan` for what a strategy does its own way: the check of N ranks
against one process, the model (or this rank's stages) with its optimizer, data and trainer,
what a step moves between ranks and how that is timed after training, and the digest of the
parameters every replica must share. Runs whose ranks each hold the model, or the share their
backend splits off (data parallelism, FSDP's shards, tensor parallelism), follow their backend
(:class:`BackendPlan`: the ``Backend`` protocol holds every rule that differs among them); a
layout with pipeline stages follows the pipeline's plan (``harness.pipelined.PipelinePlan``);
``runner.plan_for`` chooses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hpcdl.harness.parts import Hooks, make_optimizer
from hpcdl.measure import hdf5 as h5data
from hpcdl.measure.checks import one_step_equivalence, parameter_digest
from hpcdl.measure.config import RunConfig
from hpcdl.measure.data import device_pool
from hpcdl.measure.execution import Execution, compiled, inputs, prepare
from hpcdl.measure.loop import BatchSource, Trainer
from hpcdl.measure.measurement import Check
from hpcdl.parallel.backends import Backend, Traffic
from hpcdl.parallel.backends.fsdp import units
from hpcdl.parallel.placement import full_parameters, spread
from hpcdl.parallel.world import World, others_wait
from hpcdl.workloads.spec import Spec

if TYPE_CHECKING:
    from hpcdl.parallel.pipeline import StageLog


class Plan(Protocol):
    """One strategy's part of a rank's run; the driver calls these in this order."""

    streams: int
    """distinct data streams among the run's ranks: the ranks that train on different samples
    (a tensor-parallel group or a pipeline shares one)"""
    shape: str
    """how a rank holds the model, for the progress line ('' whole or as the backend splits it)"""

    def check(self, spec: Spec, world: World, device: torch.device) -> Check:
        """One step of every rank against one process on the global batch (several ranks)."""
        ...

    def build(
        self,
        spec: Spec,
        cfg: RunConfig,
        device: torch.device,
        world: World,
        execution: Execution,
        hooks: Hooks,
    ) -> tuple[Trainer, dict[str, Any]]:
        """This rank's model (or stages), optimizer and data in the trainer that times them, and
        what preparing the data measured (HDF5's I/O; empty otherwise)."""
        ...

    def traffic(self) -> list[Traffic]:
        """Every collective of a step outside forward and backward on this rank, after
        training, by the name the record gives it."""
        ...

    def reduced_bytes(self) -> int:
        """Bytes of the gradients a step reduces across ranks on this rank."""
        ...

    def time_traffic(self, traffic: list[Traffic], world: World, device: torch.device) -> dict[str, float]:
        """Median seconds per step of each of ``traffic``, timed after training (collective)."""
        ...

    def digest(self, world: World) -> str:
        """The digest of the parameters of this rank's replica of the whole model (collective
        where shards must be gathered): every replica's must be the same."""
        ...

    def stage_log(self, steps: int) -> StageLog | None:
        """What this rank's pipeline stages did in the last ``steps`` steps; None without."""
        ...


class BackendPlan:
    """A run whose every rank holds the model, or the share its backend splits off: data
    parallelism (DDP, Horovod, a plugin's), FSDP's shards, tensor parallelism. Everything that
    differs among them is the backend's rule (``parallel.backends.Backend``)."""

    shape = ""

    def __init__(self, backend: Backend, world: World) -> None:
        self.backend = backend
        self.streams = backend.streams(world.rank, world.size)[1]
        self.model: torch.nn.Module | None = None
        self._traffic: list[Traffic] = []
        self._reduced = 0

    def check(self, spec: Spec, world: World, device: torch.device) -> Check:
        return one_step_equivalence(spec, world, self.backend, device)

    def build(
        self,
        spec: Spec,
        cfg: RunConfig,
        device: torch.device,
        world: World,
        execution: Execution,
        hooks: Hooks,
    ) -> tuple[Trainer, dict[str, Any]]:
        backend = self.backend
        model = prepare(spec.build().to(device), execution)
        in_step = spread(model, world.rank, world.size, backend, device)
        source, io = make_source(spec, cfg, device, world, backend.streams(world.rank, world.size), execution)
        self.model = model  # the module itself: backends wrap it (DDP) or shard it in place (FSDP, TP)
        late = backend.compiles_after_wrap
        if not late:  # DDP around the compiled model; FSDP around each compiled block (torchtitan's way)
            model = compiled(model, execution, units(model) if backend.shards_state else None)
        fused = execution.fused_optimizer
        model, optimizer = backend.wrap(
            model, lambda params: make_optimizer(params, cfg, fused), spec.accumulation_steps
        )
        if late:
            model = compiled(model, execution)
        # what a step moves, of what this rank holds now (tensor parallelism: its shards)
        self._traffic = backend.step_traffic(self.model, spec)
        self._reduced = backend.reduced_bytes(self.model)
        trainer = Trainer(
            model=model,
            optimizer=optimizer,
            source=source,
            device=device,
            precision=spec.precision,
            backend=backend,
            in_step=in_step,
            delay_s=hooks.delay_s,
            accumulation_steps=spec.accumulation_steps,
            on_step=hooks.on_step,
            target=hooks.target,
            before_window=hooks.before_window,
        )
        return trainer, io

    def traffic(self) -> list[Traffic]:
        return self._traffic

    def reduced_bytes(self) -> int:
        return self._reduced

    def time_traffic(self, traffic: list[Traffic], world: World, device: torch.device) -> dict[str, float]:
        return self.backend.time_traffic(traffic, world, device)

    def digest(self, world: World) -> str:
        assert self.model is not None, "built first"
        return parameter_digest(full_parameters(self.model, self.backend))

    def stage_log(self, steps: int) -> StageLog | None:
        return None


def make_source(
    spec: Spec,
    cfg: RunConfig,
    device: torch.device,
    world: World,
    shard: tuple[int, int] | None = None,
    execution: Execution | None = None,
) -> tuple[BatchSource, dict[str, Any]]:
    """This rank's batch source and, for HDF5, the I/O figures measured while preparing it.
    Each rank draws its own data stream (its shard; ``shard`` = (stream, streams) where ranks
    share one, as a tensor-parallel group does); HDF5 shards are written by rank 0. Inputs come
    in the execution's memory format (a pool's converted once, read batches as they are read)."""
    stream, streams = shard or (world.rank, world.size)
    if cfg.data != "hdf5":
        learnable = cfg.data == "learnable"
        pool = device_pool(spec, device, cfg.pool_batches, learnable=learnable, stream=stream)
        if execution is not None:
            pool.batches[:] = [(inputs(x, execution), y) for x, y in pool.batches]
        return pool, {}
    io: dict[str, Any] = {}
    if world.rank == 0 and not h5data.has_shards(spec, cfg.data_dir):
        batches = max(cfg.pool_batches, 2) * world.size  # every rank gets its own batches
        with others_wait(world):
            io["write"] = h5data.write_shards(spec, cfg.data_dir, batches=batches).to_dict()
    world.barrier()
    io["read"] = h5data.read_throughput(cfg.data_dir, cfg.data_workers, rank=stream, ranks=streams).to_dict()
    source: BatchSource = h5data.HDF5Source(cfg.data_dir, device, cfg.data_workers, stream, streams)
    return (Formatted(source, execution) if execution is not None else source), io


@dataclass(frozen=True)
class Formatted:
    """A batch source whose inputs are put in the execution's memory format as they are read."""

    source: BatchSource
    execution: Execution

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.source.next()
        return inputs(x, self.execution), y
