"""``hpcdl collect``: the valid records of a state file's points in one document, with each
job's scaling table (speed-up and weak-scaling efficiency against its smallest node count
measured), written to ``OUTPUT/collected.json``."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hpcdl.records import schema
from hpcdl.records.store import write_record
from hpcdl.scaling.table import scaling_table
from hpcdl.schedulers.state import entries
from hpcdl.schedulers.status import other_world, status

COLLECTED_FILE = "collected.json"


def collect(output: Path) -> dict[str, Any]:
    """Gather, write and return the collected document."""
    known = entries(output)
    rows = []
    for st in status(output):
        entry = known[st.name]
        row: dict[str, Any] = {
            "point": st.name,
            "job": entry.point.job,
            "nodes": st.nodes,
            "ranks": st.ranks,
            "job_id": st.job_id,
            "state": st.state,
        }
        rec = st.record
        if rec is not None:
            row.update(
                record=f"{st.name}.json",
                samples_per_s=rec.metrics.samples_per_s,
                ai_ops_per_s=rec.metrics.ai_ops_per_s,
                mfu=rec.metrics.mfu,
                hosts=rec.settings.hosts,
                slurm_job_id=rec.environment.slurm_job_id,
            )
        else:
            refused = other_world(output / f"{st.name}.json", st.ranks)
            if refused:
                row.update(state="refused", refused=refused)
        rows.append(row)
    for name in {r["job"] for r in rows}:
        done = sorted((r for r in rows if r["job"] == name and "record" in r), key=lambda r: r["ranks"])
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
