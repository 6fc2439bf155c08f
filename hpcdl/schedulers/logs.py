"""Why a job failed, in one line, from its logs or the traceback its scheduler kept."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

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


def log_error(folder: Path) -> str:
    """The error line of a job's logs (every task's ``*_log.err``), if any."""
    found = ""
    for path in sorted(folder.glob("*_log.err")):
        with contextlib.suppress(OSError):
            line = error_line(path.read_text(errors="replace")[-20000:])
            if line.startswith("hpcdl: ") or (line and not found):
                found = line
    return found
