"""The gradient-reduction backend protocol and the choice among backends.

A backend adapts one communication library to the training loop: it wraps the model and
optimizer so that gradients are averaged across ranks, makes the ranks start from the same
weights, and exposes the communication still outstanding after backward as its own phase.
"""

from __future__ import annotations

import importlib.util
from typing import Protocol

import torch
from torch import nn

from hpcdl.errors import SpecError
from hpcdl.parallel.world import World

BACKENDS = ("auto", "horovod", "torch", "none")


class Backend(Protocol):
    name: str

    def wrap(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Model and optimizer whose gradients are averaged over all ranks, with every rank
        starting from rank 0's weights and optimizer state."""
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

    def close(self) -> None: ...


class NoBackend:
    """A single process: nothing to reduce."""

    name = "none"

    def wrap(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, optimizer

    def finish_reduction(self, optimizer: torch.optim.Optimizer) -> None:
        pass

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        scaler.step(optimizer)

    def allreduce(self, tensor: torch.Tensor) -> None:
        pass

    def close(self) -> None:
        pass


def horovod_available() -> bool:
    return importlib.util.find_spec("horovod") is not None


def resolve_backend_name(name: str, world_size: int) -> str:
    """``auto`` is Horovod when importable, else torch.distributed; ``none`` only for one rank."""
    if name not in BACKENDS:
        raise SpecError("run.backend", name, "allowed: " + ", ".join(BACKENDS))
    if name == "auto":
        return "none" if world_size == 1 else ("horovod" if horovod_available() else "torch")
    if name == "horovod" and not horovod_available():
        raise SpecError("run.backend", name, "Horovod is not installed (bash scripts/install_horovod.sh)")
    if name == "none" and world_size > 1:
        raise SpecError("run.backend", name, f"a run of {world_size} ranks needs horovod or torch")
    return name


def make_backend(name: str, world: World, device: torch.device) -> Backend:
    """Start the backend ``name`` (already resolved) for this rank."""
    if name == "horovod":
        from hpcdl.parallel.backends.horovod import HorovodBackend

        return HorovodBackend(world, device)
    if name == "torch":
        from hpcdl.parallel.backends.torch_ddp import TorchBackend

        return TorchBackend(world, device)
    return NoBackend()
