"""The list site's HTML pages: the index, a page per list, a page per system. Static HTML with
the project's CSS inline, no script and nothing loaded from elsewhere; every string from a
submission is escaped (a description is data written by whoever submitted it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdl.escape import html_text
from hpcdl.results.ranking import INTRO, time_to_quality
from hpcdl.results.score import SystemScore
from hpcdl.results.text import HTML_STYLE, mfu_text, si
from hpcdl.submission.check import Report, summary
from hpcdl.submission.system import Description, fields_documented, to_dict
from hpcdl.workloads import recipes

STYLE = (
    HTML_STYLE
    + "img{max-width:min(100%,900px);border:1px solid #ddd}figure{margin:1em 0}pre{white-space:pre-wrap}"
)

NOTE = (
    "Each list ranks one class version: scores of different class versions are never compared. "
    "A system's place comes from its latest edition; its page shows every edition."
)


@dataclass
class Entry:
    """A submission that passed the check: its description, score and report folder."""

    report: Report
    description: Description
    score: SystemScore
    report_dir: str = ""
    """the report's folder, relative to the site"""

    @property
    def name(self) -> str:
        return self.description.system.name

    @property
    def edition(self) -> str:
        return self.description.submission.edition

    @property
    def list_key(self) -> tuple[str, int]:
        return (self.description.submission.size_class, self.description.submission.class_version)


class Raw(str):
    """A cell that is already HTML (a link built here from escaped parts)."""


def esc(value: Any) -> str:
    return value if isinstance(value, Raw) else html_text(value)


def link(href: str, text: str) -> Raw:
    return Raw(f"<a href='{html_text(href)}'>{html_text(text)}</a>")


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    if not rows:
        return "<p>none</p>"
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def document(title: str, body: str, up: str | None = "") -> str:
    """A page; ``up`` leads back to the index (None: this is the index)."""
    home = f"<p>{link(up + 'index.html', 'all lists')}</p>" if up is not None else ""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>"
        f"<body>{home}<h1>{esc(title)}</h1>{body}</body></html>\n"
    )


def class_title(key: tuple[str, int]) -> str:
    size_class, version = key
    known = recipes.suite(size_class) if size_class in recipes.size_classes() else None
    what = f": {known.description}" if known and known.version == version else ""
    return f"Class {size_class}, suite version {version}{what}"


def _efficiency(s: SystemScore) -> str:
    return (
        f"{s.efficiency:.1%} ({s.efficiency_base}->{s.world_size})"
        if s.efficiency is not None
        else "one scale"
    )


def _energy(s: SystemScore) -> str:
    return si(s.ai_ops_per_watt, "FLOP/J") if s.ai_ops_per_watt else "not measured"


LIST_HEAD = [
    "rank",
    "system",
    "submitter",
    "edition",
    "nodes x ranks per node",
    "device",
    "score (AI-ops/s)",
    "quality-regulated",
    "efficiency",
    "energy (AI-ops/J)",
    "time to quality",
    "availability",
]


def list_rows(entries: Sequence[Entry], up: str = "") -> list[list[Any]]:
    rows = []
    for place, e in enumerate(entries, 1):
        s = e.score
        per_node = (s.world_size or 0) // max(s.nodes or 1, 1)
        rows.append(
            [
                place,
                link(f"{up}systems/{e.name}.html", e.name),
                e.description.submission.submitter,
                e.edition,
                f"{s.nodes} x {per_node}",
                s.device,
                si(s.score, "FLOP/s"),
                si(s.regulated, "FLOP/s"),
                _efficiency(s),
                _energy(s),
                time_to_quality(s),
                e.description.system.availability,
            ]
        )
    return rows


def list_page(key: tuple[str, int], entries: Sequence[Entry]) -> str:
    name = f"class-{key[0]}-v{key[1]}"
    body = (
        f"<p>{esc(INTRO)}</p><p>{esc(NOTE)}</p>"
        f"<p>Exports: {link(name + '.csv', 'CSV')}, {link(name + '.json', 'JSON')}</p>"
        + table(LIST_HEAD, list_rows(entries))
    )
    return document(f"hpcdl list: {class_title(key)}", body)


