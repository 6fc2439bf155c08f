"""Analytical scaling model in the spirit of the HPE Deep Learning Cookbook: predicted step
time, throughput and efficiency of data-parallel training at rank counts never measured.

    t(p) = t_compute(p) + t_comm(p)                   (no overlap; ``overlap="full"``: max)
    t_compute(p) = train_flops_per_sample · b(p) / γ   b(p) = b (weak) or B / p (strong)
    t_comm(p) = messages · 2(p−1)·α + 2(p−1)/p · w / β  (ring allreduce of w gradient bytes)

γ is one rank's sustained training FLOP/s, calibrated from a measured 1-rank run; α (latency
per ring step) and β (bus bandwidth) are fitted to a measured allreduce sweep (``hpcdl comm
-o``). The assumptions are stated in METRICS.md ("Scaling model").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcdl import metrics
from hpcdl.errors import HpcdlError, InputError
from hpcdl.parallel.backends import BACKENDS, SINGLE
from hpcdl.records.loader import CommRow, CommSweep, SweepSummary
from hpcdl.records.views import Result
from hpcdl.scaling.table import scaling_table
from hpcdl.workloads.precision import GRADIENT_BYTES
from hpcdl.workloads.registry import spec_from_dict

MODES = ("weak", "strong")
OVERLAPS = ("none", "full")
DEFAULT_NODES = tuple(2**k for k in range(13))  # 1 ... 4096


@dataclass(frozen=True, kw_only=True)
class Comm:
    """Ring allreduce cost: ``messages · 2(p−1)·alpha_s + 2(p−1)/p · bytes / beta_bytes_per_s``."""

    alpha_s: float
    beta_bytes_per_s: float

    def time(self, nbytes: float, p: int, messages: int = 1) -> float:
        if p <= 1:
            return 0.0
        return messages * 2 * (p - 1) * self.alpha_s + 2 * (p - 1) / p * nbytes / self.beta_bytes_per_s


@dataclass(frozen=True, kw_only=True)
class Model:
    """One workload on one system."""

    train_flops_per_sample: float
    batch: int
    """per rank (weak scaling) or global (strong scaling)"""
    grad_bytes: float
    gamma_flops_per_s: float
    """one rank's sustained training FLOP/s"""
    comm: Comm
    mode: str = "weak"
    overlap: str = "none"
    messages_per_step: int = 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError("predict.mode", self.mode, "allowed: weak, strong")
        if self.overlap not in OVERLAPS:
            raise InputError("predict.overlap", self.overlap, "allowed: none, full")
        for name in ("train_flops_per_sample", "gamma_flops_per_s"):
            if not 0 < getattr(self, name) < math.inf:
                raise InputError(f"predict.{name}", getattr(self, name), "must be > 0 and finite")
        if not self.batch >= 1:
            raise InputError("predict.batch", self.batch, "must be >= 1")
        if not 0 < self.comm.beta_bytes_per_s < math.inf:
            raise InputError("predict.beta", self.comm.beta_bytes_per_s, "must be > 0 and finite")
        if not 0 <= self.comm.alpha_s < math.inf:
            raise InputError("predict.alpha", self.comm.alpha_s, "must be >= 0 and finite")

    def batch_per_rank(self, p: int) -> float:
        return self.batch if self.mode == "weak" else self.batch / p

    def parts(self, p: int) -> tuple[float, float, float]:
        """(compute, communication, step) seconds of one step at ``p`` ranks."""
        compute = self.train_flops_per_sample * self.batch_per_rank(p) / self.gamma_flops_per_s
        comm = self.comm.time(self.grad_bytes, p, self.messages_per_step)
        return compute, comm, compute + comm if self.overlap == "none" else max(compute, comm)

    def samples_per_s(self, p: int) -> float:
        return p * self.batch_per_rank(p) / self.parts(p)[2]

    def point(self, p: int) -> dict[str, float]:
        """Predicted step time, its parts, samples/s, speed-up and efficiency at ``p`` ranks."""
        compute, comm, step = self.parts(p)
        samples = p * self.batch_per_rank(p) / step
        (row,) = scaling_table([(p, samples)], base=(1, self.samples_per_s(1)))
        return {
            "np": p,
            "step_s": step,
            "compute_s": compute,
            "comm_s": comm,
            "samples_per_s": samples,
            "ai_ops_per_s": metrics.ai_ops_per_s(self.train_flops_per_sample, samples),
            "speedup": row.speedup,
            "efficiency": row.efficiency,
        }


