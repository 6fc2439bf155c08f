"""Analytical scaling model in the spirit of the HPE Deep Learning Cookbook: predicted step
time, throughput and efficiency of distributed training at rank counts never measured.

    t(p) = t_compute(p) + t_comm(p)                   (no overlap; ``overlap="full"``: max)
    t_compute(p) = train_flops_per_sample · b(p) / γ   b(p) = b (weak) or B / p (strong)
    t_comm(p) = Σ over the step's collectives c of  calls_c · s_c(p)·α_c + f_c(p) · bytes_c / β_c

with ``f_c`` the collective's bus factor (``hpcdl.metrics.bus_factor``: 2(p−1)/p for an
allreduce, (p−1)/p for an all-gather, a reduce-scatter and an all-to-all) and ``s_c = p·f_c``
its ring steps. The collectives of a step are the backend's rule (``Backend.traffic``: one
allreduce of the gradients for data parallelism; all-gathers and reduce-scatters for FSDP) and
the experts' all-to-alls of a mixture-of-experts workload (``hpcdl.workloads.moe``).

γ is one rank's sustained training FLOP/s, calibrated from a measured 1-rank run; α (latency
per ring step) and β (bus bandwidth) of each collective are fitted to its measured sweep
(``hpcdl comm -o``). The assumptions are stated in METRICS.md ("Scaling model").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from hpcdl import metrics
from hpcdl.errors import HpcdlError, InputError
from hpcdl.parallel.backends import BACKENDS, SINGLE, Traffic
from hpcdl.parallel.placement import rank_local, spread
from hpcdl.records.loader import CommRow, CommSweep, SweepSummary
from hpcdl.records.views import Result
from hpcdl.scaling.table import scaling_table
from hpcdl.workloads import moe
from hpcdl.workloads.registry import spec_from_dict

MODES = ("weak", "strong")
OVERLAPS = ("none", "full")
DEFAULT_NODES = tuple(2**k for k in range(13))  # 1 ... 4096


@dataclass(frozen=True, kw_only=True)
class Comm:
    """Ring cost of one collective: ``messages · s(p)·alpha_s + f(p) · bytes / beta_bytes_per_s``
    (``s(p) = p·f(p)`` ring steps; ``f`` its bus factor)."""

    alpha_s: float
    beta_bytes_per_s: float
    collective: str = "allreduce"

    def time(self, nbytes: float, p: int, messages: int = 1) -> float:
        if p <= 1:
            return 0.0
        factor = metrics.bus_factor(self.collective, p)
        return messages * p * factor * self.alpha_s + factor * nbytes / self.beta_bytes_per_s


@dataclass(frozen=True, kw_only=True)
class Model:
    """One workload on one system."""

    train_flops_per_sample: float
    batch: int
    """per rank (weak scaling) or global (strong scaling)"""
    gamma_flops_per_s: float
    """one rank's sustained training FLOP/s"""
    comms: Mapping[str, Comm]
    """the fitted cost of each collective, by name"""
    traffic: tuple[Traffic, ...]
    """what a step moves per rank at p > 1 with ``b(1)`` samples per rank; all-to-all bytes
    grow with the samples per rank, the others do not"""
    mode: str = "weak"
    overlap: str = "none"
    expert_ranks: tuple[int, ...] = field(default=())
    """the rank counts the experts can be sharded across (empty: any)"""
    optimizer_s: float = 0.0
    """seconds of one rank's optimizer step per step (the base record's optimizer phase): part
    of what γ covers, but done for the parameters a rank holds, and whatever the batch"""
    sharded_fraction: float = 0.0
    """of the parameters, the fraction each rank holds only 1/p of (FSDP: all of them; experts
    across ranks: the experts'); the optimizer's time shrinks with it"""

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
        if not 0 <= self.optimizer_s < self.step_s(1):
            raise InputError(
                "predict.optimizer_s", self.optimizer_s, "must be >= 0 and below the 1-rank step"
            )
        if not 0 <= self.sharded_fraction <= 1:
            raise InputError("predict.sharded_fraction", self.sharded_fraction, "must be in [0, 1]")
        for t in self.traffic:
            comm = self.comms.get(t.collective)
            if comm is None:
                raise InputError(
                    "predict.comm", t.collective, "no fit for it: sweep it (hpcdl comm --collective all)"
                )
            if not 0 < comm.beta_bytes_per_s < math.inf:
                raise InputError("predict.beta", comm.beta_bytes_per_s, "must be > 0 and finite")
            if not 0 <= comm.alpha_s < math.inf:
                raise InputError("predict.alpha", comm.alpha_s, "must be >= 0 and finite")

    def batch_per_rank(self, p: int) -> float:
        return self.batch if self.mode == "weak" else self.batch / p

    def predictable(self, p: int) -> bool:
        """False where the experts cannot be sharded across ``p`` ranks (hpcdl refuses the run)."""
        return p == 1 or not self.expert_ranks or p in self.expert_ranks

    def comm_s(self, p: int) -> float:
        """Seconds per step of every collective at ``p`` ranks."""
        scale = self.batch_per_rank(p) / self.batch_per_rank(1)
        return sum(
            self.comms[t.collective].time(
                t.bytes * (scale if t.collective == "all_to_all" else 1), p, t.calls
            )
            for t in self.traffic
        )

    def step_s(self, p: int) -> float:
        """Seconds of one rank's step without communication: ``F · b(p) / γ``."""
        return self.train_flops_per_sample * self.batch_per_rank(p) / self.gamma_flops_per_s

    def compute_s(self, p: int) -> float:
        """``step_s(p)`` with the optimizer's part done for the parameters a rank holds:
        ``(step_s(1) − o) · b(p)/b(1) + o · (1 − s + s/p)``."""
        o, s = self.optimizer_s, self.sharded_fraction
        return (self.step_s(1) - o) * self.batch_per_rank(p) / self.batch_per_rank(1) + o * (1 - s + s / p)

    def parts(self, p: int) -> tuple[float, float, float]:
        """(compute, communication, step) seconds of one step at ``p`` ranks."""
        compute = self.compute_s(p)
        comm = self.comm_s(p)
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


