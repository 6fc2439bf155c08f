"""The report's knob-sweep figures (``hpcdl sweep --knob``): how samples/s, MFU, peak memory
(measured and estimated) and the step's phase shares grow with one knob, one curve per system.

A sweep's curve is drawn from the records its summary names that verify (the summary's own
figures are not trusted: a report reads records); a point whose run failed its validity checks
(a disturbed machine) is drawn hollow. Sweeps of one workload along one knob on several systems
share a figure."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, PercentFormatter

from hpcdl.escape import plot_text as plain
from hpcdl.records.audit import Audit
from hpcdl.records.loader import Document, KnobSweepSummary, beside
from hpcdl.results.report.data import system_of
from hpcdl.results.report.figures import PHASES, _log_si, _save
from hpcdl.results.report.plots import Plot, slug
from hpcdl.scaling.knobsweep import point_figures


@dataclass(frozen=True)
class Curve:
    """One system's points of a knob sweep, by knob value (each a record's figures)."""

    system: str
    points: dict[float, dict[str, Any]]


@dataclass(frozen=True)
class KnobFigure:
    """The curves of one workload along one knob: a figure."""

    title: str
    knob: str
    curves: list[Curve]


def groups(records: Sequence[Audit], summaries: Sequence[Document[KnobSweepSummary]]) -> list[KnobFigure]:
    """A figure per workload (its spec but the swept knob, and the batch where ``--fit`` chose
    it) and knob, a curve per summary with two or more points whose records verify and whose
    samples/s a log axis can place (a point whose run failed its checks is drawn hollow)."""
    verified = {Path(os.path.realpath(a.path)): a for a in records if not a.problems}
    found_by: dict[str, KnobFigure] = {}
    for doc in summaries:
        s = doc.view
        points: dict[float, dict[str, Any]] = {}
        system = ""
        for p in s.points:
            found = verified.get(beside(doc.path, p.record) or Path()) if p.record else None
            if found is None or not 0 < found.result.metrics.samples_per_s < math.inf:
                continue
            points[p.value] = point_figures(p.value, found.record)
            system = system or system_of(found)
        if len(points) < 2:
            continue
        ignored = {s.knob, *(("batch_size",) if s.fitted else ())}
        workload = {k: v for k, v in s.spec.items() if k not in ignored}
        key = json.dumps([s.knob, s.np, workload], sort_keys=True)
        if key not in found_by:
            ranks = f"{s.np} rank{'s' if s.np > 1 else ''}"
            title = f"{s.spec.get('family', '?')} along {s.knob} ({ranks})"
            found_by[key] = KnobFigure(title, s.knob, [])
        found_by[key].curves.append(Curve(system, points))
    return list(found_by.values())


def knob_plots(records: Sequence[Audit], summaries: Sequence[Document[KnobSweepSummary]]) -> list[Plot]:
    out = []
    for i, f in enumerate(groups(records, summaries), 1):
        systems = ", ".join(sorted({c.system for c in f.curves}))
        caption = (
            f"{f.title} on {systems}: samples/s, MFU, peak memory per rank (measured, solid; estimated, "
            f"dashed) and the share of each step phase against {f.knob}, one curve per system; from the "
            "sweep's records that verify, hollow where a run failed its validity checks"
        )
        draw_it = partial(draw, title=f.title, knob=f.knob, found=f.curves)
        out.append(Plot(f"knob-{i}-{slug(f.title)}.png", caption, draw_it))
    return out


def draw(path: Path, title: str, knob: str, found: Sequence[Curve]) -> Path:
    """Top row: samples/s, MFU and memory against the knob, a line per system; below, one panel
    per system with the phases' shares stacked at each value."""
    fig = Figure(figsize=(13, 7.5), layout="constrained")
    n = len(found)
    grid = fig.add_gridspec(2, 3 * n)  # three panels above, one per system below
    ax_x, ax_m, ax_b = (fig.add_subplot(grid[0, i * n : (i + 1) * n]) for i in range(3))
    for i, c in enumerate(found):
        xs = sorted(c.points)
        colour, name = f"C{i % 10}", plain(c.system or "this system")
        ax_x.plot(xs, [c.points[x]["samples_per_s"] for x in xs], "-", color=colour, label=name)
        mfu = [(x, c.points[x]["mfu"]) for x in xs if c.points[x]["mfu"] is not None]
        ax_m.plot([x for x, _ in mfu], [m for _, m in mfu], "-", color=colour, label=name)
        ax_b.plot(
            xs, [c.points[x]["peak_memory_bytes"] for x in xs], "-", color=colour, label=f"{name} measured"
        )
        for x in xs:  # filled where the run passed its checks, hollow where it did not
            face = colour if c.points[x]["valid"] else "none"
            for ax, key in ((ax_x, "samples_per_s"), (ax_m, "mfu"), (ax_b, "peak_memory_bytes")):
                if c.points[x][key] is not None:
                    ax.plot([x], [c.points[x][key]], "o", color=colour, mfc=face)
        est = [
            (x, c.points[x]["estimated_memory_bytes"]) for x in xs if c.points[x]["estimated_memory_bytes"]
        ]
        ax_b.plot(
            [x for x, _ in est],
            [e for _, e in est],
            "s--",
            color=colour,
            mfc="none",
            label=f"{name} estimated",
        )
    for ax, ylabel in ((ax_x, "samples/s (all ranks)"), (ax_m, "MFU"), (ax_b, "peak memory per rank (B)")):
        ax.set_xlabel(knob)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    values = [x for c in found for x in c.points]
    if min(values) > 0 and max(values) / min(values) >= 8:  # powers of two, as knobs usually go
        for ax in (ax_x, ax_m, ax_b):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    _log_si(ax_x)
    _log_si(ax_b, "B")
    ax_m.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax_m.set_ylim(bottom=0)
    for i, c in enumerate(found):
        shares(fig.add_subplot(grid[1, 3 * i : 3 * (i + 1)]), knob, c)
    fig.suptitle(plain(title))
    return _save(fig, path)


def shares(ax: Axes, knob: str, c: Curve) -> None:
    """The phases' shares of the summed medians at each value, stacked bars (evenly spaced)."""
    xs = sorted(c.points)
    bottom = np.zeros(len(xs))
    for j, phase in enumerate(PHASES):
        values = np.array([c.points[x]["phase_shares"].get(phase, 0.0) for x in xs])
        if not values.any():
            continue
        ax.bar(range(len(xs)), values, bottom=bottom, color=f"C{j}", label=phase)
        bottom += values
    ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
    ax.set_xlabel(knob)
    ax.set_ylabel("share of the step's phases")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(0, 1)
    ax.set_title(plain(c.system or "this system"), fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
