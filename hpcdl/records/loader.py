"""Reading hpcdl's JSON documents: one file, or every ``*.json`` under a results tree, sorted
by kind and typed (docs/rules.md, "The gate").

A results tree is data written by whoever ran it, so each file is read by the bounded reader
of every hpcdl document (:mod:`hpcdl.reader`: regular files only, opened without blocking, at
most :data:`MAX_JSON_BYTES`, nested at most :data:`MAX_DEPTH` deep); symbolic links to
directories are not entered (a link to an ancestor would loop). A single file that
cannot be read raises :class:`Unreadable` with the reason; a tree returns every such file
with its reason, so that the rest of the tree still reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from hpcdl import reader
from hpcdl.errors import InputError
from hpcdl.reader import MAX_DEPTH as MAX_DEPTH  # re-exported: the bounds and the error of every reader
from hpcdl.reader import Unreadable as Unreadable
from hpcdl.reader import open_regular as open_regular
from hpcdl.records import schema
from hpcdl.records.typed import MalformedRecord, parse
from hpcdl.records.views import Result, read_result

T = TypeVar("T")

MAX_JSON_BYTES = reader.MAX_DOCUMENT_BYTES
"""the size bound of a record (and of every other hpcdl document)"""


# --- typed views of the documents that sit beside records -------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    """One rank count of a sweep summary; ``record`` is None where the point has no valid record."""

    np: int
    record: str | None = None
    samples_per_s: float | None = None
    ai_ops_per_s: float | None = None
    batch_per_rank: int | None = None
    backend: str | None = None
    speedup: float | None = None
    efficiency: float | None = None


@dataclass(frozen=True)
class SweepSummary:
    """A scaling sweep's summary (``schema: hpcdl.sweep``, written by ``hpcdl sweep``)."""

    schema: str
    mode: str
    spec: dict[str, Any]
    points: list[SweepPoint]
    base_np: int | None = None


@dataclass(frozen=True)
class KnobPoint:
    """One value of a knob sweep; ``record`` is None where the value has no intact record."""

    value: float
    record: str | None = None
    valid: bool = False
    """the record passed its checks (one that did not, as on a disturbed machine, is kept)"""
    samples_per_s: float | None = None
    ai_ops_per_s: float | None = None
    mfu: float | None = None
    batch_per_rank: int | None = None
    peak_memory_bytes: int | None = None
    peak_memory_kind: str | None = None
    estimated_memory_bytes: int | None = None
    phase_shares: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class KnobSweepSummary:
    """A knob sweep's summary (``schema: hpcdl.knob-sweep``, written by ``hpcdl sweep --knob``)."""

    schema: str
    knob: str
    np: int
    spec: dict[str, Any]
    points: list[KnobPoint]
    fitted: bool = False
    left_out: dict[str, Any] | None = None
    """the first value that did not fit and why (it and the values above it did not run)"""


@dataclass(frozen=True)
class CommRow:
    """One buffer size of a collective's sweep: the backend's and raw MPI's median seconds."""

    bytes: int
    backend_s: float
    mpi_s: float | None = None
    collective: str = "allreduce"
    """allreduce, all_gather, reduce_scatter or all_to_all (sweeps before 2026-12: allreduce only)"""


@dataclass(frozen=True)
class CommSweep:
    """A collective sweep (``schema: hpcdl.comm``, written by ``hpcdl comm -o``)."""

    schema: str
    ranks: int
    backend: str
    rows: list[CommRow]


# --- what a file holds ------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """A result record: where it was read, and its view (``result.raw``: the JSON as read)."""

    path: Path
    result: Result
    system: str = ""
    """the system's name as the user gave it (``hpcdl report NAME=DIR``); '' where the record's
    own (``Result.system``: its Slurm cluster or rank 0's host) names it"""

    @property
    def raw(self) -> dict[str, Any]:
        return self.result.raw

    @property
    def system_name(self) -> str:
        """The system the record belongs to: the name given, else its own."""
        return self.system or self.result.system


@dataclass(frozen=True)
class Document(Generic[T]):
    """Another hpcdl document: where it was read, its ``schema`` and its view (or its JSON)."""

    path: Path
    kind: str
    view: T


@dataclass(frozen=True)
class Unread:
    """A file (or directory) that could not be read, and why."""

    path: Path
    reason: str


@dataclass
class Tree:
    """Everything under a results tree, by kind, each list in the order the files were found."""

    records: list[Record] = field(default_factory=list)
    sweeps: list[Document[SweepSummary]] = field(default_factory=list)
    knob_sweeps: list[Document[KnobSweepSummary]] = field(default_factory=list)
    comms: list[Document[CommSweep]] = field(default_factory=list)
    predictions: list[Document[dict[str, Any]]] = field(default_factory=list)
    """extrapolations (``hpcdl predict -o``): never measurements"""
    others: list[Document[dict[str, Any]]] = field(default_factory=list)
    """suite indexes, rankings, job states and collections: not records to read one by one"""
    unreadable: list[Unread] = field(default_factory=list)

    @property
    def files(self) -> int:
        """How many files were looked at."""
        found = len(self.records) + len(self.sweeps) + len(self.knob_sweeps) + len(self.comms)
        found += len(self.predictions)
        return found + len(self.others) + len(self.unreadable)


