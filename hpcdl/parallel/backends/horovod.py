"""Horovod: the reference HPC path. Gradients are allreduced by hooks as backward produces
them (overlapped), and ``synchronize()`` waits for the rest: that wait is the exposed phase."""

from __future__ import annotations

import importlib.util
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from torch import nn

from hpcdl.errors import HpcdlError
from hpcdl.parallel.backends import BACKENDS, MakeOptimizer
from hpcdl.parallel.world import World


@BACKENDS.register
class HorovodBackend:
    name: ClassVar[str] = "horovod"
    auto_priority: ClassVar[int | None] = 0
    message_bytes: ClassVar[int] = 64 << 20
    """Horovod's tensor fusion buffer (HOROVOD_FUSION_THRESHOLD's default)"""
    exposed_method: ClassVar[str] = "allreduce phase: optimizer.synchronize() after backward"

    def __init__(self, world: World, device: torch.device) -> None:
        import horovod.torch as hvd  # here, not at import: the registry imports every backend

        self.hvd: Any = hvd
        hvd.init(comm=world.comm)  # the run's ranks: all of MPI's, or one capacity instance's
        if hvd.size() != world.size or hvd.rank() != world.rank:
            raise HpcdlError(
                f"horovod sees rank {hvd.rank()} of {hvd.size()}, MPI rank {world.rank} of {world.size}"
            )
        if device.type == "cuda":
            torch.cuda.set_device(device)

    @staticmethod
    def unavailable() -> str | None:
        if importlib.util.find_spec("horovod") is None:
            return "Horovod is not installed (bash scripts/install_horovod.sh)"
        return None

    def wrap(
        self, model: nn.Module, make_optimizer: MakeOptimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        # The optimizer has no state yet (nothing to broadcast; broadcast_optimizer_state would
        # take a zero-gradient step to create it, which weight decay turns into an update).
        hvd = self.hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = make_optimizer(model.parameters())
        wrapped = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), op=hvd.Average
        )
        return model, wrapped

    def no_reduction(self, model: nn.Module) -> AbstractContextManager[object] | None:
        return None  # Horovod's hooks reduce every gradient backward produces

    def finish_reduction(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.synchronize()  # type: ignore[attr-defined]

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        with optimizer.skip_synchronize():  # type: ignore[attr-defined]
            scaler.step(optimizer)

    def allreduce(self, tensor: torch.Tensor) -> None:
        self.hvd.allreduce_(tensor, op=self.hvd.Sum)

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float:
        return reduction_s

    def close(self) -> None:
        self.hvd.shutdown()
