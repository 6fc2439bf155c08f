"""``hpcdl collect``: the valid records of a state file's points in one document, with each
job's scaling table (speed-up and weak-scaling efficiency against its smallest node count
measured), written to ``OUTPUT/collected.json``. A class job's point has a row per workload
(``workload``), each workload scaled against its own smallest node count."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hpcdl.records import schema
from hpcdl.records.store import load_record, write_record
from hpcdl.records.views import read_result
from hpcdl.scaling.table import scaling_table
from hpcdl.schedulers.state import Entry, entries
from hpcdl.schedulers.status import PointStatus, other_world, record_path, standing, status

COLLECTED_FILE = "collected.json"


def collect(output: Path) -> dict[str, Any]:
    """Gather, write and return the collected document."""
    known = entries(output)
    rows = [row for st in status(output) for row in point_rows(output, known[st.name], st)]
    for key in {(r["job"], r.get("workload", "")) for r in rows}:
        done = sorted(
            (r for r in rows if (r["job"], r.get("workload", "")) == key and "record" in r),
            key=lambda r: r["ranks"],
        )
        table = scaling_table((r["ranks"], r["samples_per_s"]) for r in done)
        for r, t in zip(done, table, strict=True):
            r.update(speedup=t.speedup, efficiency=t.efficiency)
    collected = {
        "schema": schema.COLLECTED,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "points": rows,
    }
    write_record(collected, output / COLLECTED_FILE)
    return collected


def point_rows(output: Path, entry: Entry, st: PointStatus) -> list[dict[str, Any]]:
    """A point's rows: one for a one-workload point, one per workload of a class point (its
    first repeat's record: ``records.repeats`` sums the repeats up)."""
    point = entry.point
    base = {
        "point": st.name,
        "job": point.job,
        "nodes": st.nodes,
        "ranks": st.ranks,
        "job_id": st.job_id,
        "state": st.state,
    }
    rows = []
    for k, name in enumerate(point.workloads or [""]):
        row = dict(base, workload=name) if name else dict(base)
        i = k * point.repeat  # Point.records(): each workload's repeats in turn
        path = record_path(output, point.records()[i][0].stem)
        if standing(output, entry, i):
            rec = read_result(load_record(path))
            row.update(
                state="done",
                record=path.name,
                samples_per_s=rec.metrics.samples_per_s,
                ai_ops_per_s=rec.metrics.ai_ops_per_s,
                mfu=rec.metrics.mfu,
                hosts=rec.settings.hosts,
                slurm_job_id=rec.environment.slurm_job_id,
            )
        elif refused := other_world(path, st.ranks):
            row.update(state="refused", refused=refused)
        rows.append(row)
    return rows
