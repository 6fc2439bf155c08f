"""Tables of figures: aligned plain text for the terminal, escaped HTML for pages."""

from __future__ import annotations

import csv
import io
import textwrap
from collections.abc import Sequence
from typing import Any

from hpcdl.escape import csv_cell, html_text

NOTE_WIDTH = 100
"""the width a note below a table is wrapped to (a table may be wider: its rows stay whole)"""


def si(value: float | None, unit: str = "") -> str:
    """1234567 -> '1.23 M' (decimal prefixes, three significant digits)."""
    if value is None or value != value:  # None or NaN
        return "n/a"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def mfu_text(mfu: float | None, flags: Sequence[str] = ()) -> str:
    """MFU as a percentage, ``n/a`` without a peak, and marked ``(!)`` when the record flags a
    figure that cannot be true (docs/metrics.md, `flags`): such a figure is never shown plain."""
    if mfu is None or mfu != mfu:
        return "n/a"
    return f"{mfu:.1%}" + (" (!)" if flags else "")


def notes_once(notes: dict[str, Sequence[str]]) -> list[str]:
    """Each distinct note once, from ``{name: its notes}``: a note every name shares (one that
    belongs to the machine, not to a workload) without names, any other after the names it
    concerns, in first-seen order."""
    who: dict[str, list[str]] = {}
    for name, lines in notes.items():
        for line in lines:
            who.setdefault(line, []).append(name)
    return [
        note if len(names) == len(notes) > 1 else f"{', '.join(names)}: {note}" for note, names in who.items()
    ]


def wrapped(note: str, width: int = NOTE_WIDTH, indent: str = "") -> str:
    """A note below a table as lines of at most ``width`` characters, each after ``indent``,
    the later ones two spaces further in, so that a 300-character note (the MFU line's peak and
    its inputs) reads on a terminal; words are never split (a path stays whole)."""
    return textwrap.fill(
        note,
        width,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: bool = True) -> str:
    """Columns aligned, with a rule under the header: the first column left, the others right
    (figures) when ``numeric``, else all left."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i == 0 or not numeric else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


HTML_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1500px}table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #bbb;padding:3px 8px;text-align:left;vertical-align:top}th{background:#eee}"
)
"""the CSS shared by hpcdl's HTML pages (ranking, report)"""


def html_table(head: Sequence[str], rows: Sequence[Sequence[str]], css: str = "") -> str:
    """An HTML table; every cell is escaped here, so callers pass plain text."""
    th = "".join(f"<th>{html_text(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html_text(c)}</td>" for c in row) + "</tr>" for row in rows)
    attr = f" class='{html_text(css)}'" if css else ""
    return f"<table{attr}><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def csv_text(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A CSV list (``hpcdl rank``, ``hpcdl list-site``): None as an empty cell, every string
    cell that a spreadsheet would evaluate as a formula neutralised (``escape.csv_cell``)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows([csv_cell("" if c is None else c) for c in row] for row in rows)
    return buf.getvalue()
