"""Reading a job file: its scheduler-neutral fields (:class:`~hpcdl.schedulers.jobfile.Job`)
and the table of every registered scheduler (``[slurm]``, a plugin's); an unknown key is a
one-line :class:`hpcdl.errors.SpecError` naming it, before anything is submitted. Reading sits
above :mod:`~hpcdl.schedulers.protocol` (it needs the registry of schedulers), the Job below it
(the protocol's methods take one), so that neither imports the other back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hpcdl import reader
from hpcdl.errors import SpecError
from hpcdl.measure.config import RunConfig
from hpcdl.schedulers.container import ContainerOptions
from hpcdl.schedulers.jobfile import ENV_NAME_RE, SET_BY_WORKLOAD, Job
from hpcdl.schedulers.protocol import SCHEDULERS
from hpcdl.schedulers.workload_table import KINDS, workload_fields
from hpcdl.workloads.knobs import Knobs

T = TypeVar("T")


def load_job(path: str | Path) -> Job:
    """Read (bounded: :func:`hpcdl.reader.document`) and validate a job file; a spec file it
    names is relative to the job file's folder."""
    return job_from_dict(reader.document(path, "job file", "toml"), base=Path(path).resolve().parent)


def job_from_dict(data: dict[str, Any], base: Path | None = None) -> Job:
    """A validated :class:`Job` from the tables of a job file (``base``: the folder a
    ``spec = "FILE"`` is relative to)."""
    options = {name: cls.options for name, cls in SCHEDULERS.items() if cls.options is not None}
    valid = [k for k in Job.knobs() if k not in ("tables", *SET_BY_WORKLOAD)]
    fields: dict[str, Any] = {}
    tables: list[Knobs] = []
    for key, value in data.items():
        if key in valid:
            fields[key] = value
        elif key in options:
            tables.append(options[key].from_dict(table_value(data, key)))
        else:
            raise SpecError(f"job.{key}", value, unknown_key(key, valid, options))
    if "workload" not in data:
        raise SpecError("job.workload", None, "required: a table with " + ", ".join(f"{k}=" for k in KINDS))
    precision = fields.get("precision", "")
    table = table_value(fields, "workload")
    del fields["workload"]
    fields |= workload_fields(table, precision_set=bool(precision), base=base)
    if "run" in fields:
        run = table_value(fields, "run")
        fields["run"] = nested(lambda: RunConfig.from_dict(run), "job.")
    if "container" in fields:
        container = table_value(fields, "container")
        fields["container"] = nested(lambda: ContainerOptions.from_dict(container), "job.")
    if "env" in fields:
        fields["env"] = env_items(table_value(fields, "env"))
    return Job(**fields, tables=tuple(tables))


def unknown_key(key: str, valid: list[str], options: dict[str, type[Knobs]]) -> str:
    """Why a top-level key is refused: it belongs in a scheduler's table, or it is unknown."""
    for name, cls in options.items():
        if key in cls.knobs():
            return f"moved to the [{name}] table: write it under [{name}]"
    return "unknown key; valid keys are " + ", ".join([*valid, *(f"[{name}]" for name in options)])


def table_value(fields: dict[str, Any], key: str) -> dict[str, Any]:
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
