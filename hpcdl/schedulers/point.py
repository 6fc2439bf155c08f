"""The points of a job file: one node count of its sweep, run as one scheduler job.

A point's record is written by rank 0 as ``OUTPUT/NAME-nN.json``; a point that already has a
valid record is never submitted or run again.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcdl.records.repeats import repeat_name
from hpcdl.records.store import NAME_RE
from hpcdl.scaling.sweep import valid_point
from hpcdl.workloads.registry import spec_from_dict

if TYPE_CHECKING:
    from hpcdl.measure.config import RunConfig
    from hpcdl.schedulers.jobfile import Job
    from hpcdl.workloads.spec import Spec


@dataclass(frozen=True)
class Point:
    """One point of a sweep: all that its ranks need, pickled into the job or written as JSON
    (plain data only, so that a job submitted by one hpcdl version still loads in the next)."""

    job: str
    name: str
    nodes: int
    tasks_per_node: int
    spec: dict[str, Any]
    run: dict[str, Any]
    output: str
    launcher: str
    cluster: str
    """the name of the scheduler it was submitted with"""
    repeat: int = 1
    """runs in the allocation, one record each (``NAME-rK``)"""
    instances: int = 1
    """concurrent instances in the allocation (capacity: ``NAME-iI`` and ``NAME-alone``)"""
    per_device: int = 1

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node

    def records(self) -> list[tuple[Path, Spec, int]]:
        """The records the point writes, each with its spec and rank count: one per repeat, or
        one per instance (its own seed) and instance 0 alone."""
        out, spec = Path(self.output), self.workload()
        if self.instances > 1:
            n = self.ranks // self.instances
            seeded = [spec.replace(seed=spec.seed + i) for i in range(self.instances)]
            names = [f"{self.name}-i{i}" for i in range(self.instances)]
            return [
                (out / f"{m}.json", s, n)
                for m, s in zip([*names, f"{self.name}-alone"], [*seeded, spec], strict=True)
            ]
        names = [repeat_name(self.name, r, self.repeat) for r in range(1, self.repeat + 1)]
        return [(out / f"{m}.json", spec, self.ranks) for m in names]

    @property
    def record_path(self) -> Path:
        """The point's first record (what ``status`` and ``collect`` show)."""
        return self.records()[0][0]

    def workload(self) -> Spec:
        return spec_from_dict(self.spec)

    def config(self) -> RunConfig:
        from hpcdl.measure.config import RunConfig

        return RunConfig.from_dict(self.run)

    def done(self) -> bool:
        """True when every record of the point is there and valid (it must not run again)."""
        return all(valid_point(path, spec, n) for path, spec, n in self.records())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Point:
        """The point of a dict that holds its fields (and maybe more, as a state-file entry;
        fields added later may be missing). A point file is a document, read from disk: each
        field is checked for its type (``FIELD_RULES``), and a ``KeyError`` or ``TypeError``
        names the first that is missing or wrong."""
        fields = [f for f in dataclasses.fields(cls) if f.name in d or f.default is dataclasses.MISSING]
        values = {f.name: d[f.name] for f in fields}
        for name, value in values.items():
            ok, allowed = FIELD_RULES[name]
            if not ok(value):
                shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
                raise TypeError(f"point field {name}={shown} is invalid: {allowed}")
        return cls(**values)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1_000_000


def _name(value: Any) -> bool:
    return isinstance(value, str) and bool(NAME_RE.fullmatch(value)) and ".." not in value


def _text(value: Any) -> bool:
    return isinstance(value, str) and "\0" not in value


FIELD_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "job": (_name, "a job's name: letters, digits and ._-"),
    "name": (_name, "a point's name, a file name: letters, digits and ._-"),
    "nodes": (_count, "an integer from 1 to 1,000,000"),
    "tasks_per_node": (_count, "an integer from 1 to 1,000,000"),
    "spec": (lambda v: isinstance(v, dict), "a table of the workload's knobs"),
    "run": (lambda v: isinstance(v, dict), "a table of run settings"),
    "output": (_text, "a folder's path"),
    "launcher": (_text, "a launcher's name"),
    "cluster": (_text, "a scheduler's name"),
    "repeat": (_count, "an integer from 1 to 1,000,000"),
    "instances": (_count, "an integer from 1 to 1,000,000"),
    "per_device": (_count, "an integer from 1 to 1,000,000"),
}
"""each field of a point: what it must be, and that in words"""


def points(job: Job, cluster: str, output: Path) -> list[Point]:
    """The points of a job, in increasing node count."""
    spec, run = job.spec().to_dict(), job.config().to_dict()
    return [
        Point(
            job=job.name,
            name=job.point_name(n),
            nodes=n,
            tasks_per_node=job.tasks_per_node,
            spec=spec,
            run=run,
            output=str(output),
            launcher=job.launcher,
            cluster=cluster,
            repeat=job.repeat,
            instances=job.instances,
            per_device=job.per_device,
        )
        for n in sorted(job.nodes)
    ]


def jobs_folder(point: Point) -> Path:
    """The folder of the files of the point's jobs, one subfolder per job id (``%j``): batch
    script, logs, and submitit's pickles."""
    return Path(point.output) / "submitit" / "%j"


def point_file(point: Point) -> Path:
    """Where :func:`write_point_file` puts the point for ``python -m hpcdl.schedulers.entry``."""
    return Path(point.output) / "submitit" / f"{point.name}.point.json"


def write_point_file(point: Point) -> Path:
    """Write the point as JSON for processes that start it by command line (mpirun's ranks, a
    scheduler that runs ``python -m hpcdl.schedulers.entry``); returns the path."""
    path = point_file(point)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(point.to_dict(), indent=1))
    return path
