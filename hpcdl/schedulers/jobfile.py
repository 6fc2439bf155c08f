"""Declarative job files: what to run on a Slurm cluster, and on how many nodes.

A job file is TOML (read with :mod:`tomllib`; it cannot run code). It names a workload, the
node counts of a weak-scaling sweep and the layout of each allocation; ``hpcdl submit`` turns
every node count into one Slurm job through submitit (see :mod:`hpcdl.schedulers.submit`)::

    name = "resnet50-bf16"
    nodes = [1, 2, 4, 8]
    tasks_per_node = 4
    gpus_per_node = 4
    partition = "gpu"
    time_min = 30
    backend = "horovod"
    precision = "bf16"

    [workload]
    preset = "resnet50"
    batch_size = 64

    [run]
    duration_s = 60

Every field is validated when the file is read; a bad one is a one-line
:class:`hpcdl.errors.SpecError` naming it (``job.nodes=[0] is invalid: ...``), before anything
is submitted.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from hpcdl.errors import SpecError
from hpcdl.measure.config import RunConfig
from hpcdl.parallel.backends import backend_choices
from hpcdl.workloads import recipes
from hpcdl.workloads.families.mlp import MLPSpec
from hpcdl.workloads.precision import PRECISIONS
from hpcdl.workloads.registry import FAMILIES, family_class, spec_from_dict
from hpcdl.workloads.sampling import sample_spec
from hpcdl.workloads.spec import Knobs, Spec, knob

LAUNCHERS = ("srun", "mpirun")
T = TypeVar("T")

# Names and values that end up in sbatch directives or the batch script: no spaces, quotes or
# shell metacharacters, so that nothing in a job file can change what the script does.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_.,-]*")  # partition, account, qos (comma lists allowed)
CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_.,:&|!*()\[\]-]*")  # Slurm's feature expressions
SAFE_VALUE = r"[A-Za-z0-9_.,:@%+/=-]+"
SBATCH_EXTRA_RE = re.compile(rf"--(?P<key>[a-z][a-z0-9-]*)(?:=(?P<value>{SAFE_VALUE}))?")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_VALUE_RE = re.compile(rf"{SAFE_VALUE}|")
# Environment variables that Slurm, PMIx and submitit set for each task: a job file must not
# override them, or world detection and requeueing would break.
RESERVED_ENV_PREFIXES = ("SLURM_", "SUBMITIT_", "PMIX_", "PMI_", "OMPI_COMM_WORLD_")

# sbatch options hpcdl sets itself (from the fields named here, or for submitit's bookkeeping):
# set through sbatch_extra they would contradict the job file or break result collection.
MANAGED_OPTIONS = {
    "nodes": "job.nodes",
    "ntasks": "job.nodes and job.tasks_per_node",
    "ntasks-per-node": "job.tasks_per_node",
    "gpus-per-node": "job.gpus_per_node",
    "gpus": "job.gpus_per_node",
    "cpus-per-task": "job.cpus_per_task",
    "partition": "job.partition",
    "account": "job.account",
    "qos": "job.qos",
    "constraint": "job.constraint",
    "time": "job.time_min",
    "job-name": "job.name",
    "output": "job.output (hpcdl keeps logs in OUTPUT/submitit)",
    "error": "job.output (hpcdl keeps logs in OUTPUT/submitit)",
    "array": "job.nodes (one job per node count)",
    "wrap": "nothing: hpcdl writes the batch script",
    "signal": "nothing: submitit uses it to checkpoint and requeue",
    "open-mode": "nothing: submitit sets it",
    "export": "job.env",
    "chdir": "nothing: jobs run where you submit from",
}


@dataclass(frozen=True, kw_only=True)
class Job(Knobs):
    """One job file: a workload and the allocations of a node-count sweep."""

    prefix: ClassVar[str] = "job"

    name: str = knob("hpcdl", doc="job name; record of each point: NAME-nN.json (letters, digits, _.-)")
    workload: Spec = knob(
        MLPSpec(), doc="table: {preset=NAME, knobs...}, {family=NAME, knobs...} or {sample={family, seed}}"
    )
    nodes: tuple[int, ...] = knob((1,), lo=1, hi=100_000, doc="node counts to sweep: one Slurm job each")
    tasks_per_node: int = knob(1, lo=1, hi=4096, doc="MPI ranks per node (one per GPU on GPU nodes)")
    gpus_per_node: int = knob(0, lo=0, hi=64, doc="GPUs to allocate per node (0: a CPU job)")
    cpus_per_task: int = knob(
        0, lo=0, hi=4096, doc="cores per rank (0: Slurm's default); sets OMP_NUM_THREADS"
    )
    partition: str = knob("", doc="Slurm partition ('': the cluster's default)")
    account: str = knob("", doc="account to charge ('': your default)")
    qos: str = knob("", doc="quality of service ('': the default)")
    constraint: str = knob("", doc="node features, e.g. 'a100&ib' ('': any node)")
    time_min: int = knob(30, lo=1, hi=525_600, doc="time limit of each job, minutes")
    backend: str = knob("auto", doc="gradient reduction: auto, horovod, torch")
    precision: str = knob("", choices=("", *PRECISIONS), doc="overrides the workload's ('': keep it)")
    run: RunConfig = knob(RunConfig(), doc="table of run settings (hpcdl list: the run knobs)")
    env: tuple[str, ...] = knob((), doc="table NAME = value exported in each job before the ranks start")
    sbatch_extra: tuple[str, ...] = knob((), doc='extra sbatch options, e.g. ["--exclusive", "--mem=0"]')
    output: str = knob("", doc="results directory ('': results/NAME), relative to where you submit from")
    launcher: str = knob(
        "srun", choices=LAUNCHERS, doc="srun --mpi=pmix per rank, or mpirun in the allocation"
    )

    def check(self) -> None:
        if not NAME_RE.fullmatch(self.name):
            raise SpecError(
                "job.name", self.name, "1-64 letters, digits, '_', '.', '-', starting alphanumeric"
            )
        if len(set(self.nodes)) != len(self.nodes):
            raise SpecError("job.nodes", list(self.nodes), "each node count once")
        if self.gpus_per_node > 0 and self.tasks_per_node > self.gpus_per_node:
            raise SpecError(
                "job.tasks_per_node",
                self.tasks_per_node,
                f"at most gpus_per_node={self.gpus_per_node}: each rank drives one GPU",
            )
        for key in ("partition", "account", "qos"):
            if not SLURM_NAME_RE.fullmatch(getattr(self, key)):
                raise SpecError(f"job.{key}", getattr(self, key), "letters, digits, '_', '.', ',', '-' only")
        if not CONSTRAINT_RE.fullmatch(self.constraint):
            raise SpecError("job.constraint", self.constraint, "a Slurm feature expression without spaces")
        for item in self.env:
            check_env(item)
        for item in self.sbatch_extra:
            check_sbatch_option(item)
        if "\n" in self.output or "\0" in self.output:
            raise SpecError("job.output", self.output, "a directory path on one line")
        if self.backend not in backend_choices():
            raise SpecError("job.backend", self.backend, "allowed: " + ", ".join(backend_choices()))
        if self.run.backend != "auto":
            raise SpecError("job.run.backend", self.run.backend, "set it at the top level: job.backend")

    # --- derived values --------------------------------------------------------------------
    def spec(self) -> Spec:
        """The workload with the job's precision applied: what every point runs."""
        return self.workload.replace(precision=self.precision) if self.precision else self.workload

    def config(self) -> RunConfig:
        """The run settings with the job's backend applied."""
        return self.run.replace(backend=self.backend)

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

    def sbatch_options(self) -> dict[str, str | bool]:
        """``sbatch_extra`` as submitit's ``additional_parameters``: option name -> value (True
        for a flag). submitit writes each as one ``#SBATCH`` line; none reaches a shell."""
        out: dict[str, str | bool] = {}
        for item in self.sbatch_extra:
            key, sep, value = item[2:].partition("=")
            out[key] = value if sep else True
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready dict (workload and run as their knob dicts, env as a table)."""
        d = super().to_dict()
        d["workload"] = self.workload.to_dict()
        d["run"] = self.run.to_dict()
        d["env"] = dict(item.split("=", 1) for item in self.env)
        return d


def check_env(item: str) -> None:
    name, _, value = item.partition("=")
    field = f"job.env.{name}"
    if not ENV_NAME_RE.fullmatch(name):
        raise SpecError("job.env", name, "variable names are letters, digits and '_'")
    if name.startswith(RESERVED_ENV_PREFIXES):
        raise SpecError(field, value, "set by Slurm, PMIx or submitit for each task; not overridable")
    if not ENV_VALUE_RE.fullmatch(value):
        raise SpecError(field, value, "letters, digits and _.,:@%+/=- only (no spaces or shell characters)")


def check_sbatch_option(item: str) -> None:
    m = SBATCH_EXTRA_RE.fullmatch(item)
    if m is None:
        raise SpecError(
            "job.sbatch_extra",
            item,
            "expected a long option '--key' or '--key=value' (letters, digits, _.,:@%+/=-; "
            "no spaces or shell characters)",
        )
    if m["key"] in MANAGED_OPTIONS:
        raise SpecError("job.sbatch_extra", item, f"set through {MANAGED_OPTIONS[m['key']]}")


# ------------------------------------------------------------------------------ reading
def load_job(path: str | Path) -> Job:
    """Read and validate a job file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise SpecError("job file", str(path), f"cannot be read ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError("job file", str(path), f"not valid TOML: {e}") from None
    return job_from_dict(data)


def job_from_dict(data: dict[str, Any]) -> Job:
    """A validated :class:`Job` from the tables of a job file."""
    valid = Job.knobs()
    for key, value in data.items():
        if key not in valid:
            raise SpecError(f"job.{key}", value, "unknown key; valid keys are " + ", ".join(valid))
    if "workload" not in data:
        raise SpecError("job.workload", None, "required: a table with preset=, family= or sample=")
    fields = dict(data)
    precision = fields.get("precision", "")
    fields["workload"] = workload_spec(table(fields, "workload"), precision_set=bool(precision))
    if "run" in fields:
        run = table(fields, "run")
        fields["run"] = nested(lambda: RunConfig.from_dict(run), "job.")
    if "env" in fields:
        fields["env"] = env_items(table(fields, "env"))
    return Job(**fields)


def table(fields: dict[str, Any], key: str) -> dict[str, Any]:
    value = fields[key]
    if not isinstance(value, dict):
        raise SpecError(f"job.{key}", value, f"expected a table ([{key}] or {key} = {{...}})")
    return value


def env_items(env: dict[str, Any]) -> tuple[str, ...]:
    """``[env]`` as ``NAME=value`` strings; numbers are written as TOML gives them."""
    items = []
    for name, value in env.items():
        if not ENV_NAME_RE.fullmatch(name):
            raise SpecError("job.env", name, "variable names are letters, digits and '_'")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise SpecError(f"job.env.{name}", value, "expected a string or a number")
        items.append(f"{name}={value}")
    return tuple(items)


def nested(build: Callable[[], T], prefix: str) -> T:
    """Call ``build()``; a SpecError from a nested table gets the job's prefix (run.steps ->
    job.run.steps), so that every message names the field as written in the job file."""
    try:
        return build()
    except SpecError as e:
        raise SpecError(prefix + e.field, e.value, e.allowed) from None


def workload_spec(w: dict[str, Any], *, precision_set: bool = False) -> Spec:
    """The spec of a ``[workload]`` table: ``preset=`` with knob overrides, ``family=`` with
    knobs, or ``sample={family=..., seed=..., ranges={...}}`` with fixed knobs."""
    kinds = [k for k in ("preset", "family", "sample") if k in w]
    if len(kinds) != 1:
        raise SpecError("job.workload", sorted(w), "exactly one of preset=, family=, sample= is required")
    if precision_set and "precision" in w:
        raise SpecError("job.workload.precision", w["precision"], "set precision once: job.precision")
    (kind,) = kinds
    if kind != "sample" and not isinstance(w[kind], str):
        raise SpecError(f"job.workload.{kind}", w[kind], "expected a string")
    knobs = {k: v for k, v in w.items() if k != kind}

    def build() -> Spec:
        if kind == "preset":
            return recipes.preset(w["preset"], **knobs)
        if kind == "family":
            return spec_from_dict(w)
        return sampled(w["sample"], knobs)

    try:
        return build()
    except SpecError as e:
        # cnn.batch_size -> job.workload.batch_size; preset -> job.workload.preset
        family, _, knob_name = e.field.partition(".")
        raise SpecError(
            f"job.workload.{knob_name if family in FAMILIES else e.field}", e.value, e.allowed
        ) from None


def sampled(sample: Any, fixed: dict[str, Any]) -> Spec:
    if not isinstance(sample, dict):
        raise SpecError("sample", sample, "expected a table {family=..., seed=...}")
    unknown = set(sample) - {"family", "seed", "ranges"}
    if unknown:
        raise SpecError(
            f"sample.{sorted(unknown)[0]}", sample, "unknown key; valid keys are family, seed, ranges"
        )
    family_class(sample.get("family"))
    seed = sample.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError("sample.seed", seed, "expected an integer >= 0")
    ranges = sample.get("ranges", {})
    if not isinstance(ranges, dict):
        raise SpecError("sample.ranges", ranges, "expected a table of knob = [values...]")
    return sample_spec(sample["family"], seed, ranges, **fixed)


__all__ = ["LAUNCHERS", "Job", "job_from_dict", "load_job"]
