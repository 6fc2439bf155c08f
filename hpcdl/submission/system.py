"""The system description of a submission (docs/reference/system-description.md): who
submits, which class, and the machine as a list needs it (nodes, processors and accelerators
per node, memory, interconnect, storage, software, availability). A TOML or JSON file, read
within the bounds of ``records.loader`` and checked field by field: :func:`problems` names
every field that is missing, of the wrong type, outside what is allowed, unknown, or still a
placeholder that ``hpcdl system init`` left."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hpcdl import reader
from hpcdl.errors import HpcdlError
from hpcdl.escape import printable
from hpcdl.records.loader import Unreadable, read_object

T = TypeVar("T")

MAX_DESCRIPTION_BYTES = 1 << 20
"""a description is a page of text: a megabyte is far more than one needs"""
PLACEHOLDER = "FILL-IN"
"""a string value that starts with this is a field ``hpcdl system init`` could not fill"""
AVAILABILITY = ("available", "preview", "research")
"""TOP500's and MLPerf's categories: buyable now, buyable within 180 days, neither"""
EDITION = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def doc(text: str, **rules: Any) -> Any:
    """A field's documentation and its rules (``choices``, ``lo``, ``pattern``; ``many``: a list)."""
    if rules.pop("many", False):  # a list, empty unless given
        return field(default_factory=list, metadata={"doc": text, **rules})
    return field(metadata={"doc": text, **rules})


@dataclass(frozen=True)
class Submission:
    """Who submits what (``[submission]``)."""

    submitter: str = doc("the organisation or person submitting, as the list shows it")
    edition: str = doc("the list edition submitted to: YYYY-MM or YYYY-MM-DD", pattern=EDITION)
    size_class: str = doc("the size class ranked (S, M, L: generators/suites/)")
    class_version: int = doc("the version of that class's suite the records ran", lo=1)
    repeats: int = doc("runs of each workload at each rank count (hpcdl run --repeat N)", lo=1)


@dataclass(frozen=True)
class Part:
    """Processors or accelerators of one model in one node."""

    model: str = doc("the model, as records name the device (environment.device_name)")
    count: int = doc("how many in one node (sockets for processors, devices for accelerators)", lo=1)


@dataclass(frozen=True)
class Machine:
    """The machine (``[system]``)."""

    name: str = doc("the system's name in the list: letters, digits, . _ -", pattern=NAME)
    vendor: str = doc("who built or integrated it")
    nodes: int = doc("nodes in the system (the records may use fewer)", lo=1)
    availability: str = doc("available, preview (within 180 days) or research", choices=AVAILABILITY)
    processor: Part = doc("the host processors of one node")
    cpus_per_node: int = doc("logical CPUs of one node (the records' environment.cpu_count)", lo=1)
    memory_per_node_gib: float = doc("host memory of one node in GiB", lo=0)
    interconnect: str = doc("the network between nodes ('none' for one node)")
    storage: str = doc("where the data sets and records live (file system, local disks)")
    accelerators: list[Part] = doc("accelerators of one node, by model (none on a CPU system)", many=True)


@dataclass(frozen=True)
class Software:
    """The software stack (``[software]``); versions as the tools print them."""

    os: str = doc("operating system and release (e.g. Debian 12)")
    python: str = doc("Python version (the records' environment.python)")
    torch: str = doc("PyTorch version (the records' environment.torch)")
    hpcdl: str = doc("hpcdl version (the records' environment.hpcdl)")
    mpi: str = doc("the MPI library and version ('none' without MPI)")
    horovod: str = doc("Horovod version ('none' when not used)")
    cuda: str = doc("CUDA or ROCm version ('' on a CPU system; the records' environment.cuda)")
    driver: str = doc("accelerator driver version ('' on a CPU system)")


@dataclass(frozen=True)
class Description:
    """A submission's system description."""

    submission: Submission = doc("who submits what")
    system: Machine = doc("the machine")
    software: Software = doc("the software stack")


# --- checking ---------------------------------------------------------------------------------


class DescriptionError(HpcdlError):
    """A description that cannot be used: every problem, one line each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def problems(data: Any) -> list[str]:
    """Every problem of a description (a JSON/TOML object), one line each:
    ``FIELD=VALUE is invalid: ALLOWED``; empty when it is sound."""
    found: list[str] = []
    _check(Description, data, "", found)
    return found


def parse(data: Any) -> Description:
    """A description's typed view; :class:`DescriptionError` with every problem otherwise."""
    found = problems(data)
    if found:
        raise DescriptionError(found)
    return _build(Description, data)


def _line(path: str, value: Any, allowed: str) -> str:
    text = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return f"{path}={text} is invalid: {allowed}"


def _check(cls: type, data: Any, where: str, found: list[str]) -> None:
    if not isinstance(data, Mapping):
        found.append(_line(where.rstrip(".") or "description", data, "a table (object) of fields"))
        return
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            found.append(_line(f"{where}{key}", data[key], f"not a field here; allowed: {', '.join(names)}"))
    for f in dataclasses.fields(cls):
        path = f"{where}{f.name}"
        if f.name not in data:
            if f.default_factory is dataclasses.MISSING:
                found.append(f"{path} is missing: {f.metadata['doc']}")
            continue
        _check_value(hints[f.name], data[f.name], path, f.metadata, found)


