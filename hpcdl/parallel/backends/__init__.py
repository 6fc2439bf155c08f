"""Gradient-reduction backends: the protocol every backend follows, the registry, and the choice
among them.

A backend adapts one communication library to the training loop: it wraps the model and makes
its optimizer so that gradients are averaged across ranks, starts every rank from the same
weights, exposes the communication still outstanding after backward as its own phase, and owns
the rules that depend on how it communicates (how many bytes travel per message, how its
exposed communication time is measured). A backend is one file in this folder, or a plugin
(``hpcdl.plugins``), that registers its class with ``@BACKENDS.register``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import ClassVar, Protocol

import torch
from torch import nn

from hpcdl.errors import SpecError
from hpcdl.parallel.world import World
from hpcdl.plugins import Registry

MakeOptimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
"""builds the run's optimizer over the parameters it is given (a backend that shards or wraps
parameters must make the optimizer over its own)"""
Wrapped = tuple[nn.Module, torch.optim.Optimizer]
"""the model and optimizer a backend hands the training loop"""


class Backend(Protocol):
    name: ClassVar[str]
    auto_priority: ClassVar[int | None]
    """order in which ``backend=auto`` tries backends (lowest first); None: never by auto"""
    message_bytes: ClassVar[int]
    """gradient bytes per reduction message (fusion buffer, bucket); 0: one message for all"""
    exposed_method: ClassVar[str]
    """how ``exposed_s`` measures communication not hidden behind computation (for records)"""

    def __init__(self, world: World, device: torch.device) -> None: ...

    @staticmethod
    def unavailable() -> str | None:
        """Why this backend cannot run here (e.g. its library is not installed), or None."""
        ...

    def wrap(
        self, model: nn.Module, make_optimizer: MakeOptimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Model and optimizer whose gradients are averaged over all ranks, with every rank
        starting from rank 0's weights and optimizer state."""
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

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float:
        """Median communication time not hidden behind computation, from the median backward
        time, the median backward time without reduction (None when not measured) and the
        median of the reduction phase (``finish_reduction``)."""
        ...

    def close(self) -> None: ...


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
