"""The report's scaling sweeps: the sweep summaries found, then sweeps put together from loose
records of one workload at several rank counts (e.g. the suite run at 1 and at N ranks)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcdl.records import schema
from hpcdl.records.audit import Audit
from hpcdl.records.loader import Document, SweepPoint, SweepSummary, beside
from hpcdl.records.views import finite
from hpcdl.results.best import best_per_rank_count
from hpcdl.results.report.data import label, system_of

MAX_RANKS = 1 << 30
"""a rank count beyond this in a summary is not a measurement a figure can place"""


@dataclass(frozen=True)
class Sweep:
    """Samples/s of one workload at several rank counts, as a sweep summary (also for sweeps
    put together from records)."""

    label: str
    summary: SweepSummary


def sweeps(records: Sequence[Audit], summaries: Sequence[Document[SweepSummary]]) -> list[Sweep]:
    """The sweep summaries with a measured point, then groups of records that no summary covers."""
    out: list[Sweep] = []
    covered: set[Path | None] = set()
    for doc in summaries:
        covered |= {beside(doc.path, p.record) for p in doc.view.points if p.record}
        if measured_points(doc.view):
            out.append(Sweep(re.sub(r"-summary$", "", doc.path.stem), doc.view))
    return out + record_groups([r for r in records if r.path not in covered])


def plottable(points: Mapping[int, float]) -> dict[int, float]:
    """The points a figure can place: rank counts from 1 to MAX_RANKS, positive finite rates."""
    return {n: x for n, x in points.items() if 1 <= n <= MAX_RANKS and finite(x) and x > 0}


def measured_points(summary: SweepSummary) -> dict[int, float]:
    """Rank count -> samples/s of a summary's points that have a record."""
    return plottable({p.np: p.samples_per_s for p in summary.points if p.record and p.samples_per_s})


def record_groups(records: Sequence[Audit]) -> list[Sweep]:
    """Weak-scaling sweeps from loose records: the same spec (batch per rank included) on the
    same system and device at two or more rank counts; the best record counts where a count has
    several, as in the score. Only records that verify and passed validity take part: a
    scaling curve from an edited or failed run would mislead."""
    groups: dict[str, list[Audit]] = {}
    for a in records:
        r = a.result
        if a.problems or not r.validity.passed or not r.metrics.samples_per_s > 0:
            continue
        key = json.dumps([r.spec, system_of(a), r.environment.device_name], sort_keys=True)
        groups.setdefault(key, []).append(a)
    best = [best_per_rank_count(g, lambda r: r.metrics.samples_per_s) for g in groups.values()]
    several = len({system_of(a) for a in records}) > 1
    return [_group_sweep(g, several) for g in best if len(g) > 1]


def _group_sweep(group: Mapping[int, Audit], several: bool = False) -> Sweep:
    base = group[min(group)]
    points = [
        SweepPoint(
            np=n,
            record=a.path.name,
            samples_per_s=a.result.metrics.samples_per_s,
            ai_ops_per_s=a.result.metrics.ai_ops_per_s,
            batch_per_rank=a.result.settings.batch_per_rank,
            backend=a.result.settings.backend,
        )
        for n, a in sorted(group.items())
    ]
    summary = SweepSummary(schema.SWEEP, "weak", base.result.spec, points, base_np=min(group))
    name = re.sub(r" \(np\d+\)$|-np\d+$", "", label(base))
    system = f"{system_of(base)}: " if several else ""  # two machines' sweeps of one workload apart
    return Sweep(f"{system}{name} (records)", summary)
