"""The report's HTML page: the systems measured, a table of every record, the figures with
their captions, and the records that do not verify.

Every string taken from a record is escaped: a record is data written by whoever ran it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hpcdl.escape import html_text
from hpcdl.measure.environment import hpcdl_version
from hpcdl.records.audit import Audit
from hpcdl.records.loader import Unread
from hpcdl.records.views import Result, Stats
from hpcdl.results.report.data import system_of
from hpcdl.results.report.plots import Plot
from hpcdl.results.report.sweeps import Sweep
from hpcdl.results.score import execution_mode
from hpcdl.results.text import HTML_STYLE, html_table, mfu_text, si

STYLE = HTML_STYLE + (
    "td.num{text-align:right}.bad{color:#b00;font-weight:bold}figure{margin:1.5em 0}"
    "img{max-width:100%;border:1px solid #ddd}figcaption{color:#333;margin-top:.3em}"
)

Section = tuple[str, list[Plot], str]
"""a section of figures: its title, its figures, and what the page says when it has none"""


def esc(value: Any) -> str:
    return html_text(value)


def _join(values: Iterable[Any]) -> str:
    return ", ".join(sorted({str(v) for v in values if v})) or "n/a"


def systems_table(records: Sequence[Audit]) -> str:
    """One row per system (as named on the command line, NAME=DIR; else its Slurm cluster or rank
    0's host) and device: what was measured where, when, with which hpcdl."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for a in records:
        groups.setdefault((system_of(a), a.result.environment.device_name), []).append(a.result)
    rows = []
    for (name, device), found in sorted(groups.items()):
        dates = sorted(r.created[:10] for r in found if r.created)
        rows.append(
            [
                name,
                _join(h for r in found for h in r.settings.hosts),
                f"{device} ({_join(r.settings.device for r in found)})",
                str(len(found)),
                f"{dates[0]} – {dates[-1]}" if dates and dates[0] != dates[-1] else (dates or ["n/a"])[0],
                _join(r.environment.hpcdl for r in found),
                _join(r.environment.git for r in found),
                _join(r.environment.torch for r in found),
            ]
        )
    head = ["system", "hosts", "device", "records", "dates", "hpcdl", "git commit", "torch"]
    return html_table(head, rows)


def _step_time(stats: Stats) -> str:
    ms = {k: getattr(stats, k) * 1e3 for k in ("median", "p10", "p90")}
    return f"{ms['median']:.3g} ms ({ms['p10']:.3g}–{ms['p90']:.3g})"


def _validity(r: Result) -> str:
    return "passed" if r.validity.passed else "failed: " + (", ".join(r.validity.failed) or "no checks")


def _energy(r: Result) -> str:
    e = r.metrics.energy
    if e.energy_to_solution_j is None:
        return "unavailable"
    per_sample = e.energy_per_sample_j
    return si(e.energy_to_solution_j, "J") + (
        f" ({si(per_sample, 'J')}/sample)" if per_sample is not None else ""
    )


def record_row(a: Audit) -> list[str]:
    r, m = a.result, a.result.metrics
    return [
        r.name,
        r.family,
        str(r.world_size),
        r.settings.backend or "n/a",
        r.settings.precision,
        execution_mode(r),
        si(m.samples_per_s),
        si(m.ai_ops_per_s, "FLOP/s"),
        mfu_text(m.mfu, m.flags),
        _step_time(m.step_time_s),
        _validity(r),
        _energy(r),
        "; ".join(a.problems) or "ok",
    ]


RECORD_HEAD = [
    "record",
    "family",
    "ranks",
    "backend",
    "precision",
    "mode",
    "samples/s",
    "AI-ops/s",
    "MFU",
    "step time median (p10–p90)",
    "validity",
    "energy",
    "integrity",
]


NUMERIC = {"ranks", "samples/s", "AI-ops/s", "MFU", "step time median (p10–p90)"}


def _cell_class(head: str, cell: str) -> str:
    if (head == "validity" and cell != "passed") or (head == "integrity" and cell != "ok"):
        return "bad"
    if head == "MFU" and cell.endswith("(!)"):
        return "bad num"
    return "num" if head in NUMERIC else ""


def records_table(records: Sequence[Audit]) -> str:
    """Every record; the file each came from as the name's tooltip; failures and edits in red."""
    rows = []
    for a in records:
        name, *cells = record_row(a)
        tds = [f"<td title='{esc(os.path.relpath(a.path))}'>{esc(name)}</td>"]
        for h, c in zip(RECORD_HEAD[1:], cells, strict=True):
            css = _cell_class(h, c)
            tds.append(f"<td class='{css}'>{esc(c)}</td>" if css else f"<td>{esc(c)}</td>")
        rows.append("<tr>" + "".join(tds) + "</tr>")
    th = "".join(f"<th>{esc(h)}</th>" for h in RECORD_HEAD)
    flagged = "".join(
        f"<li><b>{esc(a.result.name)}</b>: <span class='bad'>{esc(flag)}</span></li>"
        for a in records
        for flag in a.result.metrics.flags
    )
    note = (
        f"<p>(!) figures that cannot be true, with their likely cause:</p><ul>{flagged}</ul>"
        if flagged
        else ""
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(rows)}</tbody></table>{note}"


def figure_html(p: Plot) -> str:
    return (
        f"<figure><img src='{esc(p.file)}' alt='{esc(p.caption)}'>"
        f"<figcaption>{esc(p.caption)}</figcaption>{p.extra}</figure>"
    )


def section(title: str, plotted: Sequence[Plot], absent: str) -> str:
    body = "".join(figure_html(p) for p in plotted) if plotted else f"<p>{esc(absent)}</p>"
    return f"<h3>{esc(title)}</h3>{body}"


def unverified_html(records: Sequence[Audit], skipped: Sequence[Unread]) -> str:
    """The records that do not verify, then the files that could not be read at all."""
    bad = [a for a in records if a.problems]
    if not bad:
        text = "<p>none: every record matches its digest and its steps file</p>"
    else:
        items = "".join(
            f"<li><b>{esc(a.result.name)}</b> ({esc(os.path.relpath(a.path))}): "
            f"<span class='bad'>{esc('; '.join(a.problems))}</span></li>"
            for a in bad
        )
        note = "Shown above, but not to be trusted: their figures may not be what was measured."
        text = f"<p>{note}</p><ul>{items}</ul>"
    if skipped:
        items = "".join(
            f"<li>{esc(os.path.relpath(s.path))}: <span class='bad'>{esc(s.reason)}</span></li>"
            for s in skipped
        )
        text += f"<p>Files skipped, not shown above:</p><ul>{items}</ul>"
    return text


def page(
    paths: Sequence[Path],
    records: Sequence[Audit],
    found: Sequence[Sweep],
    sections: Sequence[Section],
    skipped: Sequence[Unread],
) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>hpcdl report</title>"
        f"<style>{STYLE}</style></head><body><h1>hpcdl report</h1>"
        f"<p>{len(records)} records and {len(found)} scaling sweeps from {esc(', '.join(map(str, paths)))}; "
        f"written {now} by hpcdl {esc(hpcdl_version())}. Formulas: docs/metrics.md.</p>"
        f"<h2>Systems</h2>{systems_table(records)}"
        f"<h2>Records</h2>{records_table(records)}"
        "<h2>Figures</h2>"
        + "".join(section(*s) for s in sections)
        + f"<h2>Records that do not verify</h2>{unverified_html(records, skipped)}</body></html>\n"
    )
