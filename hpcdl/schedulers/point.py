"""The points of a job file: one node count of its sweep, run as one scheduler job.

A point's record is written by rank 0 as ``OUTPUT/NAME-nN.json`` (a class job's: one per
workload of the class, ``OUTPUT/NAME-nN-WORKLOAD.json``); a point whose records are all there
and valid is never submitted or run again, and a requeued class point runs only the workloads
that have none.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcdl.records import schema
from hpcdl.records.audit import audit
from hpcdl.records.loader import Unreadable, read_record
from hpcdl.records.repeats import repeat_name
from hpcdl.records.store import NAME_RE
from hpcdl.workloads.registry import canonical, spec_from_dict

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
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    """a class job's suite, or a knob sweep's values: each workload's spec by name, run one
    after another in the allocation, a record each; empty where the point runs the one
    workload ``spec``"""

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node

    def named_specs(self) -> dict[str, Spec]:
        """What the point runs, by workload name ('' for a one-workload point)."""
        if self.workloads:
            return {name: spec_from_dict(d) for name, d in self.workloads.items()}
        return {"": self.workload()}

    def record_stem(self, workload: str) -> str:
        """The name of a workload's record (its first repeat's): ``NAME`` or ``NAME-WORKLOAD``."""
        return f"{self.name}-{workload}" if workload else self.name

    def workload_records(self, workload: str, spec: Spec) -> list[tuple[Path, Spec, int]]:
        """A workload's records: one per repeat."""
        stem, out = self.record_stem(workload), Path(self.output)
        names = [repeat_name(stem, r, self.repeat) for r in range(1, self.repeat + 1)]
        return [(out / f"{m}.json", spec, self.ranks) for m in names]

    def records(self) -> list[tuple[Path, Spec, int]]:
        """The records the point writes, each with its spec and rank count: one per repeat (of
        each workload of a class), or one per instance (its own seed) and instance 0 alone."""
        if not self.workloads and self.instances > 1:
            out, spec = Path(self.output), self.workload()
            n = self.ranks // self.instances
            seeded = [spec.replace(seed=spec.seed + i) for i in range(self.instances)]
            names = [f"{self.name}-i{i}" for i in range(self.instances)]
            return [
                (out / f"{m}.json", s, n)
                for m, s in zip([*names, f"{self.name}-alone"], [*seeded, spec], strict=True)
            ]
        return [r for name, spec in self.named_specs().items() for r in self.workload_records(name, spec)]

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
        return all(self.stands(path, spec, n) for path, spec, n in self.records())

    def stands(self, path: Path, spec: Spec, ranks: int) -> bool:
        """Whether ``path`` holds a record that stands for ``spec`` at ``ranks``: valid, intact
        (``audit``), of that world size and spec; of a class point, also as a device without
        bf16 trains it (``classes.fp32_fallback``), and with any batch where ``--fit`` chose it."""
        from hpcdl.harness.classes import fp32_fallback  # torch: the class's rules

        try:
            record = read_record(path)
        except Unreadable:
            return False
        r = record.result
        fitted = self.config().fit_fraction > 0
        wanted = [spec, fp32_fallback(spec)] if self.config().suite_class else [spec]
        mine = canonical(r.spec) or {}
        same = any(_but_batch(mine, fitted) == _but_batch(s.to_dict(), fitted) for s in wanted)
        return same and r.world_size == ranks and r.validity.passed and not audit(record).problems

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Point:
        """The point of a dict that holds its fields (and maybe more, as a state-file entry;
        fields added later may be missing). A point file is a document, read from disk: each
        field is checked for its type (``FIELD_RULES``), and a ``KeyError`` or ``TypeError``
        names the first that is missing or wrong."""

        def required(f: dataclasses.Field[Any]) -> bool:
            return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING

        fields = [f for f in dataclasses.fields(cls) if f.name in d or required(f)]
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
    "workloads": (
        lambda v: isinstance(v, dict) and all(isinstance(w, dict) for w in v.values()),
        "a table of a class's workloads, each a table of knobs",
    ),
}
"""each field of a point: what it must be, and that in words"""


def _but_batch(spec: dict[str, Any], fitted: bool) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "batch_size"} if fitted else spec


def points(job: Job, cluster: str, output: Path) -> list[Point]:
    """The points of a job, in increasing node count."""
    named, run = job.specs(), job.config().to_dict()
    workloads = {name: s.to_dict() for name, s in named.items()} if job.size_class else {}
    if job.sweep:  # a knob sweep: each value is a workload of the point, run in increasing order
        from hpcdl.scaling.knobsweep import value_text

        sweep = job.knob_sweep()
        workloads = {f"{sweep.knob}{value_text(v)}": s.to_dict() for v, s in sweep.specs.items()}
    return [
        Point(
            job=job.name,
            name=job.point_name(n),
            nodes=n,
            tasks_per_node=job.tasks_per_node,
            spec={} if workloads else named[""].to_dict(),
            run=run,
            output=str(output),
            launcher=job.launcher,
            cluster=cluster,
            repeat=job.repeat,
            instances=job.instances,
            per_device=job.per_device,
            workloads=workloads,
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
    path.write_text(json.dumps({"schema": schema.POINT, **point.to_dict()}, indent=1))
    return path
