"""The figures a report draws, as data: for each, its file name, caption, the HTML under it and
the drawing (``figures``) with the figures taken from the records and sweeps."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from hpcdl.measure import caps
from hpcdl.records.audit import Audit
from hpcdl.records.loader import SweepSummary
from hpcdl.records.views import Result, Stats, compute_times, finite
from hpcdl.results.report import figures
from hpcdl.results.report.data import labels, system_of
from hpcdl.results.report.sweeps import Sweep, measured_points, plottable
from hpcdl.results.text import html_table
from hpcdl.scaling.capsweep import cap_figures, cap_of
from hpcdl.scaling.model import relative_error

Predictor = Callable[[SweepSummary], dict[int, float] | None]
"""a sweep summary -> predicted samples/s by rank count, or None"""


@dataclass(frozen=True)
class Plot:
    """A figure to draw: its file name, caption, HTML shown under it, and the drawing."""

    file: str
    caption: str
    draw: Callable[[Path], Path]
    extra: str = ""


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "x"


def scaling_plots(found: Sequence[Sweep], predicted: Predictor | None) -> list[Plot]:
    """One throughput-and-efficiency figure per sweep, with the predicted line when the model gives one."""
    out = []
    for i, s in enumerate(found, 1):
        measured = measured_points(s.summary)
        pred = plottable(predicted(s.summary) or {}) if predicted else {}
        spec, mode = s.summary.spec, s.summary.mode
        caption = (
            f"{s.label}: {mode} scaling of {spec.get('family', '?')} ({spec.get('precision', '?')}, "
            f"batch {spec.get('batch_size', '?')}{' per rank' if mode == 'weak' else ''}) at "
            f"{', '.join(map(str, sorted(measured)))} ranks: samples/s of all ranks and efficiency "
            "against the ideal (N/N₀)·X(N₀)" + ("; dotted: the scaling model's prediction" if pred else "")
        )
        draw = partial(figures.scaling, title=s.label, measured=measured, predicted=pred or None, mode=mode)
        extra = error_table(measured, pred) if pred else ""
        out.append(Plot(f"scaling-{i}-{slug(s.label)}.png", caption, draw, extra))
    return out


def error_table(measured: Mapping[int, float], predicted: Mapping[int, float]) -> str:
    """Predicted against measured samples/s at the measured rank counts, with the relative error."""
    rows = [
        [str(n), f"{x:.4g}", f"{predicted[n]:.4g}", f"{relative_error(predicted[n], x):+.1%}"]
        for n, x in sorted(measured.items())
        if n in predicted and x > 0
    ]
    if not rows:
        return "<p>prediction: no measured rank count to compare with</p>"
    head = ["ranks", "measured samples/s", "predicted samples/s", "error (predicted − measured) / measured"]
    return html_table(head, rows, "prediction")


def phase_plots(records: Sequence[Audit]) -> list[Plot]:
    timed = [a for a in records if a.result.metrics.phases_s]
    names = labels(timed)
    rows = [
        (names[a.path], {p: _median_s(a.result.metrics.phases_s.get(p)) for p in figures.PHASES})
        for a in timed
    ]
    if not rows:
        return []
    caption = (
        "Median time of each step phase (data, forward with loss, backward, a pipeline's schedule, "
        "allreduce, optimizer) "
        "per record, in ms and as a share of their sum"
    )
    return [Plot("phases.png", caption, partial(figures.phases, rows=rows))]


DIMENSIONS = ("computation and the rest", "tp collectives", "pp bubble", "dp allreduce")
"""where a layout run's step goes (:func:`by_dimension`)"""


def by_dimension(result: Result) -> dict[str, float]:
    """Median seconds of a layout run's step by parallel dimension: tensor parallelism's
    collectives (each timed after training on its group: their cost, not their place in the
    step), the pipeline's bubble (its measured share of the ``schedule`` phase), the data-parallel
    replicas' allreduce after backward or the schedule, and what is left of the median step."""
    m = result.metrics
    tp = sum(c.seconds_per_step for name, c in m.communication.collectives.items() if name.startswith("tp."))
    bubble = m.pipeline.bubble_measured * _median_s(m.phases_s.get("schedule")) if m.pipeline else 0.0
    dp = m.communication.exposed_s or 0.0
    rest = max(0.0, m.step_time_s.median - tp - bubble - dp)
    return dict(zip(DIMENSIONS, (rest, tp, bubble, dp), strict=True))


def layout_plots(records: Sequence[Audit]) -> list[Plot]:
    laid = [a for a in records if a.result.settings.layout]
    names = labels(laid)
    rows = [
        (f"{names[a.path]} {str(a.result.settings.layout).split(',schedule')[0]}", by_dimension(a.result))
        for a in laid
    ]
    if not rows:
        return []
    caption = (
        "Where the step of each record with a parallel layout goes, per dimension: tensor parallelism's "
        "collectives (timed after training on their groups), the pipeline's measured bubble, the "
        "data-parallel allreduce, and the rest of the median step (computation, point-to-point sends)"
    )
    return [Plot("layouts.png", caption, partial(figures.phases, rows=rows, parts=DIMENSIONS))]


