"""The state file, ``OUTPUT/hpcdl-jobs.json``: which job each point was submitted as, so that
``hpcdl status`` and ``hpcdl collect`` work later, from another shell.

Its ``points`` map each point's name to the point's fields (:class:`~hpcdl.schedulers.point.Point`;
``cluster`` names the scheduler) plus ``ranks``, ``job_id``, ``folder`` (the job's logs),
``submitted``, ``job_file`` and ``time_min``. It is rewritten atomically on every change.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcdl import reader
from hpcdl.errors import InputError
from hpcdl.records import schema
from hpcdl.records.store import write_record
from hpcdl.schedulers.point import Point

if TYPE_CHECKING:
    from hpcdl.schedulers.jobfile import Job

STATE_FILE = "hpcdl-jobs.json"


@dataclass(frozen=True)
class Handle:
    """A submitted point: the scheduler's job id, and the folder of the job's logs."""

    job_id: str
    logs: Path


@dataclass(frozen=True)
class Entry:
    """One point of the state file and the job it was submitted as (none yet: ``job_id`` None)."""

    point: Point
    job_id: str | None
    folder: str
    submitted: str | None
    job_file: str
    time_min: int

    @property
    def logs(self) -> Path:
        """The folder of the job's logs (older state files wrote it with submitit's ``%j``)."""
        return Path(self.folder.replace("%j", str(self.job_id)))

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.point.to_dict(),
            "ranks": self.point.ranks,
            "job_id": self.job_id,
            "folder": self.folder,
            "submitted": self.submitted,
            "job_file": self.job_file,
            "time_min": self.time_min,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Entry:
        job_id = d.get("job_id")
        return cls(
            point=Point.from_dict(d),
            job_id=None if job_id is None else str(job_id),
            folder=str(d.get("folder", "")),
            submitted=d.get("submitted"),
            job_file=str(d.get("job_file", "")),
            time_min=int(d.get("time_min", 0)),
        )


def state_path(output: Path) -> Path:
    return output / STATE_FILE


def load_state(output: Path) -> dict[str, Any]:
    """The state file of a results directory, as JSON (a one-line error when there is none)."""
    path = state_path(output)
    if not path.exists():
        raise InputError(
            "dir", str(output), f"no {STATE_FILE} here: hpcdl submit writes it into the job's output"
        )
    try:
        state = reader.read_json(path)
    except reader.Unreadable as e:
        raise InputError("dir", str(output), f"{STATE_FILE} cannot be read: {e}") from None
    if (
        not isinstance(state, dict)
        or state.get("schema") != schema.JOBS
        or not isinstance(state.get("points"), dict)
    ):
        raise InputError("dir", str(output), f"{STATE_FILE} is not an hpcdl state file")
    return state


def entries(output: Path) -> dict[str, Entry]:
    """Every point of the state file, by name."""
    points = load_state(output)["points"]
    try:
        return {name: Entry.from_dict(d) for name, d in points.items()}
    except (KeyError, TypeError, ValueError) as e:
        raise InputError("dir", str(output), f"{STATE_FILE} has a damaged entry ({e!r})") from None


def remember(output: Path, point: Point, handle: Handle | None, job: Job, job_file: str) -> Entry:
    """Add or update a point in the state file, and return its entry; ``handle`` None: not
    submitted, as it has a valid record (an entry that has a job keeps it: the job that made
    the record)."""
    path = state_path(output)
    state: dict[str, Any] = load_state(output) if path.exists() else {"schema": schema.JOBS, "points": {}}
    old = state["points"].get(point.name)
    if handle is None and old and old.get("job_id"):
        return Entry.from_dict(old)
    entry = Entry(
        point=point,
        job_id=handle.job_id if handle else None,
        folder=str(handle.logs) if handle else "",
        submitted=datetime.now(UTC).isoformat(timespec="seconds") if handle else None,
        job_file=job_file,
        time_min=job.time_min,
    )
    state["points"][point.name] = entry.to_dict()
    write_record(state, path)
    return entry
