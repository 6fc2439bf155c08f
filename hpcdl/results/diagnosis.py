"""``hpcdl diagnose``, the analysis: which device, node or link is below its peers.

Every figure is compared with a reference: the median of the same figure over the allocation,
or, with a baseline (an earlier diagnosis of the same system), the same item's figure there.
A figure where more is better is flagged below ``threshold x reference``; a time or a latency
above ``reference / threshold``. The hosts of flagged devices and nodes, and a host common to
two or more flagged links (one slow link alone does not say which end is at fault), make the
``--exclude`` list for sbatch.

The same analysis applies to a multi-rank record (``metrics.per_rank``), with two figures per
rank: its median compute-only time, which names a rank slower at every step (a slower device,
a delay before each forward pass); and its CPU share, of the time its main thread was ready to
run in the timed window, the fraction it ran (:mod:`hpcdl.measure.schedstat`), which names a rank
slowed in bursts (a cgroup CPU limit, a shared core): such a rank stalls mostly inside the
collectives, where its peers wait alike, and its median phases stay a fast rank's.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from hpcdl.errors import InputError
from hpcdl.escape import shell_word
from hpcdl.records.loader import Unreadable, read_object, read_record
from hpcdl.records.views import RankRow, compute_times
from hpcdl.results.text import si

SCHEMA = "hpcdl.diagnosis"
DEFAULT_THRESHOLD = 0.9
# figure -> (section, True when more is better)
FIGURES = {
    "gemm_flops": ("devices", True),
    "copy_bytes_per_s": ("devices", True),
    "compute_s": ("devices", False),
    "cpu_share": ("devices", True),
    "allreduce_busbw": ("nodes", True),
    "bandwidth": ("links", True),
    "latency_s": ("links", False),
}

# figure -> (column title, how a value reads)
SHOWN: dict[str, tuple[str, Callable[[float], str]]] = {
    "gemm_flops": ("GEMM ceiling", lambda v: si(v, "FLOP/s")),
    "copy_bytes_per_s": ("memory bandwidth", lambda v: si(v, "B/s")),
    "compute_s": ("compute-only time", lambda v: f"{v * 1e3:.3g} ms"),
    "cpu_share": ("CPU share when ready", lambda v: f"{v:.1%}"),
    "allreduce_busbw": ("allreduce busbw", lambda v: si(v, "B/s")),
    "bandwidth": ("bandwidth", lambda v: si(v, "B/s")),
    "latency_s": ("latency", lambda v: f"{v * 1e6:.3g} µs"),
}


def check_threshold(threshold: float) -> float:
    if not 0 < threshold < 1:
        raise InputError(
            "threshold", threshold, "a fraction in (0, 1), e.g. 0.9: flag below 90% of the median"
        )
    return threshold


def key(section: str, item: dict[str, Any]) -> str:
    """What identifies an item between two diagnoses of one system."""
    if section == "devices":
        return f"{item['host']}/rank{item['rank']}"
    if section == "nodes":
        return str(item["host"])
    return "-".join(item["hosts"])


def references(doc: dict[str, Any], baseline: dict[str, Any] | None = None) -> dict[str, dict[str, float]]:
    """Per figure, each item's reference: the allocation's median of that figure (with two
    items or more), or the same item's figure in the baseline (where it has one)."""
    out = {}
    for figure, (section, _) in FIGURES.items():
        items = [i for i in doc.get(section, []) if i.get(figure) is not None]
        if baseline is None:
            if len(items) < 2:
                continue  # nothing to compare with
            median = float(np.median([i[figure] for i in items]))
            refs = {key(section, i): median for i in items}
        else:
            before = {key(section, i): i.get(figure) for i in baseline.get(section, [])}
            refs = {k: float(v) for k, v in before.items() if v is not None}
        out[figure] = refs
    return out


