"""The caps journal: the file that holds a device's original limits while a cap is in force
(``hpcdl.measure.caps``), so that a process killed with SIGKILL leaves behind what the next one
restores; while its process lives it is also the lock that says another sweep holds caps here.

A journal tells a privileged process what to write where, so it lives where only its owner can
write (:func:`journal_path`: ``/run/hpcdl/`` for root, else ``$XDG_RUNTIME_DIR/hpcdl/``), in a
folder that is refused when it is a symbolic link, owned by another user or writable by group or
others, and files in it are opened relative to the folder checked, never through a link. This
module knows the file, not the limits its entries name: ``caps.from_journal`` decides which
entries are limits hpcdl may write.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpcdl.errors import InputError
from hpcdl.reader import Unreadable, read_json

JOURNAL_ENV = "HPCDL_CAPS_JOURNAL"
"""the file that holds the original limits while a cap is in force (default: see
:func:`journal_path`); its folder must be one only its owner can write"""
ROOT_JOURNAL_DIR = Path("/run/hpcdl")
"""root's journal folder: /run is root's own tmpfs, cleared at boot like the limits themselves"""


def journal_path() -> Path:
    """Where the caps journal is: :data:`JOURNAL_ENV` when set; else ``/run/hpcdl/caps.json``
    for root, ``$XDG_RUNTIME_DIR/hpcdl/caps.json`` for a user who has one, and
    ``$TMPDIR/hpcdl-UID/caps.json`` otherwise (a folder of that name made by another user is
    refused, never used)."""
    if os.environ.get(JOURNAL_ENV):
        return Path(os.environ[JOURNAL_ENV])
    if os.geteuid() == 0:
        return ROOT_JOURNAL_DIR / "caps.json"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(runtime) / "hpcdl" if runtime else Path(tempfile.gettempdir()) / f"hpcdl-{os.geteuid()}"
    return folder / "caps.json"


def read_journal(path: Path) -> list[Any] | None:
    """The entries of the journal at ``path`` (None when there is none), after checking its
    shape and that the process that wrote it has ended. InputError when its folder is not
    private, it is malformed, or its process still runs."""
    with journal_folder(path, create=False) as folder:
        if folder is None:
            return None
        try:
            data = read_json(path.name, dir_fd=folder, follow_links=False)
        except Unreadable as e:
            if str(e) == "missing":
                return None
            raise malformed(path, str(e)) from None
    if not isinstance(data, dict) or not isinstance(data.get("limits"), list):
        raise malformed(path, "not an object with a list of limits")
    pid = data.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise malformed(path, f"pid {pid!r} is not a process id")
    if pid != os.getpid() and alive(pid):
        raise InputError("caps", str(path), f"process {pid} holds caps on this host; wait for it to end")
    return list(data["limits"])


def malformed(path: Path, why: str) -> InputError:
    return InputError("caps journal", str(path), f"{why}: restore the limits by hand, then remove it")


@contextlib.contextmanager
def journal_folder(path: Path, create: bool) -> Iterator[int | None]:
    """The journal's folder, open (None when it does not exist and ``create`` is false), after
    checking that only this user can write it: not a symbolic link, owned by this user, not
    writable by group or others. Files are then opened relative to it, so that the folder
    checked is the folder used."""
    folder = path.parent
    if create:
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass  # checked below, whoever made it
        except OSError as e:
            raise InputError("caps journal", str(folder), f"cannot be made ({e.strerror or e})") from None
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(folder, flags)
    except FileNotFoundError:
        if create:
            raise
        yield None
        return
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            why = "a symbolic link" if os.path.islink(folder) else "not a folder"
            raise InputError("caps journal", str(folder), f"{why}: a folder only you can write") from None
        raise InputError("caps journal", str(folder), f"cannot be opened ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            why = f"owned by uid {st.st_uid}, not you (uid {os.geteuid()})"
            raise InputError("caps journal", str(folder), f"{why}: a folder only you can write")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            why = f"mode {stat.S_IMODE(st.st_mode):o} lets others write"
            raise InputError("caps journal", str(folder), f"{why}: a folder only you can write (0700)")
        yield fd
    finally:
        os.close(fd)


def write_journal(path: Path, data: dict[str, Any]) -> None:
    """Write the journal whole (a kill mid-write leaves a hidden temporary file, no half
    journal), in a private folder, through no symbolic link."""
    with journal_folder(path, create=True) as folder:
        temporary = f".{path.name}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=folder)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(temporary, flags, 0o600, dir_fd=folder)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data))
        os.replace(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)


def remove_journal(path: Path) -> None:
    with journal_folder(path, create=False) as folder:
        if folder is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.name, dir_fd=folder)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return pid > 0
