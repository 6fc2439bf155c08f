"""Declarative job files: what to run, on how many nodes, with which scheduler's settings.

A job file is TOML (read by :mod:`hpcdl.schedulers.load` through the bounded
:mod:`hpcdl.reader`; it cannot run code). It names a workload, the node counts of a weak-scaling
sweep and the layout of each allocation; ``hpcdl submit`` turns every node count into one job of
a scheduler (see :mod:`hpcdl.schedulers.submit`). The fields at the top level mean the same to
every scheduler; what only one scheduler has sits in its own table, named after it
(``[slurm]``: :class:`hpcdl.schedulers.builtin.slurm.SlurmOptions`)::

    name = "resnet50-bf16"
    nodes = [1, 2, 4, 8]
    tasks_per_node = 4
    gpus_per_node = 4
    time_min = 30
    backend = "horovod"
    precision = "bf16"

    [workload]
    preset = "resnet50"
    batch_size = 64

    [run]
    duration_s = 60

    [slurm]
    partition = "gpu"

Every field is validated when the file is read; a bad one is a one-line
:class:`hpcdl.errors.SpecError` naming it (``job.nodes=[0] is invalid: ...``), before anything
is submitted.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hpcdl.errors import SpecError
from hpcdl.measure.config import RunConfig
from hpcdl.parallel.backends import backend_choices
from hpcdl.schedulers.container import ContainerOptions, check_launcher
from hpcdl.workloads.families.mlp import MLPSpec
from hpcdl.workloads.knobs import Knobs, knob
from hpcdl.workloads.precision import PRECISIONS
from hpcdl.workloads.recipes import size_classes
from hpcdl.workloads.spec import Spec

if TYPE_CHECKING:
    from hpcdl.scaling.knobsweep import KnobSweep

LAUNCHERS = ("srun", "mpirun")
SET_BY_WORKLOAD = ("size_class", "class_knobs")
"""fields a job file sets through its ``[workload]`` table (``class = ...``), never at the top"""
K = TypeVar("K", bound=Knobs)

# Names and values that end up in batch scripts: no spaces, quotes or shell metacharacters, so
# that nothing in a job file can change what a script does.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SAFE_VALUE = r"[A-Za-z0-9_.,:@%+/=-]+"
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_VALUE_RE = re.compile(rf"{SAFE_VALUE}|")
# Environment variables that Slurm, PMIx and submitit set for each task: a job file must not
# override them, or world detection and requeueing would break.
RESERVED_ENV_PREFIXES = ("SLURM_", "SUBMITIT_", "PMIX_", "PMI_", "OMPI_COMM_WORLD_")


@dataclass(frozen=True, kw_only=True)
class Job(Knobs):
    """One job file: a workload and the allocations of a node-count sweep."""

    prefix: ClassVar[str] = "job"

    name: str = knob("hpcdl", doc="job name; record of each point: NAME-nN.json (letters, digits, _.-)")
    workload: Spec = knob(
        MLPSpec(),
        doc="table: {preset=NAME, knobs...}, {family=NAME, knobs...}, {sample={family, seed}}, "
        "{spec=FILE, knobs...} or {class=S, version=N, tunable knobs...}",
    )
    size_class: str = knob(
        "",
        doc="set by [workload] class=NAME: every workload of the class's suite runs at each node count, "
        "a record each ('' = the one workload)",
    )
    class_knobs: tuple[str, ...] = knob(
        (), doc="set by the knobs of a class's [workload] table: tunable knobs as NAME=value"
    )
    nodes: tuple[int, ...] = knob((1,), lo=1, hi=100_000, doc="node counts to sweep: one job each")
    sweep: str = knob(
        "",
        doc="a knob sweep at each node count, as hpcdl sweep --knob: NAME=V1,V2,... of a numeric knob of "
        "the workload, one record per value (NAME-nN-KNOBV), in increasing order; the first value that "
        "does not fit ends the point ('' = the workload as it is)",
    )
    tasks_per_node: int = knob(1, lo=1, hi=4096, doc="MPI ranks per node (one per GPU on GPU nodes)")
    gpus_per_node: int = knob(0, lo=0, hi=64, doc="GPUs to allocate per node (0: a CPU job)")
    cpus_per_task: int = knob(
        0, lo=0, hi=4096, doc="cores per rank (0: the scheduler's default); sets OMP_NUM_THREADS"
    )
    time_min: int = knob(30, lo=1, hi=525_600, doc="time limit of each job, minutes")
    backend: str = knob("auto", doc="gradient reduction: auto, horovod, torch")
    precision: str = knob("", choices=("", *PRECISIONS), doc="overrides the workload's ('': keep it)")
    run: RunConfig = knob(RunConfig(), doc="table of run settings (hpcdl list: the run knobs)")
    env: tuple[str, ...] = knob((), doc="table NAME = value exported in each job before the ranks start")
    output: str = knob("", doc="results directory ('': results/NAME), relative to where you submit from")
    launcher: str = knob(
        "srun", choices=LAUNCHERS, doc="srun --mpi=pmix per rank, or mpirun in the allocation"
    )
    repeat: int = knob(1, lo=1, hi=1000, doc="runs of each point in its allocation (records NAME-nN-rK)")
    instances: int = knob(
        1,
        lo=1,
        hi=1_000_000,
        doc="concurrent instances in each point's allocation (capacity: the ranks split among them)",
    )
    per_device: int = knob(
        1, lo=1, hi=1024, doc="capacity: instances sharing each device (a divisor of instances)"
    )
    container: ContainerOptions = knob(
        ContainerOptions(), doc="table: the image every rank runs in (runtime, image, mounts, env)"
    )
    tables: tuple[Knobs, ...] = knob(
        (), doc="the scheduler tables ([slurm], ...), each its scheduler's options"
    )

    def check(self) -> None:
        if not NAME_RE.fullmatch(self.name):
            raise SpecError(
                "job.name", self.name, "1-64 letters, digits, '_', '.', '-', starting alphanumeric"
            )
        if self.size_class and self.size_class not in size_classes():
            raise SpecError("job.workload.class", self.size_class, "allowed: " + ", ".join(size_classes()))
        if self.size_class and self.run.suite_class:
            raise SpecError(
                "job.run.suite_class", self.run.suite_class, "set the class in [workload]: class="
            )
        if self.size_class and self.instances > 1:
            raise SpecError("job.instances", self.instances, "1 for a class job (capacity runs one workload)")
        if self.sweep:
            self.knob_sweep()  # the knob and its values, checked against the workload
            if self.size_class or self.instances > 1:
                raise SpecError("job.sweep", self.sweep, "one workload's knob: not with a class or instances")
        if len(set(self.nodes)) != len(self.nodes):
            raise SpecError("job.nodes", list(self.nodes), "each node count once")
        if self.gpus_per_node > 0 and self.tasks_per_node > self.gpus_per_node:
            raise SpecError(
                "job.tasks_per_node",
                self.tasks_per_node,
                f"at most gpus_per_node={self.gpus_per_node}: each rank drives one GPU",
            )
        for item in self.env:
            check_env(item)
        if "\n" in self.output or "\0" in self.output:
            raise SpecError("job.output", self.output, "a directory path on one line")
        if self.backend not in backend_choices():
            raise SpecError("job.backend", self.backend, "allowed: " + ", ".join(backend_choices()))
        if self.instances > 1 and self.repeat > 1:
            raise SpecError(
                "job.repeat", self.repeat, "1 when instances > 1: a point repeats or runs instances"
            )
        if self.instances % self.per_device:
            raise SpecError("job.per_device", self.per_device, f"a divisor of instances={self.instances}")
        for n in self.nodes:
            if self.ranks(n) % self.instances:
                raise SpecError(
                    "job.instances", self.instances, f"must divide the {self.ranks(n)} ranks of {n} node(s)"
                )
        check_launcher(self.container, self.launcher)
        if self.run.backend != "auto":
            raise SpecError("job.run.backend", self.run.backend, "set it at the top level: job.backend")

    # --- derived values --------------------------------------------------------------------
    def spec(self) -> Spec:
        """The workload with the job's precision applied: what every point of a one-workload job runs."""
        return self.workload.replace(precision=self.precision) if self.precision else self.workload

    def specs(self) -> dict[str, Spec]:
        """What every point runs, by workload name: a class job's suite (its tunable knobs and
        the job's precision applied), or the one workload under the name ''."""
        if not self.size_class:
            return {"": self.spec()}
        from hpcdl.harness.classes import class_specs  # torch: only for a class job

        knobs = dict(parse_class_knob(item) for item in self.class_knobs)
        if self.precision:
            knobs["precision"] = self.precision
        return class_specs(self.size_class, knobs, "job.workload")

    def knob_sweep(self) -> KnobSweep:
        """The job's knob sweep (``sweep``): its knob and the spec of each value."""
        from hpcdl.scaling.knobsweep import parse

        return parse(self.spec(), self.sweep, "job.sweep")

    def config(self) -> RunConfig:
        """The run settings with the job's backend applied, and a class job's class and version
        (what makes its records rank in the class's list)."""
        cfg = self.run.replace(backend=self.backend)
        if not self.size_class:
            return cfg
        from hpcdl.workloads.recipes import suite

        return cfg.replace(suite_class=self.size_class, suite_version=suite(self.size_class).version)

    def ranks(self, nodes: int) -> int:
        return nodes * self.tasks_per_node

    def point_name(self, nodes: int) -> str:
        """File stem of the record of the point on ``nodes`` nodes (and its Slurm job name)."""
        return f"{self.name}-n{nodes}"

    def output_dir(self, base: Path | None = None) -> Path:
        """Absolute results directory: relative paths are from ``base`` (default: the current directory)."""
        out = Path(self.output or f"results/{self.name}")
        return out if out.is_absolute() else (base or Path.cwd()) / out

    def environment(self) -> dict[str, str]:
        """Variables to export in each job: the job file's, plus OMP_NUM_THREADS from cpus_per_task
        (torch would otherwise start one thread per core of the node in every rank)."""
        env = dict(item.split("=", 1) for item in self.env)
        if self.cpus_per_task and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(self.cpus_per_task)
        return env

    def export_lines(self) -> list[str]:
        """The environment as shell ``export`` lines for a batch script (values are validated
        to contain no shell characters, and quoted anyway)."""
        return [f"export {k}={shlex.quote(v)}" for k, v in self.environment().items()]

    def table(self, cls: type[K]) -> K:
        """A scheduler's table of this job (its class of options), or its defaults."""
        return next((t for t in self.tables if isinstance(t, cls)), cls())

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready dict, as a job file writes it (env and the scheduler tables as tables)."""
        d = super().to_dict()
        del d["tables"], d["size_class"], d["class_knobs"]
        d["workload"] = self.workload.to_dict()
        if self.size_class:
            version = self.config().suite_version
            knobs = dict(parse_class_knob(item) for item in self.class_knobs)
            d["workload"] = {"class": self.size_class, "version": version, **knobs}
        d["run"] = self.run.to_dict()
        d["container"] = self.container.to_dict()
        d["env"] = dict(item.split("=", 1) for item in self.env)
        return d | {table_name(t): t.to_dict() for t in self.tables}


def check_env(item: str) -> None:
    name, _, value = item.partition("=")
    field = f"job.env.{name}"
    if not ENV_NAME_RE.fullmatch(name):
        raise SpecError("job.env", name, "variable names are letters, digits and '_'")
    if name.startswith(RESERVED_ENV_PREFIXES):
        raise SpecError(field, value, "set by Slurm, PMIx or submitit for each task; not overridable")
    if not ENV_VALUE_RE.fullmatch(value):
        raise SpecError(field, value, "letters, digits and _.,:@%+/=- only (no spaces or shell characters)")


def parse_class_knob(item: str) -> tuple[str, Any]:
    """A class knob as the job file gave it (``NAME=value``, typed as the knob is)."""
    name, _, text = item.partition("=")
    return name, Spec.parse_knob(name, text)


def table_name(options: Knobs) -> str:
    """The job-file table of a scheduler's options (``job.slurm`` -> ``slurm``)."""
    return options.prefix.removeprefix("job.")


__all__ = ["LAUNCHERS", "Job"]
