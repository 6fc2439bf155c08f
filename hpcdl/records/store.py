"""Result records: one JSON file per run (schema: docs/reference/record.md), per-step times in HDF5 beside it.

A record and its steps file are written as one unit: both to temporary names first, then
renamed, the record last, under a lock per record name; the steps file's name is the record's
own (``NAME.<id>.steps.h5``), so a replaced record's pair stays whole until the new record takes
its place, and no failure (a full disk, a kill) leaves half a pair or breaks an older one. The
record's rename is the moment the pair appears: a steps file no record names (a writer killed
between the two renames) is never read, and the next writer of the name removes it.
Every record carries a digest over its content; a record edited by hand no longer matches it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import h5py
import numpy as np

from hpcdl.errors import InputError
from hpcdl.records.loader import read_object


def digest(record: Mapping[str, Any]) -> str:
    """SHA-256 over the canonical JSON of the record without its ``digest`` field."""
    body = {k: v for k, v in record.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def seal(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its digest set."""
    return {**record, "digest": digest(record)}


def digest_ok(record: Mapping[str, Any]) -> bool:
    return record.get("digest") == digest(record)


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""a record's name is a file name in the output directory, never a path"""
RECORD_ROOM_BYTES = 16 << 20
"""free space the output directory must have before anything is measured: a record and its
steps file take well under this (about 100 bytes per step and column)"""


def check_name(name: str) -> str:
    """``name`` if it is a file name hpcdl may write a record under, else a one-line error."""
    if not NAME_RE.fullmatch(name) or ".." in name:
        raise InputError(
            "name",
            name,
            "a file name: letters, digits and ._- (no '/' or '..'), starting with a letter or digit",
        )
    return name


def check_output(directory: str | Path, room: int = RECORD_ROOM_BYTES) -> Path:
    """Refuse an output directory that cannot take a record before anything is measured: under a
    regular file, not writable (permissions, a read-only file system), or with less free space
    than ``room``. It is created if missing."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
        free = shutil.disk_usage(path).free
    except OSError as e:
        raise InputError(
            "output", str(path), f"a directory hpcdl can write records in ({e.strerror or e})"
        ) from None
    if free < room:
        raise InputError("output", str(path), f"{free >> 20} MiB free; a record needs up to {room >> 20} MiB")
    return path


def steps_image(columns: Mapping[str, Sequence[float]]) -> bytes:
    """Per-step series (step time, phases, loss) as float64 datasets of one HDF5 file, made in
    memory: a disk that fills up then fails a plain write, not the HDF5 library."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        for name, values in columns.items():
            f.create_dataset(name, data=np.asarray(values, dtype=np.float64))
    return buffer.getvalue()


def write_pair(
    record: dict[str, Any],
    columns: Mapping[str, Sequence[float]],
    directory: str | Path,
    name: str,
    proceed: Callable[[], None] = lambda: None,
) -> tuple[dict[str, Any], Path, Path]:
    """Seal ``record`` with its steps file and write both as one unit (see the module's
    docstring); returns the sealed record and the two paths. An OSError (a full disk) removes
    what was written and leaves an older record of the name as it was; so does an exception
    from ``proceed``, called at the last moment before the files take their names."""
    out = Path(directory)
    image = steps_image(columns)
    steps_path = out / f"{check_name(name)}.{record['id'][:12]}.steps.h5"
    sealed = seal(
        {
            **record,
            "steps_file": steps_path.name,
            "steps_sha256": "sha256:" + hashlib.sha256(image).hexdigest(),
        }
    )
    text = json.dumps(sealed, indent=1, allow_nan=True) + "\n"
    path = out / f"{name}.json"
    temps: list[str] = []
    try:
        with _name_lock(out, name):
            old_steps = _steps_of(path)
            _clear_leftovers(out, name, old_steps)
            tmp_steps = _written(out, steps_path.name, image, temps)
            tmp_json = _written(out, path.name, text.encode(), temps)
            proceed()
            os.replace(tmp_steps, steps_path)
            temps[0] = str(steps_path)  # until the record takes its name, a steps file alone
            os.replace(tmp_json, path)
            temps.clear()
            if old_steps and old_steps != steps_path.name:
                (out / old_steps).unlink(missing_ok=True)  # the replaced record's steps file
    finally:
        for tmp in temps:
            Path(tmp).unlink(missing_ok=True)
    return sealed, path, steps_path


