"""The backend of a single process: nothing to reduce."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import ClassVar

import torch
from torch import nn

from hpcdl.parallel.backends import BACKENDS, SINGLE, MakeOptimizer
from hpcdl.parallel.world import World


@BACKENDS.register
class SingleProcess:
    name: ClassVar[str] = SINGLE
    auto_priority: ClassVar[int | None] = None
    message_bytes: ClassVar[int] = 0
    exposed_method: ClassVar[str] = "none"

    def __init__(self, world: World | None = None, device: torch.device | None = None) -> None:
        pass

    @staticmethod
    def unavailable() -> str | None:
        return None

    def wrap(
        self, model: nn.Module, make_optimizer: MakeOptimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, make_optimizer(model.parameters())

    def no_reduction(self, model: nn.Module) -> AbstractContextManager[object] | None:
        return None

    def finish_reduction(self, optimizer: torch.optim.Optimizer) -> None:
        pass

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        scaler.step(optimizer)

    def allreduce(self, tensor: torch.Tensor) -> None:
        pass

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float:
        return 0.0

    def close(self) -> None:
        pass
