"""Result records: one JSON file per run (schema in METRICS.md), per-step times in HDF5 beside it.

Files are written atomically (temporary file, then rename), so a crash never leaves half a
record. Every record carries a digest over its content; a record edited by hand no longer
matches its digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpcdl.errors import InputError


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


def read_steps(path: str | Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {name: np.asarray(f[name]) for name in f}


def file_sha256(path: str | Path) -> str:
    """``sha256:<hex>`` of a file's bytes (the steps file, so a record's digest covers it too)."""
    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


def json_files(paths: Sequence[Path]) -> list[Path]:
    """Every ``*.json`` under the given files and directories, each once, in a stable order."""
    files: list[Path] = []
    for p in paths:
        if not p.exists():
            raise InputError("path", str(p), "an existing record file or directory")
        files += sorted(f for f in p.rglob("*.json") if not f.name.startswith(".")) if p.is_dir() else [p]
    return list(dict.fromkeys(f.resolve() for f in files))


def load_record(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        record: dict[str, Any] = json.load(f)
    return record
