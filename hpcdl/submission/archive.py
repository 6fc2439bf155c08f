"""Reading a submission's ``.tar.gz`` without trusting it, within stated limits (docs/rules.md,
"What a submission holds"; the figures in ``layout``).

Every member is inspected before anything is extracted: a path that is absolute or climbs out
with ``..``, longer or deeper than a path may be, a second top-level folder, a symbolic or hard
link, a device or FIFO, a sparse file, a member beyond its kind's bound, a name that appears
twice: each is a problem and is never extracted. The archive as a whole is refused, and nothing
extracted, once it holds more members than a submission may, would expand to more bytes than
it may (in all, and against its own size: a gzip bomb), or more than the extraction folder has
free. Its reader (:class:`Bounded`) refuses any one header read larger than
``MAX_HEADER_BYTES`` (a long name or pax header that would fill the memory) and any read after
``MAX_SECONDS``. What is left (regular files and folders) is extracted with tarfile's ``data``
filter as a second guard, into a folder of the caller's that must be empty."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from hpcdl.reader import size_text
from hpcdl.records.loader import Unreadable, open_regular
from hpcdl.submission.layout import (
    MAX_DEPTH,
    MAX_FILES,
    MAX_HEADER_BYTES,
    MAX_NAME_CHARS,
    MAX_PART_BYTES,
    MAX_RATIO,
    MAX_SECONDS,
    MAX_TOTAL_BYTES,
    RATIO_FLOOR,
    limit_of,
)

MAX_LISTED = 50
"""members refused one line each; beyond this many, one line counts the rest"""
CHUNK = 1 << 20


class Refused(Exception):
    """The archive breaks one of its limits; the message says which."""


class Bounded(io.RawIOBase):
    """An archive's uncompressed bytes, read within ``MAX_HEADER_BYTES`` per read and before a
    deadline. A forward seek in a compressed stream reads its way there (so the deadline holds
    while a member is skipped); a backward one starts from the beginning again."""

    def __init__(self, source: BinaryIO, compressed: bool, deadline: float) -> None:
        self.source, self.compressed, self.deadline = source, compressed, deadline
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def read(self, n: int | None = -1) -> bytes:
        self._in_time()
        if n is None or n < 0 or n > MAX_HEADER_BYTES:
            raise Refused(f"a header of more than {size_text(MAX_HEADER_BYTES)}: not read")
        data = self.source.read(n)
        self.position += len(data)
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence != io.SEEK_SET:
            raise io.UnsupportedOperation("only absolute seeks")
        if not self.compressed:
            self._in_time()
            self.position = self.source.seek(offset)
            return self.position
        if offset < self.position:
            self.source.seek(0)
            self.position = 0
        while self.position < offset:
            self._in_time()
            data = self.source.read(min(CHUNK, offset - self.position))
            if not data:
                break
            self.position += len(data)
        return self.position

    def _in_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise Refused(f"not read and extracted within {MAX_SECONDS:g} s: nothing more read")


@dataclass
class Inspection:
    """What an archive holds: the members that may be extracted, the one top-level folder,
    and one line per problem."""

    safe: list[tarfile.TarInfo] = field(default_factory=list)
    top: str | None = None
    problems: list[str] = field(default_factory=list)
    members: int = 0
    bytes: int = 0
    refused_members: int = 0


def _name_problem(name: str) -> str | None:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or name.startswith("\\") or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in p.parts:
        return "a path that escapes the archive's root (..)"
    if len(name) > MAX_NAME_CHARS:
        return f"a path of {len(name)} characters, more than {MAX_NAME_CHARS}"
    if len(p.parts) - 1 > MAX_DEPTH:
        return f"a path {len(p.parts) - 1} folders deep, more than {MAX_DEPTH}"
    if any(len(part.encode("utf-8", "surrogateescape")) > MAX_PART_BYTES for part in p.parts):
        return f"a name of more than {MAX_PART_BYTES} bytes"
    return None


def _member_problem(m: tarfile.TarInfo, name: str) -> str | None:
    named = _name_problem(name)
    if named:
        return named
    if m.issym():
        return f"a symbolic link (to {m.linkname!r})"
    if m.islnk():
        return f"a hard link (to {m.linkname!r})"
    if m.ischr() or m.isblk():
        return "a device file"
    if m.isfifo():
        return "a FIFO"
    if m.issparse():
        return "a sparse file (its holes are not in the archive)"
    if not (m.isreg() or m.isdir()):
        return "not a regular file or folder"
    if m.isreg() and m.size > limit_of(name):
        return f"{m.size} bytes, more than the {limit_of(name)} a file of its kind may hold"
    return None


def expansion_limit(archive_bytes: int) -> int:
    """The most bytes an archive of this size may expand to (``layout``: the total, the ratio)."""
    return min(MAX_TOTAL_BYTES, max(MAX_RATIO * archive_bytes, RATIO_FLOOR))


def inspect(tar: tarfile.TarFile, archive_bytes: int) -> Inspection:
    """Every member of ``tar`` checked, in order, reading headers only; the archive refused as
    soon as it holds more members than a submission may or would expand beyond
    :func:`expansion_limit` (nothing of it is extracted then)."""
    out = Inspection()
    seen: set[str] = set()
    tops: list[str] = []
    most = expansion_limit(archive_bytes)
    for m in tar:
        out.members += 1
        out.bytes += max(m.size, 0)
        if out.members > MAX_FILES:
            return _refused(out, f"more than {MAX_FILES} members: not read further")
        if out.bytes > most:
            return _refused(
                out,
                f"its files expand to more than {size_text(most)} (at most {MAX_RATIO} times the archive's "
                f"{size_text(archive_bytes)}, and {size_text(MAX_TOTAL_BYTES)} in all): not read further",
            )
        name = m.name.rstrip("/")
        parts = [x for x in PurePosixPath(name).parts if x != "."]
        clean = "/".join(parts)
        problem = _member_problem(m, name)
        if problem is None and clean in seen:
            problem = "appears twice in the archive"
        if problem is None and len(parts) == 1 and m.isreg():
            problem = "a file outside the submission's folder"
        if problem:
            _refuse_member(out, f"{m.name!r}: {problem}")
            continue
        seen.add(clean)
        if parts and parts[0] not in tops:
            tops.append(parts[0])
        out.safe.append(m)
    if out.refused_members > MAX_LISTED:
        out.problems.append(f"{out.refused_members - MAX_LISTED} more members refused (not listed)")
    if len(tops) != 1:
        shown = ", ".join(repr(t) for t in tops[:10]) + (", ..." if len(tops) > 10 else "")
        out.problems.append(f"the archive holds {len(tops)} top-level folders ({shown}), not one")
    out.top = tops[0] if len(tops) == 1 else None
    return out


def _refuse_member(out: Inspection, line: str) -> None:
    out.refused_members += 1
    if out.refused_members <= MAX_LISTED:
        out.problems.append(line)


def _refused(out: Inspection, line: str) -> Inspection:
    out.problems.append(line)
    out.safe, out.top = [], None
    return out


def _room(dest: Path, found: Inspection) -> str | None:
    """Why the safe members do not fit into ``dest``'s file system (None: they fit)."""
    need = sum(m.size for m in found.safe if m.isreg())
    free = shutil.disk_usage(dest).free
    if need > free:
        return (
            f"its files need {size_text(need)}, the extraction folder has {size_text(free)} free: "
            "none extracted"
        )

    return None


