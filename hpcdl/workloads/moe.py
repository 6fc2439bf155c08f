"""Mixture-of-experts feed-forward layers (GShard / Switch style): the one place they are built
and counted, for the families that offer them (``attention``: knobs ``experts``, ``top_k``,
``capacity_factor``, ``expert_parallel``).

A router (a bias-free linear layer) scores every token against the ``experts``; each token goes
to its ``top_k`` best experts, weighted by their softmax probabilities. Each expert is a
bias-free two-layer feed-forward network (width -> hidden -> width). Experts take at most
``capacity = ceil(capacity_factor * seq_len * top_k / experts)`` tokens of each sequence
(GShard's groups, here one sequence each, so that routing never depends on how the batch is
split among ranks); the first choices of all tokens queue before the second choices, in token
order, and a token over capacity skips that expert (its residual carries it). Routing has no
random part: the router's weights come from the spec's seed, so runs route alike.

**Expert parallelism** (``expert_parallel``, ``experts`` a multiple of the ranks): each rank
keeps ``experts / ranks`` of them. Every rank's capacity slots go to the experts' ranks through
the backend's all-to-all, come back the same way, and the gradients of a rank's experts, which
hold the contributions of every rank's tokens, are divided by the ranks (the data-parallel
average); backends neither broadcast nor reduce these rank-local weights.

Counting convention (docs/metrics.md, "Counting"): parameters are every expert's; FLOPs are the **active**
experts' work per token: the router ``2·T·d·E`` and ``top_k`` experts per token,
``2·T·k·(d·h + h·d)`` forward, both twice again backward. The slots a full expert buffer holds
beyond that (``capacity_factor`` > 1 pads the buffers) are computed but not counted, so that
MFU measures useful work; at ``capacity_factor`` = 1 with ``seq_len·top_k`` a multiple of
``experts`` the buffers hold exactly ``T·k`` slots and what runs is what is counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from hpcdl.errors import SpecError
from hpcdl.workloads.counting import Tally
from hpcdl.workloads.precision import precision

AllToAll = Callable[[torch.Tensor], torch.Tensor]
"""an all-to-all of equal chunks along dimension 0 (``Backend.all_to_all``); layers make it
differentiable themselves"""


@runtime_checkable
class MoEKnobs(Protocol):
    """The knobs of a family that has mixture-of-experts layers."""

    @property
    def family(self) -> str: ...
    @property
    def width(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def ffn_hidden(self) -> int: ...
    @property
    def experts(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    @property
    def capacity_factor(self) -> float: ...
    @property
    def expert_parallel(self) -> bool: ...


KNOBS = ("experts", "top_k", "capacity_factor", "expert_parallel")


def check(spec: MoEKnobs) -> None:
    """A spec's mixture-of-experts knobs, each with the others."""
    if spec.experts and spec.top_k > spec.experts:
        raise SpecError(f"{spec.family}.top_k", spec.top_k, f"must be <= experts={spec.experts}")


def check_ranks(spec: Any, ranks: int) -> None:
    """Refuse expert parallelism that the rank count cannot divide (before anything runs)."""
    if not isinstance(spec, MoEKnobs) or not (spec.experts and spec.expert_parallel) or ranks == 1:
        return
    if spec.experts % ranks:
        raise SpecError(
            f"{spec.family}.experts",
            spec.experts,
            f"must be a positive multiple of the {ranks} ranks with expert_parallel=true "
            "(or expert_parallel=false: every rank holds every expert)",
        )


def without_dense_defaults(knobs: dict[str, Any]) -> dict[str, Any]:
    """A spec's dict without the mixture-of-experts knobs when it has no experts: a dense
    spec's dict (its records, the suites) is what it was before these knobs existed."""
    return {k: v for k, v in knobs.items() if k not in KNOBS} if not knobs.get("experts") else knobs


def capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert and sequence: ceil(capacity_factor · tokens · top_k / experts)."""
    return max(1, math.ceil(capacity_factor * tokens * top_k / experts))


def count(t: Tally, spec: MoEKnobs) -> None:
    """One mixture-of-experts layer over a sequence: router, every expert's parameters, the
    active experts' FLOPs (see the module's docstring) and the buffers kept for backward."""
    T, d, h, E, k = spec.seq_len, spec.width, spec.ffn_hidden, spec.experts, spec.top_k
    slots = E * capacity(T, E, k, spec.capacity_factor)
    t.linear(T, d, E, bias=False)  # the router; keeps its logits
    t.add_params(E * 2 * d * h)
    t.matmul(T * k, d, h)
    t.matmul(T * k, h, d)
    # an expert's second product's backward: its output's and its input's gradients, and the
    # experts' weight gradients
    t.transient(slots * (d + h))
    # softmax output, the slots in, the hidden units before and after the activation, the
    # experts' outputs gathered back per token
    t.keep(T * E + slots * (d + 2 * h) + T * k * d)


def dispatch_bytes(spec: MoEKnobs, sequences: int, precision_name: str) -> int:
    """One rank's send buffer of one all-to-all of one layer: every slot of every expert for
    ``sequences`` sequences, in the compute precision."""
    slots = spec.experts * capacity(spec.seq_len, spec.experts, spec.top_k, spec.capacity_factor)
    return sequences * slots * spec.width * precision(precision_name).bytes


ALL_TO_ALLS_PER_LAYER = 4
"""dispatch and combine forward, and the same two in backward"""


class _AllToAll(torch.autograd.Function):
    """An all-to-all of equal chunks, differentiable: its backward is the same exchange of the
    gradients (chunk j went to rank j, so the gradient of chunk j comes back from rank j)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, op: AllToAll) -> torch.Tensor:
        ctx.op = op
        return op(x.contiguous())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.op(grad.contiguous()), None