def _clear_leftovers(directory: Path, name: str, keep: str | None) -> None:
    """Remove what a writer of ``name`` killed mid-write left (SIGKILL runs no ``finally``):
    its temporary files, and a steps file renamed before its record was, which no record names
    (readers never see either: they read ``*.json`` only, not hidden ones). Only under the
    name's lock, which every writer holds from its first temporary file to its record's rename:
    what a live writer has in flight is never taken for a leftover."""
    stem = re.escape(name)
    leftover = re.compile(
        rf"\.{stem}(\.json|\.[0-9a-f]{{12}}\.steps\.h5)\.[^.]+\.tmp|{stem}\.[0-9a-f]{{12}}\.steps\.h5"
    )
    for entry in os.scandir(directory):
        if entry.name != keep and leftover.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
            Path(entry.path).unlink(missing_ok=True)


def _written(directory: Path, name: str, data: bytes, temps: list[str]) -> str:
    """``data`` in a new temporary file beside ``name``, flushed to disk; its path."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    temps.append(tmp)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


@contextlib.contextmanager
def _name_lock(directory: Path, name: str) -> Iterator[None]:
    """Serialise writers of one record name (two runs given the same --name). The lock file is
    removed by its holder when done, so that an output folder holds records and steps files
    only: a writer that waited on a file since removed finds it replaced (another inode, or
    none) and takes the lock again on the file now there."""
    path = directory / f".{name}.lock"
    while True:
        f = open(path, "a")
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            same = os.path.samestat(os.fstat(f.fileno()), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # still holding the lock: no writer takes this file any more
        f.close()


def _steps_of(path: Path) -> str | None:
    """The steps file named by the record at ``path``, if one is there and readable."""
    try:
        name = read_object(path).get("steps_file")
    except (OSError, ValueError):
        return None
    return name if isinstance(name, str) and NAME_RE.fullmatch(name.removesuffix(".steps.h5")) else None


def write_record(record: Mapping[str, Any], path: str | Path) -> Path:
    """Write a JSON document atomically; a path that cannot be written is a one-line error."""
    path = Path(path)

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1, allow_nan=True)
            f.write("\n")

    try:
        _atomic_write(path, write)
    except OSError as e:
        raise InputError("output", str(path), f"a file hpcdl can write ({e.strerror or e})") from None
    return path


def write_steps(columns: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """A steps file on its own, atomically (tests and tools; runs use ``write_pair``)."""
    path = Path(path)
    image = steps_image(columns)
    _atomic_write(path, lambda tmp: Path(tmp).write_bytes(image))
    return path


def read_steps(source: str | Path | BinaryIO, max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """The per-step columns of a steps file (a path or an open binary file) as float64 arrays;
    ``ValueError`` for a dataset that is not a 1-D column, or, with ``max_bytes``, that would
    take more memory than that (a compressed dataset can expand far beyond its file's size)."""
    with h5py.File(source, "r") as f:
        datasets = {name: d for name, d in f.items() if isinstance(d, h5py.Dataset)}
        for name, d in datasets.items():
            if d.ndim != 1 or (max_bytes is not None and d.size * 8 > max_bytes):
                raise ValueError(f"dataset {name} of shape {d.shape} is not a column of a steps file")
        return {name: np.asarray(d, dtype=np.float64) for name, d in datasets.items()}


def file_sha256(source: str | Path | io.BufferedReader) -> str:
    """``sha256:<hex>`` of a file's bytes (the steps file, so a record's digest covers it too);
    an open file is read from where it stands to its end."""
    if isinstance(source, str | Path):
        with open(source, "rb") as f:
            return file_sha256(f)
    return "sha256:" + hashlib.file_digest(source, "sha256").hexdigest()


def load_record(path: str | Path) -> dict[str, Any]:
    """The JSON object in a record file, read within ``loader``'s bounds (regular files only, a
    size and a nesting limit); ``loader.Unreadable`` (a ``ValueError``) says why not."""
    return read_object(Path(path))
