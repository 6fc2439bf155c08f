"""What the ``hpcdl`` command prints, made printable: while a command runs, ``sys.stdout`` and
``sys.stderr`` write every string through ``escape.printable`` (newlines kept), so that no
string a stranger controls (a description, a host or device name in a record, a file name found
on disk, an argument) moves the cursor, recolours or clears the terminal, reorders what is
shown, or fails to encode (a file name that is not UTF-8). hpcdl's own lines hold no control
character; a progress bar, which draws with them, writes to :func:`unfiltered`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from hpcdl.escape import printable


class Printable:
    """A text stream whose ``write`` passes :func:`escape.printable` (newlines kept); all else
    is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self.unfiltered = stream

    def write(self, text: str) -> int:
        self.unfiltered.write(printable(text, keep="\n"))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.unfiltered, name)


def unfiltered(stream: TextIO) -> TextIO:
    """The stream under a :class:`Printable` one (for a progress bar's own control codes)."""
    return stream.unfiltered if isinstance(stream, Printable) else stream


@contextlib.contextmanager
def printable_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` made :class:`Printable` while inside."""
    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, Printable):
        sys.stdout = Printable(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, Printable):
        sys.stderr = Printable(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
