"""The report page of a diagnosis (``hpcdl diagnose --report DIR``, or ``hpcdl report
DIAGNOSIS.json``): what was flagged and the ``--exclude`` list first, then every device, node
and link with each figure against its reference (flagged cells marked), then the software of
each node and where the nodes differ.

Every string taken from the diagnosis is escaped: it is data, possibly from another site.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpcdl.escape import html_text, shell_word
from hpcdl.measure.environment import hpcdl_version
from hpcdl.results.diagnosis import FIGURES, SHOWN, key
from hpcdl.results.output import output_dir
from hpcdl.results.text import HTML_STYLE

STYLE = HTML_STYLE + "td.num{text-align:right}.bad{color:#b00;font-weight:bold}tr.bad td{background:#fee}"

# section -> (title, identifying columns, how an item fills them)
SECTIONS: dict[str, tuple[str, list[str], Callable[[dict[str, Any]], list[Any]]]] = {
    "devices": (
        "Devices (one row per rank)",
        ["rank", "host", "node", "local rank", "device"],
        lambda i: [i.get("rank"), i.get("host"), i.get("node"), i.get("local_rank"), i.get("device", "n/a")],
    ),
    "nodes": ("Nodes (the ranks of one node)", ["host", "ranks"], lambda i: [i.get("host"), i.get("ranks")]),
    "links": (
        "Links (neighbour node pairs, their leaders)",
        ["hosts", "ranks"],
        lambda i: [" ↔ ".join(map(str, i.get("hosts", []))), " ↔ ".join(map(str, i.get("ranks", [])))],
    ),
}
SOFTWARE = ["torch", "cuda", "nccl", "mpi", "driver", "ofed"]


def esc(value: Any) -> str:
    return html_text("n/a" if value is None else value)


def table(head: Sequence[str], rows: Sequence[tuple[Sequence[str], Sequence[bool], bool]]) -> str:
    """``rows``: (escaped cells, which cells are flagged, whether the row is)."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join(
        f"<tr{' class=bad' if bad_row else ''}>"
        + "".join(
            f"<td class='{'bad' if bad else 'num'}'>{c}</td>" for c, bad in zip(cells, bad_cells, strict=True)
        )
        + "</tr>"
        for cells, bad_cells, bad_row in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def bound(doc: dict[str, Any], figure: str) -> str:
    t = doc["threshold"]
    return f"< {t:g} ×" if FIGURES[figure][1] else f"> 1/{t:g} ×"


def flags_html(doc: dict[str, Any]) -> str:
    if not doc["flags"]:
        return "<p>nothing flagged: every figure is within the threshold of its reference</p>"
    rows = []
    for f in doc["flags"]:
        where = (
            f"rank {f.get('rank')} on {f['hosts'][0]}"
            if f.get("rank") is not None
            else " ↔ ".join(f["hosts"])
        )
        title, shown = SHOWN[f["figure"]]
        cells = [where, title, shown(f["value"]), f"{bound(doc, f['figure'])} {f.get('against', '')}",
                 shown(f["reference"]), f"{f['ratio']:.2f}"]  # fmt: skip
        rows.append(([esc(c) for c in cells], [False, False, True, False, False, True], True))
    return table(["where", "figure", "value", "flagged as", "reference", "value / reference"], rows)


def section_html(doc: dict[str, Any], section: str) -> str:
    items = doc.get(section, [])
    title, ids, fill = SECTIONS[section]
    if not items:
        why = "a record holds figures per rank only" if doc.get("record") else "one node, or one rank a node"
        return f"<h3>{esc(title)}</h3><p>none measured ({why})</p>"
    figures = [
        f for f, (s, _) in FIGURES.items() if s == section and any(i.get(f) is not None for i in items)
    ]
    flagged = {(f.get("item"), f["figure"]) for f in doc["flags"]}
    refs = doc.get("references", {})
    rows = []
    for item in items:
        k = key(section, item)
        cells, bad = [esc(v) for v in fill(item)], [False] * len(ids)
        for figure in figures:
            shown = SHOWN[figure][1]
            value, ref = item.get(figure), refs.get(figure, {}).get(k)
            text = "n/a" if value is None else shown(value)
            if value is not None and ref:
                text += f" ({value / ref:.2f} of {shown(ref)})"
            cells.append(esc(text))
            bad.append((k, figure) in flagged)
        rows.append((cells, bad, any(bad)))
    head = ids + [f"{SHOWN[f][0]} (of reference)" for f in figures]
    return f"<h3>{esc(title)}</h3>" + table(head, rows)


def software_html(doc: dict[str, Any]) -> str:
    soft: dict[str, dict[str, Any]] = doc.get("software", {})
    if not soft:
        return "<p>not recorded (a diagnosis of a record holds no software)</p>"
    envs = sorted({e for s in soft.values() for e in s.get("env", {})})
    head = ["host", *SOFTWARE, *envs]
    values = {
        h: [s.get(f) for f in SOFTWARE] + [s.get("env", {}).get(e) for e in envs] for h, s in soft.items()
    }
    differ = [len({str(v[c]) for v in values.values()}) > 1 for c in range(len(head) - 1)]
    rows = [([esc(h), *(esc(v) for v in vs)], [False, *differ], False) for h, vs in sorted(values.items())]
    warnings = "".join(f"<li class='bad'>{esc(w)}</li>" for w in doc.get("warnings", []))
    return table(head, rows) + (f"<ul>{warnings}</ul>" if warnings else "<p>the nodes agree</p>")


def diagnosis_page(doc: dict[str, Any]) -> str:
    """The whole page, from a diagnosis document (``hpcdl.results.diagnosis.diagnosis``)."""
    t = doc["threshold"]
    source = (
        f"the record {esc(doc['record'])}" if doc.get("record")
        else f"{esc(doc.get('world_size', 'n/a'))} ranks measured at {esc(doc.get('precision'))}"
    )  # fmt: skip
    against = f"the baseline {esc(doc['baseline'])}" if doc.get("baseline") else "the allocation's median"
    exclude = (
        f"<pre>sbatch --exclude={esc(shell_word(','.join(doc['exclude'])))}</pre>"
        if doc["exclude"]
        else "<p>none</p>"
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in doc.get("notes", []))
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>hpcdl diagnosis</title>"
        f"<style>{STYLE}</style></head><body><h1>hpcdl diagnosis</h1>"
        f"<p>From {source}, {esc(doc.get('created'))}; page by hpcdl {esc(hpcdl_version())}. Each figure "
        f"is compared with {against}: a rate is flagged below {t:g} × its reference, a time or a "
        f'latency above reference / {t:g} (docs/metrics.md, "Diagnosis").</p>'
        f"<h2>Flagged</h2>{flags_html(doc)}"
        f"<h2>Hosts to exclude</h2>{exclude}"
        "<p>A device's or a node's host is excluded; a link's only when the host is in two flagged links.</p>"
        "<h2>Figures</h2>"
        + "".join(section_html(doc, s) for s in SECTIONS)
        + f"<h2>Software</h2>{software_html(doc)}"
        + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
        + "</body></html>\n"
    )


def write_diagnosis_page(doc: dict[str, Any], out_dir: Path, field: str = "report.output") -> Path:
    """Write ``out_dir/index.html``; returns its path (an :class:`InputError` naming ``field``
    when the folder cannot be written)."""
    with output_dir(field, out_dir):
        index = out_dir / "index.html"
        index.write_text(diagnosis_page(doc), encoding="utf-8")
    return index