def flags(
    doc: dict[str, Any], threshold: float, baseline: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every figure below its reference by more than the threshold allows."""
    out = []
    for figure, refs in references(doc, baseline).items():
        section, more_is_better = FIGURES[figure]
        for item in doc.get(section, []):
            ref = refs.get(key(section, item))
            if item.get(figure) is None or ref is None or ref <= 0:
                continue
            value = float(item[figure])
            low = value < threshold * ref if more_is_better else value > ref / threshold
            if low:
                out.append(
                    {
                        "section": section,
                        "figure": figure,
                        "item": key(section, item),
                        "hosts": item["hosts"] if section == "links" else [item["host"]],
                        "rank": item.get("rank"),
                        "value": value,
                        "reference": ref,
                        "against": "baseline" if baseline is not None else "median",
                        "ratio": value / ref,
                    }
                )
    return out


def exclude(found: list[dict[str, Any]]) -> list[str]:
    """Hosts to leave out of the next allocation (see the module's docstring)."""
    hosts = {h for f in found if f["section"] != "links" for h in f["hosts"]}
    links = {f["item"]: f["hosts"] for f in found if f["section"] == "links"}  # each link once
    seen = Counter(h for ends in links.values() for h in ends)
    hosts |= {h for h, n in seen.items() if n >= 2}
    return sorted(hosts)


def software_warnings(software: dict[str, dict[str, Any]]) -> list[str]:
    """One line per version or setting in which the nodes differ."""
    if len(software) < 2:
        return []
    out = []
    fields = sorted({k for s in software.values() for k in s if k not in ("host", "env")})
    envs = sorted({k for s in software.values() for k in s.get("env", {})})
    for name in fields + [f"env.{e}" for e in envs]:
        values = {
            h: (s.get("env", {}).get(name[4:]) if name.startswith("env.") else s.get(name))
            for h, s in software.items()
        }
        if len(set(map(str, values.values()))) > 1:
            out.append(f"nodes differ in {name}: " + ", ".join(f"{h}={v}" for h, v in sorted(values.items())))
    return out


def diagnosis(
    measured: dict[str, Any], threshold: float, base: dict[str, Any] | None, **about: Any
) -> dict[str, Any]:
    """The diagnosis document: the figures, what is flagged, the exclude list, the software."""
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "threshold": threshold,
        **about,
        **measured,
    }
    doc["references"] = references(doc, base)
    doc["flags"] = flags(doc, threshold, base)
    doc["exclude"] = exclude(doc["flags"])
    doc["warnings"] = software_warnings(doc.get("software", {}))
    return doc


def cpu_share(row: RankRow) -> float | None:
    """Of the time the rank's main thread was ready to run in its timed window, the fraction it
    ran (``on_cpu_s / (on_cpu_s + descheduled_s)``)."""
    if row.on_cpu_s is None or row.descheduled_s is None or row.on_cpu_s + row.descheduled_s <= 0:
        return None
    return row.on_cpu_s / (row.on_cpu_s + row.descheduled_s)


def from_record(path: Path) -> dict[str, Any]:
    """The figures of an existing multi-rank record: each rank's median compute-only time and
    CPU share (see the module's docstring); notes say what a record cannot show."""
    try:
        rec = read_record(path).result
    except Unreadable as e:
        raise InputError("record", str(path), str(e)) from None
    rows = rec.metrics.per_rank
    if len(rows) < 2:
        raise InputError("record", str(path), "a record of 2 or more ranks (this one has 1)")
    notes = []
    if any(r.compute_only_s is None for r in rows):
        method = rec.metrics.straggler.method if rec.metrics.straggler else "not recorded"
        notes.append(
            f"compute_s is forward + backward, which holds the waiting for the slowest rank "
            f"(the {rec.settings.backend} backend's compute-only time: {method}): a slow rank may not show"
        )
    if any(cpu_share(r) is None for r in rows):
        notes.append("cpu_share is not in this record (recorded since 2026-12, on Linux)")
    return {
        "record": str(path),
        "notes": notes,
        "devices": [
            {
                "rank": r.rank,
                "host": r.host,
                "node": r.node,
                "local_rank": r.local_rank,
                "compute_s": t,
                "cpu_share": cpu_share(r),
            }
            for r, t in zip(rows, compute_times(rows), strict=True)
        ],
    }


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v


def _problem(doc: dict[str, Any]) -> str | None:
    """What makes ``doc`` no diagnosis hpcdl can read (None when it is one): every item named
    as :func:`key` names it, every figure a number or null, the threshold in (0, 1)."""
    if doc.get("schema") != SCHEMA:
        return f"a diagnosis written by hpcdl diagnose -o (schema {SCHEMA})"
    if not _number(doc.get("threshold")) or not 0 < doc["threshold"] < 1:
        return "threshold: a fraction in (0, 1)"
    for section in ("devices", "nodes", "links", "flags", "exclude", "warnings", "notes"):
        if not isinstance(doc.get(section, []), list):
            return f"{section}: a list"
    named = {
        "devices": lambda i: isinstance(i.get("host"), str) and _number(i.get("rank")),
        "nodes": lambda i: isinstance(i.get("host"), str),
        "links": lambda i: isinstance(i.get("hosts"), list) and all(isinstance(h, str) for h in i["hosts"]),
    }
    for section, ok in named.items():
        for n, item in enumerate(doc.get(section, [])):
            if not isinstance(item, dict) or not ok(item):
                return f"{section}[{n}]: an object naming its host (and rank), or hosts"
            for figure in (f for f, (s, _) in FIGURES.items() if s == section):
                if item.get(figure) is not None and not _number(item[figure]):
                    return f"{section}[{n}].{figure}: a number or null"
    for n, f in enumerate(doc.get("flags", [])):
        shaped = isinstance(f, dict) and f.get("figure") in FIGURES and isinstance(f.get("hosts"), list)
        figures = ("value", "reference", "ratio")
        if not shaped or not f["hosts"] or not all(_number(f.get(k)) for k in figures):
            return f"flags[{n}]: an object with figure, hosts, value, reference and ratio"
    soft, refs = doc.get("software", {}), doc.get("references", {})
    if not isinstance(soft, dict) or not all(isinstance(v, dict) for v in soft.values()):
        return "software: an object of one object per host"
    if not isinstance(refs, dict) or not all(
        isinstance(r, dict) and all(_number(x) for x in r.values()) for r in refs.values()
    ):
        return "references: an object of numbers per figure"
    return None


def load_diagnosis(path: Path, field: str = "diagnosis") -> dict[str, Any]:
    """A diagnosis written by ``hpcdl diagnose -o``, checked; one :class:`InputError` naming
    ``field`` otherwise."""
    try:
        doc = read_object(path)
    except Unreadable as e:
        raise InputError(field, str(path), str(e)) from None
    problem = _problem(doc)
    if problem is not None:
        raise InputError(field, str(path), problem)
    return doc


def load_baseline(path: Path) -> dict[str, Any]:
    return load_diagnosis(path, "baseline")


def is_diagnosis(path: Path) -> bool:
    """Whether ``path`` is a file that says it is a diagnosis (its schema)."""
    try:
        return path.is_file() and read_object(path).get("schema") == SCHEMA
    except Unreadable:
        return False


def report(doc: dict[str, Any]) -> str:
    """The terminal report: each flag with its figure and reference, warnings, the exclude list."""
    lines = []
    t = doc["threshold"]
    for f in doc["flags"]:
        where = f"rank {f['rank']} on {f['hosts'][0]}" if f["rank"] is not None else " <-> ".join(f["hosts"])
        sign = "<" if FIGURES[f["figure"]][1] else ">"
        bound = f"{t:g} x" if sign == "<" else f"1/{t:g} x"
        title, read = SHOWN[f["figure"]]
        against = f"the {f['against']} {read(f['reference'])}"
        lines.append(f"flagged: {where}: {title} {read(f['value'])} {sign} {bound} {against}")
    lines += [f"warning: {w}" for w in doc["warnings"]]
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    if doc["exclude"]:
        lines.append(f"sbatch --exclude={shell_word(','.join(doc['exclude']))}")
    elif not doc["flags"]:
        lines.append(f"nothing below {t:g} x the {'baseline' if doc.get('baseline') else 'median'}")
    return "\n".join(lines)


def write(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
