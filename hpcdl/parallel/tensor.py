"""Tensor parallelism, Megatron-style, on PyTorch's own ``torch.distributed.tensor.parallel``,
composed with data parallelism over a layout's ``dp`` dimension (``hpcdl.parallel.layout``).

Each transformer block's fused q/k/v projection and the first feed-forward layer are split by
output columns (``ColwiseParallel``: each rank computes its heads and its share of the hidden
units, no communication forward), the output projection and the second feed-forward layer by
input rows (``RowwiseParallel``: each rank's partial product summed by an allreduce). An MLP's
hidden layers pair up the same way (a last unpaired layer stays whole). Embeddings, norms and
the head stay whole on every rank. Per block and step that is 2 allreduces forward (after the
row-parallel layers) and 2 backward (the gradient of the column-parallel layers' replicated
input), each of batch x tokens x width elements (docs/metrics.md, "Parallel layouts").

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
from hpcdl.workloads.precision import precision

if TYPE_CHECKING:
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


def plan(model: nn.Module) -> dict[str, ParallelStyle]:
    """Which submodule of ``model`` (an attention ``Transformer`` or an MLP ``Sequential``) is
    split how: column-parallel then row-parallel, pair by pair."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    blocks = getattr(model, "blocks", None)
    if blocks is not None:  # attention: q/k/v and the feed-forward's first layer by columns
        styles: dict[str, ParallelStyle] = {}
        for i in range(len(blocks)):
            styles |= {
                f"blocks.{i}.qkv": ColwiseParallel(),
                f"blocks.{i}.proj": RowwiseParallel(),
                f"blocks.{i}.ffn.0": ColwiseParallel(),
                f"blocks.{i}.ffn.2": RowwiseParallel(),
            }
        return styles
    linears = [name for name, m in model.named_children() if isinstance(m, nn.Linear)]
    pairs = zip(linears[0::2], linears[1::2], strict=False)  # a last unpaired layer stays whole
    return {name: style for c, r in pairs for name, style in ((c, ColwiseParallel()), (r, RowwiseParallel()))}


def tp_traffic(spec: Spec, tp: int) -> list[Traffic]:
    """The allreduces one training step of tensor parallelism runs on one rank (over its tp
    group), a step being ``spec.accumulation_steps`` micro-batches of ``spec.batch_size``:
    attention, 2 forward and 2 backward per block, each of batch x seq_len x width elements; an
    MLP, one forward per column/row pair (batch x the row-parallel layer's outputs) and one
    backward per pair whose input is not the data (batch x its inputs). Elements are in the
    run's compute precision (autocast's products are bf16 or fp16), but for attention's backward
    ones: they reduce the gradients of layer-norm outputs (and of the residual stream), which
    autocast keeps in fp32."""
    if tp == 1:
        return []
    width = precision(spec.precision).bytes
    rows = spec.batch_size * spec.accumulation_steps
    if spec.family == "attention":
        calls = 2 * spec.layers  # type: ignore[attr-defined]  # each way
        elements = calls * rows * spec.seq_len * spec.width  # type: ignore[attr-defined]
        return [Traffic("allreduce", elements * (width + 4), 2 * calls * spec.accumulation_steps)]
    sizes = [spec.input_size] + [spec.width] * spec.layers + [spec.output_size]  # type: ignore[attr-defined]
    pairs = len(sizes[:-1]) // 2  # linears: sizes[i] -> sizes[i + 1]
    forward = sum(sizes[2 * p + 2] for p in range(pairs))
    backward = sum(sizes[2 * p] for p in range(1, pairs))  # the first pair's input is the data
    calls = pairs + max(pairs - 1, 0)
    return [Traffic("allreduce", rows * (forward + backward) * width, calls * spec.accumulation_steps)]


def stage_tp_traffic(spec: Spec, blocks: int, tp: int, microbatches: int) -> list[Traffic]:
    """The tensor-parallel allreduces of one pipeline step on a rank whose stages hold
    ``blocks`` of an attention model's blocks: those of a model of ``blocks`` blocks over the
    whole batch (:func:`tp_traffic`), each of the ``microbatches`` making its own calls."""
    return [
        Traffic(t.collective, t.bytes, t.calls * microbatches)
        for t in tp_traffic(spec.replace(layers=blocks), tp)
    ]


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
    family's own count of its shard (``AttentionSpec.count``, ``MLPSpec.count``)."""
    count: Count = spec.count(tp)  # type: ignore[call-arg]
    return count
