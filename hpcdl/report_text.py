"""Plain-text tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence


def si(value: float | None, unit: str = "") -> str:
    """1234567 -> '1.23 M' (decimal prefixes, three significant digits)."""
    if value is None or value != value:  # None or NaN
        return "n/a"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


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
