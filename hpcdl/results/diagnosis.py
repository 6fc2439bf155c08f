"""``hpcdl diagnose``, the analysis: which device, node or link is below its peers.

Every figure is compared with a reference: the median of the same figure over the allocation,
or, with a baseline (an earlier diagnosis of the same system), the same item's figure there.
A figure where more is better is flagged below ``threshold x reference``; a time or a latency
above ``reference / threshold``. The hosts of flagged devices and nodes, and a host common to
two or more flagged links (one slow link alone does not say which end is at fault), make the
``--exclude`` list for sbatch. The same analysis applies to a multi-rank record: each rank's
median compute-only time (``metrics.per_rank``).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from hpcdl.errors import InputError
from hpcdl.records.loader import Unreadable, read_object, read_record
from hpcdl.records.views import compute_times

SCHEMA = "hpcdl.diagnosis"
DEFAULT_THRESHOLD = 0.9
# figure -> (section, True when more is better)
FIGURES = {
    "gemm_flops": ("devices", True),
    "copy_bytes_per_s": ("devices", True),
    "compute_s": ("devices", False),
    "allreduce_busbw": ("nodes", True),
    "bandwidth": ("links", True),
    "latency_s": ("links", False),
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


def flags(
    doc: dict[str, Any], threshold: float, baseline: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every figure below its reference by more than the threshold allows."""
    out = []
    for figure, (section, more_is_better) in FIGURES.items():
        items = [i for i in doc.get(section, []) if i.get(figure) is not None]
        if baseline is None:
            if len(items) < 2:
                continue  # nothing to compare with
            median = float(np.median([i[figure] for i in items]))
            refs = {key(section, i): median for i in items}
        else:
            before = {key(section, i): i.get(figure) for i in baseline.get(section, [])}
            refs = {k: v for k, v in before.items() if v is not None}
        for item in items:
            ref = refs.get(key(section, item))
            if ref is None or ref <= 0:
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
    doc["flags"] = flags(doc, threshold, base)
    doc["exclude"] = exclude(doc["flags"])
    doc["warnings"] = software_warnings(doc.get("software", {}))
    return doc


def from_record(path: Path) -> dict[str, Any]:
    """The figures of an existing multi-rank record: each rank's median compute-only time."""
    try:
        rec = read_record(path).result
    except Unreadable as e:
        raise InputError("record", str(path), str(e)) from None
    rows = rec.metrics.per_rank
    times = compute_times(rows)
    return {
        "record": str(path),
        "devices": [
            {"rank": r.rank, "host": r.host, "node": r.node, "local_rank": r.local_rank, "compute_s": t}
            for r, t in zip(rows, times, strict=True)
        ],
    }


def load_baseline(path: Path) -> dict[str, Any]:
    try:
        doc = read_object(path)
    except Unreadable as e:
        raise InputError("baseline", str(path), str(e)) from None
    if doc.get("schema") != SCHEMA:
        raise InputError("baseline", str(path), f"a diagnosis written by hpcdl diagnose -o (schema {SCHEMA})")
    return doc


def report(doc: dict[str, Any]) -> str:
    """The terminal report: each flag with its figure and reference, warnings, the exclude list."""
    lines = []
    t = doc["threshold"]
    for f in doc["flags"]:
        where = f"rank {f['rank']} on {f['hosts'][0]}" if f["rank"] is not None else " <-> ".join(f["hosts"])
        sign = "<" if FIGURES[f["figure"]][1] else ">"
        bound = f"{t:g} x" if sign == "<" else f"1/{t:g} x"
        lines.append(
            f"flagged: {where}: {f['figure']} {f['value']:.4g} {sign} {bound} "
            f"{f['against']} {f['reference']:.4g}"
        )
    lines += [f"warning: {w}" for w in doc["warnings"]]
    if doc["exclude"]:
        lines.append(f"sbatch --exclude={','.join(doc['exclude'])}")
    elif not doc["flags"]:
        lines.append(f"nothing below {t:g} x the {'baseline' if doc.get('baseline') else 'median'}")
    return "\n".join(lines)


def write(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
