"""Tensor parallelism, Megatron-style, on PyTorch's own ``torch.distributed.tensor.parallel``,
composed with data parallelism over a layout's ``dp`` dimension (``hpcdl.parallel.layout``).

Which layers split how is the family's own plan (``Spec.tp_splits``, in the family's file):
pairs of layers, the first split by output columns (``ColwiseParallel``: each rank computes
its share of the outputs, no communication forward), the second by input rows
(``RowwiseParallel``: each rank's partial product summed by an allreduce); the rest stays whole
on every rank. A transformer block splits its fused q/k/v projection and its feed-forward's
first layer by columns, its output projection and second feed-forward layer by rows; an MLP
pairs its hidden layers. What the allreduces move is the family's count too
(``Spec.tp_allreduces``; docs/metrics.md, "Parallel layouts").

Sequence parallelism (norms and dropout on a sequence shard, reduce-scatter + all-gather in place
of each allreduce) moves the same bytes and saves only activation memory: not built.

Gradients of the ``dp`` replicas are averaged after backward in one flat allreduce over the dp
group (the simplest correct equivalent of DDP on a sub-group), exposed as the step's
``allreduce`` phase.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from hpcdl.device import synchronize
from hpcdl.parallel.backends import Traffic
from hpcdl.workloads.counting import Count

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

    from hpcdl.workloads.spec import Spec

TIMING_REPEATS = 5
"""timed repetitions of a step's collectives of one dimension (after 1 untimed), median taken"""


# torch.distributed.tensor is imported where a tensor-parallel model is made or read: it takes
# half a second to import, which every process of an eager, data-parallel run would pay


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: a DTensor's local shard, or ``t`` itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def whole(t: torch.Tensor) -> torch.Tensor:
    """``t`` whole: a DTensor gathered from its group's shards (collective over its mesh), or
    ``t`` itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def plan(spec: Spec, root: nn.Module, model: nn.Module | None = None) -> dict[str, ParallelStyle]:
    """Which submodule of ``root`` is split how, by its name in ``root``: the family's own
    plan (``Spec.tp_splits``) of ``model``, the model ``root`` holds the layers of (default:
    ``root`` itself; a pipeline stage holds some of a model's)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    splits = spec.tp_splits(root if model is None else model)
    styles = {"columns": ColwiseParallel, "rows": RowwiseParallel}
    return {name: styles[splits[m]]() for name, m in root.named_modules() if m in splits}


def split(spec: Spec, root: nn.Module, mesh: DeviceMesh, model: nn.Module | None = None) -> None:
    """Split ``root``'s layers over ``mesh`` as the family's :func:`plan` says, each layer given
    its style itself: torch 2.6's ``parallelize_module`` matched a dotted name's later parts
    against the parent's children again (``blocks.0.mlp.0`` also split ``blocks.0``, and failed)."""
    from torch.distributed.tensor.parallel import parallelize_module

    for name, style in plan(spec, root, model).items():
        parallelize_module(root.get_submodule(name), mesh, style)


def tp_traffic(spec: Spec, tp: int) -> list[Traffic]:
    """The allreduces one training step of tensor parallelism runs on one rank (over its tp
    group), a step being ``spec.accumulation_steps`` micro-batches: the family's own count of
    one micro-batch's (``Spec.tp_allreduces``), once per micro-batch."""
    if tp == 1:
        return []
    one, n = spec.tp_allreduces(), spec.accumulation_steps
    return [Traffic("allreduce", one.bytes * n, one.calls * n)]


def stage_tp_traffic(spec: Spec, blocks: int, tp: int, microbatches: int) -> list[Traffic]:
    """The tensor-parallel allreduces of one pipeline step on a rank whose stages hold
    ``blocks`` of the model's blocks: those of its blocks over the whole batch, each of the
    ``microbatches`` making its own calls."""
    if tp == 1:
        return []
    mine = spec.tp_allreduces(blocks)
    return [Traffic("allreduce", mine.bytes, mine.calls * microbatches)]


def time_collective(traffic: Traffic, group: dist.ProcessGroup, device: torch.device) -> float:
    """Median seconds of one step's ``traffic`` over ``group``: its ``calls`` blocking
    allreduces of ``bytes / calls`` each, after one untimed round (per-layer messages are small:
    timing them as one call of all the bytes would hide their latency)."""
    size = max(1, traffic.bytes // max(traffic.calls, 1) // 4)
    buf = torch.zeros(size, dtype=torch.float32, device=device)
    times = []
    for i in range(TIMING_REPEATS + 1):
        dist.barrier(group=group)
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(traffic.calls):
            dist.all_reduce(buf, group=group)
        synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rank_count(spec: Spec, tp: int) -> Count:
    """One rank's parameters and work per sample under tensor parallelism over ``tp`` ranks: the
    family's own count of its shard (``Spec.tp_count``), or the whole model's at tp = 1."""
    return spec.tp_count(tp) if tp > 1 else spec.count()
