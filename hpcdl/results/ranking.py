"""``hpcdl rank``: read the result records of one or more systems, verify every record, score
each system and write the ranking list (Markdown, HTML, CSV and JSON), TOP500-style.

Each argument is one system's submission: a directory of records (searched recursively),
named by the directory or as ``NAME=DIR``. Rejected records are listed with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpcdl.errors import InputError
from hpcdl.escape import html_text, markdown_text
from hpcdl.records import schema
from hpcdl.records.audit import Audit, audit, gate_problems
from hpcdl.records.loader import Document, Record, SweepSummary, beside, load_tree
from hpcdl.records.store import write_record
from hpcdl.results.output import output_dir
from hpcdl.results.score import SystemScore, execution_mode, list_key, record_class, score_system, split_key
from hpcdl.results.text import HTML_STYLE, csv_text, html_table, mfu_text, si, table
from hpcdl.scaling.table import scaling_table
from hpcdl.workloads import recipes


@dataclass(frozen=True)
class Rejected:
    system: str
    path: str
    reason: str


@dataclass
class Ranking:
    lists: dict[str, list[SystemScore]]
    """one ranking list per size class (smallest class first): ranked systems first (score,
    descending), so a ranked system's place is its position; then those without a score"""
    rejected: list[Rejected]
    accepted: int
    unclassed: int = 0
    """accepted records of workloads of no size class: reported, never ranked"""
    sweeps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """per system: its sweep summaries, recomputed from their accepted point records"""
    records: dict[str, list[Audit]] = field(default_factory=dict)
    """per system: its accepted records (what ``--baseline`` compares)"""

    @property
    def systems(self) -> list[SystemScore]:
        """Every class's list, one after the other."""
        return [s for scores in self.lists.values() for s in scores]


def parse_submission(arg: str, field: str = "rank.path") -> tuple[str, Path]:
    """``NAME=DIR`` or ``DIR`` (named by its last component)."""
    name, sep, folder = arg.partition("=")
    path = Path(folder if sep else arg)
    if not path.exists():
        raise InputError(field, str(path), "an existing directory or record file")
    return (name if sep else path.resolve().name), path


def collect(
    submissions: Sequence[tuple[str, Path]], say: Callable[[str], None] = lambda _m: None
) -> tuple[dict[str, list[Audit]], list[Rejected], dict[str, list[Document[SweepSummary]]]]:
    """Every accepted result record per system (audited, with rank 0's steps), every rejected
    file with its reason (in the order the files were found), and the sweep summaries. Other
    hpcdl documents (suite indexes, comm sweeps, rankings) are not records to rank."""
    summaries: dict[str, list[Document[SweepSummary]]] = {}
    accepted: dict[str, list[Audit]] = {}
    rejected: list[Rejected] = []
    seen: dict[str, str] = {}  # record id or digest -> path of its first occurrence
    for system, root in submissions:
        tree = load_tree([root])
        say(f"rank: {system}: checking {tree.files} JSON files under {root}")
        refused = [(u.path, u.reason) for u in tree.unreadable]
        refused += [(d.path, "a prediction, not a measurement") for d in tree.predictions]
        accepted[system] = []
        for found in tree.records:
            checked = audit(Record(shown(found.path), found.result))
            problems = list(checked.problems) or gate_problems(found.result)
            keys = [found.result.id, found.result.digest]
            first = next((seen[k] for k in keys if k in seen), None)
            if first is not None:
                problems = [f"duplicate of {first}", *problems]
            if problems:
                refused.append((found.path, "; ".join(problems)))
                continue
            seen |= dict.fromkeys(keys, str(checked.path))
            accepted[system].append(checked)
        rejected += [Rejected(system, str(shown(p)), why) for p, why in sorted(refused, key=lambda x: x[0])]
        summaries[system] = tree.sweeps
    return accepted, rejected, summaries


def shown(path: Path) -> Path:
    """A path as the user named it (relative to the working directory), not /abs/olute."""
    return Path(os.path.relpath(path))


def sweep_rows(summary: Document[SweepSummary], entries: Sequence[Audit]) -> dict[str, Any]:
    """A sweep of a system, from the accepted records its summary names (the summary's own
    figures are not trusted): samples/s, speed-up and efficiency against its smallest point."""
    by_path = {Path(os.path.realpath(e.path)): e for e in entries}
    points = []
    for p in summary.view.points:
        target = beside(summary.path, p.record) if p.record else None
        entry = by_path.get(target) if target else None
        if entry is not None:
            points.append((entry.result.world_size, entry.result.metrics.samples_per_s))
    rows = [
        {"np": t.ranks, "samples_per_s": t.samples_per_s, "speedup": t.speedup, "efficiency": t.efficiency}
        for t in scaling_table(points)
    ]
    name = summary.path.name.removesuffix("-summary.json").removesuffix(".json")
    return {"sweep": name, "mode": summary.view.mode, "points": rows}


