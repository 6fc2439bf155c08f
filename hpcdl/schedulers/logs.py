"""Why a job failed, in one line, from its logs or the traceback its scheduler kept."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from hpcdl.reader import Unreadable, open_regular

ERROR_LINE = re.compile(r"^(hpcdl: .*|[\w.]*(Error|Exception|Interrupt)\b.*)$")


def error_line(text: str) -> str:
    """The most telling line of a log or traceback: hpcdl's own message, else the last
    exception line."""
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    ours = [s for s in lines if s.startswith("hpcdl: error") or (s.startswith("hpcdl: ") and "failed" in s)]
    if ours:
        return ours[-1]
    errors = [s for s in lines if ERROR_LINE.match(s) and not s.startswith("hpcdl: ")]
    return errors[-1] if errors else (lines[-1] if lines else "")


TAIL_BYTES = 20_000
"""the end of a log that is read: where the failure is said"""


def tail(path: Path, size: int = TAIL_BYTES) -> str:
    """The last ``size`` bytes of a regular file as text (a log may hold gigabytes; a FIFO put
    in its place would block: ``reader.open_regular`` refuses it)."""
    with open_regular(path, 1 << 62, "a log may hold") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - size))
        return f.read(size).decode("utf-8", errors="replace")


def log_error(folder: Path) -> str:
    """The error line of a job's logs (every task's ``*_log.err``), if any."""
    found = ""
    for path in sorted(folder.glob("*_log.err")):
        with contextlib.suppress(OSError, Unreadable):
            line = error_line(tail(path))
            if line.startswith("hpcdl: ") or (line and not found):
                found = line
    return found