def _queue_positions(choice: torch.Tensor, experts: int) -> torch.Tensor:
    """Each (token, choice)'s place in its expert's queue within its sequence: first choices of
    all tokens first, in token order, then second choices, ... ``choice``: (B, T, k)."""
    b, t, k = choice.shape
    onehot = F.one_hot(choice, experts).transpose(1, 2).reshape(b, k * t, experts)
    place = (onehot.cumsum(1) - 1) * onehot
    return place.sum(-1).reshape(b, k, t).transpose(1, 2)


class MoE(nn.Module):
    """A mixture-of-experts feed-forward layer over (batch, tokens, width) (see the module)."""

    def __init__(self, spec: MoEKnobs, activation: nn.Module) -> None:
        super().__init__()
        d, h = spec.width, spec.ffn_hidden
        self.experts, self.top_k = spec.experts, spec.top_k
        self.capacity_factor, self.expert_parallel = spec.capacity_factor, spec.expert_parallel
        self.router = nn.Linear(d, self.experts, bias=False)
        # each expert's layers initialised as nn.Linear's weights: U(-1/sqrt(fan_in), +)
        self.w_in = nn.Parameter(torch.empty(self.experts, d, h).uniform_(-(d**-0.5), d**-0.5))
        self.w_out = nn.Parameter(torch.empty(self.experts, h, d).uniform_(-(h**-0.5), h**-0.5))
        self.act = activation
        self.ranks = 1
        self.all_to_all: AllToAll | None = None

    # --- placement across ranks (hpcdl.parallel.placement.SpreadsAcrossRanks) -----------------
    def spread(self, rank: int, ranks: int, all_to_all: AllToAll | None) -> None:
        if not self.expert_parallel or ranks == 1:
            return  # every rank holds every expert: data parallelism reduces them as any weight
        mine = slice(rank * self.experts // ranks, (rank + 1) * self.experts // ranks)
        self.w_in = nn.Parameter(self.w_in.detach()[mine].clone())
        self.w_out = nn.Parameter(self.w_out.detach()[mine].clone())
        for p in (self.w_in, self.w_out):  # every rank's tokens: the data-parallel average
            p.register_hook(lambda g: g / ranks)
        self.ranks, self.all_to_all = ranks, all_to_all

    def rank_local_parameters(self) -> list[nn.Parameter]:
        return [self.w_in, self.w_out] if self.ranks > 1 else []

    # --- computation --------------------------------------------------------------------------
    def _ffn(self, slots: torch.Tensor) -> torch.Tensor:
        """Every held expert over its slots: (experts here, slots, width) -> same shape."""
        return torch.bmm(self.act(torch.bmm(slots, self.w_in)), self.w_out)

    def _experts(self, slots: torch.Tensor) -> torch.Tensor:
        """(experts, slots, width) of this rank's sequences through their experts, wherever
        those are held."""
        if self.ranks == 1:
            return self._ffn(slots)
        assert self.all_to_all is not None, "placed without an all-to-all (meta model)"
        e, n, d = slots.shape
        r, mine = self.ranks, e // self.ranks
        # chunk j (experts of rank j) to rank j; chunk i back is rank i's sequences for mine
        got = _AllToAll.apply(slots.reshape(e * n, d), self.all_to_all)
        got = got.reshape(r, mine, n, d).transpose(0, 1).reshape(mine, r * n, d)
        done = self._ffn(got).reshape(mine, r, n, d).transpose(0, 1).reshape(e * n, d)
        return _AllToAll.apply(done, self.all_to_all).reshape(e, n, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        e, k = self.experts, self.top_k
        cap = capacity(t, e, k, self.capacity_factor)
        gate, choice = self.router(x).float().softmax(-1).topk(k, dim=-1)  # (b, t, k)
        place = _queue_positions(choice, e)
        kept = place < cap
        # slot of each (token, choice) in its sequence's buffer; the one past the end drops it
        slot = torch.where(kept, choice * cap + place, e * cap).reshape(b, t * k, 1).expand(b, t * k, d)
        dtype = (
            torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        )
        tokens = x.to(dtype).unsqueeze(2).expand(b, t, k, d).reshape(b, t * k, d)
        buffer = x.new_zeros(b, e * cap + 1, d, dtype=dtype).scatter(1, slot, tokens)
        slots = buffer[:, :-1].reshape(b, e, cap, d).transpose(0, 1).reshape(e, b * cap, d)
        out = self._experts(slots).reshape(e, b, cap, d).transpose(0, 1).reshape(b, e * cap, d)
        out = torch.cat([out, out.new_zeros(b, 1, d)], dim=1).gather(1, slot).reshape(b, t, k, d)
        return (out * (gate * kept).to(out.dtype).unsqueeze(-1)).sum(2)
