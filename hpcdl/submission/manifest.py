"""A submission's manifest: the SHA-256 and size of every file beside it, so that a list
maintainer sees any file changed, added or removed after packaging (``schema: hpcdl.manifest``).
Files are hashed through ``records.loader``'s bounded open: regular files only, each within
the bound of its kind (``layout.limit_of``)."""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hpcdl.records import schema
from hpcdl.records.loader import Unreadable, open_regular, read_object, view
from hpcdl.records.store import file_sha256
from hpcdl.submission.layout import MANIFEST, limit_of, walk


@dataclass(frozen=True)
class FileSum:
    sha256: str
    """``sha256:<hex>``, as ``records.store.file_sha256`` writes it"""
    bytes: int


@dataclass(frozen=True)
class Manifest:
    schema: str
    files: dict[str, FileSum]
    """path relative to the submission's folder (``/``-separated) -> its checksum"""


def sum_file(path: Path, name: str) -> FileSum:
    """A file's checksum, read within its kind's bound; :class:`Unreadable` says why not."""
    with open_regular(path, limit_of(name), "a file of this kind may hold in a submission") as f:
        return sum_open(f)


def sum_open(f: io.BufferedReader) -> FileSum:
    """The checksum of an open file from its start to its end."""
    f.seek(0)
    digest = file_sha256(f)
    return FileSum(digest, f.tell())


def document(sums: dict[str, FileSum]) -> dict[str, Any]:
    """The manifest's JSON object."""
    return {
        "schema": schema.MANIFEST,
        "files": {n: {"sha256": s.sha256, "bytes": s.bytes} for n, s in sorted(sums.items())},
    }


def read(root: Path) -> Manifest:
    """The manifest of the submission folder ``root``; :class:`Unreadable` says why there is none."""
    doc = read_object(root / MANIFEST)
    if doc.get("schema") != schema.MANIFEST:
        raise Unreadable(f"schema {doc.get('schema')!r}, not {schema.MANIFEST}")
    return view(Manifest, doc, "manifest")


def safe_name(name: str) -> bool:
    """A relative ``/``-separated path that stays inside its folder."""
    p = PurePosixPath(name)
    return bool(name) and not p.is_absolute() and ".." not in p.parts and "\\" not in name


def verify(root: Path, manifest: Manifest) -> list[str]:
    """One line per file of ``root`` that is not what the manifest says: changed, added,
    missing, not a regular file, or beyond its bound."""
    problems = [
        f"{MANIFEST}: {n!r} is not a path inside the submission" for n in manifest.files if not safe_name(n)
    ]
    found: set[str] = set()
    for entry in walk(root):
        if entry.kind == "dir" or entry.name == MANIFEST:
            continue
        found.add(entry.name)
        if entry.kind != "file":
            problems.append(f"{entry.name}: {entry.kind}, not a regular file")
            continue
        want = manifest.files.get(entry.name)
        if want is None:
            problems.append(f"{entry.name}: not in the manifest (added after packaging)")
            continue
        try:
            got = sum_file(root / entry.name, entry.name)
        except Unreadable as e:
            problems.append(f"{entry.name}: {e}")
            continue
        if got != want:
            problems.append(
                f"{entry.name}: its SHA-256 or size differs from the manifest's (changed after packaging)"
            )
    missing: Iterable[str] = sorted(set(manifest.files) - found)
    problems += [f"{n}: in the manifest but missing" for n in missing if safe_name(n)]
    return problems
