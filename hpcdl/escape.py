"""Strings that strangers control, made inert for each output they reach.

A submitter writes the system description, a record names its hosts, devices and workload, a
results tree names its files (in any bytes: a file name need not be UTF-8). hpcdl prints these
and writes them into pages, lists and tables, so each output has one function here, and every
writer of that output calls it on every string it did not write itself:

- :func:`printable`: terminals and one-line messages. Control characters (which move the cursor,
  recolour or clear a terminal), bidirectional overrides (which reorder what is shown), and the
  bytes of a file name that are not UTF-8 are written as visible escapes (``\\x1b``, ``\\u202e``,
  ``\\xff``). The CLI runs every byte it prints through it (``hpcdl/cli/terminal.py``).
- :func:`html_text`: HTML, every markup character escaped, over :func:`printable`.
- :func:`markdown_text`: inline Markdown (a table's cell, a heading): pipes, Markdown's
  punctuation and inline HTML escaped, newlines made visible, over :func:`printable`.
- :func:`csv_cell`: a cell of a CSV list: a string a spreadsheet would take for a formula (first
  character ``=``, ``+``, ``-``, ``@``, tab or carriage return) is prefixed with ``'``, so that it
  is shown as text (OWASP, "CSV Injection").
- :func:`plot_text`: a label matplotlib draws: ``$`` does not start math mode.
- :func:`file_part`: a stranger's string as part of a file name: letters, digits, ``.-_`` only.
- :func:`shell_word`: a stranger's string in a command line hpcdl prints for a person to run
  (``sbatch --exclude=HOSTS``): one word to the shell, whatever it holds.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from typing import Any

_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""Unicode's bidirectional marks, embeddings, overrides and isolates: text after them is shown
in another order than it is stored ("Trojan Source")"""


_CATEGORIES = ("Cc", "Cs", "Zl", "Zp")
"""control characters, lone surrogates, and the line and paragraph separators some viewers break
lines at"""


def _visible(c: str) -> str:
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by Python as a lone surrogate
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _unsafe(c: str, keep: str) -> bool:
    return c not in keep and (c in _BIDI or unicodedata.category(c) in _CATEGORIES)


def printable(text: Any, keep: str = "") -> str:
    """``text`` (any value, as ``str()`` shows it) with every control character, bidirectional
    override and undecodable byte written as a visible escape; the characters in ``keep`` (e.g.
    ``"\\n"`` for several lines) are left as they are."""
    s = str(text)
    rest = s
    for c in keep:
        rest = rest.replace(c, "")
    if rest.isprintable() and not _BIDI.intersection(s):  # the common case, at C speed
        return s
    return "".join(_visible(c) if _unsafe(c, keep) else c for c in s)


def html_text(text: Any) -> str:
    """``text`` for HTML, in an element or a quoted attribute."""
    return (
        printable(text)
        .replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
        .replace("'", "&#x27;")
    )


_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~&])")
"""the punctuation that makes Markdown structure inside a line: escapes, code, emphasis and
strike-through, links and images (``[``), inline HTML and entities, a table cell's end
(CommonMark escapes any of it with ``\\``); ``#``, ``+`` and ``-`` matter only where a line starts"""


def markdown_text(text: Any) -> str:
    """``text`` inline in Markdown (a table's cell, a heading): shown as written, never as markup."""
    return _MARKDOWN.sub(r"\\\1", printable(text))


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""a cell beginning with one of these is a formula (or starts one) to a spreadsheet"""


def csv_cell(value: Any) -> Any:
    """A value for a CSV cell: numbers as they are; a string :func:`printable`, and prefixed with
    ``'`` when a spreadsheet would read it as a formula (shown as text then, not evaluated)."""
    if not isinstance(value, str):
        return value
    text = printable(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def plot_text(text: Any) -> str:
    """``text`` for a matplotlib label: a pair of ``$`` would start math mode (and a bad formula
    fails when the figure is drawn), so strings are drawn literally."""
    return printable(text).replace("$", r"\$")


def file_part(text: Any, limit: int = 60) -> str:
    """``text`` as part of a file name: runs of anything but letters, digits, ``.``, ``_`` and
    ``-`` become ``-``; never empty, never ``.`` or ``..``, at most ``limit`` characters."""
    part = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-.")[:limit]
    return part or "x"


def shell_word(text: Any) -> str:
    """``text`` as one word of a shell command line, quoted where the shell would read anything
    else in it (``;``, ``$(...)``, spaces), and :func:`printable`."""
    return printable(shlex.quote(str(text)))