def rank(submissions: Sequence[tuple[str, Path]], say: Callable[[str], None] = lambda _m: None) -> Ranking:
    """Verify every record of every system, score each system and rank them."""
    if len({name for name, _ in submissions}) != len(submissions):
        raise InputError("rank.system", [n for n, _ in submissions], "each system name once (use NAME=DIR)")
    accepted, rejected, summaries = collect(submissions, say)
    everything = [e for entries in accepted.values() for e in entries]
    present = {(c[0], execution_mode(e.result)) for e in everything if (c := record_class(e.result))}
    present.add((recipes.DEFAULT_CLASS, "eager"))
    lists = {}
    for size_class in recipes.size_classes():
        modes = sorted((m for c, m in present if c == size_class), key=lambda m: (m != "eager", m))
        for mode in modes:  # modes apart, eager first
            scores = [score_system(name, entries, size_class, mode) for name, entries in accepted.items()]
            scored = sorted((s for s in scores if s.score is not None), key=lambda s: -(s.score or 0.0))
            lists[list_key(size_class, mode)] = scored + [s for s in scores if s.score is None]
    sweeps = {
        name: [sweep_rows(doc, accepted[name]) for doc in found] for name, found in summaries.items() if found
    }
    unclassed = sum(record_class(e.result) is None for entries in accepted.values() for e in entries)
    return Ranking(lists, rejected, sum(map(len, accepted.values())), unclassed, sweeps, accepted)


HEADER = [
    "rank",
    "system",
    "nodes x ranks",
    "device",
    "score AI-ops/s",
    "quality-regulated",
    "efficiency",
    "AI-ops/W",
    "time to quality",
    "date",
    "validity",
]


def rows(r: Ranking, size_class: str) -> list[list[str]]:
    """A class's ranking list as text: one row per system, unscored systems without a rank."""
    out = []
    rejected_by = {s.system: sum(1 for x in r.rejected if x.system == s.system) for s in r.systems}
    for place, s in enumerate(r.lists[size_class], 1):  # ranked systems come first
        validity = f"verified ({len(s.workloads)} records)" if s.score is not None else s.reason
        if rejected_by[s.system]:
            validity += f"; {rejected_by[s.system]} rejected"
        if s.score is None:
            out.append(["-", s.system, "", "", "", "", "", "", time_to_quality(s), "", validity])
            continue
        eff = (
            f"{s.efficiency:.1%} ({s.efficiency_base}->{s.world_size})"
            if s.efficiency is not None
            else "one scale"
        )
        per_node = (s.world_size or 0) // max(s.nodes or 1, 1)
        out.append(
            [
                str(place),
                s.system,
                f"{s.nodes} x {per_node}",
                s.device,
                si(s.score or 0.0, "FLOP/s"),
                si(s.regulated or 0.0, "FLOP/s"),
                eff,
                si(s.ai_ops_per_watt, "FLOP/J") if s.ai_ops_per_watt else "unavailable",
                time_to_quality(s),
                s.date,
                validity,
            ]
        )
    return out


def time_to_quality(s: SystemScore) -> str:
    return f"{s.time_to_quality_s:.3g} s" if s.time_to_quality_s else "not measured"


Table = tuple[str, list[str], list[list[str]]]  # title, header, rows


def batch_text(batch: int, accumulation_steps: int) -> str:
    """The batch per rank of a step: ``8`` or, with gradient accumulation, ``8 x 4`` (micro-batch
    times micro-batches)."""
    return f"{batch} x {accumulation_steps}" if accumulation_steps > 1 else str(batch)


def detail_tables(r: Ranking) -> list[Table]:
    """Below the list: each ranked system's suite workloads and sweeps, then the rejections."""
    tables: list[Table] = []
    for s in r.systems:  # every class's list
        if s.score is not None:
            head = [
                "workload",
                "AI-ops/s",
                "samples/s",
                "MFU",
                "precision",
                "batch/rank",
                "loss fall q",
                "record",
            ]
            rows = [
                [
                    w,
                    si(d["ai_ops_per_s"], "FLOP/s"),
                    f"{d['samples_per_s']:.1f}",
                    mfu_text(d["mfu"], d["flags"]),
                    d["precision"],
                    batch_text(d["batch_per_rank"], d.get("accumulation_steps", 1)),
                    f"{d['loss_reduction']:.2f}",
                    d["record"],
                ]
                for w, d in s.workloads.items()
            ]
            tables.append((f"{s.system}: class {s.size_class} suite at {s.world_size} ranks", head, rows))
        sweeps = r.sweeps.get(s.system, []) if s.size_class == next(iter(r.lists)) else []
        if sweeps:  # a system's sweeps, once
            head = ["sweep", "mode", "ranks", "samples/s", "speed-up", "efficiency"]
            rows = [
                [
                    w["sweep"],
                    str(w["mode"]),
                    str(p["np"]),
                    f"{p['samples_per_s']:.1f}",
                    f"{p['speedup']:.2f}",
                    f"{p['efficiency']:.1%}",
                ]
                for w in sweeps
                for p in w["points"]
            ]
            tables.append((f"{s.system}: scaling sweeps (from their accepted records)", head, rows))
    rejected = [[x.system, x.path, x.reason] for x in r.rejected]
    tables.append((f"Rejected records ({len(r.rejected)})", ["system", "record", "reason"], rejected))
    return tables


