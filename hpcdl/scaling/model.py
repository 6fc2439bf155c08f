"""Analytical scaling model in the spirit of the HPE Deep Learning Cookbook: predicted step
time, throughput and efficiency of distributed training at rank counts never measured.

    t(p) = t_compute(p) + t_exposed(p)      (``overlap="none"``: + t_comm; ``"full"``: max)
    t_compute(p) = N · (F · b / γ − o) · b(p)/b + o · (1 − s + s/p)
    t_comm(p) = Σ over the step's collectives c of  (N or 1) · cost_c(bytes_c, p, calls_c)

``N`` micro-batches (gradient accumulation) make one optimizer step: the gradients are reduced
once, the other collectives (FSDP's all-gathers, experts' all-to-alls) run in each. A
collective's cost is one flat ring (``Comm``: α per ring step, β of the bus) or two levels
(``Hierarchy``: a node's link and the fabric between nodes, the cheapest of ring, tree and
hierarchical allreduce; ``hpcdl.scaling.collectives``). ``bucketed`` overlap (the default)
reduces the gradients bucket by bucket while backward runs (``bucket_tail``).

γ is one rank's sustained training FLOP/s, calibrated from a measured 1-rank run (or given);
α and β are fitted to measured sweeps (``hpcdl comm -o``) or read from a system file
(``hpcdl.scaling.system``); the fits are ``hpcdl.scaling.fitting``'s. The assumptions are
stated in docs/metrics.md ("Prediction").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hpcdl import metrics
from hpcdl.errors import HpcdlError, InputError
from hpcdl.parallel.backends import BACKENDS, COLLECTIVES, SINGLE, Traffic
from hpcdl.records.loader import SweepSummary
from hpcdl.records.views import PredictionPoint
from hpcdl.scaling.collectives import Comm, Cost, Hierarchy
from hpcdl.scaling.modelparallel import Layout, ModelParallel, activations, check, levels, replicas
from hpcdl.scaling.table import scaling_table
from hpcdl.scaling.traffic import sharded_fraction, step_traffic
from hpcdl.workloads import moe
from hpcdl.workloads.registry import spec_from_dict

__all__ = ["Comm", "Cost", "Hierarchy", "Model", "model_for"]

MODES = ("weak", "strong")
OVERLAPS = ("none", "bucketed", "full")
DEFAULT_NODES = tuple(2**k for k in range(13))  # 1 ... 4096
MAX_NODES = 4096
PER_STEP = ("allreduce", "reduce_scatter")
"""the gradients' reductions: once per optimizer step, started bucket by bucket during the
last micro-batch's backward; the other collectives (FSDP's all-gathers, the experts'
all-to-alls) run in every micro-batch's forward and backward and are counted whole"""
BACKWARD_FRACTION = 2 / 3
"""backward's share of forward + backward where no record measured it: backward computes two
products for each of forward's one (docs/metrics.md, "Counting": training FLOPs = 3 x forward)"""
CostsOf = Callable[[Sequence[Traffic]], Mapping[str, Cost]]
"""the cost of each collective of a step, given what the step moves (a sweep's fit)"""
SYNC_BYTES = 8
"""what a step's agreement moves: a flag or a counter"""


