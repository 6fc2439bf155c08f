"""User-facing errors: one line that names the field, the value and what is allowed."""

from __future__ import annotations

from typing import Any


class HpcdlError(Exception):
    """An error caused by user input or the environment; the CLI prints it as one line and exits
    with ``exit_code``."""

    exit_code = 2


class RunFailed(HpcdlError):
    """A fault found while measuring (a data shard damaged mid-run): one line, exit code 1, every
    rank ended, nothing recorded."""

    exit_code = 1


class InputError(HpcdlError, ValueError):
    """A value given by the user (a command-line flag, a path, a job-file field, a plugin) is
    outside what is allowed."""

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        shown = repr(value)  # a value may be a stranger's megabyte: the line stays a line
        if len(shown) > MAX_SHOWN:
            shown = shown[: MAX_SHOWN - 3] + "..."
        super().__init__(f"{field}={shown} is invalid: {allowed}")


MAX_SHOWN = 200
"""the most characters of a refused value an error line shows"""


class SpecError(InputError):
    """A workload or run knob has a value outside what is allowed."""
