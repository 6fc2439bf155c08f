"""Auto-fit, hpcdl's version of HPL's N: the per-rank batch that fills a stated fraction of the
device's memory. The batch comes from the analytic memory estimate (``metrics.memory_estimate``);
then one trial training step per rank, without communication, halves it on an out-of-memory
error until every rank fits. The record keeps the batch chosen and how it was found.

The trial step runs before the ranks communicate on purpose: an out-of-memory error inside a
collective would leave the other ranks waiting for the failed one.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hpcdl import metrics
from hpcdl.errors import InputError, SpecError
from hpcdl.measure.config import RunConfig
from hpcdl.measure.data import make_batch
from hpcdl.measure.device import memory_capacity, synchronize
from hpcdl.parallel.world import World
from hpcdl.workloads.precision import precision
from hpcdl.workloads.spec import Spec

MAX_BACKOFFS = 8
"""halvings tried after an out-of-memory error before giving up"""


RANK_PROCESS_BYTES = 256 << 20
"""what a rank process takes on a CPU before its model: Python, torch, mpi4py and Horovod
(233-238 MiB resident here)"""


def rank_memory(device: torch.device, world: World) -> int:
    """Bytes one rank may give its model: its GPU's memory, or on a CPU its share of the host's
    available memory less what the rank process itself takes; one line when a host cannot
    even hold its ranks' processes (``--np 10000``)."""
    if device.type == "cuda":
        return memory_capacity(device)
    available = memory_capacity(device)
    share = available // world.local_size - RANK_PROCESS_BYTES
    if share <= 0:
        most = max(1, available // (RANK_PROCESS_BYTES + (64 << 20)))
        raise InputError(
            "np",
            world.local_size,
            f"at most about {most} ranks fit in the {available / 2**30:.1f} GiB available on "
            f"{world.hostname} (a rank process takes about {RANK_PROCESS_BYTES >> 20} MiB before its model)",
        )
    return share


@dataclass(frozen=True)
class Fit:
    """How a batch was fitted (the record's ``metrics.fit``)."""

    fraction: float
    capacity_bytes: int
    """memory of one rank (the smallest over ranks)"""
    estimated_batch: int
    """the batch the analytic estimate chose"""
    batch: int
    """the batch that ran, after any backing off"""
    estimate_bytes: int
    """the analytic estimate at ``batch``"""
    backoffs: int


def estimated_batch(spec: Spec, optimizer: str, fraction: float, capacity: int) -> int:
    """The largest batch whose estimated memory is within ``fraction`` of ``capacity``; a
    one-line error when even one sample does not fit."""
    count = spec.count()
    fixed = metrics.memory_estimate(count.params, 0, 0, optimizer)
    per_sample = spec.memory_per_sample()
    room = fraction * capacity - fixed
    if room < per_sample:
        need = metrics.memory_estimate(count.params, per_sample, 1, optimizer)
        raise SpecError(
            f"{spec.family}.batch_size",
            "fit",
            f"even batch 1 needs an estimated {need / 2**30:.2f} GiB, more than {fraction:g} of the "
            f"{capacity / 2**30:.2f} GiB of a rank; this workload needs a larger device (or more ranks "
            "sharding it)",
        )
    return max(1, math.floor(room / max(per_sample, 1)))


def fit_batch(spec: Spec, cfg: RunConfig, device: torch.device, world: World) -> tuple[Spec, Fit]:
    """``spec`` with the batch that fills ``cfg.fit_fraction`` of every rank's memory."""
    capacity = min(world.allgather(rank_memory(device, world)))
    batch = estimated_batch(spec, cfg.optimizer, cfg.fit_fraction, capacity)
    first, backoffs = batch, 0
    # a CPU that runs out of memory is ended by the kernel, not told: there the estimate decides
    gpu = device.type == "cuda"
    while gpu and not world.all_true(trial_step_fits(spec.replace(batch_size=batch), device)):
        if backoffs == MAX_BACKOFFS or batch == 1:
            raise SpecError(
                f"{spec.family}.batch_size", batch, f"out of device memory even after {backoffs} halvings"
            )
        batch, backoffs = max(1, batch // 2), backoffs + 1
    fitted = spec.replace(batch_size=batch)
    count = fitted.count()
    estimate = metrics.memory_estimate(count.params, fitted.memory_per_sample(), batch, cfg.optimizer)
    return fitted, Fit(cfg.fit_fraction, capacity, first, batch, estimate, backoffs)


def trial_step_fits(spec: Spec, device: torch.device, step: Callable[..., None] | None = None) -> bool:
    """One forward, backward and AdamW step of ``spec`` on ``device``, alone: False when the
    device runs out of memory (its memory is released either way)."""
    try:
        (step or _adamw_step)(spec, device)
        return True
    except torch.OutOfMemoryError:
        return False
    except RuntimeError as e:  # cuBLAS and cuDNN report their failed allocations so
        if "ALLOC_FAILED" in str(e) or "out of memory" in str(e):
            return False
        raise
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _adamw_step(spec: Spec, device: torch.device) -> None:
    model = spec.build().to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    x, y = make_batch(spec, spec.batch_size, device)
    p = precision(spec.precision)
    with torch.autocast(device.type, dtype=p.dtype, enabled=p.autocast):
        logits = model(x)
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1)).backward()
    optimizer.step()
    synchronize(device)