def fit_comm(
    rows: Sequence[CommRow], ranks: int, collective: str = "allreduce", message_bytes: float | None = None
) -> Comm:
    """α and β of ``collective`` from its sweep at ``ranks`` ranks (the backend's times of
    ``hpcdl comm``): least squares of ``t(S) = a + c·S`` in relative error (every size counts
    alike, not just the largest), then ``α = a / s(P)`` and ``β = f(P) / c``.

    With ``message_bytes`` (the size of a step's messages) inside the sweep's sizes, only the
    two sizes around it count: a library's time is seldom one line from 1 KiB to 64 MiB
    (caches, protocol switches; gloo's all-gather at 2 ranks here: 0.8 ms at 1 MiB, 5.2 ms at
    4 MiB), and one message size is what the step sends. Where that line would start below
    zero or fall (noise), it runs from zero through the larger size instead."""
    if ranks < 2:
        raise InputError("comm.ranks", ranks, "a collective sweep of at least 2 ranks")
    rows = sorted((r for r in rows if r.collective == collective), key=lambda r: r.bytes)
    sizes = np.array([float(r.bytes) for r in rows])
    times = np.array([r.backend_s for r in rows])
    if not (np.all(np.isfinite(sizes) & (sizes > 0)) and np.all(np.isfinite(times) & (times > 0))):
        raise HpcdlError(f"the {collective} sweep holds a size or a time that is not a positive number")
    if len(rows) < 2 or len(set(sizes.tolist())) < 2:
        raise HpcdlError(
            f"the {collective} sweep needs at least two buffer sizes to fit latency and bandwidth"
        )
    local = message_bytes is not None and sizes[0] < message_bytes <= sizes[-1]
    if message_bytes is not None and local:
        upper = int(np.searchsorted(sizes, message_bytes))
        sizes, times = sizes[upper - 1 : upper + 1], times[upper - 1 : upper + 1]
    design = np.stack([np.ones_like(sizes), sizes], axis=1) / times[:, None]
    (a, c), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    if local and (a < 0 or c <= 0):  # bandwidth falls with the size here, or noise: bound it
        a, c = 0.0, times[-1] / sizes[-1]
    a = max(float(a), 0.0)  # a negative intercept over all sizes is noise in the latency: none
    if not c > 0:
        raise HpcdlError(f"the {collective} sweep does not grow with the buffer size; cannot fit a bandwidth")
    factor = metrics.bus_factor(collective, ranks)
    return Comm(
        alpha_s=float(a) / (ranks * factor), beta_bytes_per_s=factor / float(c), collective=collective
    )


def comm_from_record(comm: CommSweep) -> Comm:
    """The fitted α, β of a sweep's allreduce (the backend's column, not raw MPI)."""
    return fit_comm(comm.rows, comm.ranks)


def comms_for(sweep: CommSweep, traffic: Sequence[Traffic]) -> dict[str, Comm]:
    """α, β of each collective of a step, fitted to the sweep around its message size."""
    return {t.collective: fit_comm(sweep.rows, sweep.ranks, t.collective, t.bytes / t.calls) for t in traffic}