@dataclass(frozen=True, kw_only=True)
class Model:
    """One workload on one system."""

    train_flops_per_sample: float
    batch: int
    """per rank (weak scaling) or global (strong scaling), of one micro-batch"""
    gamma_flops_per_s: float
    """one rank's sustained training FLOP/s"""
    comms: Mapping[str, Cost]
    """the cost of each collective, by name: one level (``Comm``) or two (``Hierarchy``)"""
    traffic: tuple[Traffic, ...]
    """what a step moves per rank at p > 1 with ``b(1)`` samples per rank; all-to-all bytes
    grow with the samples per rank, the others do not. A reduction's calls are its buckets."""
    mode: str = "weak"
    overlap: str = "bucketed"
    expert_ranks: tuple[int, ...] = field(default=())
    """the rank counts the experts can be sharded across (empty: any)"""
    optimizer_s: float = 0.0
    """seconds of one rank's optimizer step per step (the base record's optimizer phase): part
    of what γ covers, but done for the parameters a rank holds, and whatever the batch"""
    sharded_fraction: float = 0.0
    """of the parameters, the fraction each rank holds only 1/p of (FSDP: all of them; experts
    across ranks: the experts'); the optimizer's time shrinks with it"""
    accumulation_steps: int = 1
    """micro-batches of compute per optimizer step and gradient reduction"""
    backward_fraction: float = BACKWARD_FRACTION
    """backward's share of a micro-batch's compute (the base record's phases, when measured)"""
    cycle_s: float = 0.0
    """the backend's polling period (``Backend.cycle_s``, Horovod's cycle time): a ready
    bucket waits half of it"""
    gamma_rse: float = 0.0
    """relative standard error of γ (0: given, not measured)"""
    parallel: ModelParallel | None = None
    """a layout's tensor- and pipeline-parallel terms (``hpcdl.scaling.modelparallel``); with
    one, ``batch`` (weak scaling) is a data-parallel replica's, and ``traffic`` a replica's
    whole model's (each rank reduces its ``1/(tp·pp)``)"""
    step_cv: float = 0.0
    """one rank's relative step-time spread σ/μ (a record's, ``metrics.step_cv``): a synchronous
    step waits for the slowest of p ranks (``straggler_s``); 0: none"""
    sync_calls: int = 0
    """latency-bound allreduces of a few bytes per step beside the gradients' (the ranks agree on
    each step: Horovod's negotiation, a loop's stop vote; ``sync_s``); 0: none"""
    data_rate: float = 0.0
    """samples/s one node's input pipeline delivers (a record's measured read rate), shared by
    its ranks (``data_s``); 0: not measured"""
    ranks_per_node: int = 1
    """ranks that share a node's input pipeline"""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError("predict.mode", self.mode, "allowed: weak, strong")
        if self.overlap not in OVERLAPS:
            raise InputError("predict.overlap", self.overlap, f"allowed: {', '.join(OVERLAPS)}")
        for name in ("train_flops_per_sample", "gamma_flops_per_s"):
            if not 0 < getattr(self, name) < math.inf:
                raise InputError(f"predict.{name}", getattr(self, name), "must be > 0 and finite")
        if not self.batch >= 1:
            raise InputError("predict.batch", self.batch, "must be >= 1")
        if isinstance(self.accumulation_steps, bool) or not (
            isinstance(self.accumulation_steps, int) and 1 <= self.accumulation_steps <= 1 << 20
        ):
            raise InputError(
                "predict.accumulation_steps", self.accumulation_steps, "an integer in 1..1048576"
            )
        if not math.isfinite(self.step_s(1)):  # a denormal γ passes the check above
            raise InputError(
                "predict.gamma_flops_per_s", self.gamma_flops_per_s, "large enough for a finite step time"
            )
        if not 0 <= self.optimizer_s < self.step_s(1):
            raise InputError(
                "predict.optimizer_s", self.optimizer_s, "must be >= 0 and below the 1-rank step"
            )
        if not 0 <= self.sharded_fraction <= 1:
            raise InputError("predict.sharded_fraction", self.sharded_fraction, "must be in [0, 1]")
        if not 0 <= self.backward_fraction <= 1:
            raise InputError("predict.backward_fraction", self.backward_fraction, "must be in [0, 1]")
        for name in ("cycle_s", "gamma_rse", "step_cv", "data_rate"):
            if not 0 <= getattr(self, name) < math.inf:
                raise InputError(f"predict.{name}", getattr(self, name), "must be >= 0 and finite")
        if not 0 <= self.sync_calls <= 1 << 20 or not 1 <= self.ranks_per_node <= 1 << 20:
            raise InputError("predict.sync_calls", self.sync_calls, "an integer in 0..1048576")
        if self.sync_calls and "allreduce" not in self.comms:
            raise InputError(
                "predict.comm", "allreduce", "the step's synchronisation is an allreduce: fit it"
            )
        for t in self.traffic:
            cost = self.comms.get(t.collective)
            if cost is None:
                raise InputError(
                    "predict.comm", t.collective, "no fit for it: sweep it (hpcdl comm --collective all)"
                )
            for level in (cost.intra, cost.inter) if isinstance(cost, Hierarchy) else (cost,):
                if not isinstance(level, Comm):
                    raise InputError("predict.comm", type(level).__name__, "a Comm or a Hierarchy")
                if not 0 < level.beta_bytes_per_s < math.inf:
                    raise InputError("predict.beta", level.beta_bytes_per_s, "must be > 0 and finite")
                if not 0 <= level.alpha_s < math.inf:
                    raise InputError("predict.alpha", level.alpha_s, "must be >= 0 and finite")

    def batch_per_rank(self, p: int) -> float:
        """One micro-batch's samples on each rank."""
        return self.batch if self.mode == "weak" else self.batch / p

    def predictable(self, p: int) -> bool:
        """False where the experts cannot be sharded across ``p`` ranks (hpcdl refuses the run),
        or where the layout does not fit ``p`` ranks."""
        if self.parallel is not None and replicas(self.parallel.layout, p) is None:
            return False
        return p == 1 or not self.expert_ranks or p in self.expert_ranks

    def _bytes(self, t: Traffic, p: int) -> float:
        scale = self.batch_per_rank(p) / self.batch_per_rank(1)
        return t.bytes * (scale if t.collective == "all_to_all" else 1)

    def comm_s(self, p: int) -> float:
        """Seconds per optimizer step of every collective at ``p`` ranks, none hidden."""
        n = self.accumulation_steps
        return sum(
            (1 if t.collective in PER_STEP else n)
            * self.comms[t.collective].time(self._bytes(t, p), p, t.calls)
            for t in self.traffic
        )

    def step_s(self, p: int) -> float:
        """Seconds of one rank's micro-batch without communication: ``F · b(p) / γ``."""
        return self.train_flops_per_sample * self.batch_per_rank(p) / self.gamma_flops_per_s

    def micro_s(self, p: int) -> float:
        """One micro-batch's forward and backward at ``p`` ranks (the optimizer's part out)."""
        return (self.step_s(1) - self.optimizer_s) * self.batch_per_rank(p) / self.batch_per_rank(1)

    def compute_s(self, p: int) -> float:
        """``N`` micro-batches and one optimizer step done for the parameters a rank holds:
        ``N · (step_s(1) − o) · b(p)/b(1) + o · (1 − s + s/p)``."""
        o, s = self.optimizer_s, self.sharded_fraction
        return self.accumulation_steps * self.micro_s(p) + o * (1 - s + s / p)

    def exposed_s(self, p: int) -> float:
        """Communication not hidden behind computation (``bucketed``): the collectives of every
        micro-batch whole, and what of the reductions' buckets ends after the last backward."""
        n = self.accumulation_steps
        exposed = sum(
            n * self.comms[t.collective].time(self._bytes(t, p), p, t.calls)
            for t in self.traffic
            if t.collective not in PER_STEP
        )
        backward = self.backward_fraction * self.micro_s(p)
        return exposed + bucket_tail(
            [
                (self.comms[t.collective], self._bytes(t, p), t.calls)
                for t in self.traffic
                if t.collective in PER_STEP
            ],
            p,
            backward,
            self.cycle_s,
        )

    def parts(self, p: int) -> tuple[float, float, float]:
        """(compute, communication, step) seconds of one optimizer step at ``p`` ranks, the
        losses besides communication (``losses``) included in the step."""
        compute, comm, step = self.collective_parts(p)
        return compute, comm, step + sum(self.losses(p, step))

    def collective_parts(self, p: int) -> tuple[float, float, float]:
        """(compute, communication, step) seconds of one optimizer step at ``p`` ranks from the
        computation and the collectives alone."""
        if self.parallel is not None:
            compute, comm, step, _ = self.layered(p)
            return compute, comm, step
        compute = self.compute_s(p)
        comm = self.comm_s(p)
        if self.overlap == "none":
            return compute, comm, compute + comm
        if self.overlap == "full":
            return compute, comm, max(compute, comm)
        return compute, comm, compute + (self.exposed_s(p) if p > 1 else 0.0)

    def losses(self, p: int, step: float) -> tuple[float, float, float]:
        """(straggler, synchronisation, data loading) seconds a step of ``step`` seconds at ``p``
        ranks loses besides its collectives (docs/metrics.md, "Prediction"):

        - the slowest of p ranks' steps, ``z(p) · cv · t_compute(p)``, z the expected largest of
          p standard normal draws (``metrics.expected_max_normal``);
        - ``sync_calls`` allreduces of ``SYNC_BYTES``, latency-bound, at p > 1;
        - the input pipeline of a node, shared by its ``r`` ranks: what loading ``r·b·N``
          samples at ``data_rate`` takes beyond both the step and one rank's own loading (which
          the 1-rank γ already holds)."""
        if p <= 1:
            return 0.0, 0.0, 0.0
        straggler = metrics.expected_max_normal(p) * self.step_cv * self.compute_s(p)
        sync = self.sync_calls * self.comms["allreduce"].time(SYNC_BYTES, p, 1) if self.sync_calls else 0.0
        data = 0.0
        if self.data_rate > 0:
            per_rank = self.batch_per_rank(p) * self.accumulation_steps / self.data_rate
            node = min(p, self.ranks_per_node) * per_rank
            data = max(0.0, node - max(step + straggler + sync, per_rank))
        return straggler, sync, data

    def layered(self, p: int) -> tuple[float, float, float, float]:
        """(compute, communication, step, bubble) seconds of one optimizer step at ``p`` ranks
        in the layout's ``dp × tp × pp`` (docs/metrics.md, "Prediction"): each of the
        ``m`` micro-batches of ``b/m`` samples takes a slot of ``F·b/(m·γ·tp·pp)`` (its stage's
        share of the work) plus its tensor-parallel collectives and its sends between stages;
        the pipeline runs ``N·(m + pp − 1)`` slots, ``pp − 1`` of them idle; the optimizer
        updates ``1/(tp·pp)`` of the parameters; the gradients of that share are reduced over
        the ``dp`` ranks, behind the last backward (tp = pp = 1, bucketed), or whole after
        backward (tp > 1: one flat allreduce of the shards) or after the pipeline's flush (pp > 1:
        the schedule ends before any is reduced). Other collectives (FSDP's
        all-gathers, the experts' all-to-alls) run in every micro-batch, unhidden."""
        mp = self.parallel
        if mp is None:
            raise InputError("predict.layout", None, "a model with a layout")
        layout = mp.layout
        dp = replicas(layout, p)
        if dp is None:
            raise InputError(
                "predict.layout", str(p), f"a rank count divisible by tp x pp = {layout.model_parallel}"
            )
        m, n, share = layout.chunks, self.accumulation_steps, layout.model_parallel
        samples = self.batch_per_rank(dp) / m
        work = self.micro_s(dp) / share / m
        slot = work + mp.tp_s(samples, p) + mp.p2p_s(samples, p)
        o, s = self.optimizer_s, self.sharded_fraction
        optimizer = o * (1 - s + s / dp) / share
        reductions, others = [], 0.0
        for t in self.traffic:
            cost = mp.dp_cost(self.comms[t.collective])
            nbytes = self._bytes(t, dp) / share
            if t.collective in PER_STEP:
                # tensor parallelism reduces a rank's gradient shards in one flat allreduce
                # after backward (hpcdl's tensor backend), not in buckets during it
                reductions.append((cost, nbytes, 1 if layout.tp > 1 else t.calls))
            else:
                others += n * m * cost.time(nbytes, dp, t.calls)
        reduce_s = sum(cost.time(nbytes, dp, calls) for cost, nbytes, calls in reductions)
        if self.overlap == "none" or layout.pp > 1 or layout.tp > 1:
            exposed = reduce_s
        elif self.overlap == "full":
            exposed = 0.0
        else:
            exposed = bucket_tail(reductions, dp, self.backward_fraction * work, self.cycle_s)
        compute = n * m * work + optimizer
        comm = n * m * (slot - work) + reduce_s + others
        bubble = n * (layout.pp - 1) * slot
        return compute, comm, n * (m + layout.pp - 1) * slot + optimizer + exposed + others, bubble

    def samples_per_step(self, p: int) -> float:
        if self.parallel is not None:
            dp = replicas(self.parallel.layout, p) or 0
            return dp * self.batch_per_rank(dp) * self.accumulation_steps
        return p * self.batch_per_rank(p) * self.accumulation_steps

    def samples_per_s(self, p: int) -> float:
        return self.samples_per_step(p) / self.parts(p)[2]

    def step_rse(self, p: int) -> float:
        """Relative standard error of the step time: each fitted parameter (γ, every α, every
        β) moved by its standard error, the step's relative changes added in quadrature."""
        step = self.parts(p)[2]
        moved = [replace(self, gamma_flops_per_s=self.gamma_flops_per_s / (1 + self.gamma_rse))]
        for parameter in ("alpha", "beta"):
            moved.append(replace(self, comms={k: c.shifted(parameter) for k, c in self.comms.items()}))
        return math.sqrt(sum(((m.parts(p)[2] - step) / step) ** 2 for m in moved))

    def algorithm(self, p: int) -> str:
        """The algorithm of the step's largest collective at ``p`` ranks (for the table)."""
        if p <= 1 or not self.traffic:
            return "-"
        t = max(self.traffic, key=lambda t: t.bytes)
        return self.comms[t.collective].algorithm(self._bytes(t, p) / t.calls, p)

    def point(self, p: int) -> PredictionPoint:
        """Predicted step time, its parts, samples/s, speed-up and efficiency at ``p`` ranks."""
        compute, comm, step = self.parts(p)
        samples = self.samples_per_step(p) / step
        one = replace(self, parallel=None)  # the base: one rank holding the whole model
        (row,) = scaling_table([(p, samples)], base=(1, one.samples_per_s(1)))
        straggler, sync, data = self.losses(p, self.collective_parts(p)[2])
        exposed = step - compute - straggler - sync - data
        if self.overlap == "full":
            exposed = max(0.0, comm - compute)
        layered = self.parallel is not None
        return PredictionPoint(
            np=p,
            ranks=p,
            step_s=step,
            compute_s=compute,
            comm_s=comm,
            exposed_comm_s=exposed,
            overlap=metrics.overlap_fraction(comm, exposed),
            algorithm=self.algorithm(p),
            samples_per_s=samples,
            ai_ops_per_s=metrics.ai_ops_per_s(self.train_flops_per_sample, samples),
            speedup=row.speedup,
            efficiency=row.efficiency,
            step_rse=self.step_rse(p),
            straggler_s=straggler,
            sync_s=sync,
            data_s=data,
            layout=str(self.parallel.layout) if self.parallel is not None else None,
            bubble_s=self.layered(p)[3] if layered else None,
        )


