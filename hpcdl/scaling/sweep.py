"""Scaling sweeps over rank counts: one record per point, written as soon as the point
finishes; a rerun skips points that already have a valid record."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpcdl.errors import InputError, SpecError
from hpcdl.parallel.launch import STOPPED, launch
from hpcdl.records import schema
from hpcdl.records.audit import audit
from hpcdl.records.loader import Record, Unreadable, read_record
from hpcdl.records.store import write_record
from hpcdl.scaling.table import scaling_table
from hpcdl.workloads.registry import canonical, spec_to_args
from hpcdl.workloads.spec import Spec

MODES = ("weak", "strong")


def point_spec(spec: Spec, mode: str, np: int) -> Spec:
    """Weak: the batch per rank stays ``spec.batch_size``. Strong: ``spec.batch_size`` is the
    global batch, split evenly among the ranks."""
    if mode == "weak":
        return spec
    if spec.batch_size % np:
        raise SpecError(
            f"{spec.family}.batch_size",
            spec.batch_size,
            f"strong scaling splits the global batch among ranks: must be divisible by np={np}",
        )
    return spec.replace(batch_size=spec.batch_size // np)


def point_name(prefix: str, mode: str, np: int) -> str:
    return f"{prefix}-{mode}-np{np}"


def valid_record(path: Path, spec: Spec, np: int) -> Record | None:
    """The record at ``path`` if it may stand for this point: same spec and rank count, valid,
    and intact (``audit``: digest, steps file, recomputed figures); else None."""
    try:
        record = read_record(path)
    except Unreadable:
        return None
    r = record.result
    if (
        canonical(r.spec) != spec.to_dict()
        or r.world_size != np
        or not r.validity.passed
        or audit(record).problems
    ):
        return None
    return record


def valid_point(path: Path, spec: Spec, np: int) -> bool:
    """Whether ``path`` holds a record that may stand for this point (:func:`valid_record`)."""
    return valid_record(path, spec, np) is not None


def run_point(
    spec: Spec, np: int, name: str, out: Path, run_args: Sequence[str], timeout_s: float | None
) -> int:
    argv = ["run", *spec_to_args(spec), "--np", str(np), "--name", name, "-o", str(out), *run_args]
    return launch(np, argv, timeout_s)


def sweep(
    spec: Spec,
    nps: Sequence[int],
    mode: str,
    out: Path,
    run_args: Sequence[str] = (),
    *,
    prefix: str = "sweep",
    redo: bool = False,
    timeout_s: float | None = None,
    say: Callable[[str], None] = print,
) -> tuple[dict[str, Any], int | None]:
    """Run every point (unless it already has a valid record), then write the summary; returns
    it and, when the sweep was told to stop, the exit code that says so. A failed point is
    reported and left out; the others still run. A stopped point (SIGTERM, e.g. ``scancel``,
    or SIGHUP) ends the sweep; the summary of the completed points is still written."""
    if mode not in MODES:
        raise InputError("sweep.mode", mode, "allowed: weak, strong")
    specs = {np: point_spec(spec, mode, np) for np in sorted(set(nps))}  # all checked before any runs
    stopped = None
    for np, s in specs.items():
        path = out / f"{point_name(prefix, mode, np)}.json"
        if not redo and valid_point(path, s, np):
            say(f"np={np}: valid record {path.name} exists, skipped")
            continue
        say(f"np={np}: running ({s.batch_size} per rank)")
        code = run_point(s, np, point_name(prefix, mode, np), out, run_args, timeout_s)
        if code in STOPPED:
            say(f"np={np}: stopped (exit code {code}); the sweep stops, completed points are kept")
            stopped = code
            break
        if code != 0:
            say(f"np={np}: failed with exit code {code}")
    summary = summarize(out, prefix, mode, specs)
    write_record(summary, out / f"{prefix}-{mode}-summary.json")
    return summary, stopped


def summarize(out: Path, prefix: str, mode: str, specs: dict[int, Spec]) -> dict[str, Any]:
    """Throughput and efficiency of every point with a valid record."""
    rows: list[dict[str, Any]] = []
    for np, s in specs.items():
        path = out / f"{point_name(prefix, mode, np)}.json"
        record = valid_record(path, s, np)
        if record is None:
            rows.append({"np": np, "record": None})
            continue
        m, settings = record.result.metrics, record.result.settings
        rows.append(
            {
                "np": np,
                "record": path.name,
                "samples_per_s": m.samples_per_s,
                "ai_ops_per_s": m.ai_ops_per_s,
                "batch_per_rank": settings.batch_per_rank,
                "backend": settings.backend,
            }
        )
    done = [r for r in rows if r["record"]]
    table = scaling_table((r["np"], r["samples_per_s"]) for r in done)
    for r, t in zip(done, table, strict=True):
        r.update(speedup=t.speedup, efficiency=t.efficiency)
    return {
        "schema": schema.SWEEP,
        "mode": mode,
        "spec": next(iter(specs.values())).to_dict(),
        "base_np": done[0]["np"] if done else None,
        "points": rows,
    }
