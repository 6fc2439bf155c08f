"""Fully sharded data parallelism (FSDP2, ``torch.distributed.fsdp.fully_shard``) over the
torch.distributed process group: NCCL on GPUs, gloo on CPUs.

Every rank holds 1/N of each parameter, of its gradient and of the optimizer state. Each block
of the generated model (:func:`units`) is one FSDP unit: its parameters are all-gathered just
before its forward and again before its backward, and its gradients reduce-scattered as soon
as its backward ends; the rest of the model (embeddings, heads) is the root unit, which stays
gathered from forward to backward. Parameters that are rank-local (experts sharded across
ranks) are left out of the units: they are this rank's alone already.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn

from hpcdl.parallel.backends import BACKENDS, MakeOptimizer, Traffic, Wrapped
from hpcdl.parallel.backends.torch_ddp import DistGroup
from hpcdl.parallel.placement import rank_local, shared_state

CONTAINERS = (nn.Sequential, nn.ModuleList)


def units(model: nn.Module) -> list[nn.Module]:
    """The blocks of a generated model, each one FSDP unit: the elements that hold parameters of
    the outermost ``nn.Sequential`` or ``nn.ModuleList`` on every path from the root (a
    transformer's blocks, an MLP's layers, a CNN's stages and blocks, a speech model's
    convolutions). What no block holds belongs to the root unit."""
    if isinstance(model, CONTAINERS):
        return [m for m in model if next(m.parameters(), None) is not None]
    return [u for child in model.children() for u in units(child)]


@contextmanager
def _without_gradient_sync(model: nn.Module) -> Iterator[None]:
    """FSDP2's gradient accumulation without communication (``set_requires_gradient_sync``,
    FSDP1's ``no_sync``): every unit keeps its unsharded gradients, summed over the
    micro-batches, and skips its reduce-scatter; the all-gathers still run."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


@BACKENDS.register
class FsdpBackend(DistGroup):
    name: ClassVar[str] = "fsdp"
    auto_priority: ClassVar[int | None] = None  # sharding is chosen, never the default
    shards_state: ClassVar[bool] = True
    keeps_gradients: ClassVar[bool] = False
    exposed_method: ClassVar[str] = (
        "not measured: FSDP's all-gathers and reduce-scatters run inside forward and backward"
    )
    compute_only_method: ClassVar[str] = (
        "not measured: every unit's forward and backward starts with an all-gather from every rank"
    )

    @staticmethod
    def unavailable() -> str | None:
        if not dist.is_available():
            return "this torch build has no torch.distributed, which FSDP needs"
        try:
            from torch.distributed.fsdp import fully_shard  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} lacks torch.distributed.fsdp.fully_shard (FSDP2, torch >= 2.6)"
        return None

    def wrap(self, model: nn.Module, make_optimizer: MakeOptimizer, accumulation_steps: int = 1) -> Wrapped:
        from torch.distributed.fsdp import fully_shard

        local = rank_local(model)
        ignored = {p for p in model.parameters() if id(p) in local}
        for t in shared_state(model).values():  # rank 0's weights (FSDP2 does not broadcast)
            dist.broadcast(t, src=0)
        for unit in units(model):
            fully_shard(unit, ignored_params=ignored)
        fully_shard(model, ignored_params=ignored)
        # made after sharding: the optimizer state is created for this rank's shards only
        return model, make_optimizer(model.parameters())

    def accumulating(self, model: nn.Module) -> AbstractContextManager[object]:
        return _without_gradient_sync(model)

    def no_reduction(self, model: nn.Module) -> AbstractContextManager[object] | None:
        # set_requires_gradient_sync(False) would skip the reduce-scatters but not the
        # all-gathers, which wait for every rank: no timing of computation alone
        return None

    def finish_reduction(self, optimizer: torch.optim.Optimizer) -> None:
        pass  # FSDP's backward returns once its last reduce-scatter is done

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        scaler.step(optimizer)

    @staticmethod
    def traffic(model: nn.Module, accumulation_steps: int = 1) -> list[Traffic]:
        local = rank_local(model)

        def nbytes(m: nn.Module) -> int:
            return sum(p.numel() * p.element_size() for p in m.parameters() if id(p) not in local)

        blocks = [nbytes(u) for u in units(model)]
        root = nbytes(model) - sum(blocks)
        groups = len(blocks) + (root > 0)
        # forward gathers every unit; backward gathers the blocks again (the root stays gathered),
        # in every micro-batch; the gradients are reduce-scattered once per step
        n = accumulation_steps
        return [
            Traffic("all_gather", n * (root + 2 * sum(blocks)), n * (groups + len(blocks))),
            Traffic("reduce_scatter", root + sum(blocks), groups),
        ]

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float | None:
        return None

    @staticmethod
    def compute_only_s(forward_s: float, backward_s: float, local_backward_s: float | None) -> float | None:
        return None
