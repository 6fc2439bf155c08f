"""A gradient-reduction backend in one file outside the package: registered through
HPCDL_PLUGINS by tests/test_extensions.py. After backward it averages every gradient with one
blocking mpi4py Allreduce per parameter: no overlap, no fusion, but correct. Its other
collectives are mpi4py's on numpy copies; rank-local parameters (experts sharded across
ranks) are neither broadcast nor reduced. It holds a replica of the model on every rank: the
protocol's data-parallel rules come from ``Replicated``."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from hpcdl.parallel.backends import BACKENDS, MakeOptimizer, Traffic, Wrapped, gradient_bytes
from hpcdl.parallel.backends.replicated import Replicated
from hpcdl.parallel.placement import shared_parameters
from hpcdl.parallel.world import World


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().contiguous().numpy().copy()


@BACKENDS.register
class NaiveMpiBackend(Replicated):
    name: ClassVar[str] = "naive-mpi"
    auto_priority: ClassVar[int | None] = None  # never chosen by backend=auto
    shards_state: ClassVar[bool] = False
    keeps_gradients: ClassVar[bool] = False  # its gradients are freed with each step (zero_grad)
    exposed_method: ClassVar[str] = "allreduce phase: every gradient reduced after backward"
    compute_only_method: ClassVar[str] = "median forward + median backward (reduction comes after)"

    def __init__(self, world: World, device: torch.device) -> None:
        self.comm: Any = world.comm
        self.size = world.size
        self.params: list[nn.Parameter] = []

    @staticmethod
    def unavailable() -> str | None:
        return None

    def wrap(self, model: nn.Module, make_optimizer: MakeOptimizer, accumulation_steps: int = 1) -> Wrapped:
        self.params = [p for _, p in shared_parameters(model)]
        with torch.no_grad():
            for p in self.params:  # every rank starts from rank 0's weights
                p.copy_(torch.from_numpy(self.comm.bcast(p.detach().cpu().numpy(), root=0)))
        return model, make_optimizer(model.parameters())

    def accumulating(self, model: nn.Module) -> AbstractContextManager[object]:
        return nullcontext()  # backward reduces nothing: finish_reduction reduces the step's sum

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

        buf = _numpy(tensor)
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        tensor.copy_(torch.from_numpy(buf))

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        buf = _numpy(tensor)
        out = np.empty((self.size * buf.shape[0], *buf.shape[1:]), dtype=buf.dtype)
        self.comm.Allgather(buf, out)
        return torch.from_numpy(out).to(tensor.device)

    def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        buf = _numpy(tensor)
        out = np.empty((buf.shape[0] // self.size, *buf.shape[1:]), dtype=buf.dtype)
        self.comm.Reduce_scatter_block(buf, out)
        return torch.from_numpy(out).to(tensor.device)

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        buf = _numpy(tensor)
        out = np.empty_like(buf)
        self.comm.Alltoall(buf, out)
        return torch.from_numpy(out).to(tensor.device)

    @staticmethod
    def traffic(model: nn.Module, accumulation_steps: int = 1) -> list[Traffic]:
        params = [p for _, p in shared_parameters(model) if p.requires_grad]
        return [Traffic("allreduce", gradient_bytes(model), len(params))]

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float | None:
        return reduction_s

    @staticmethod
    def compute_only_s(forward_s: float, backward_s: float, local_backward_s: float | None) -> float | None:
        return forward_s + backward_s  # it reduces after backward, in the allreduce phase

    def close(self) -> None:
        pass
