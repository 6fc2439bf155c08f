"""Reading a submission's ``.tar.gz`` without trusting it. Every member is inspected before
anything is extracted: a path that is absolute or climbs out with ``..``, a second top-level
folder, a symbolic or hard link, a device or FIFO, a member beyond its kind's bound, a name
that appears twice, too many members or bytes, each is a problem and is never extracted.
What is left (regular files and folders) is extracted with tarfile's ``data`` filter as a
second guard, into a folder of the caller's that must be empty."""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from hpcdl.records.loader import Unreadable, open_regular
from hpcdl.submission.layout import MAX_FILES, MAX_TOTAL_BYTES, limit_of


@dataclass
class Inspection:
    """What an archive holds: the members that may be extracted, the one top-level folder,
    and one line per problem."""

    safe: list[tarfile.TarInfo] = field(default_factory=list)
    top: str | None = None
    problems: list[str] = field(default_factory=list)
    members: int = 0
    bytes: int = 0


def _member_problem(m: tarfile.TarInfo, name: str) -> str | None:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or name.startswith("\\") or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in p.parts:
        return "a path that escapes the archive's root (..)"
    if m.issym():
        return f"a symbolic link (to {m.linkname!r})"
    if m.islnk():
        return f"a hard link (to {m.linkname!r})"
    if m.ischr() or m.isblk():
        return "a device file"
    if m.isfifo():
        return "a FIFO"
    if not (m.isreg() or m.isdir()):
        return "not a regular file or folder"
    if m.isreg() and m.size > limit_of(name):
        return f"{m.size} bytes, more than the {limit_of(name)} a file of its kind may hold"
    return None


def inspect(tar: tarfile.TarFile) -> Inspection:
    """Every member of ``tar`` checked, in order, reading headers only (and stopping once the
    archive holds more members or bytes than a submission may)."""
    out = Inspection()
    seen: set[str] = set()
    tops: list[str] = []
    for m in tar:
        out.members += 1
        out.bytes += max(m.size, 0)
        if out.members > MAX_FILES or out.bytes > MAX_TOTAL_BYTES:
            out.problems.append(f"more than {MAX_FILES} members or {MAX_TOTAL_BYTES} bytes: not read further")
            out.safe = []
            return out
        name = m.name.rstrip("/")
        parts = [x for x in PurePosixPath(name).parts if x != "."]
        clean = "/".join(parts)
        problem = _member_problem(m, name)
        if problem is None and clean in seen:
            problem = "appears twice in the archive"
        if problem:
            out.problems.append(f"{m.name!r}: {problem}")
            continue
        seen.add(clean)
        if parts and parts[0] not in tops:
            tops.append(parts[0])
        if len(parts) == 1 and m.isreg():
            out.problems.append(f"{m.name!r}: a file outside the submission's folder")
            continue
        out.safe.append(m)
    if len(tops) != 1:
        out.problems.append(f"the archive holds {len(tops)} top-level folders ({', '.join(tops)}), not one")
    out.top = tops[0] if len(tops) == 1 else None
    return out


def extract(path: Path, dest: Path) -> tuple[Path | None, Inspection]:
    """Inspect the archive at ``path`` and extract what is safe into the empty folder ``dest``;
    (the submission's folder inside ``dest``, or None, and the inspection)."""
    if any(dest.iterdir()):
        raise ValueError(f"{dest} must be empty")
    try:
        with (
            open_regular(path, MAX_TOTAL_BYTES, "a submission may hold") as f,
            tarfile.open(fileobj=f, mode="r:*") as tar,
        ):
            found = inspect(tar)
            if found.top is not None and found.safe:
                tar.extractall(dest, members=found.safe, filter="data")
    except Unreadable as e:
        return None, Inspection(problems=[f"{path.name}: {e}"])
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        return None, Inspection(problems=[f"{path.name}: not a readable tar archive ({e})"])
    root = dest / found.top if found.top else None
    return (root if root is not None and root.is_dir() else None), found
