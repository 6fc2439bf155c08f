"""The points of a job file: one node count of its sweep, run as one scheduler job.

A point's record is written by rank 0 as ``OUTPUT/NAME-nN.json``; a point that already has a
valid record is never submitted or run again.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def record_path(self) -> Path:
        return Path(self.output) / f"{self.name}.json"

    def workload(self) -> Spec:
        return spec_from_dict(self.spec)

    def config(self) -> RunConfig:
        from hpcdl.measure.config import RunConfig

        return RunConfig.from_dict(self.run)

    def done(self) -> bool:
        """True when the point already has a valid record (and must not run again)."""
        return valid_point(self.record_path, self.workload(), self.ranks)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Point:
        """The point of a dict that holds its fields (and maybe more, as a state-file entry)."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


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