def placed_model(spec: Any, ranks: int) -> nn.Module:
    """The spec's model on the meta device (no memory), its experts placed as at ``ranks`` ranks."""
    with torch.device("meta"):
        model = spec.build()
    spread(model, 0, ranks, None, torch.device("meta"))
    return model


def sharded_fraction(spec: Any, backend: str, ranks: int) -> float:
    """Of the spec's parameters, the fraction each of ``ranks`` ranks holds only 1/ranks of."""
    if BACKENDS.get(backend).shards_state:
        return 1.0
    model = placed_model(spec, ranks)
    local = rank_local(model)
    held = sum(p.numel() for p in model.parameters() if id(p) in local)
    return held * ranks / spec.count().params


def step_traffic(spec: Any, backend: str, ranks: int, batch_per_rank: int) -> list[Traffic]:
    """What one training step of ``spec`` moves per rank at ``ranks`` ranks: the backend's rule
    on the spec's model (built on the meta device, its experts placed as at ``ranks``) and the
    experts' all-to-alls of ``batch_per_rank`` sequences -- what a run records."""
    model = placed_model(spec, ranks)
    traffic = BACKENDS.get(backend).traffic(model)
    layers = sum(isinstance(m, moe.MoE) and m.ranks > 1 for m in model.modules())
    if layers:
        calls = moe.ALL_TO_ALLS_PER_LAYER * layers
        nbytes = calls * moe.dispatch_bytes(spec, batch_per_rank, spec.precision)
        traffic.append(Traffic("all_to_all", nbytes, calls))
    return traffic


def model_for(
    spec: Mapping[str, Any],
    batch: int,
    gamma_flops_per_s: float,
    comm: Comm | Mapping[str, Comm] | CommSweep,
    *,
    backend: str = "horovod",
    mode: str = "weak",
    overlap: str = "none",
    optimizer_s: float = 0.0,
) -> Model:
    """The model of a workload (a spec dict, counted analytically) on a system (γ; α, β of each
    collective: one ``Comm`` is an allreduce's, a sweep is fitted around the step's message
    sizes; the optimizer's seconds per step at one rank, when known)."""
    reducing = [n for n in BACKENDS.names() if n != SINGLE]
    if backend not in reducing:
        raise InputError("predict.backend", backend, f"allowed: {', '.join(reducing)}")
    workload = spec_from_dict(dict(spec))
    experts = workload.experts if isinstance(workload, moe.MoEKnobs) and workload.expert_parallel else 0
    sharded_at = experts if experts > 1 else 2  # the traffic per rank is the same at every such p
    traffic = step_traffic(workload, backend, sharded_at, batch)
    if isinstance(comm, CommSweep):
        comms = comms_for(comm, traffic)
    else:
        comms = {comm.collective: comm} if isinstance(comm, Comm) else dict(comm)
    return Model(
        train_flops_per_sample=float(workload.count().train_flops),
        batch=batch,
        gamma_flops_per_s=gamma_flops_per_s,
        comms=comms,
        traffic=tuple(traffic),
        mode=mode,
        overlap=overlap,
        expert_ranks=tuple(p for p in range(1, experts + 1) if experts % p == 0),
        optimizer_s=optimizer_s,
        sharded_fraction=sharded_fraction(workload, backend, sharded_at),
    )


def model_from_records(
    base: Result,
    comm: Comm | Mapping[str, Comm] | CommSweep,
    *,
    backend: str = "horovod",
    mode: str = "weak",
    overlap: str = "none",
) -> Model:
    """The model of ``base``'s workload on ``base``'s system: γ from its AI-ops/s and the
    optimizer's time from its optimizer phase (it must be a 1-rank record), α and β given or
    fitted to a collective sweep."""
    if base.world_size != 1:
        raise InputError("predict.base", base.name, "a 1-rank result record calibrates gamma")
    gamma = base.metrics.ai_ops_per_s
    batch = base.settings.batch_per_rank
    optimizer = base.metrics.phases_s.get("optimizer")
    optimizer_s = optimizer.median if optimizer is not None and math.isfinite(optimizer.median) else 0.0
    return model_for(
        base.spec, batch, gamma, comm, backend=backend, mode=mode, overlap=overlap, optimizer_s=optimizer_s
    )


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


def relative_error(predicted: float, measured: float) -> float:
    """(predicted − measured) / measured: positive when the model is optimistic."""
    return (predicted - measured) / measured