def bucket_tail(
    reductions: Sequence[tuple[Cost, float, int]], p: int, backward_s: float, cycle_s: float
) -> float:
    """Seconds of gradient reduction after backward ends: each reduction of ``nbytes`` in
    ``calls`` buckets, the buckets ready evenly through backward (bucket i of k at
    ``(i+1)/k · backward_s``, plus half a cycle), reduced one after another on one stream; what
    ends before backward is hidden, the last bucket never is (DDP, Horovod)."""
    if p <= 1:
        return 0.0
    buckets = sorted(
        ((i + 1) / calls * backward_s + cycle_s / 2, cost.time(nbytes / calls, p))
        for cost, nbytes, calls in reductions
        for i in range(calls)
    )
    end = 0.0
    for ready, seconds in buckets:
        end = max(end, ready) + seconds
    return max(0.0, end - backward_s) if buckets else 0.0


def model_for(
    spec: Mapping[str, Any],
    batch: int,
    gamma_flops_per_s: float,
    comm: Comm | Mapping[str, Cost] | CostsOf,
    *,
    backend: str = "horovod",
    mode: str = "weak",
    overlap: str = "bucketed",
    optimizer_s: float = 0.0,
    accumulation_steps: int | None = None,
    backward_fraction: float = BACKWARD_FRACTION,
    gamma_rse: float = 0.0,
    layout: Layout | None = None,
    step_cv: float = 0.0,
    sync_calls: int = 0,
    data_rate: float = 0.0,
) -> Model:
    """The model of a workload (a spec dict, counted analytically) on a system (γ; the cost of
    each collective: one ``Comm`` is an allreduce's, a mapping by collective, or a function of
    the step's traffic, as ``hpcdl.scaling.fitting`` fits a sweep around the step's message
    sizes; the optimizer's seconds per step at one rank, when known).
    ``accumulation_steps`` None: the spec's own (1 where it has none). ``layout``: tensor and
    pipeline parallelism on top (``hpcdl.scaling.modelparallel``), on the costs' two levels.
    ``step_cv``, ``sync_calls``, ``data_rate``: the losses besides communication
    (``Model.losses``)."""
    reducing = [n for n in BACKENDS.names() if n != SINGLE]
    if backend not in reducing:
        raise InputError("predict.backend", backend, f"allowed: {', '.join(reducing)}")
    workload = spec_from_dict(dict(spec))
    if accumulation_steps is None:
        accumulation_steps = workload.accumulation_steps
    experts = workload.experts if isinstance(workload, moe.MoEKnobs) and workload.expert_parallel else 0
    sharded_at = experts if experts > 1 else 2  # the traffic per rank is the same at every such p
    traffic = step_traffic(workload, backend, sharded_at, batch)
    if isinstance(comm, Comm):
        comms: Mapping[str, Cost] = {comm.collective: comm}
    else:
        comms = dict(comm) if isinstance(comm, Mapping) else dict(comm(traffic))
    parallel = None
    if layout is not None:
        check(layout, workload)
        intra, inter, rpn = levels(comms)
        parallel = ModelParallel(
            layout=layout, activations=activations(workload), intra=intra, inter=inter, ranks_per_node=rpn
        )
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
        accumulation_steps=accumulation_steps,
        backward_fraction=backward_fraction,
        cycle_s=BACKENDS.get(backend).cycle_s,
        gamma_rse=gamma_rse,
        parallel=parallel,
        step_cv=step_cv,
        sync_calls=sync_calls,
        data_rate=data_rate,
        ranks_per_node=levels(comms)[2] if comms else 1,
    )


def system_comms(system: Any, ranks_per_node: int) -> dict[str, Cost]:
    """Every collective's cost on a ``hpcdl.scaling.system.System``."""
    return {c: system.cost(c, ranks_per_node) for c in COLLECTIVES}


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