def fit_comm(rows: Sequence[CommRow], ranks: int) -> Comm:
    """α and β from an allreduce sweep at ``ranks`` ranks (the backend's times of ``hpcdl comm``):
    least squares of ``t(S) = a + c·S`` in relative error (every size counts alike, not just
    the largest), then ``α = a / 2(p−1)`` and ``β = 2(p−1)/p / c``."""
    if ranks < 2:
        raise InputError("comm.ranks", ranks, "an allreduce sweep of at least 2 ranks")
    sizes = np.array([float(r.bytes) for r in rows])
    times = np.array([r.backend_s for r in rows])
    if not (np.all(np.isfinite(sizes) & (sizes > 0)) and np.all(np.isfinite(times) & (times > 0))):
        raise HpcdlError("the allreduce sweep holds a size or a time that is not a positive number")
    if len(rows) < 2 or len(set(sizes.tolist())) < 2:
        raise HpcdlError("the allreduce sweep needs at least two buffer sizes to fit latency and bandwidth")
    design = np.stack([np.ones_like(sizes), sizes], axis=1) / times[:, None]
    (a, c), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    a = max(float(a), 0.0)  # a negative intercept is noise in the latency: none
    if not c > 0:
        raise HpcdlError("the allreduce sweep does not grow with the buffer size; cannot fit a bandwidth")
    return Comm(alpha_s=a / (2 * (ranks - 1)), beta_bytes_per_s=2 * (ranks - 1) / ranks / float(c))


def comm_from_record(comm: CommSweep) -> Comm:
    """The fitted α, β of an allreduce sweep (the backend's column, not raw MPI)."""
    return fit_comm(comm.rows, comm.ranks)


def model_for(
    spec: Mapping[str, Any],
    batch: int,
    gamma_flops_per_s: float,
    comm: Comm,
    *,
    backend: str = "horovod",
    mode: str = "weak",
    overlap: str = "none",
) -> Model:
    """The model of a workload (a spec dict, counted analytically) on a system (γ, α, β)."""
    reducing = [n for n in BACKENDS.names() if n != SINGLE]
    if backend not in reducing:
        raise InputError("predict.backend", backend, f"allowed: {', '.join(reducing)}")
    count = spec_from_dict(dict(spec)).count()
    grad_bytes = float(GRADIENT_BYTES * count.params)
    return Model(
        train_flops_per_sample=float(count.train_flops),
        batch=batch,
        grad_bytes=grad_bytes,
        gamma_flops_per_s=gamma_flops_per_s,
        comm=comm,
        mode=mode,
        overlap=overlap,
        messages_per_step=messages_per_step(grad_bytes, backend),
    )


def model_from_records(
    base: Result,
    comm: Comm,
    *,
    backend: str = "horovod",
    mode: str = "weak",
    overlap: str = "none",
) -> Model:
    """The model of ``base``'s workload on ``base``'s system: γ from its AI-ops/s (it must be
    a 1-rank record), α and β given (``comm_from_record`` fits them to an allreduce sweep)."""
    if base.world_size != 1:
        raise InputError("predict.base", base.name, "a 1-rank result record calibrates gamma")
    gamma = base.metrics.ai_ops_per_s
    batch = base.settings.batch_per_rank
    return model_for(base.spec, batch, gamma, comm, backend=backend, mode=mode, overlap=overlap)


def sweep_predictor(fits: Mapping[str, Comm]) -> Callable[[SweepSummary], dict[int, float] | None]:
    """For reports: a sweep summary -> predicted samples/s at its rank counts, calibrated on
    its 1-rank point and the fitted allreduce sweep of its backend (``fits``, by backend); None
    where either is missing, or where the summary holds figures the model cannot take."""

    def predicted(summary: SweepSummary) -> dict[int, float] | None:
        base = next((p for p in summary.points if p.np == 1 and p.ai_ops_per_s), None)
        backends = {p.backend for p in summary.points if p.np > 1 and p.backend}
        if base is None or base.ai_ops_per_s is None or base.batch_per_rank is None or len(backends) != 1:
            return None
        backend = str(backends.pop())
        if backend not in fits:
            return None
        try:
            m = model_for(
                summary.spec,
                base.batch_per_rank,
                base.ai_ops_per_s,
                fits[backend],
                backend=backend,
                mode=summary.mode,
            )
        except (HpcdlError, TypeError):  # a spec that does not rebuild (TypeError: a knob that is a list)
            return None
        return {p.np: m.samples_per_s(p.np) for p in summary.points if p.np >= 1}

    return predicted


def messages_per_step(grad_bytes: float, backend: str) -> int:
    """Allreduce calls per step: gradients travel in the backend's messages (Horovod's fusion
    buffer, DDP's buckets; ``Backend.message_bytes``, 0 for one message of all of them)."""
    size = BACKENDS.get(backend).message_bytes
    return max(1, math.ceil(grad_bytes / size)) if size else 1


def relative_error(predicted: float, measured: float) -> float:
    """(predicted − measured) / measured: positive when the model is optimistic."""
    return (predicted - measured) / measured
