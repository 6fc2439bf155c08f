"""What a family tells tensor and pipeline parallelism about its network: the types of
``Spec``'s optional hooks (``tp_sizes``, ``tp_splits``, ``tp_allreduces``, ``tp_count``,
``pp_blocks``, ``pp_parts``, ``pp_boundary_bytes``), which a family implements in its own file.
``hpcdl.parallel`` and ``hpcdl.scaling`` call the hooks and never name a family: a new family
with tensor or pipeline parallelism is still one file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

Split = Literal["columns", "rows"]
"""Megatron's two halves of a pair of layers: split by output columns (each rank computes its
share of the outputs, no communication forward), then by input rows (each rank's partial
product summed by an allreduce over the tensor-parallel group)"""


@dataclass(frozen=True)
class Allreduces:
    """Tensor parallelism's allreduces on one rank of its group, for one micro-batch: their
    bytes summed over the calls (nccl-tests' size), and the calls, forward and backward."""

    bytes: int
    calls: int


@dataclass(frozen=True)
class End:
    """What a pipeline stage runs before or after its blocks (embeddings, head): a function of
    the model and the modules it uses, which the stage holds."""

    run: Callable[[torch.Tensor], torch.Tensor]
    modules: tuple[nn.Module, ...]


@dataclass(frozen=True)
class Parts:
    """A model seen as a pipeline: ``before`` its blocks, the blocks a pipeline deals out to its
    stages, and ``after`` them; ``shared``: parameters both ends use (a tied head's token
    table), which the first and the last stage both hold."""

    before: End | None
    blocks: list[nn.Module]
    after: End
    shared: tuple[nn.Parameter, ...] = ()
