"""A gradient-reduction backend in one file outside the package: registered through
HPCDL_PLUGINS by tests/test_extensions.py. After backward it averages every gradient with one
blocking mpi4py Allreduce per parameter: no overlap, no fusion, but correct."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from hpcdl.parallel.backends import BACKENDS, MakeOptimizer, Wrapped
from hpcdl.parallel.world import World


@BACKENDS.register
class NaiveMpiBackend:
    name: ClassVar[str] = "naive-mpi"
    auto_priority: ClassVar[int | None] = None  # never chosen by backend=auto
    message_bytes: ClassVar[int] = 0
    exposed_method: ClassVar[str] = "allreduce phase: every gradient reduced after backward"

    def __init__(self, world: World, device: torch.device) -> None:
        self.comm: Any = world.comm
        self.size = world.size
        self.params: list[nn.Parameter] = []

    @staticmethod
    def unavailable() -> str | None:
        return None

    def wrap(self, model: nn.Module, make_optimizer: MakeOptimizer) -> Wrapped:
        self.params = list(model.parameters())
        with torch.no_grad():
            for p in self.params:  # every rank starts from rank 0's weights
                p.copy_(torch.from_numpy(self.comm.bcast(p.detach().cpu().numpy(), root=0)))
        return model, make_optimizer(self.params)

    def no_reduction(self, model: nn.Module) -> AbstractContextManager[object] | None:
        return None

    def finish_reduction(self, optimizer: torch.optim.Optimizer) -> None:
        from mpi4py import MPI

        for p in self.params:
            if p.grad is not None:
                buf = p.grad.detach().cpu().numpy().astype(np.float32, copy=True)
                self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
                p.grad.copy_(torch.from_numpy(buf / self.size))

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        scaler.step(optimizer)

    def allreduce(self, tensor: torch.Tensor) -> None:
        from mpi4py import MPI

        buf = tensor.detach().cpu().numpy().copy()
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        tensor.copy_(torch.from_numpy(buf))

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float:
        return reduction_s

    def close(self) -> None:
        pass
