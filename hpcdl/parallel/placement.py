"""Where a model's parameters live across the ranks of a run, and the blocking collectives
called inside a training step.

A parameter is *replicated* (every rank holds the same tensor: data parallelism), *sharded*
(each rank holds 1/N of it: FSDP's DTensors) or *rank-local* (one rank alone holds it:
experts sharded across ranks, ``hpcdl.workloads.moe``). Layers that hold rank-local
parameters follow :class:`SpreadsAcrossRanks`; :func:`spread` places them before a backend
wraps the model, and backends leave the parameters :func:`rank_local` names alone.
:func:`full_parameters` gathers all three kinds back into whole tensors (for the checks).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn

from hpcdl.clock import Mark, StepClock
from hpcdl.workloads.moe import AllToAll


class Collectives(Protocol):
    """The blocking collectives placement calls: those of every ``Backend``
    (``hpcdl.parallel.backends``, which builds on this module)."""

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor: ...
    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class SpreadsAcrossRanks(Protocol):
    """A layer whose parameters may be divided among the ranks (mixture-of-experts layers)."""

    def spread(self, rank: int, ranks: int, all_to_all: AllToAll | None) -> None:
        """Keep only this rank's part of the parameters and exchange data with ``all_to_all``
        (None: place only, as on the meta device for the scaling model)."""
        ...

    def rank_local_parameters(self) -> list[nn.Parameter]:
        """The parameters only this rank holds (empty until spread, or when it keeps all)."""
        ...


@dataclass
class InStepCollectives:
    """The blocking collectives that layers call inside a training step (the experts'
    all-to-all): their bytes (nccl-tests' size: one rank's send buffer) and calls so far, and
    their seconds, by the phase the loop said it was in (``phase``), between marks of the step's
    clock, read once the step has ended (:meth:`take`): nothing waits for the device here."""

    device: torch.device
    bytes: int = 0
    calls: int = 0
    phase: str = ""
    clock: StepClock = field(init=False)
    _pending: list[tuple[str, Mark, Mark]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.clock = StepClock(self.device)

    def timed(self, op: AllToAll) -> AllToAll:
        """``op`` between two marks, its size counted here."""

        def run(tensor: torch.Tensor) -> torch.Tensor:
            start = self.clock.mark()
            out = op(tensor)
            self._pending.append((self.phase, start, self.clock.mark()))
            self.bytes += tensor.numel() * tensor.element_size()
            self.calls += 1
            return out

        return run

    def take(self) -> dict[str, float]:
        """Seconds in the collectives by phase since the last take; call it after the device's
        work of the step has ended (the step's synchronisation)."""
        spent: dict[str, float] = {}
        for phase, a, b in self._pending:
            spent[phase] = spent.get(phase, 0.0) + self.clock.seconds(a, b)
            self.clock.recycle(a, b)
        self._pending.clear()
        return spent


def _spreading(model: nn.Module) -> Iterator[SpreadsAcrossRanks]:
    return (m for m in model.modules() if isinstance(m, SpreadsAcrossRanks))


def spread(
    model: nn.Module, rank: int, ranks: int, backend: Collectives | None, device: torch.device
) -> InStepCollectives:
    """Place every layer that can divide its parameters among ``ranks`` ranks, with its
    collectives going through ``backend`` (None: place only) and timed in what it returns."""
    clock = InStepCollectives(device)
    op = clock.timed(backend.all_to_all) if backend is not None and ranks > 1 else None
    for layer in _spreading(model):
        layer.spread(rank, ranks, op)
    return clock


def rank_local(model: nn.Module) -> set[int]:
    """``id()`` of every parameter only this rank holds: backends neither broadcast nor reduce
    them (their layers scale the gradients themselves)."""
    return {id(p) for layer in _spreading(model) for p in layer.rank_local_parameters()}


def shared_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The named parameters every rank holds a copy or a shard of: all but the rank-local ones."""
    local = rank_local(model)
    return [(n, p) for n, p in model.named_parameters() if id(p) not in local]


def shared_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state (parameters and buffers) but its rank-local parameters: what every
    rank takes from rank 0 before training."""
    local = rank_local(model)
    local_names = {n for n, p in model.named_parameters() if id(p) in local}
    return {k: v for k, v in model.state_dict().items() if k not in local_names}


def full_parameters(model: nn.Module, backend: Collectives) -> list[tuple[str, torch.Tensor]]:
    """Every parameter of ``model`` whole, by name, on every rank: shards gathered (FSDP's
    DTensors), rank-local parameters gathered along dimension 0 in rank order through the
    backend, replicated ones as they are. Collective: every rank must call it."""
    from torch.distributed.tensor import DTensor  # FSDP's shards and tensor parallelism's

    local = rank_local(model)
    out = []
    for name, p in model.named_parameters():
        t = p.detach()
        if isinstance(t, DTensor):
            t = t.full_tensor()
        elif id(p) in local:
            t = backend.all_gather(t.contiguous()).reshape(-1, *t.shape[1:])
        out.append((name, t))
    return out


def average_across(grads: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Average ``grads`` in place over the ranks of ``group`` in one flat allreduce (data
    parallelism on a sub-group after backward: tensor parallelism's replicas, a pipeline
    stage's). Collective: every rank of ``group`` must call it with the same shapes."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