def index_page(
    lists: dict[tuple[str, int], list[Entry]], systems: Sequence[str], refused: Sequence[Report]
) -> str:
    parts = [f"<p>{esc(NOTE)}</p>"]
    for key, entries in lists.items():
        name = f"class-{key[0]}-v{key[1]}"
        parts.append(f"<h2>{link(name + '.html', class_title(key))}</h2>")
        parts.append(f"<p>Exports: {link(name + '.csv', 'CSV')}, {link(name + '.json', 'JSON')}</p>")
        parts.append(table(LIST_HEAD, list_rows(entries)))
    parts.append("<h2>Systems</h2><ul>")
    parts += [f"<li>{link(f'systems/{s}.html', s)}</li>" for s in systems]
    parts.append("</ul>")
    parts.append(f"<h2>Submissions not listed ({len(refused)})</h2>")
    parts.append(table(["submission", "problems"], [[r.shown, _problems(r.problems)] for r in refused]))
    return document("hpcdl lists", "".join(parts), up=None)


def _problems(lines: Sequence[str], most: int = 10) -> str:
    """A submission's problems, the first ``most`` of them (``hpcdl check`` prints them all)."""
    more = f"; and {len(lines) - most} more (hpcdl check prints every one)" if len(lines) > most else ""
    return "; ".join(lines[:most]) + more


def _description_rows(e: Entry) -> list[list[str]]:
    data = to_dict(e.description)
    docs = fields_documented()
    rows = []
    for table_name, fields in data.items():
        for key, value in fields.items():
            if key == "accelerators":
                text = ", ".join(f"{a['count']} x {a['model']}" for a in value) or "none"
                rows.append([f"{table_name}.{key}", text, "accelerators of one node, by model"])
            elif isinstance(value, dict):
                text = ", ".join(f"{k}: {v}" for k, v in value.items())
                rows.append([f"{table_name}.{key}", text, "the host processors of one node"])
            else:
                rows.append([f"{table_name}.{key}", str(value), docs.get(f"{table_name}.{key}", "")])
    return rows


def _workload_rows(s: SystemScore) -> list[list[str]]:
    return [
        [
            w,
            si(d["ai_ops_per_s"], "FLOP/s"),
            f"{d['samples_per_s']:.4g}",
            mfu_text(d["mfu"], d["flags"]),
            "; ".join(d["flags"]) or "none",
            d["precision"],
            str(d["batch_per_rank"]),
            f"{d['loss_reduction']:.2f}",
        ]
        for w, d in s.workloads.items()
    ]


def system_page(name: str, history: Sequence[Entry], site: Path) -> str:
    latest = history[-1]
    s = latest.score
    parts = [
        f"<p>Latest edition {esc(latest.edition)}: {esc(class_title(latest.list_key))}; "
        f"{link(f'../class-{latest.list_key[0]}-v{latest.list_key[1]}.html', 'its list')}</p>",
        "<h2>Description</h2>",
        table(["field", "value", "what it is"], _description_rows(latest)),
        f"<h2>Figures of edition {esc(latest.edition)}</h2>",
        table(
            [
                "score",
                "quality-regulated",
                "efficiency",
                "energy",
                "time to quality",
                "nodes",
                "ranks",
                "date",
            ],
            [
                [
                    si(s.score, "FLOP/s"),
                    si(s.regulated, "FLOP/s"),
                    _efficiency(s),
                    _energy(s),
                    time_to_quality(s),
                    s.nodes,
                    s.world_size,
                    s.date,
                ]
            ],
        ),
        table(
            ["workload", "AI-ops/s", "samples/s", "MFU", "flags", "precision", "batch/rank", "loss fall q"],
            _workload_rows(s),
        ),
        "<h2>History</h2>",
        table(
            ["edition", "class", "score", "efficiency", "energy", "nodes x ranks", "report"],
            [
                [
                    e.edition,
                    f"{e.list_key[0]} v{e.list_key[1]}",
                    si(e.score.score, "FLOP/s"),
                    _efficiency(e.score),
                    _energy(e.score),
                    f"{e.score.nodes} x {e.score.world_size}",
                    link(f"../{e.report_dir}/index.html", "report"),
                ]
                for e in history
            ],
        ),
        "<h2>What hpcdl check found</h2>",
        f"<pre>{esc(summary(latest.report))}</pre>",
        f"<h2>The report's plots</h2><p>{link(f'../{latest.report_dir}/index.html', 'the full report')}"
        " (captions, every record)</p>",
    ]
    for png in sorted((site / latest.report_dir).glob("*.png")):
        src = f"../{latest.report_dir}/{png.name}"
        img = f"<img src='{esc(src)}' alt='{esc(png.stem)}'>"
        parts.append(f"<figure>{img}<figcaption>{esc(png.stem)}</figcaption></figure>")
    return document(f"hpcdl system {name}", "".join(parts), up="../")
