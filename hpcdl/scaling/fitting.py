"""Fitting the scaling model to measurements: α and β of each collective from the sweeps of
``hpcdl comm`` (one level, or two: a sweep inside one node and one across two), γ and the
step's phases from a 1-rank record, and the standard errors of each fit from its residuals
(what ``Model.step_rse`` turns into the prediction's uncertainty). The model itself is
``hpcdl.scaling.model``; docs/metrics.md ("Prediction") states the fits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from hpcdl import metrics
from hpcdl.errors import HpcdlError, InputError
from hpcdl.parallel.backends import Traffic
from hpcdl.parallel.layout import parse_layout
from hpcdl.records.loader import CommRow, CommSweep
from hpcdl.records.views import Result
from hpcdl.scaling.collectives import Comm, Cost, Hierarchy
from hpcdl.scaling.model import BACKWARD_FRACTION, CostsOf, Model, model_for
from hpcdl.scaling.modelparallel import Layout

__all__ = ["fit_comm", "fitted", "fitted_hierarchy", "hierarchy_comms", "model_from_records"]


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
    zero (the time grows faster than the size there: gloo's all-to-all across two hosts took
    6.0 ms for 256 KiB and 39.3 for 1 MiB) or fall (noise), it runs from zero through the
    measurement interpolated at the message size: exact there, and no negative latency for
    other rank counts to multiply."""
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
    alpha_se, beta_rse = _standard_errors(sizes, times)
    local = message_bytes is not None and sizes[0] < message_bytes <= sizes[-1]
    if message_bytes is not None and local:
        upper = int(np.searchsorted(sizes, message_bytes))
        sizes, times = sizes[upper - 1 : upper + 1], times[upper - 1 : upper + 1]
    (a, c) = _line(sizes, times)
    # convex here, or noise: from zero through the time interpolated at the message size
    if message_bytes is not None and local and (a < 0 or c <= 0):
        a, c = 0.0, float(np.interp(message_bytes, sizes, times)) / message_bytes
    a = max(float(a), 0.0)  # a negative intercept over all sizes is noise in the latency: none
    if not c > 0:
        raise HpcdlError(f"the {collective} sweep does not grow with the buffer size; cannot fit a bandwidth")
    factor = metrics.bus_factor(collective, ranks)
    return Comm(
        alpha_s=float(a) / (ranks * factor),
        beta_bytes_per_s=factor / float(c),
        collective=collective,
        alpha_se_s=alpha_se / (ranks * factor),
        beta_rse=beta_rse,
    )