def _open(f: BinaryIO, deadline: float) -> tarfile.TarFile:
    """The archive in ``f`` (a ``.tar.gz`` or a ``.tar``) for reading through :class:`Bounded`."""
    compressed = f.read(2) == b"\x1f\x8b"
    f.seek(0)
    source: BinaryIO = gzip.GzipFile(fileobj=f, mode="rb") if compressed else f  # type: ignore[assignment]
    bounded = Bounded(source, compressed, deadline)
    return tarfile.open(fileobj=bounded, mode="r:")  # type: ignore[arg-type]


def extract(path: Path, dest: Path) -> tuple[Path | None, Inspection]:
    """Inspect the archive at ``path`` and extract what is safe into the empty folder ``dest``;
    (the submission's folder inside ``dest``, or None, and the inspection)."""
    if any(dest.iterdir()):
        raise ValueError(f"{dest} must be empty")
    deadline = time.monotonic() + MAX_SECONDS
    found = Inspection()
    try:
        with open_regular(path, MAX_TOTAL_BYTES, "a submission may hold") as f:
            archive_bytes = os.fstat(f.fileno()).st_size
            with _open(f, deadline) as tar:
                found = inspect(tar, archive_bytes)
                room = _room(dest, found) if found.top is not None and found.safe else None
                if room:
                    return None, _refused(found, room)
                if found.top is not None and found.safe:
                    tar.extractall(dest, members=found.safe, filter="data")
    except Unreadable as e:
        return None, Inspection(problems=[f"{path.name}: {e}"])
    except Refused as e:
        return None, _refused(found, f"{path.name}: {e}")
    except RecursionError:  # tarfile reads each extended header by recursing into the next
        return None, _refused(found, f"{path.name}: extended headers chained too deep: not read")
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error, ValueError) as e:
        return None, _refused(found, f"{path.name}: not a readable tar archive ({e})")
    except OSError as e:
        return None, _refused(found, f"{path.name}: could not be extracted ({e.strerror or e})")
    root = dest / found.top if found.top else None
    return (root if root is not None and root.is_dir() else None), found
