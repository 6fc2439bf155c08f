"""Horovod: the reference HPC path. Gradients are allreduced by hooks as backward produces
them (overlapped), and ``synchronize()`` waits for the rest: that wait is the exposed phase."""

from __future__ import annotations

import importlib.util
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

import torch
from torch import nn

from hpcdl.errors import HpcdlError
from hpcdl.parallel.backends import BACKENDS, MakeOptimizer, Traffic, Wrapped, allreduce_traffic
from hpcdl.parallel.backends.replicated import Replicated
from hpcdl.parallel.placement import rank_local, shared_parameters, shared_state
from hpcdl.parallel.world import World


@BACKENDS.register
class HorovodBackend(Replicated):
    name: ClassVar[str] = "horovod"
    auto_priority: ClassVar[int | None] = 0
    shards_state: ClassVar[bool] = False
    keeps_gradients: ClassVar[bool] = False
    MESSAGE_BYTES: ClassVar[int] = 128 << 20
    """Horovod's tensor fusion buffer: HOROVOD_FUSION_THRESHOLD's default in the release hpcdl
    installs (0.28.1: ``SetTensorFusionThresholdBytes(128 * 1024 * 1024)`` in
    horovod/common/operations.cc; the 2017 releases had 64 MB)"""
    cycle_s: ClassVar[float] = 1e-3
    """``HOROVOD_CYCLE_TIME``'s default in the release hpcdl installs (0.28.1:
    ``SetCycleTimeMs(1)`` in horovod/common/operations.cc; the 2017 releases had 5 ms)"""
    exposed_method: ClassVar[str] = "allreduce phase: optimizer.synchronize() after backward"
    compute_only_method: ClassVar[str] = (
        "median forward + median backward (the hooks only enqueue reductions)"
    )

    def __init__(self, world: World, device: torch.device) -> None:
        import horovod.torch as hvd  # here, not at import: the registry imports every backend

        self.hvd: Any = hvd
        hvd.init(comm=world.comm)  # the run's ranks: all of MPI's, or one capacity instance's
        if hvd.size() != world.size or hvd.rank() != world.rank:
            raise HpcdlError(
                f"horovod sees rank {hvd.rank()} of {hvd.size()}, MPI rank {world.rank} of {world.size}"
            )
        if device.type == "cuda":
            if not hvd.nccl_built():
                # without NCCL Horovod would stage every GPU tensor through host memory (or fail
                # where MPI is not CUDA-aware): a figure of that path is not Horovod on GPUs
                raise HpcdlError(
                    "horovod was built without NCCL: rebuild it on a GPU node with "
                    "HPCDL_HOROVOD_GPU=1 bash scripts/install_horovod.sh"
                )
            torch.cuda.set_device(device)

    @staticmethod
    def unavailable() -> str | None:
        if importlib.util.find_spec("horovod") is None:
            return "Horovod is not installed (bash scripts/install_horovod.sh)"
        return None

    def wrap(self, model: nn.Module, make_optimizer: MakeOptimizer, accumulation_steps: int = 1) -> Wrapped:
        # The optimizer has no state yet (nothing to broadcast; broadcast_optimizer_state would
        # take a zero-gradient step to create it, which weight decay turns into an update).
        # Rank-local parameters are neither broadcast nor reduced: Horovod hooks every
        # parameter of the optimizer it wraps, so they join it as a param group afterwards.
        hvd = self.hvd
        shared, local_ids = shared_parameters(model), rank_local(model)
        local = [p for p in model.parameters() if id(p) in local_ids]
        hvd.broadcast_parameters(shared_state(model), root_rank=0)
        # backward_passes_per_step: each parameter's hook counts the backward passes of a step
        # and enqueues its allreduce on the last one only (gradient accumulation)
        optimizer = hvd.DistributedOptimizer(
            make_optimizer(p for _, p in shared),
            named_parameters=shared,
            op=hvd.Average,
            backward_passes_per_step=accumulation_steps,
        )
        if local:  # with the run's hyperparameters: the rebuilt optimizer's defaults are the class's
            settings = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
            optimizer.add_param_group({**settings, "params": local})
        return model, optimizer

    def accumulating(self, model: nn.Module) -> AbstractContextManager[object]:
        return nullcontext()  # the optimizer's backward_passes_per_step holds the allreduces back

    def no_reduction(self, model: nn.Module) -> AbstractContextManager[object] | None:
        return None  # Horovod's hooks reduce every gradient backward produces

    def finish_reduction(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.synchronize()  # type: ignore[attr-defined]

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        with optimizer.skip_synchronize():  # type: ignore[attr-defined]
            scaler.step(optimizer)

    # Blocking collectives, named: Horovod matches a tensor across ranks by its name, and an
    # unnamed call gets a per-process counter that diverges once ranks' call sequences differ.
    def allreduce(self, tensor: torch.Tensor) -> None:
        self.hvd.allreduce_(tensor, op=self.hvd.Sum, name="hpcdl.allreduce")

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hvd.allgather(tensor, name="hpcdl.all_gather")  # type: ignore[no-any-return]

    def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hvd.reducescatter(tensor, op=self.hvd.Sum, name="hpcdl.reduce_scatter")  # type: ignore[no-any-return]

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hvd.alltoall(tensor, name="hpcdl.all_to_all")  # type: ignore[no-any-return]

    @staticmethod
    def traffic(model: nn.Module, accumulation_steps: int = 1) -> list[Traffic]:
        return allreduce_traffic(model, HorovodBackend.MESSAGE_BYTES)  # once per step

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float | None:
        return reduction_s

    @staticmethod
    def compute_only_s(forward_s: float, backward_s: float, local_backward_s: float | None) -> float | None:
        # the hooks only enqueue reductions: backward does not wait, synchronize() does
        return forward_s + backward_s

    def close(self) -> None:
        self.hvd.shutdown()