INTRO = (
    "Score: geometric mean over a size class's standard suite of sustained AI-ops/s (analytic "
    "training FLOPs x samples/s, all ranks) at the largest measured scale; one list per class, "
    "records of other classes never mixed in; see docs/rules.md, The score."
)


def class_title(key: str) -> str:
    """The title of a ranking list (``score.list_key``): its class, and its mode unless eager."""
    size_class, mode = split_key(key)
    s = recipes.suite(size_class)
    run = "" if mode == "eager" else f", {mode} runs"
    return f"Class {size_class} (suite version {s.version}: {s.description}){run}"


def unclassed_note(r: Ranking) -> str:
    return (
        f"{r.unclassed} accepted records of workloads of no size class: reported, not ranked."
        if r.unclassed
        else ""
    )


def _markdown(r: Ranking) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(markdown_text(c) for c in cells) + " |"

    def tab(head: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
        return [line(head), line(["---"] * len(head)), *(line(row) for row in body)] if body else ["none"]

    text = ["# hpcdl ranking", "", INTRO]
    for size_class in r.lists:
        text += ["", f"## {markdown_text(class_title(size_class))}", "", *tab(HEADER, rows(r, size_class))]
    if r.unclassed:
        text += ["", markdown_text(unclassed_note(r))]
    for title, head, body in detail_tables(r):
        text += ["", f"## {markdown_text(title)}", "", *tab(head, body)]
    return "\n".join(text) + "\n"


def _html(r: Ranking) -> str:
    def tab(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
        return html_table(head, body) if body else "<p>none</p>"

    lists = "".join(f"<h2>{html_text(class_title(c))}</h2>{tab(HEADER, rows(r, c))}" for c in r.lists)
    note = f"<p>{html_text(unclassed_note(r))}</p>" if r.unclassed else ""
    details = "".join(f"<h2>{html_text(t)}</h2>{tab(h, b)}" for t, h, b in detail_tables(r))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>hpcdl ranking</title>"
        f"<style>{HTML_STYLE}</style></head><body><h1>hpcdl ranking</h1><p>{html_text(INTRO)}</p>"
        + lists
        + note
        + details
        + "</body></html>\n"
    )


def write(r: Ranking, out: Path) -> list[Path]:
    """ranking.md, ranking.html, ranking.csv and ranking.json in ``out``; :class:`InputError`
    when ``out`` cannot be written."""
    with output_dir("rank.output", out):
        paths = [out / "ranking.md", out / "ranking.html", out / "ranking.csv"]
        paths[0].write_text(_markdown(r), encoding="utf-8")
        paths[1].write_text(_html(r), encoding="utf-8")
        paths[2].write_text(_csv(r), encoding="utf-8", newline="")
        doc: dict[str, Any] = {
            "schema": schema.RANKING,
            "classes": {c: [asdict(s) for s in scores] for c, scores in r.lists.items()},
            "unclassed_records": r.unclassed,
            "sweeps": r.sweeps,
            "rejected": [asdict(x) for x in r.rejected],
        }
        paths.append(write_record(doc, out / "ranking.json"))
    return paths


FIGURE_COLUMNS = [
    "nodes",
    "ranks",
    "device",
    "score_ai_ops_per_s",
    "regulated_ai_ops_per_s",
    "efficiency",
    "efficiency_base_ranks",
    "ai_ops_per_watt",
    "time_to_quality_s",
    "date",
]
"""the columns of a system's figures in every CSV list (hpcdl rank, hpcdl list-site)"""


def _csv(r: Ranking) -> str:
    rows = [
        _csv_row(size_class, place, s)
        for size_class, scores in r.lists.items()
        for place, s in enumerate(scores, 1)  # ranked systems come first
    ]
    return csv_text(["class", "rank", "system", *FIGURE_COLUMNS, "reason"], rows)


def _csv_row(size_class: str, place: int, s: SystemScore) -> list[Any]:
    return [
        size_class,
        place if s.score is not None else "",
        s.system,
        s.nodes or "",
        s.world_size or "",
        s.device,
        s.score or "",
        s.regulated if s.regulated is not None else "",
        s.efficiency or "",
        s.efficiency_base or "",
        s.ai_ops_per_watt or "",
        s.time_to_quality_s or "",
        s.date,
        s.reason,
    ]


def terminal_table(r: Ranking) -> str:
    parts = [f"{class_title(c)}\n{table(HEADER, rows(r, c))}" for c in r.lists]
    return "\n\n".join(parts + ([unclassed_note(r)] if r.unclassed else []))
