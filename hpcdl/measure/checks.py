"""Correctness of distributed training (data parallel, sharded, experts across ranks), checked
in every multi-rank run on the whole parameters, gathered from wherever they live."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from hpcdl.device import synchronize
from hpcdl.measure.data import make_batch
from hpcdl.measure.measurement import Check
from hpcdl.parallel.backends import Backend
from hpcdl.parallel.placement import full_parameters, spread
from hpcdl.parallel.world import World
from hpcdl.workloads.spec import Spec

EQUIVALENCE_TOLERANCE = 1e-3
"""largest allowed |distributed - single| parameter difference, relative to the update size"""
CHECK_STREAM = 90_000  # data streams of the check, apart from the training data's


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def _for_check(model: nn.Module) -> nn.Module:
    """Eval mode but for recurrent layers: cuDNN's RNN backward runs only in training mode
    ("cudnn RNN backward can only be called in training mode"), and without dropout an RNN's
    training mode computes what its eval mode does."""
    model.eval()
    for m in model.modules():
        if isinstance(m, nn.RNNBase):
            m.train()
    return model


def one_step_equivalence(spec: Spec, world: World, backend: Backend, device: torch.device) -> Check:
    """One SGD step of N ranks, each on its own shard, against one process stepping on the
    whole global batch (all N shards) from the same weights: the parameters must agree.

    With gradient accumulation (``spec.accumulation_steps`` = A) each rank's shard is A
    micro-batches, run as training runs them (the backend's ``accumulating`` context for all
    but the last, each loss divided by A): the reduction once per step must give the gradient
    of the global batch.

    The one process takes the global batch as the same N x A micro-batches, one after the
    other, each loss divided by their number (the mean loss of the global batch), and steps
    once. It computes every product at the shapes the ranks do: a batch of another size may
    be rounded differently (the CPU's GEMM kernels are chosen by shape), and a rounding that
    flips one ReLU moves a gradient by far more than rounding does (an MLP of width 1024 at one
    thread, 8 shards of 4 against one batch of 32: 6e-3 of the update, one ReLU flipped).

    Models run in eval mode (batch norm uses its running statistics) and without dropout so
    that the per-shard losses are independent and deterministic; the check is about the
    reduction of gradients, and compares the whole parameters by name, however the backend and
    the layers placed them.
    """
    small = spec.replace(batch_size=min(spec.batch_size, 4), precision="fp32")
    if getattr(small, "dropout", 0):
        small = small.replace(dropout=0.0)
    micro = small.accumulation_steps
    stream, streams = backend.streams(world.rank, world.size)  # tp groups share theirs
    shards = [make_batch(small, device=device, stream=CHECK_STREAM + i) for i in range(streams * micro)]
    mine = shards[stream * micro : (stream + 1) * micro]

    model = _for_check(small.build().to(device))
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    spread(model, world.rank, world.size, backend, device)
    wrapped, opt = backend.wrap(model, lambda params: torch.optim.SGD(params, lr=0.1), micro)
    for i, (x, y) in enumerate(mine):
        with backend.accumulating(wrapped) if i < micro - 1 else nullcontext():
            (_loss(wrapped, x, y) / micro).backward()
    backend.finish_reduction(opt)
    backend.step(opt, torch.amp.GradScaler(device.type, enabled=False))
    stepped = dict(full_parameters(model, backend))

    ref = _for_check(small.build().to(device))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for x, y in shards:
        (_loss(ref, x, y) / len(shards)).backward()
    ref_opt.step()
    synchronize(device)

    expected = dict(ref.named_parameters())
    update = max(float((expected[n].detach() - p0).abs().max()) for n, p0 in start.items())
    diff = max(float((stepped[n] - expected[n].detach()).abs().max()) for n in expected)
    worst = max(world.allgather(diff / update if update > 0 else float("inf")))
    steps = f" of {micro} micro-batches" if micro > 1 else ""
    return Check(
        "one_step_equivalence",
        worst <= EQUIVALENCE_TOLERANCE,
        f"{world.size} ranks{steps} vs 1 process on the global batch: max parameter difference "
        f"{worst:.2e} of the update (tolerance {EQUIVALENCE_TOLERANCE:g})",
    )


def parameter_digest(parameters: Sequence[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 of every parameter's bytes, in order (``placement.full_parameters``: whole)."""
    h = hashlib.sha256()
    for _, p in parameters:
        # reshape(-1), not contiguous(): a channels-last (C, K, 1, 1) weight counts as contiguous
        # with a last stride of K, which view() as bytes refuses
        h.update(p.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def parameters_identical(digests: list[str]) -> Check:
    """After training, every rank holds bitwise the same parameters, once gathered: replicas
    have not drifted apart, and shards and rank-local parts gather into one model."""
    distinct = len(set(digests))
    return Check(
        "parameters_identical",
        distinct == 1,
        f"{len(digests)} ranks, {distinct} distinct parameter digest(s)",
    )
