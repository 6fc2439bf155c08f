"""What a report is made of: the records under its paths, each audited (the checks ``hpcdl
rank`` applies before its gate; a record whose figures are out of range is skipped, said with
its reason, before any plot computes with them), the sweep summaries, the allreduce sweeps
fitted for the scaling model, and the files that could not be read."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hpcdl.errors import HpcdlError
from hpcdl.records.audit import Audit, audit, out_of_range
from hpcdl.records.loader import Document, KnobSweepSummary, SweepSummary, Tree, Unread, load_tree
from hpcdl.scaling.fitting import comm_from_record
from hpcdl.scaling.model import Comm


@dataclass(frozen=True)
class ReportData:
    records: list[Audit]
    """every result record, with why it does not verify (empty when it does)"""
    summaries: list[Document[SweepSummary]]
    knob_sweeps: list[Document[KnobSweepSummary]]
    fits: dict[str, Comm]
    """the allreduce latency and bandwidth of each backend, from its allreduce sweep"""
    skipped: list[Unread]
    """files that could not be read, and allreduce sweeps that could not be fitted"""


def load(sources: Sequence[tuple[str, Path]], say: Callable[[str], None]) -> ReportData:
    """Everything under each source's path a report shows, its records named by the source's
    system name ('': their own); each file skipped is said with its reason."""
    tree = Tree()
    for name, path in sources:
        found = load_tree([path])
        found.records = [replace(r, system=name) for r in found.records]
        for kind in ("records", "sweeps", "knob_sweeps", "comms", "predictions", "others", "unreadable"):
            getattr(tree, kind).extend(getattr(found, kind))
    skipped = list(tree.unreadable)
    fits: dict[str, Comm] = {}
    for doc in tree.comms:
        try:
            fits[doc.view.backend] = comm_from_record(doc.view)
        except HpcdlError as e:
            skipped.append(Unread(doc.path, f"allreduce sweep not fitted: {e}"))
    records = []
    for record in tree.records:
        ranges = out_of_range(record.result)
        if ranges:  # a forged figure is drawn nowhere: plots compute with every one
            skipped.append(Unread(record.path, "figures out of range: " + "; ".join(ranges)))
        else:
            records.append(audit(record))
    for s in skipped:
        say(f"report: skipped {s.path}: {s.reason}")
    records.sort(key=lambda a: (a.result.family, system_of(a), label(a), a.result.world_size))
    return ReportData(records, tree.sweeps, tree.knob_sweeps, fits, skipped)


def label(a: Audit) -> str:
    """Short name for figures: without the suite's timestamp, with the rank count."""
    name = re.sub(r"^\d{8}-\d{6}-", "", a.result.name)
    n = a.result.world_size
    if n > 1 and not re.search(r"np\d+$", name):
        name += f" (np{n})"
    return name + (" (edited)" if a.problems else "")


def system_of(a: Audit) -> str:
    """The system a record belongs to in the report: the name given (``NAME=DIR``), else its own."""
    return a.record.system_name


def labels(records: Sequence[Audit]) -> dict[Path, str]:
    """Distinct names for the records of one figure, by path: each :func:`label`, led by its
    system where the records span several, and where two would still read alike, with the time
    it was measured (then its path, where even that is shared). No label repeats in a figure."""
    several = len({system_of(a) for a in records}) > 1
    names = {a.path: (f"{system_of(a)}: " if several else "") + label(a) for a in records}
    for extra in (lambda a: a.result.created.replace("T", " ")[:19], lambda a: os.path.relpath(a.path)):
        counts = Counter(names.values())
        names = {a.path: f"{names[a.path]} ({extra(a)})" if counts[names[a.path]] > 1 else names[a.path]
                 for a in records}  # fmt: skip
    return names
