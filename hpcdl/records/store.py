"""Result records: one JSON file per run (schema in METRICS.md), per-step times in HDF5 beside it.

Files are written atomically (temporary file, then rename), so a crash never leaves half a
record. Every record carries a digest over its content; a record edited by hand no longer
matches its digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import h5py
import numpy as np

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


def write_record(record: Mapping[str, Any], path: str | Path) -> Path:
    """Write a sealed record as JSON, atomically."""
    path = Path(path)

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1, allow_nan=True)
            f.write("\n")

    _atomic_write(path, write)
    return path


def write_steps(columns: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """Per-step series (step time, phases, loss) as float64 datasets of one HDF5 file."""
    path = Path(path)

    def write(tmp: str) -> None:
        with h5py.File(tmp, "w") as f:
            for name, values in columns.items():
                f.create_dataset(name, data=np.asarray(values, dtype=np.float64))

    _atomic_write(path, write)
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