def _check_value(hint: Any, value: Any, path: str, rules: Mapping[str, Any], found: list[str]) -> None:
    if isinstance(value, str) and value.startswith(PLACEHOLDER):
        found.append(_line(path, value, f"a placeholder (FILL-IN) to fill in: {rules['doc']}"))
        return
    if dataclasses.is_dataclass(hint):
        _check(hint, value, f"{path}.", found)  # type: ignore[arg-type]
        return
    if typing.get_origin(hint) is list:
        if not isinstance(value, list):
            found.append(_line(path, value, "a list of tables"))
            return
        for i, item in enumerate(value):
            _check_value(typing.get_args(hint)[0], item, f"{path}[{i}]", rules, found)
        return
    ok = (
        isinstance(value, hint) if hint is not float else isinstance(value, int | float)
    ) and not isinstance(value, bool)
    if not ok:
        kind = {str: "a string", int: "an integer", float: "a number"}[hint]
        found.append(_line(path, value, f"{kind}: {rules['doc']}"))
        return
    if "choices" in rules and value not in rules["choices"]:
        found.append(_line(path, value, "allowed: " + ", ".join(rules["choices"])))
    if "lo" in rules and not value >= rules["lo"]:
        found.append(_line(path, value, f"a number >= {rules['lo']}: {rules['doc']}"))
    if "pattern" in rules and not rules["pattern"].match(value):
        found.append(_line(path, value, rules["doc"]))


def _build(cls: type[T], data: Mapping[str, Any]) -> T:
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue
        hint, value = hints[f.name], data[f.name]
        if dataclasses.is_dataclass(hint):
            value = _build(hint, value)  # type: ignore[arg-type]
        elif typing.get_origin(hint) is list:
            value = [_build(typing.get_args(hint)[0], v) for v in value]
        elif hint is float:
            value = float(value)
        values[f.name] = value
    return cls(**values)


def fields_documented() -> dict[str, str]:
    """Every field's dotted name and its documentation (docs/reference/system-description.md lists each)."""
    out: dict[str, str] = {}

    def walk(cls: type, where: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            inner = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
            if dataclasses.is_dataclass(inner):
                walk(inner, f"{where}{f.name}.")  # type: ignore[arg-type]
            else:
                out[f"{where}{f.name}"] = f.metadata["doc"]

    walk(Description, "")
    return out


# --- reading and writing ----------------------------------------------------------------------


def read(path: Path) -> dict[str, Any]:
    """The object in a description file (``.toml`` or ``.json``), read within bounds;
    :class:`Unreadable` says why there is none."""
    if path.suffix == ".json":
        return read_object(path)
    if path.suffix != ".toml":
        raise Unreadable(f"{path.name}: a description is a .toml or .json file")
    return reader.parse_toml(reader.read_bytes(path, MAX_DESCRIPTION_BYTES))


def load(path: Path) -> Description:
    """A description file, read and checked; :class:`Unreadable` or :class:`DescriptionError`."""
    return parse(read(path))


def to_dict(d: Description) -> dict[str, Any]:
    """The description as a JSON/TOML object (the inverse of :func:`parse`)."""
    return dataclasses.asdict(d)


def to_toml(data: Mapping[str, Any], comments: bool = True) -> str:
    """A description object as TOML text, each field under a comment with its documentation.
    Only the shapes a description has: tables of strings and numbers, one list of tables."""
    docs = fields_documented()
    lines = ["# hpcdl system description: docs/reference/system-description.md documents every field", ""]
    for table, cls in (("submission", Submission), ("system", Machine), ("software", Software)):
        lines.append(f"[{table}]")
        nested: list[str] = []
        for f in dataclasses.fields(cls):
            value = data.get(table, {}).get(f.name)
            if value is None:
                continue
            if isinstance(value, dict):
                nested += ["", f"[{table}.{f.name}]  # {f.metadata['doc']}"]
                nested += [
                    _toml_line(k, v, docs.get(f"{table}.{f.name}.{k}"), comments) for k, v in value.items()
                ]
            elif isinstance(value, list):
                for item in value:
                    nested += ["", f"[[{table}.{f.name}]]  # {f.metadata['doc']}"]
                    nested += [_toml_line(k, v, None, False) for k, v in item.items()]
            else:
                lines.append(_toml_line(f.name, value, f.metadata["doc"], comments))
        lines += [*nested, ""]
    return "\n".join(lines)


def _toml_line(key: str, value: Any, text: str | None, comments: bool) -> str:
    # a JSON string or number is a TOML one too; a string from a record (a device's name) is
    # printable first: TOML has no escape for a byte that is not UTF-8, and a control character
    # is best seen in a file a person edits
    shown = printable(value) if isinstance(value, str) else value
    line = f"{key} = {json.dumps(shown, ensure_ascii=False)}"
    return f"{line}  # {text}" if comments and text else line
