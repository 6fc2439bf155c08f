"""Where each point of a state file stands: done (a valid record), or its job's state as its
scheduler reports it, with the reason; and waiting until none is queued or running."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdl.records.store import load_record
from hpcdl.records.typed import MalformedRecord
from hpcdl.records.views import Result, read_result
from hpcdl.schedulers.protocol import SCHEDULERS, JobState
from hpcdl.schedulers.state import Entry, entries


@dataclass
class PointStatus:
    """Where one point stands."""

    name: str
    nodes: int
    ranks: int
    job_id: str | None
    state: str  # done, invalid, not submitted, or its job's state (RUNNING, CANCELLED, ...)
    detail: str
    samples_per_s: float | None = None
    record: Result | None = dataclasses.field(default=None, repr=False, compare=False)
    """its valid (first) record (state ``done``)"""
    records: list[Path] = dataclasses.field(default_factory=list, repr=False, compare=False)
    """where each of its records is expected (a class point's: one per workload and repeat)"""
    problems: list[str] = dataclasses.field(default_factory=list)
    """one line per record written that does not stand for its part of the point, with why"""
    size_class: str = ""
    """the class a class job's point runs ('' for one workload)"""

    @property
    def active(self) -> bool:
        """Still queued or running (or requeued): its outcome is not known yet."""
        return JobState(self.state).active

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``hpcdl status --json`` (without the record)."""
        hidden = ("record", "records")
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in hidden}
        return {**shown, "active": self.active}


def record_path(output: Path, name: str) -> Path:
    """Where a point's record is now (the results directory may have moved since submission)."""
    return output / f"{name}.json"


def valid_record(output: Path, entry: Entry) -> Result | None:
    """The point's (first) record, if every record of the point stands for its part of it."""
    if any(not standing(output, entry, i) for i in range(len(entry.point.records()))):
        return None
    try:
        return read_result(load_record(record_path(output, entry.point.record_path.stem)))
    except MalformedRecord:
        return None  # intact and valid, but not a shape this version reads: not done


def standing(output: Path, entry: Entry, i: int) -> bool:
    """Whether the point's ``i``-th record stands for its part of the point (``Point.stands``)."""
    first, spec, ranks = entry.point.records()[i]
    return entry.point.stands(record_path(output, first.stem), spec, ranks)


def record_problems(output: Path, entry: Entry) -> list[str]:
    """One line per record of the point that is written but does not stand, with why."""
    out = []
    for i, (first, _, ranks) in enumerate(entry.point.records()):
        path = record_path(output, first.stem)
        if path.exists() and not standing(output, entry, i):
            out.append(invalid_detail(path, ranks))
    return out


def job_states(chosen: Sequence[Entry]) -> dict[str, JobState]:
    """The state of each entry's job, by job id: one question to each scheduler."""
    out: dict[str, JobState] = {}
    for cluster in sorted({e.point.cluster for e in chosen}):
        group = [e for e in chosen if e.point.cluster == cluster]
        if cluster not in SCHEDULERS:
            why = JobState("unknown", f"no scheduler {cluster!r} here (a plugin? see HPCDL_PLUGINS)")
            out.update((str(e.job_id), why) for e in group)
        else:
            out.update(SCHEDULERS.get(cluster)().states(group))
    return out


def point_status(output: Path, entry: Entry, record: Result | None, job: JobState | None) -> PointStatus:
    point = entry.point
    row = PointStatus(point.name, point.nodes, point.ranks, entry.job_id, "", "")
    row.records = [record_path(output, p.stem) for p, _, _ in point.records()]
    row.size_class = point.config().suite_class if point.workloads else ""
    several = len(row.records) > 1
    if record is not None:
        row.state, row.record, row.samples_per_s = "done", record, record.metrics.samples_per_s
        row.detail = f"{len(row.records)} valid records" if several else f"{row.samples_per_s:.1f} samples/s"
        return row
    if entry.job_id is None:
        row.state = "not submitted"
        return row
    job = job or JobState("UNKNOWN", "its scheduler did not say")
    row.state, row.detail = job.state, job.detail
    written = [p for p in row.records if p.exists()]
    if several and written:  # a class point records as it goes: how far it got
        row.detail = "; ".join(x for x in (f"{len(written)} of {len(row.records)} records", job.detail) if x)
    if not job.active:
        row.problems = record_problems(output, entry)
    if row.problems:
        missing = len(row.records) - len(written)
        row.state = "invalid"
        row.detail = (
            row.problems[0]
            if not several
            else f"{len(row.problems)} of {len(row.records)} records do not count"
        )
        row.detail += f"; {missing} missing" if several and missing else ""
    return row


def invalid_detail(path: Path, ranks: int) -> str:
    """Why the record at ``path`` does not count for a point of ``ranks`` ranks."""
    try:
        failed = read_result(load_record(path)).validity.reasons
    except (OSError, ValueError, MalformedRecord):
        return f"{path.name} is damaged"
    if failed:
        return f"record {path.name} fails: {'; '.join(failed)}"
    return other_world(path, ranks) or f"record {path.name} is for another spec"


def other_world(path: Path, ranks: int) -> str:
    """Why a point's record cannot stand for it because it was measured on another world (a
    launch that split into processes each alone writes 1-rank records of an N-rank point);
    '' when there is no such record."""
    try:
        world = read_result(load_record(path)).settings.world_size
    except (OSError, ValueError, MalformedRecord):
        return ""
    if world == ranks:
        return ""
    return f"{path.name} was measured on a world of {world} rank(s), the point has {ranks}: not collected"


def status(output: Path, names: Iterable[str] | None = None) -> list[PointStatus]:
    """Every point of the state file (or those named), in order of job and node count."""
    everything = entries(output)
    chosen = sorted(
        everything.values() if names is None else [everything[n] for n in names],
        key=lambda e: (e.point.job, e.point.nodes),
    )
    records = {e.point.name: valid_record(output, e) for e in chosen}
    states = job_states([e for e in chosen if records[e.point.name] is None and e.job_id])
    return [point_status(output, e, records[e.point.name], states.get(str(e.job_id))) for e in chosen]


def wait(
    output: Path, names: Iterable[str] | None = None, timeout_s: float | None = None, poll_s: float = 2.0
) -> list[PointStatus]:
    """Poll until no point is queued or running (a requeued point is waited for again)."""
    names = list(names) if names is not None else None
    t0 = time.monotonic()
    while True:
        rows = status(output, names)
        if not any(r.active for r in rows) or (timeout_s is not None and time.monotonic() - t0 > timeout_s):
            return rows
        time.sleep(poll_s)
