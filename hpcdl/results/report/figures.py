"""Figures of the HTML report (``hpcdl report``): one function per figure, each taking plain
data and a path and writing a PNG.

Figures are ``matplotlib.figure.Figure`` objects, never pyplot: ``savefig`` renders PNG with
the Agg canvas whatever backend is selected, so nothing needs a display, no global pyplot state
is touched (a notebook that imports hpcdl keeps its backend) and no figure has to be closed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullLocator, PercentFormatter

from hpcdl.escape import plot_text
from hpcdl.results.text import si
from hpcdl.scaling.model import relative_error
from hpcdl.scaling.table import scaling_table

DPI = 110
PHASES = ("data", "forward", "backward", "schedule", "allreduce", "optimizer")
"""step phases, in order (a pipeline's ``schedule`` holds its forwards and backwards)"""


class PowerTrace(NamedTuple):
    """Rank 0's GPU power samples of one record (the steps file's ``gpu_time_s``, ``gpu_power_w``)."""

    label: str
    time_s: Sequence[float]
    power_w: Sequence[float]


class RankFigures(NamedTuple):
    """Per-rank figures of one multi-rank record (``metrics.per_rank``), in rank order."""

    label: str
    samples_per_s: Sequence[float]
    compute_s: Sequence[float]  # median seconds of computation (alone where timed); empty when not recorded


class CapPoint(NamedTuple):
    """One capped record: its time to solution, energy to solution and EDP (None unmeasured)."""

    time_s: float
    energy_j: float | None
    edp_js: float | None


class MemoryPoint(NamedTuple):
    """One record's input size per rank and step, its measured peak memory per rank and the
    analytic estimate for it."""

    label: str
    family: str
    workload: str  # records with the same workload (all but the input size) are drawn as one curve
    input_elements: float  # batch per rank x elements of one input sample
    estimate_bytes: float
    measured_bytes: float
    kind: str  # metrics.peak_memory_kind: CUDA allocator peak or the host's peak RSS


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def _si_formatter(unit: str = "") -> FuncFormatter:
    return FuncFormatter(lambda v, _pos: si(v, unit))


def _log_si(ax: Axes, unit: str = "", which: str = "y") -> None:
    """Log y (or x) axis in SI numbers, set after its limits. A decade has one major tick, so
    narrow ranges label minor ticks too (else an axis from 80 to 1500 reads only "100" and
    "1 k"): every one within a decade, 2x and 5x within two, none wider."""
    axis: Axis
    if which == "x":
        ax.set_xscale("log")
        axis, (lo, hi) = ax.xaxis, ax.get_xlim()
    else:
        ax.set_yscale("log")
        axis, (lo, hi) = ax.yaxis, ax.get_ylim()
    axis.set_major_formatter(_si_formatter(unit))
    shown = range(1, 10) if hi / lo < 10 else (2, 5) if hi / lo < 100 else ()

    def minor(v: float, _pos: int | None) -> str:
        mantissa = round(v / 10 ** math.floor(math.log10(v))) if v > 0 else 0
        return si(v, unit) if mantissa in shown else ""

    axis.set_minor_formatter(FuncFormatter(minor))


def _log2_ranks(ax: Axes, ranks: Sequence[int]) -> None:
    """Log-2 x axis labelled with the rank counts themselves (a tick per count when they are few)."""
    ax.set_xscale("log", base=2)
    if len(ranks) <= 13:
        ax.set_xticks(list(ranks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(ranks) / 1.3, max(ranks) * 1.3)
    ax.set_xlabel("ranks N (log₂ scale)")


def _prediction_label(measured: Mapping[int, float], predicted: Mapping[int, float]) -> str:
    errors = [(n, relative_error(predicted[n], x)) for n, x in sorted(measured.items()) if n in predicted]
    if not errors:
        return "predicted (no measured point to compare)"
    if len(errors) <= 3:
        return "predicted (error " + ", ".join(f"N={n}: {e:+.1%}" for n, e in errors) + ")"
    worst = max(abs(e) for _, e in errors)
    return f"predicted (max |error| {worst:.1%} over {len(errors)} points)"


def scaling(
    path: Path,
    title: str,
    measured: Mapping[int, float],
    predicted: Mapping[int, float] | None = None,
    mode: str = "weak",
) -> Path:
    """Throughput (left, log-log) and scaling efficiency (right) against ranks: measured points,
    the ideal (N/N0)·X(N0) and E = 1 from the smallest measured count N0, and the predicted
    samples/s when given, its relative error at the measured counts in the legend."""
    ns = sorted(measured)
    n0, x0 = ns[0], measured[ns[0]]
    every_n = sorted(set(ns) | set(predicted or {}))
    fig = Figure(figsize=(10.5, 4.4), layout="constrained")
    ax_x, ax_e = fig.subplots(1, 2)
    ax_x.plot(every_n, [n / n0 * x0 for n in every_n], "--", color="0.55", label=f"ideal (N/{n0})·X({n0})")
    ax_x.plot(ns, [measured[n] for n in ns], "o-", color="C0", label="measured")
    ax_e.axhline(1.0, ls="--", color="0.55", label="ideal")
    efficiency = [t.efficiency for t in scaling_table(measured.items())]
    ax_e.plot(ns, efficiency, "o-", color="C0", label="measured")
    if predicted:
        pn = sorted(predicted)
        ax_x.plot(
            pn, [predicted[n] for n in pn], "s:", color="C1", label=_prediction_label(measured, predicted)
        )
        # Against the measured X(N0), like the measured curve, so that the model's error at N0
        # shows instead of being normalised away.
        pe = [t.efficiency for t in scaling_table(predicted.items(), base=(n0, x0))]
        ax_e.plot(pn, pe, "s:", color="C1", label="predicted")
        efficiency += pe
    _log_si(ax_x)
    ax_x.set_ylabel("throughput X(N) (samples/s, all ranks)")
    ax_e.set_ylim(0, max(1.1, max(efficiency) * 1.1))
    ax_e.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax_e.set_ylabel(f"efficiency X(N) / ((N/{n0})·X({n0}))")
    for ax in (ax_x, ax_e):
        _log2_ranks(ax, every_n)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(plot_text(f"{title}: {mode} scaling"))
    return _save(fig, path)


def phases(
    path: Path, rows: Sequence[tuple[str, Mapping[str, float]]], parts: Sequence[str] = PHASES
) -> Path:
    """Median seconds of each step phase (or other ``parts`` of a step) per record (``rows``:
    label, part -> seconds), stacked horizontal bars: in milliseconds (left) and as a share of
    the bar (right), since step times of different workloads differ by orders of magnitude."""
    labels = [plot_text(label) for label, _ in rows]
    ms = np.array([[max(0.0, ph.get(p, 0.0)) * 1e3 for p in parts] for _, ph in rows]).reshape(-1, len(parts))
    totals = ms.sum(axis=1, keepdims=True)
    shares = np.divide(ms, totals, out=np.zeros_like(ms), where=totals > 0)
    fig = Figure(figsize=(11, 1.6 + 0.3 * len(rows)), layout="constrained")
    ax_t, ax_f = fig.subplots(1, 2, sharey=True)
    y = np.arange(len(rows))
    for ax, values in ((ax_t, ms), (ax_f, shares)):
        left = np.zeros(len(rows))
        for i, phase in enumerate(parts):
            ax.barh(y, values[:, i], left=left, color=f"C{i}", label=phase if ax is ax_t else None)
            left += values[:, i]
        ax.grid(True, axis="x", alpha=0.3)
    ax_t.set_yticks(y, labels, fontsize=8)
    ax_t.invert_yaxis()
    ax_t.set_xlabel("median time per step (ms)")
    ax_f.set_xlabel("share of the summed medians")
    ax_f.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax_f.set_xlim(0, 1)
    fig.legend(loc="outside upper center", ncols=len(parts), fontsize=9)
    return _save(fig, path)


def per_rank(path: Path, groups: Sequence[RankFigures]) -> Path:
    """Every rank of each multi-rank record against the median over its ranks: samples/s (left)
    and median compute time (right; computation alone where the backend can time it, else
    forward + backward: the straggler figure, since synchronous ranks wait for each other and
    their samples/s hardly differ even when one computes slowly).
    Horizontal bars from the median line at 0, so that a deviation of a few percent shows."""
    fig = Figure(figsize=(12, 1.4 + 0.42 * len(groups)), layout="constrained")
    ax_x, ax_c = fig.subplots(1, 2, sharey=True)
    _deviation_bars(ax_x, [g.samples_per_s for g in groups])
    _deviation_bars(ax_c, [g.compute_s for g in groups])
    labels = []
    for g in groups:
        rates = g.samples_per_s
        line = f"{plot_text(g.label)}\nmedian {si(_median(rates))} samples/s, spread {_spread(rates):.2%}"
        if g.compute_s:
            line += f"\ncompute {_median(g.compute_s) * 1e3:.3g} ms, spread {_spread(g.compute_s):.2%}"
        labels.append(line)
    ax_x.set_yticks(range(len(groups)), labels, fontsize=7)
    ax_x.invert_yaxis()
    ax_x.set_xlabel("rank's samples/s relative to the median over ranks")
    ax_c.set_xlabel("rank's compute time relative to the median over ranks")
    ax_x.set_title("samples/s", fontsize=10)
    ax_c.set_title("median compute time (alone where timed)", fontsize=10)
    ax_x.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def _median(values: Sequence[float]) -> float:
    return float(np.median(values)) if len(values) else float("nan")


def _spread(values: Sequence[float]) -> float:
    median = _median(values)
    return (max(values) - min(values)) / median if len(values) and median > 0 else 0.0


def _deviation_bars(ax: Axes, rows: Sequence[Sequence[float]]) -> None:
    """Row i's values as bars around y = i, each relative to the row's median, with the median
    line at 0; the axis spans at least ±1 % so that noise of 0.1 % does not fill it."""
    widest = 0.01
    for i, values in enumerate(rows):
        median = _median(values)
        if not len(values) or not median > 0:
            continue
        deviation = np.asarray(values, dtype=float) / median - 1
        height = 0.8 / len(values)
        ys = i - 0.4 + height * (np.arange(len(values)) + 0.5)
        ax.barh(ys, deviation, height=0.9 * height, color="C0")
        if len(values) <= 8:  # room to name each rank
            _name_ranks(ax, ys.tolist(), deviation.tolist())
        widest = max(widest, float(np.abs(deviation).max()))
    ax.axvline(0, color="C3", ls="--", lw=1.2, label="median over the record's ranks")
    ax.set_xlim(-1.35 * widest, 1.35 * widest)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(True, axis="x", alpha=0.3)


def _name_ranks(ax: Axes, ys: Sequence[float], deviation: Sequence[float]) -> None:
    """ "rank i" at the end of each rank's bar, outside it."""
    for rank, (y, d) in enumerate(zip(ys, deviation, strict=True)):
        side = 1 if d >= 0 else -1
        ax.annotate(
            f"rank {rank}",
            (d, y),
            xytext=(3 * side, 0),
            textcoords="offset points",
            ha="left" if side > 0 else "right",
            va="center",
            fontsize=6.5,
        )


def power(path: Path, traces: Sequence[PowerTrace]) -> Path:
    """GPU power of rank 0 over the timed window, one line per record."""
    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax = fig.subplots()
    for t in traces:
        start = t.time_s[0]
        ax.plot([s - start for s in t.time_s], t.power_w, lw=1.2, label=plot_text(t.label))
    ax.set_xlabel("time since the first sample (s)")
    ax.set_ylabel("GPU power, rank 0 (W)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncols=2 if len(traces) > 8 else 1)
    return _save(fig, path)


def memory(path: Path, points: Sequence[MemoryPoint], labelled: int = 8) -> Path:
    """Peak memory per rank against the input size of one step (log-log), coloured by family:
    measured (filled, the marker telling CUDA allocator peaks from host RSS) and the analytic
    estimate at the same input sizes (hollow). The points of one workload are joined in order
    of input size, solid for measured and dashed for the estimate, so that a workload measured
    at several sizes is a curve. Records are named beside their points only when there are at
    most ``labelled`` of them."""
    families = sorted({p.family for p in points})
    fig = Figure(figsize=(8.5, 6), layout="constrained")
    ax = fig.subplots()
    for group in _workloads(points):
        colour = f"C{families.index(group[0].family) % 10}"
        # Through the median of repeated records at an input size: no vertical zigzag.
        xs = sorted({p.input_elements for p in group})
        at = [[p for p in group if p.input_elements == x] for x in xs]
        ax.plot(xs, [_median([p.measured_bytes for p in ps]) for ps in at], "-", color=colour, lw=1.2)
        ax.plot(xs, [_median([p.estimate_bytes for p in ps]) for ps in at], "--", color=colour, lw=1.2)
        for p in group:
            marker = _marker(p.kind)
            ax.scatter(p.input_elements, p.measured_bytes, color=colour, marker=marker, s=36, zorder=3)
            ax.scatter(
                p.input_elements, p.estimate_bytes, facecolors="none", edgecolors=colour, marker=marker, s=36
            )
    if len(points) <= labelled:
        _label_clusters(ax, points)
    xs = [p.input_elements for p in points]
    ys = [v for p in points for v in (p.estimate_bytes, p.measured_bytes)]
    ax.set_xlim(min(xs) / 1.5, max(xs) * 1.5)
    ax.set_ylim(min(ys) / 1.5, max(ys) * 1.5)
    _log_si(ax, which="x")
    _log_si(ax, "B")
    ax.set_xlabel("input size of one step per rank (elements): batch per rank × elements per sample")
    ax.set_ylabel("peak memory per rank (bytes)")
    ax.grid(True, which="major", alpha=0.3)
    handles = [
        Line2D([], [], ls="", marker="s", color=f"C{i % 10}", label=plot_text(family))
        for i, family in enumerate(families)
    ]
    handles += [
        Line2D([], [], ls="", marker=_marker(k), color="0.4", label=_kind_label(k))
        for k in sorted({p.kind for p in points})
    ]
    handles += [
        Line2D([], [], ls="-", marker="o", color="0.4", label="measured"),
        Line2D([], [], ls="--", marker="o", color="0.4", mfc="none", label="estimate"),
    ]
    ax.legend(handles=handles, fontsize=8, loc="best")
    return _save(fig, path)


def _workloads(points: Sequence[MemoryPoint]) -> list[list[MemoryPoint]]:
    """The points of each workload, in order of input size."""
    groups: dict[str, list[MemoryPoint]] = {}
    for p in points:
        groups.setdefault(p.workload, []).append(p)
    return [sorted(g, key=lambda p: (p.input_elements, p.measured_bytes)) for g in groups.values()]


def _label_clusters(ax: Axes, points: Sequence[MemoryPoint]) -> None:
    """Each measured point's record name; a stack of names hangs below its cluster, a single
    one sits above its point."""
    for (x, y), labels in _clusters(points).items():
        below = len(labels) > 1
        ax.annotate(
            "\n".join(labels),
            (x, y),
            fontsize=6.5,
            xytext=(5, -4 if below else 3),
            textcoords="offset points",
            va="top" if below else "bottom",
        )


def _clusters(points: Sequence[MemoryPoint], decades: float = 0.05) -> dict[tuple[float, float], list[str]]:
    """Labels of measured points that lie within ``decades`` of each other on both log axes,
    together: one stacked annotation per cluster instead of labels printed over each other."""
    found: dict[tuple[float, float], list[str]] = {}
    for p in points:
        here = (p.input_elements, p.measured_bytes)
        near = [
            c for c in found if all(abs(math.log10(a / b)) < decades for a, b in zip(c, here, strict=True))
        ]
        found.setdefault(near[0] if near else here, []).append(plot_text(p.label))
    return found


def _marker(kind: str) -> str:
    return "o" if kind.startswith("cuda") else "^"


def _kind_label(kind: str) -> str:
    if kind.startswith("cuda"):
        return "CUDA max allocated"
    if kind == "host_peak_rss":
        return "host peak RSS of the run (includes the interpreter)"
    if kind == "host_max_rss":
        return "host peak RSS since the process started"
    return plot_text(kind) or "unknown kind"


def caps(path: Path, title: str, kind: str, unit: str, points: Mapping[float, CapPoint]) -> Path:
    """Time to solution, energy to solution and EDP against the cap, one panel each; the cap of
    the lowest EDP marked with a star (panels without a measured energy say so)."""
    xs = sorted(points)
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    axes = fig.subplots(1, 3, sharex=True)
    measured = [x for x in xs if points[x].edp_js is not None]
    best = min(measured, key=lambda x: points[x].edp_js or 0.0) if measured else None
    panels = (
        ("time_s", "time to solution (s)"),
        ("energy_j", "ETS = ∫P dt (J)"),
        ("edp_js", "EDP = ETS·T (J·s)"),
    )
    for ax, (field, ylabel) in zip(axes, panels, strict=True):
        have = [x for x in xs if getattr(points[x], field) is not None]
        ax.plot(have, [getattr(points[x], field) for x in have], "o-", color="C0")
        if best is not None:
            ax.plot(
                [best],
                [getattr(points[best], field)],
                "*",
                ms=16,
                color="C3",
                label=f"best EDP: {best:g} {unit}",
            )
            ax.legend(fontsize=8)
        if not have:
            ax.text(0.5, 0.5, "energy not measured", ha="center", va="center", transform=ax.transAxes)
            ax.set_yticks([])
        ax.set_xlabel(f"{kind} cap ({unit})")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    fig.suptitle(plot_text(f"{title}: {kind} caps"))
    return _save(fig, path)