# --- reading one file -------------------------------------------------------------------------


def read_json(path: Path) -> Any:
    """The JSON value of a file, read by the bounded reader (:mod:`hpcdl.reader`);
    :class:`Unreadable` says why not."""
    try:
        return reader.read_json(path)
    except Unreadable as e:
        raise Unreadable(f"unreadable: {e}") from None


def read_object(path: Path) -> dict[str, Any]:
    """The JSON object in a file; :class:`Unreadable` says why there is none."""
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise Unreadable(f"not a JSON object but {type(doc).__name__}")
    return doc


def view(cls: type[T], doc: dict[str, Any], where: str) -> T:
    """``doc`` as the view ``cls``; :class:`Unreadable` names the key that is missing or wrong."""
    try:
        return parse(cls, doc, where)
    except MalformedRecord as e:
        raise Unreadable(f"malformed {where}: {e}") from None


def _record(path: Path, doc: dict[str, Any]) -> Record:
    try:
        return Record(path, read_result(doc))
    except MalformedRecord as e:
        raise Unreadable(f"malformed record: {e}") from None


def read_record(path: Path) -> Record:
    """The result record in ``path``; :class:`Unreadable` says why there is none."""
    doc = read_object(path)
    if doc.get("schema") != schema.RESULT:
        raise Unreadable(f"schema {doc.get('schema')!r}, not {schema.RESULT}")
    return _record(path, doc)


def read_comm(path: Path) -> CommSweep:
    """The collective sweep in ``path``; :class:`Unreadable` says why there is none."""
    doc = read_object(path)
    if doc.get("schema") != schema.COMM:
        raise Unreadable(f"schema {doc.get('schema')!r}, not {schema.COMM}")
    return view(CommSweep, doc, "comm")


# --- reading a tree ---------------------------------------------------------------------------


def load_tree(paths: Sequence[Path]) -> Tree:
    """Every ``*.json`` under the given files and directories (each file once, in a stable
    order), read and sorted by kind; :class:`InputError` when a path does not exist. Documents
    carry their resolved path (a record's steps file lies beside the file itself, not beside a
    link to it); a file that cannot be read carries the path it was found under."""
    tree = Tree()
    for path, found in _json_files(paths, tree.unreadable).items():
        try:
            _add(tree, path)
        except Unreadable as e:
            tree.unreadable.append(Unread(found, str(e)))
    return tree


def _add(tree: Tree, path: Path) -> None:
    doc = read_object(path)
    kind = doc.get("schema")
    if kind == schema.RESULT:
        tree.records.append(_record(path, doc))
    elif kind == schema.SWEEP:
        tree.sweeps.append(Document(path, kind, view(SweepSummary, doc, "sweep")))
    elif kind == schema.KNOB_SWEEP:
        tree.knob_sweeps.append(Document(path, kind, view(KnobSweepSummary, doc, "knob sweep")))
    elif kind == schema.COMM:
        tree.comms.append(Document(path, kind, view(CommSweep, doc, "comm")))
    elif kind == schema.PREDICTION:
        tree.predictions.append(Document(path, kind, doc))
    elif kind in schema.NOT_RECORDS:
        tree.others.append(Document(path, str(kind), doc))
    else:
        raise Unreadable(f"not an hpcdl document (schema {kind!r})")


def _json_files(paths: Sequence[Path], unreadable: list[Unread]) -> dict[Path, Path]:
    """Resolved path -> the path it was first found under, for the files named and the
    ``*.json`` below the directories named (hidden files, such as half-written temporary ones,
    left out); directories that cannot be listed go to ``unreadable``."""
    files: list[Path] = []
    for p in paths:
        if not p.exists():
            raise InputError("path", str(p), "an existing record file or directory")
        files += sorted(_walk(p, unreadable)) if p.is_dir() else [p]
    found: dict[Path, Path] = {}
    for f in files:
        found.setdefault(Path(os.path.realpath(f)), f)
    return found


def _walk(top: Path, unreadable: list[Unread]) -> Iterator[Path]:
    """``*.json`` entries below ``top`` of any type (a FIFO is refused when read, with its
    reason); directories are entered only when they are not symbolic links."""
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as e:
            unreadable.append(Unread(folder, f"directory not listed: {e.strerror or e}"))
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.name.endswith(".json") and not entry.name.startswith("."):
                yield Path(entry.path)


def beside(document: Path, name: str) -> Path | None:
    """The file a document names relative to its own folder (a sweep's point record),
    resolved for comparison with loaded paths; None for a name no file can have."""
    try:
        return Path(os.path.realpath(document.parent / name))
    except ValueError:  # a NUL byte
        return None