def _line(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """Least squares of ``t = a + c·S`` in relative error."""
    design = np.stack([np.ones_like(sizes), sizes], axis=1) / times[:, None]
    (a, c), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    return float(a), float(c)


def _standard_errors(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """Standard error of the intercept ``a`` (seconds) and relative standard error of the slope
    ``c`` of the line over every size, from its residuals (``σ² (XᵀX)⁻¹``, σ² the residuals'
    sum of squares over n − 2); 0 where two sizes leave no residual to judge by."""
    if len(sizes) < 3:
        return 0.0, 0.0
    design = np.stack([np.ones_like(sizes), sizes], axis=1) / times[:, None]
    theta, *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    residual = np.ones_like(times) - design @ theta
    sigma2 = float(residual @ residual) / (len(sizes) - 2)
    try:
        cov = sigma2 * np.linalg.inv(design.T @ design)
    except np.linalg.LinAlgError:
        return 0.0, 0.0
    c = float(theta[1])
    return math.sqrt(max(cov[0, 0], 0.0)), (math.sqrt(max(cov[1, 1], 0.0)) / c if c > 0 else 0.0)


def comm_from_record(comm: CommSweep) -> Comm:
    """The fitted α, β of a sweep's allreduce (the backend's column, not raw MPI)."""
    return fit_comm(comm.rows, comm.ranks)


def comms_for(sweep: CommSweep, traffic: Sequence[Traffic]) -> dict[str, Cost]:
    """α, β of each collective of a step, fitted to the sweep around its message size."""
    return {t.collective: fit_comm(sweep.rows, sweep.ranks, t.collective, t.bytes / t.calls) for t in traffic}


def fitted(sweep: CommSweep) -> CostsOf:
    """One level: a step's collectives fitted to ``sweep`` (for ``model_for``)."""
    return lambda traffic: comms_for(sweep, traffic)


def fitted_hierarchy(
    intra: CommSweep, inter: CommSweep, ranks_per_node: int, algorithms: tuple[str, ...] | None = None
) -> CostsOf:
    """Two levels: a step's collectives fitted to a sweep inside one node and one across two
    (for ``model_for``); ``algorithms``: the allreduce algorithms the library runs (None: all)."""
    return lambda traffic: hierarchy_comms(intra, inter, traffic, ranks_per_node, algorithms)


def hierarchy_comms(
    intra: CommSweep,
    inter: CommSweep,
    traffic: Sequence[Traffic],
    ranks_per_node: int,
    algorithms: tuple[str, ...] | None = None,
) -> dict[str, Cost]:
    """Two levels fitted to two sweeps: ``intra`` taken inside one node, ``inter`` across two
    nodes (one rank on each: its β is the node's fabric, its α the latency across it). An
    all-to-all's β across is one rank's, which may be below the fabric (gloo's at one rank a
    node sends and receives in turn): the allreduce's fit at the same size gives the fabric."""
    out: dict[str, Cost] = {}
    for t in traffic:
        size = t.bytes / t.calls
        fabric = 0.0
        if t.collective == "all_to_all" and any(r.collective == "allreduce" for r in inter.rows):
            fabric = fit_comm(inter.rows, inter.ranks, "allreduce", size).beta_bytes_per_s
        cost = Hierarchy(
            intra=fit_comm(intra.rows, intra.ranks, t.collective, size),
            inter=fit_comm(inter.rows, inter.ranks, t.collective, size),
            ranks_per_node=ranks_per_node,
            collective=t.collective,
            fabric_bytes_per_s=fabric,
        )
        out[t.collective] = replace(cost, algorithms=algorithms) if algorithms else cost
    return out


def model_from_records(
    base: Result,
    comm: Comm | Mapping[str, Cost] | CostsOf | CommSweep,
    *,
    backend: str = "horovod",
    mode: str = "weak",
    overlap: str = "bucketed",
    accumulation_steps: int | None = None,
    layout: Layout | None = None,
    gamma_from: str = "throughput",
    sync_calls: int = 0,
) -> Model:
    """The model of ``base``'s workload on ``base``'s system: γ from its AI-ops/s (``gamma_from
    "throughput"``) or from the medians of its phases (``"phases"``: ``F · b`` over data +
    forward + backward + optimizer, what a step computes without the stalls a loaded machine
    puts between them), the optimizer's time and backward's share from its phases (it must be a
    1-rank record), γ's standard error from the spread of its step times; α and β given or
    fitted to a sweep.

    ``base`` may instead be the record of one tensor-parallel group (``--layout tp=T``, ``T``
    ranks, no replicas, no pipeline; phases only): what a tp rank computes is then measured, not
    taken as 1/T of the whole model's work (on a CPU DTensor's sharded step is not T times
    faster), and stands in the model as a 1-rank whole model ``T`` times as slow: γ = ``F · b``
    over ``T`` × (its phases less its tensor-parallel collectives, which the model adds back on
    the intra-node link), the optimizer ``T`` × its own."""
    tp = tensor_parallel_ranks(base)
    if base.world_size != tp:
        raise InputError(
            "predict.base",
            base.name,
            "a 1-rank result record, or one tensor-parallel group's (--layout tp=N), calibrates gamma",
        )
    if gamma_from not in GAMMA_FROM:
        raise InputError("predict.gamma_from", gamma_from, "allowed: " + ", ".join(GAMMA_FROM))
    if tp > 1 and gamma_from != "phases":
        raise InputError("predict.gamma_from", gamma_from, "phases, with a tensor-parallel base record")
    gamma = base.metrics.ai_ops_per_s if gamma_from == "throughput" else phase_gamma(base, tp)
    steps = base.metrics.step_time_s
    batch = base.settings.batch_per_rank
    phases = base.metrics.phases_s
    optimizer = phases.get("optimizer")
    optimizer_s = tp * optimizer.median if optimizer is not None and math.isfinite(optimizer.median) else 0.0
    forward, backward = phases.get("forward"), phases.get("backward")
    fraction = BACKWARD_FRACTION
    if forward is not None and backward is not None and forward.median + backward.median > 0:
        fraction = backward.median / (forward.median + backward.median)
    return model_for(
        base.spec,
        batch,
        gamma,
        fitted(comm) if isinstance(comm, CommSweep) else comm,
        backend=backend,
        mode=mode,
        overlap=overlap,
        optimizer_s=optimizer_s,
        accumulation_steps=accumulation_steps,
        backward_fraction=fraction if math.isfinite(fraction) else BACKWARD_FRACTION,
        gamma_rse=median_rse(base.metrics.step_time_s),
        layout=layout,
        step_cv=metrics.step_cv(steps.p10, steps.p90, steps.median),
        sync_calls=sync_calls,
        data_rate=read_rate(base),
    )


def read_rate(base: Result) -> float:
    """Samples/s the record's rank read from its HDF5 shards through its DataLoader (a node's
    input pipeline as one rank measured it), or 0 where it read none (data in memory)."""
    read = base.metrics.io.read
    rate = read.samples_per_s if read is not None else 0.0
    return float(rate) if math.isfinite(rate) and rate > 0 else 0.0


GAMMA_FROM = ("throughput", "phases")
COMPUTE_PHASES = ("data", "forward", "backward", "optimizer")


def phase_gamma(base: Result, tp: int = 1) -> float:
    """γ of a 1-rank record from its phases: ``F · b / Σ median(phase)`` over ``COMPUTE_PHASES``;
    of a tensor-parallel group's record, ``F · b / (tp · (Σ − its tp collectives per step))``."""
    phases = base.metrics.phases_s
    seconds = sum(phases[k].median for k in COMPUTE_PHASES if k in phases and math.isfinite(phases[k].median))
    if tp > 1:
        seconds = tp * (seconds - sum(
            c.seconds_per_step for name, c in base.metrics.communication.collectives.items()
            if name.startswith("tp.")
        ))  # fmt: skip
    if not seconds > 0:
        raise InputError("predict.base", base.name, "a record whose phases were timed (gamma from phases)")
    return base.metrics.train_flops_per_sample * base.settings.batch_per_rank / seconds


def tensor_parallel_ranks(base: Result) -> int:
    """``T`` where ``base`` ran one tensor-parallel group of its ``T`` ranks alone (no replicas,
    no pipeline), else 1."""
    layout = parse_layout(base.settings.layout or "")
    return layout.tp if layout.tp > 1 and layout.pp == 1 and layout.dp in (0, 1) else 1


def median_rse(stats: Any) -> float:
    """Relative standard error of a median of ``n`` steps: ``1.2533 · σ / √n / median`` with
    ``σ ≈ (p90 − p10) / 2.563`` (a normal sample's 10th-90th percentile span)."""
    if not (stats.n > 1 and stats.median > 0 and math.isfinite(stats.p90 - stats.p10)):
        return 0.0
    return 1.2533 * (stats.p90 - stats.p10) / 2.563 / math.sqrt(stats.n) / stats.median
