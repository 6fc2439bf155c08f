"""The report's operator-mix figure (``hpcdl run --profile``): where each workload's step goes on
each system, across the stack: the step's phases, then within each phase the operator classes
(``metrics.operators``; docs/metrics.md, "Operator classes"). Workloads are grouped, their
systems side by side, from records that verify."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import PercentFormatter

from hpcdl.escape import plot_text as plain
from hpcdl.measure.kernels import CLASSES
from hpcdl.records.audit import Audit
from hpcdl.records.views import Operators
from hpcdl.results.report.data import label, system_of
from hpcdl.results.report.figures import PHASES, _save
from hpcdl.results.report.plots import Plot

CLASS_COLOURS = {cls: f"C{i}" for i, cls in enumerate(CLASSES)}
PHASE_GREYS = ("0.85", "0.65", "0.45", "0.3", "0.15", "0.75")


class Mix(NamedTuple):
    """One profiled record: its workload and system, and each phase's share of the step with
    the classes' shares within it."""

    workload: str
    system: str
    phases: dict[str, tuple[float, dict[str, float]]]


def mix_of(a: Audit, ops: Operators) -> Mix:
    """The phases' shares of the step (their medians in the timed window, many steps) and the
    classes' shares in each (the profiled steps)."""
    timed = a.result.metrics.phases_s
    times = {p: timed[p].median if p in timed else ph.time_s for p, ph in ops.phases.items()}
    whole = sum(times.values())
    phases = {
        p: (times[p] / whole if whole > 0 else 0.0, dict(ops.phases[p].time_share))
        for p in PHASES
        if p in ops.phases
    }
    return Mix(label(a).split(" (")[0], system_of(a), phases)


def mixes(records: Sequence[Audit]) -> list[Mix]:
    """Every record profiled with ``--profile`` that verifies (as the phases figure, also one
    whose run a disturbed machine made invalid: its mix is still what ran), by workload."""
    found: dict[str, list[Mix]] = {}
    for a in records:
        ops = a.result.metrics.operators
        if ops is None or a.problems:
            continue
        key = json.dumps([a.result.spec, a.result.world_size], sort_keys=True)
        found.setdefault(key, []).append(mix_of(a, ops))
    mixes = [m for group in found.values() for m in sorted(group, key=lambda m: m.system)]
    return sorted(mixes, key=lambda m: natural(m.workload))  # seq_len64 before seq_len128


def natural(text: str) -> list[tuple[int, str]]:
    """A sort key that orders the numbers inside a name by value."""
    return [(int(part), "") if part.isdigit() else (0, part) for part in re.split(r"(\d+)", text)]


def operator_plots(records: Sequence[Audit]) -> list[Plot]:
    found = mixes(records)
    if not found:
        return []
    caption = (
        "Where each profiled workload's step goes, its systems side by side (hpcdl run --profile): the "
        "upper bar splits the step into phases (their medians in the timed window), the lower bar each "
        "phase into operator classes (steps profiled after the window: CPU time, or the kernels' device time)"
    )
    return [Plot("operators.png", caption, partial(draw, found=found))]


def draw(path: Path, found: Sequence[Mix]) -> Path:
    fig = Figure(figsize=(12, 1.8 + 0.75 * len(found)), layout="constrained")
    ax = fig.subplots()
    for i, m in enumerate(found):
        left = 0.0
        for j, (phase, (share, classes)) in enumerate(m.phases.items()):
            grey = PHASE_GREYS[j % len(PHASE_GREYS)]
            ax.barh(i - 0.2, share, left=left, height=0.3, color=grey)
            if share > 0.06:
                ink = "white" if float(grey) < 0.5 else "black"
                ax.text(left + share / 2, i - 0.2, phase, ha="center", va="center", fontsize=7, color=ink)
            inner = left
            for cls in CLASSES:
                width = share * classes.get(cls, 0.0)
                if width > 0:
                    ax.barh(i + 0.17, width, left=inner, height=0.3, color=CLASS_COLOURS[cls])
                    inner += width
            left += share
    ax.set_yticks(np.arange(len(found)), [plain(f"{m.workload}\n{m.system}") for m in found], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("share of the profiled step's operator time: phases (upper bar), operator classes (lower)")
    used = [cls for cls in CLASSES if any(c.get(cls, 0) > 0 for m in found for _, c in m.phases.values())]
    handles = [Patch(color=CLASS_COLOURS[cls], label=cls) for cls in used]
    fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), fontsize=8)
    return _save(fig, path)