def _median_s(stats: Stats | None) -> float:
    return stats.median if stats is not None and finite(stats.median) else 0.0


def per_rank_plots(records: Sequence[Audit]) -> list[Plot]:
    multi = [a for a in records if a.result.world_size > 1]
    names = labels(multi)
    groups = [
        figures.RankFigures(names[a.path], [x.samples_per_s for x in rows], compute_times(rows))
        for a in multi
        for rows in [a.result.metrics.per_rank]
    ]
    # A figure needs two ranks and real numbers (an edited record may hold NaN)
    groups = [
        g for g in groups if len(g.samples_per_s) > 1 and all(map(finite, [*g.samples_per_s, *g.compute_s]))
    ]
    if not groups:
        return []
    caption = (
        "Each rank of multi-rank records against the median over the record's ranks: samples/s, and "
        "median compute time: each rank's computation alone where its backend can time it (forward and "
        "backward without waiting for the others: under DDP every rank's backward waits for the slowest, "
        "so phase times even out), else forward + backward; spread = (max − min) / median. The table "
        "names each record's slowest rank and its host."
    )
    return [Plot("per-rank.png", caption, partial(figures.per_rank, groups=groups), straggler_table(multi))]


def straggler_table(records: Sequence[Audit]) -> str:
    """The slowest-computing rank of each multi-rank record, with its host, or why none is named."""
    rows = []
    names = labels(records)
    for a in records:
        s = a.result.metrics.straggler
        if s is None:
            continue
        if s.rank is None or s.compute_only_s is None or s.median_compute_only_s is None:
            rows.append([names[a.path], "", "", "", "", "", s.method])
            continue
        rows.append(
            [
                names[a.path],
                str(s.rank),
                s.host or "",
                f"{s.compute_only_s * 1e3:.3g}",
                f"{s.median_compute_only_s * 1e3:.3g}",
                f"{s.excess:+.1%}" if s.excess is not None else "",
                s.method,
            ]
        )
    head = ["record", "slowest rank", "host", "its compute ms", "median rank ms", "excess", "how timed"]
    return html_table(head, rows, "stragglers") if rows else ""


def power_traces(records: Sequence[Audit]) -> list[figures.PowerTrace]:
    """Rank 0's GPU power trace of every record whose steps file holds one (read by its audit)."""
    traced = [a for a in records if _traced(a)]
    names = labels(traced)
    return [
        figures.PowerTrace(names[a.path], a.steps["gpu_time_s"].tolist(), a.steps["gpu_power_w"].tolist())
        for a in traced
    ]


def _traced(a: Audit) -> bool:
    t, w = a.steps.get("gpu_time_s"), a.steps.get("gpu_power_w")
    return t is not None and w is not None and len(t) > 1 and len(t) == len(w)


def power_plots(records: Sequence[Audit]) -> list[Plot]:
    traces = power_traces(records)
    if not traces:
        return []
    caption = "GPU power of rank 0 over the timed window (NVML, sampled every 0.1 s), one line per record"
    return [Plot("power.png", caption, partial(figures.power, traces=traces))]


def cap_plots(records: Sequence[Audit]) -> list[Plot]:
    """One figure per cap sweep: records of one workload on one system and rank count measured
    under two or more caps of one kind (``environment.cap``), verified and valid."""
    groups: dict[tuple[str, str], dict[float, Audit]] = {}
    for a in records:
        r, cap = a.result, cap_of(a.record)
        if cap is None or a.problems or not r.validity.passed:
            continue
        key = json.dumps([r.spec, system_of(a), r.environment.device_name, r.world_size], sort_keys=True)
        groups.setdefault((key, cap[0]), {})[cap[1]] = a
    out: list[Plot] = []
    for (_, kind), group in groups.items():
        if len(group) < 2:
            continue
        first = next(iter(group.values()))
        unit = caps.KINDS[kind]
        points = {value: cap_point(a) for value, a in sorted(group.items())}
        r = first.result
        title = f"{r.family} on {system_of(first)}, {r.world_size} rank{'s' if r.world_size > 1 else ''}"
        caption = (
            f"{title}: the same work under each {kind} cap ({unit}): time to solution, energy to solution "
            "ETS = ∫P dt and the energy-delay product EDP = ETS·T; the cap of the lowest EDP marked"
        )
        draw = partial(figures.caps, title=title, kind=kind, unit=unit, points=points)
        out.append(Plot(f"caps-{len(out) + 1}-{slug(title)}.png", caption, draw))
    return out


def cap_point(a: Audit) -> figures.CapPoint:
    f = cap_figures(a.record)
    return figures.CapPoint(f["time_s"], f["energy_to_solution_j"], f["energy_delay_product_js"])
