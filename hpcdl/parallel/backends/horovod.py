"""Horovod: the reference HPC path. Gradients are allreduced by hooks as backward produces
them (overlapped), and ``synchronize()`` waits for the rest: that wait is the exposed phase."""

from __future__ import annotations

import horovod.torch as hvd
import torch
from torch import nn

from hpcdl.errors import HpcdlError
from hpcdl.parallel.world import World


class HorovodBackend:
    name = "horovod"

    def __init__(self, world: World, device: torch.device) -> None:
        hvd.init()
        if hvd.size() != world.size or hvd.rank() != world.rank:
            raise HpcdlError(
                f"horovod sees rank {hvd.rank()} of {hvd.size()}, MPI rank {world.rank} of {world.size}"
            )
        if device.type == "cuda":
            torch.cuda.set_device(device)

    def wrap(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        # The optimizer has no state yet (nothing to broadcast; broadcast_optimizer_state would
        # take a zero-gradient step to create it, which weight decay turns into an update).
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        wrapped = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), op=hvd.Average
        )
        return model, wrapped

    def finish_reduction(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.synchronize()  # type: ignore[attr-defined]

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        with optimizer.skip_synchronize():  # type: ignore[attr-defined]
            scaler.step(optimizer)

    def allreduce(self, tensor: torch.Tensor) -> None:
        hvd.allreduce_(tensor, op=hvd.Sum)

    def close(self) -> None:
        hvd.shutdown()
