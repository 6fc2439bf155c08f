"""Gradient-reduction backends: the protocol every backend follows, the registry, and the choice
among them.

A backend adapts one communication library to the training loop: it wraps the model and makes
its optimizer so that gradients are averaged across ranks, starts every rank from the same
weights, exposes the communication still outstanding after backward as its own phase, and owns
the rules that depend on how it communicates (which collectives a step runs and how many bytes
each moves, how its exposed communication and its ranks' computation alone are measured). It
also runs the blocking collectives the rest of hpcdl needs: an allreduce, an all-gather and a
reduce-scatter (checks and bandwidth sweeps) and an all-to-all (mixture-of-experts token
dispatch, ``hpcdl.workloads.moe``). A backend is one file in this folder, or a plugin
(``hpcdl.plugins``), that registers its class with ``@BACKENDS.register``; one that holds a
replica of the model on every rank inherits the protocol's data-parallel rules
(``backends.replicated.Replicated``: its data streams, the traffic of its step and their timing)
and states the rest.

Parameters that ``hpcdl.parallel.placement.rank_local`` names (experts sharded across ranks)
belong to this rank alone: a backend neither broadcasts nor reduces them, and still makes the
optimizer over them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import torch
from torch import nn

from hpcdl.errors import SpecError
from hpcdl.parallel.placement import shared_parameters
from hpcdl.parallel.world import World
from hpcdl.plugins import Registry

if TYPE_CHECKING:
    from hpcdl.workloads.spec import Spec

MakeOptimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
"""builds the run's optimizer over the parameters it is given (a backend that shards or wraps
parameters must make the optimizer over its own)"""
Wrapped = tuple[nn.Module, torch.optim.Optimizer]
"""the model and optimizer a backend hands the training loop"""

COLLECTIVES = ("allreduce", "all_gather", "reduce_scatter", "all_to_all")
"""the collectives hpcdl records, sweeps and models (``hpcdl.metrics.bus_factor`` of each)"""


@dataclass(frozen=True)
class Traffic:
    """What one collective moves in one training step on one rank: ``bytes`` in nccl-tests'
    sense (``hpcdl.metrics.algbw``), split into ``calls`` messages."""

    collective: str
    bytes: int
    calls: int


class Backend(Protocol):
    name: ClassVar[str]
    auto_priority: ClassVar[int | None]
    """order in which ``backend=auto`` tries backends (lowest first); None: never by auto"""
    shards_state: ClassVar[bool]
    """each rank keeps 1/N of the parameters, gradients and optimizer state, and its optimizer
    step updates only those (FSDP); False: every rank holds them all (data parallelism)"""
    keeps_gradients: ClassVar[bool]
    """every gradient stays allocated through the whole run, in the buckets the backend reduces
    (DDP's, the gradients being views into them); the memory estimate and auto-fit's trials then
    hold them all at every moment of a step (``Spec.memory_parts``'s ``kept_grads``). False: a
    step's gradients are freed after its optimizer step (``zero_grad``'s None)"""
    exposed_method: ClassVar[str]
    """how ``exposed_s`` measures communication not hidden behind computation (for records)"""
    compute_only_method: ClassVar[str]
    """how ``compute_only_s`` times a rank's computation alone, or why it cannot (for records)"""
    compiles_after_wrap: ClassVar[bool]
    """a compiled run compiles the model this backend made (tensor parallelism's sharded
    layers), not the model it is given (False: the backend wraps the compiled model)"""
    cycle_s: ClassVar[float]
    """the period at which the backend looks for gradients ready to reduce (Horovod's cycle
    time): a ready bucket waits half of it on average (the scaling model's ``bucket_tail``);
    0: a bucket is reduced as soon as it is ready"""

    def __init__(self, world: World, device: torch.device) -> None: ...

    @staticmethod
    def unavailable() -> str | None:
        """Why this backend cannot run here (e.g. its library is not installed), or None."""
        ...

    def wrap(self, model: nn.Module, make_optimizer: MakeOptimizer, accumulation_steps: int = 1) -> Wrapped:
        """Model and optimizer whose gradients are averaged over all ranks, with every rank
        starting from rank 0's weights and optimizer state (rank-local parameters excepted).
        The gradients are reduced once per ``accumulation_steps`` backward passes: the
        optimizer steps on the sum of that many micro-batches' gradients, averaged."""
        ...

    def accumulating(self, model: nn.Module) -> AbstractContextManager[object]:
        """The context of each micro-batch of a step but the last (gradient accumulation):
        its forward and backward leave the gradients on this rank, summed into those of the
        step's other micro-batches; the last micro-batch's backward reduces the sum."""
        ...

    def no_reduction(self, model: nn.Module) -> AbstractContextManager[object] | None:
        """A context in which backward reduces nothing (to time computation alone), or None
        when the library has none."""
        ...

    def finish_reduction(self, optimizer: torch.optim.Optimizer) -> None:
        """Wait for gradient reductions still running after backward (the exposed allreduce)."""
        ...

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        """The optimizer step, once gradients are reduced."""
        ...

    def allreduce(self, tensor: torch.Tensor) -> None:
        """In-place sum over all ranks, blocking (for bandwidth measurements and checks)."""
        ...

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along dimension 0 in rank order, blocking."""
        ...

    def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of the sum over ranks: the sum split into equal chunks along
        dimension 0 (its size a multiple of the ranks), chunk ``rank``; blocking."""
        ...

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` split into equal chunks along dimension 0 (its size a multiple of the
        ranks), chunk j sent to rank j; returns the chunks received, rank i's at place i."""
        ...

    @staticmethod
    def traffic(model: nn.Module, accumulation_steps: int = 1) -> list[Traffic]:
        """The collectives one training step of ``model`` runs through this backend (before
        ``wrap``, rank-local parameters already placed), a step being ``accumulation_steps``
        micro-batches: for the record and the scaling model."""
        ...

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float | None:
        """Median communication time not hidden behind computation, from the median backward
        time, the median backward time without reduction (None when not measured) and the
        median of the reduction phase (``finish_reduction``); None where it cannot be told."""
        ...

    @staticmethod
    def compute_only_s(forward_s: float, backward_s: float, local_backward_s: float | None) -> float | None:
        """A rank's median computation per step without waiting for other ranks, from its median
        forward and backward (in-step collectives already taken out) and its median backward
        without reduction (None when not measured); None where communication cannot be told
        apart from computation. This, not the phase times, names a straggler: where backward
        waits for the slowest rank, every rank's phases last as long as the slowest's."""
        ...

    def streams(self, rank: int, ranks: int) -> tuple[int, int]:
        """(this rank's data stream, the number of distinct streams) of a run of ``ranks``
        ranks: each rank its own in data parallelism; the ranks of a tensor-parallel group
        share one."""
        ...

    def step_traffic(self, model: nn.Module, spec: Spec) -> list[Traffic]:
        """Every collective one training step of ``spec`` runs on this rank outside forward and
        backward (the in-step ones, the experts' all-to-alls, are timed as they run), by the name
        the record gives it (a layout's dimension first: ``tp.allreduce``); ``model`` is the
        module handed to ``wrap``, after it (this rank's shards). Timed after training by
        :meth:`time_traffic`; data parallelism's is ``traffic``."""
        ...

    def reduced_bytes(self, model: nn.Module) -> int:
        """Bytes of the gradients one step reduces across ranks on this rank (``model`` as for
        :meth:`step_traffic`)."""
        ...

    def time_traffic(self, traffic: list[Traffic], world: World, device: torch.device) -> dict[str, float]:
        """Median seconds per step of each collective of :meth:`step_traffic`, by name, timed
        after training among the ranks it runs among. Collective: every rank must call it."""
        ...

    def close(self) -> None: ...


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of the gradients a step reduces across ranks: every trainable parameter that is not
    rank-local, in its own precision (fp32: autocast keeps the weights in fp32)."""
    return sum(p.numel() * p.element_size() for _, p in shared_parameters(model) if p.requires_grad)


def allreduce_traffic(model: nn.Module, message_bytes: int) -> list[Traffic]:
    """Data parallelism's step: one allreduce of the gradients, in messages of ``message_bytes``
    (a fusion buffer or bucket; 0: one message for all)."""
    grads = gradient_bytes(model)
    calls = max(1, math.ceil(grads / message_bytes)) if message_bytes else 1
    return [Traffic("allreduce", grads, calls)]


BACKENDS: Registry[type[Backend]] = Registry(
    "run.backend", "hpcdl.parallel.backends", key=lambda cls: cls.name, error=SpecError
)
SINGLE = "none"
"""the backend of a single process: nothing to reduce"""


def resolve_backend_name(name: str, world_size: int) -> str:
    """The backend a run of ``world_size`` ranks uses: ``auto`` is the available backend of
    lowest ``auto_priority`` (Horovod, then torch.distributed), or ``none`` for one rank;
    ``none`` only for one rank; a named backend must be available here."""
    if name == "auto":
        if world_size == 1:
            return SINGLE
        ranked = sorted(
            (cls.auto_priority, n)
            for n, cls in BACKENDS.items()
            if cls.auto_priority is not None and cls.unavailable() is None
        )
        if not ranked:
            raise SpecError("run.backend", name, "no backend for several ranks is available here")
        return ranked[0][1]
    cls = BACKENDS.get(name)
    if name == SINGLE and world_size > 1:
        raise SpecError("run.backend", name, f"a run of {world_size} ranks needs a backend that reduces")
    reason = cls.unavailable()
    if reason is not None:
        raise SpecError("run.backend", name, reason)
    return name


def backend_choices() -> list[str]:
    """Every name ``run.backend`` accepts."""
    return ["auto", *BACKENDS.names()]


def make_backend(name: str, world: World, device: torch.device) -> Backend:
    """Start the backend ``name`` (already resolved) for this rank."""
    return BACKENDS.get(name)(world, device)
