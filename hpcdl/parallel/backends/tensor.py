"""Tensor parallelism inside each ``tp`` group of a run's layout, gradients averaged across its
``dp`` replicas (``hpcdl.parallel.tensor`` says how layers are split and what a step moves)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from hpcdl.parallel.backends import BACKENDS, MakeOptimizer, Traffic, Wrapped
from hpcdl.parallel.backends.torch_ddp import DistGroup
from hpcdl.parallel.layout import Layout, device_mesh, fit_layout
from hpcdl.parallel.placement import average_across
from hpcdl.parallel.tensor import local_tensor, split, time_collective, tp_traffic
from hpcdl.parallel.world import World

if TYPE_CHECKING:
    from hpcdl.workloads.spec import Spec


@BACKENDS.register
class TensorParallel(DistGroup):
    """Tensor parallelism inside each ``tp`` group of a layout, gradients averaged across the
    ``dp`` replicas; the world's blocking collectives as ``torch``'s. Chosen by a layout with
    tp > 1 (``--layout``), never by ``backend=auto``; named alone it is plain data parallelism."""

    name: ClassVar[str] = "tensor"
    auto_priority: ClassVar[int | None] = None
    shards_state: ClassVar[bool] = False
    keeps_gradients: ClassVar[bool] = False
    compiles_after_wrap: ClassVar[bool] = True
    """torch.compile traces the layers as parallelize_module split them (torchtitan's order)"""
    exposed_method: ClassVar[str] = (
        "median of the allreduce phase (one flat allreduce of the dp replicas' gradients)"
    )
    compute_only_method: ClassVar[str] = (
        "not measured: the tensor-parallel allreduces inside forward and backward wait for the group"
    )

    def __init__(
        self, world: World, device: torch.device, layout: Layout | None = None, spec: Spec | None = None
    ) -> None:
        """``spec``: the workload, whose family's plan splits its layers (``Spec.tp_splits``);
        needed with tp > 1."""
        super().__init__(world, device)
        try:
            self.layout = fit_layout(layout or Layout(), world.size)
            self.rank, self.spec = world.rank, spec
            self.mesh = device_mesh(self.layout, device.type)
            self.tp_group = self.mesh["tp"].get_group()
            self.dp_group = self.mesh["dp"].get_group()
        except BaseException:  # the run's finally never sees a backend it was not handed
            self.close()
            raise

    def streams(self, rank: int, ranks: int) -> tuple[int, int]:
        """A tp group reads one stream: its dp coordinate's, of the layout's dp."""
        return self.layout.coords(rank)["dp"], self.layout.dp

    def wrap(self, model: nn.Module, make_optimizer: MakeOptimizer, accumulation_steps: int = 1) -> Wrapped:
        # every rank built the same weights from the spec's seed; the dp replicas still take
        # their first rank's, as DDP would, so that no build difference can go unseen
        if self.layout.tp > 1:
            assert self.spec is not None, "tensor parallelism splits a spec's model: start it with the spec"
            split(self.spec, model, self.mesh["tp"])
        if self.layout.dp > 1:
            source = self.layout.dp_group(self.rank)[0]
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(local_tensor(t.detach()), src=source, group=self.dp_group)
        return model, make_optimizer(model.parameters())

    def accumulating(self, model: nn.Module) -> AbstractContextManager[object]:
        return nullcontext()  # gradients are reduced once, in finish_reduction

    def no_reduction(self, model: nn.Module) -> AbstractContextManager[object] | None:
        return None  # backward's tensor-parallel allreduces cannot be switched off

    def finish_reduction(self, optimizer: torch.optim.Optimizer) -> None:
        if self.layout.dp == 1:
            return
        params = [p for g in optimizer.param_groups for p in g["params"]]
        average_across([local_tensor(p.grad) for p in params if p.grad is not None], self.dp_group)

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        scaler.step(optimizer)

    @staticmethod
    def traffic(model: nn.Module, accumulation_steps: int = 1) -> list[Traffic]:
        """The dp replicas' one flat allreduce of this rank's gradients (its shards under
        tensor parallelism: call it on the wrapped model)."""
        grads = sum(local_tensor(p).numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        return [Traffic("allreduce", grads, 1)]

    def step_traffic(self, model: nn.Module, spec: Spec) -> list[Traffic]:
        """``allreduce`` (the dp replicas' gradients, when dp > 1) and ``tp.allreduce`` (tensor
        parallelism's, when tp > 1), of this rank's shards."""
        out = [self.traffic(model)[0]] if self.layout.dp > 1 else []
        tp = [Traffic(f"tp.{t.collective}", t.bytes, t.calls) for t in tp_traffic(spec, self.layout.tp)]
        return out + tp

    def reduced_bytes(self, model: nn.Module) -> int:
        """The shards' gradients, reduced across the dp replicas only (none with dp = 1)."""
        return self.traffic(model)[0].bytes if self.layout.dp > 1 else 0

    def time_traffic(self, traffic: list[Traffic], world: World, device: torch.device) -> dict[str, float]:
        """Each collective on its group: ``tp.*`` over the tp group, the rest over the dp replicas."""

        def group(name: str) -> dist.ProcessGroup:
            return self.tp_group if name.startswith("tp.") else self.dp_group

        return {t.collective: time_collective(t, group(t.collective), device) for t in traffic}

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float | None:
        return reduction_s  # the dp allreduce runs after backward, alone

    @staticmethod
    def compute_only_s(forward_s: float, backward_s: float, local_backward_s: float | None) -> float | None:
        return None
