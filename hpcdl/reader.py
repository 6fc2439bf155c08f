"""The one bounded reader of every document hpcdl reads: records and results trees, profiles and
fit records, job files, caps journals, HDF5 shard manifests, comm sweeps.

A document is data written by someone else, so reading it is bounded: only a regular file is
read (a FIFO would block, a device never end), opened without blocking and checked on the open
file (so that it cannot be swapped between the check and the read); at most
:data:`MAX_DOCUMENT_BYTES` bytes; nested at most :data:`MAX_DEPTH` deep (Python's parsers
recurse, and so do the views and digests built on what they return); UTF-8 text. Whatever is
wrong raises :class:`Unreadable` with the reason in one line; :func:`document` turns it into the
:class:`InputError` of the field that named the file.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from hpcdl.errors import HpcdlError, InputError

MAX_DOCUMENT_BYTES = 64 << 20
"""a record of 4,096 ranks is about 4 MB (1 KB per rank with its energy block); a job file,
profile or manifest a few kB"""
MAX_DEPTH = 64
"""hpcdl's documents nest 7 deep; Python's parser raises RecursionError near 1,000"""


class Unreadable(HpcdlError, ValueError):
    """A file that cannot be read as an hpcdl document; the message is the reason."""


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}
_ERRORS = {errno.ENOENT: "missing", errno.ELOOP: "a symbolic link loop", errno.EACCES: "permission denied"}


def size_text(n: float) -> str:
    """Bytes for a reason: '1.5 MB'."""
    for factor, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= factor:
            return f"{n / factor:.3g} {unit}"
    return f"{n:.0f} bytes"


@contextmanager
def open_regular(
    path: Path | str,
    limit: int,
    what: str,
    *,
    dir_fd: int | None = None,
    follow_links: bool = True,
) -> Iterator[io.BufferedReader]:
    """``path`` open for reading if it is a regular file of at most ``limit`` bytes (``what``
    names the limit in the reason); :class:`Unreadable` otherwise. ``follow_links=False`` refuses
    a symbolic link as the last part of the path; ``dir_fd`` reads relative to an open folder."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links:
            raise Unreadable("a symbolic link, not a regular file") from None
        raise Unreadable(_ERRORS.get(e.errno or 0, e.strerror or str(e))) from None
    except ValueError:  # a NUL byte in a name taken from a document
        raise Unreadable("not a valid file name") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{_KINDS.get(stat.S_IFMT(st.st_mode), 'not a file')}, not a regular file")
        raise Unreadable(f"{size_text(st.st_size)}, more than the {size_text(limit)} {what}")
    with os.fdopen(fd, "rb") as f:
        yield f


def read_bytes(
    path: Path | str,
    limit: int = MAX_DOCUMENT_BYTES,
    *,
    dir_fd: int | None = None,
    follow_links: bool = True,
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; :class:`Unreadable` says why not."""
    what = "a document may hold"
    try:
        with open_regular(path, limit, what, dir_fd=dir_fd, follow_links=follow_links) as f:
            data = f.read(limit + 1)  # the file may have grown since it was checked
    except OSError as e:  # EIO, a file on a failing disk
        raise Unreadable(e.strerror or str(e)) from None
    if len(data) > limit:
        raise Unreadable(f"more than the {size_text(limit)} {what}")
    return data


def parse_json(data: bytes) -> Any:
    """The JSON value of ``data``, at most :data:`MAX_DEPTH` deep; :class:`Unreadable` says why not."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise Unreadable(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise Unreadable("not UTF-8 text") from None
    except ValueError as e:
        raise Unreadable(f"not JSON ({e})") from None
    if too_deep(value, MAX_DEPTH):  # the digest and the views recurse too: refuse it here
        raise Unreadable(f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


def parse_toml(data: bytes) -> dict[str, Any]:
    """The TOML tables of ``data``, at most :data:`MAX_DEPTH` deep; :class:`Unreadable` says why not."""
    try:
        value = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise Unreadable(f"not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise Unreadable(f"TOML nested deeper than {MAX_DEPTH} levels") from None
    except tomllib.TOMLDecodeError as e:
        raise Unreadable(f"not valid TOML: {e}") from None
    if too_deep(value, MAX_DEPTH):
        raise Unreadable(f"TOML nested deeper than {MAX_DEPTH} levels")
    return value


def read_json(path: Path | str, **where: Any) -> Any:
    """The JSON value of a file, read within the bounds above; :class:`Unreadable` says why not
    (``where``: ``dir_fd``, ``follow_links`` as :func:`open_regular`)."""
    return parse_json(read_bytes(path, **where))


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects and lists more than ``limit`` deep (without recursing)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack += [(c, depth + 1) for c in children]
    return False


def document(path: Path | str, field: str, form: Literal["json", "toml"] = "json") -> dict[str, Any]:
    """The object (JSON) or tables (TOML) in the file ``path`` names, within the bounds above;
    an :class:`InputError` of ``field`` (the option or key that named the file) otherwise."""
    try:
        data = read_bytes(path)
    except Unreadable as e:
        raise InputError(field, str(path), f"cannot be read: {e}") from None
    try:
        value = parse_toml(data) if form == "toml" else parse_json(data)
    except Unreadable as e:
        raise InputError(field, str(path), f"is {e}") from None  # "is not JSON (...)"
    if not isinstance(value, dict):
        raise InputError(field, str(path), f"expected a JSON object, not {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
