"""What a submission holds and where (docs/rules.md, "What a submission holds"), and the bounds every file
of one is read within. A submission is one folder, ``NAME/``, as a directory or as the only
top-level folder of a ``.tar.gz``::

    NAME/system.toml      the system description (or system.json)
    NAME/manifest.json    every other file's SHA-256 and size (schema hpcdl.manifest)
    NAME/results/...      records, steps files, job files and logs, as the results tree held them
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpcdl.records.audit import STEPS_FILE_MAX_BYTES
from hpcdl.records.loader import MAX_JSON_BYTES

MANIFEST = "manifest.json"
DESCRIPTIONS = ("system.toml", "system.json")
RESULTS = "results"

KINDS = (".json", ".h5", ".toml", ".log", ".out", ".err", ".txt", ".md")
"""the files a results tree contributes: records and other hpcdl documents, steps files, job
files, logs and notes; figures and pages (.png, .html) are made again from these"""
MAX_FILES = 100_000
"""files in one submission: a sweep of 4,096 points with repeats is a few thousand"""
MAX_TOTAL_BYTES = 16 << 30
"""all files of one submission together, uncompressed: a steps file holds about 100 bytes per
step and column, so thousands of records take well under a gigabyte"""
MAX_RATIO = 200
"""an archive's files together at most this many times the archive's own size (a gzip bomb
expands about 1,000 times; records and steps files about 5 to 20 times)..."""
RATIO_FLOOR = 256 << 20
"""... once they are more than this (a small archive's padding compresses far better)"""
MAX_NAME_CHARS = 1024
"""the most characters of one member's path"""
MAX_PART_BYTES = 255
"""the most bytes (UTF-8) of one part of a path: every file system's own limit"""
MAX_DEPTH = 32
"""the most folders a path goes down (results/SYSTEM/sweep/point/... is 5)"""
MAX_HEADER_BYTES = 1 << 20
"""the most bytes of one header an archive's reader reads at once (a long name, pax records)"""
MAX_SECONDS = 300.0
"""reading and extracting one archive, all together (a checksum then reads what was extracted)"""


def limit_of(name: str) -> int:
    """The most bytes a file of this name may hold: a JSON document's bound, else a steps
    file's (the largest kind of file a submission holds)."""
    return MAX_JSON_BYTES if name.endswith(".json") else STEPS_FILE_MAX_BYTES


@dataclass(frozen=True)
class Entry:
    """A file or other entry found under a submission's folder: its path relative to the
    folder (``/``-separated) and its kind (``file``, ``dir``, ``symlink``, ``a FIFO``, ...)."""

    name: str
    kind: str
    size: int


def walk(root: Path) -> Iterator[Entry]:
    """Every entry under ``root``, without following symbolic links, in a stable order; a folder
    that cannot be listed is an entry of its own kind."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            found = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:  # named as an entry of its own kind: a problem wherever it is seen
            name = folder.relative_to(root).as_posix()
            yield Entry(name, f"a folder that cannot be listed ({e.strerror})", 0)
            continue
        for entry in found:
            st = entry.stat(follow_symlinks=False)
            name = Path(entry.path).relative_to(root).as_posix()
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(entry.path))
                yield Entry(name, "dir", 0)
            else:
                yield Entry(name, _kind(st.st_mode), st.st_size)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return {
        stat.S_IFIFO: "a FIFO",
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
        stat.S_IFSOCK: "a socket",
    }.get(stat.S_IFMT(mode), "not a regular file")
