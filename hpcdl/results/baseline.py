"""A class's records against a baseline (``--baseline DIR`` on ``hpcdl run --class``, ``status``
and ``rank``): each workload's AI-ops/s over the baseline's at the same scale, and a pass or fail
at a stated threshold.

The baseline is a folder of records: a vendor's published ones, or the site's acceptance run.
Both sides count only records ``hpcdl rank`` accepts (the same audit and gate), the best of each
workload at each scale (``results.best``). The threshold is the acceptance rule of NVIDIA DGX
Cloud's Exemplar program, applied to hpcdl's classes: at least 95 % of the baseline on every
workload. A workload without a baseline record at the scale compared cannot pass: the check says
which.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcdl.errors import InputError
from hpcdl.records.audit import Audit, audit, gate_problems
from hpcdl.records.loader import load_tree
from hpcdl.records.views import Result
from hpcdl.results.best import best_per_rank_count
from hpcdl.results.score import record_class, suite_workload
from hpcdl.results.text import si, table
from hpcdl.workloads import recipes

THRESHOLD = 0.95
"""the least share of the baseline each workload must reach (DGX Cloud Exemplar's acceptance)"""
RULE = "at least 95 % of the baseline on every workload: DGX Cloud Exemplar's acceptance rule"

Best = dict[str, dict[int, float]]
"""workload -> world size -> the best accepted AI-ops/s there"""


def best_of(audits: Iterable[Audit], size_class: str) -> Best:
    """The best AI-ops/s of each of the class's workloads at each scale, from accepted records
    of the class's current version."""
    version = recipes.suite(size_class).version
    by_workload: dict[str, list[Audit]] = {}
    for a in audits:
        name = suite_workload(a.result.spec, size_class)
        if name is not None and record_class(a.result) == (size_class, version):
            by_workload.setdefault(name, []).append(a)
    return {
        w: {n: a.result.metrics.ai_ops_per_s for n, a in best_per_rank_count(found, _ai_ops).items()}
        for w, found in by_workload.items()
    }


def _ai_ops(r: Result) -> float:
    return r.metrics.ai_ops_per_s


def accepted(paths: Sequence[Path]) -> list[Audit]:
    """The records under ``paths`` that ``hpcdl rank`` accepts (audit and gate)."""
    found = [audit(r) for r in load_tree(list(paths)).records]
    return [a for a in found if not a.problems and not gate_problems(a.result)]


def load_baseline(folder: str | Path, size_class: str | None = None) -> list[Audit]:
    """A baseline folder's accepted records (of ``size_class`` where one is named); one line
    when the folder holds none."""
    path = Path(folder)
    if not path.exists():
        raise InputError("baseline", str(folder), "an existing folder of records")
    found = accepted([path])
    if size_class is not None and not best_of(found, size_class):
        raise InputError("baseline", str(folder), f"holds no accepted record of class {size_class}")
    if not found:
        raise InputError("baseline", str(folder), "holds no record hpcdl rank accepts")
    return found


@dataclass(frozen=True)
class Row:
    workload: str
    ranks: int | None
    mine: float | None
    base: float | None

    @property
    def ratio(self) -> float | None:
        return self.mine / self.base if self.mine is not None and self.base else None

    @property
    def passed(self) -> bool:
        return self.ratio is not None and self.ratio >= THRESHOLD


@dataclass(frozen=True)
class Comparison:
    """A class's workloads against the baseline, each at the scale compared."""

    size_class: str
    folder: str
    rows: list[Row]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def lines(self) -> list[str]:
        head = ["workload", "ranks", "AI-ops/s", "baseline", "ratio", f">= {THRESHOLD:.0%}"]
        body = [
            [
                r.workload,
                str(r.ranks or "-"),
                si(r.mine, "FLOP/s") if r.mine is not None else "no accepted record",
                si(r.base, "FLOP/s") if r.base is not None else "none at this scale",
                f"{r.ratio:.1%}" if r.ratio is not None else "-",
                "pass" if r.passed else "FAIL",
            ]
            for r in self.rows
        ]
        failed = sum(not r.passed for r in self.rows)
        verdict = "pass" if self.passed else f"FAIL ({failed} of {len(self.rows)} workloads)"
        return [
            f"class {self.size_class} against the baseline {self.folder}:",
            table(head, body),
            f"baseline check: {verdict}; {RULE}",
        ]


def compare(
    records: Iterable[Audit], baseline: Iterable[Audit], size_class: str, folder: str, at: int | None = None
) -> Comparison:
    """Each of the class's workloads in ``records`` against the baseline's at world size ``at``
    (the scored scale), or where ``at`` is None at the largest scale the workload was measured."""
    mine, base = best_of(records, size_class), best_of(baseline, size_class)
    rows = []
    for w in recipes.suite(size_class).workloads:
        found = mine.get(w, {})
        n = at if at is not None else max(found, default=None)
        rows.append(Row(w, n, found.get(n) if n else None, base.get(w, {}).get(n) if n else None))
    return Comparison(size_class, folder, rows)
