"""The backend of a single process: nothing to reduce."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import ClassVar

import torch
from torch import nn

from hpcdl.parallel.backends import BACKENDS, SINGLE, MakeOptimizer, Traffic, Wrapped
from hpcdl.parallel.backends.replicated import Replicated
from hpcdl.parallel.world import World


@BACKENDS.register
class SingleProcess(Replicated):
    name: ClassVar[str] = SINGLE
    auto_priority: ClassVar[int | None] = None
    shards_state: ClassVar[bool] = False
    keeps_gradients: ClassVar[bool] = False
    exposed_method: ClassVar[str] = "none"
    compute_only_method: ClassVar[str] = "median forward + median backward"

    def __init__(self, world: World | None = None, device: torch.device | None = None) -> None:
        pass

    @staticmethod
    def unavailable() -> str | None:
        return None

    def wrap(self, model: nn.Module, make_optimizer: MakeOptimizer, accumulation_steps: int = 1) -> Wrapped:
        return model, make_optimizer(model.parameters())

    def accumulating(self, model: nn.Module) -> AbstractContextManager[object]:
        return nullcontext()  # gradients sum in .grad; nothing to reduce

    def no_reduction(self, model: nn.Module) -> AbstractContextManager[object] | None:
        return None

    def finish_reduction(self, optimizer: torch.optim.Optimizer) -> None:
        pass

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        scaler.step(optimizer)

    def allreduce(self, tensor: torch.Tensor) -> None:
        pass

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()

    def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()

    @staticmethod
    def traffic(model: nn.Module, accumulation_steps: int = 1) -> list[Traffic]:
        return []

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float | None:
        return 0.0

    @staticmethod
    def compute_only_s(forward_s: float, backward_s: float, local_backward_s: float | None) -> float | None:
        return forward_s + backward_s

    def close(self) -> None:
        pass
