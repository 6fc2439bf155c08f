"""Scaling sweeps over rank counts: one record per point, written as soon as the point
finishes; a rerun skips points that already have a valid record."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpcdl.errors import InputError, SpecError
from hpcdl.parallel.launch import TERMINATED, launch
from hpcdl.records import schema
from hpcdl.records.audit import integrity_problems
from hpcdl.records.store import load_record, write_record
from hpcdl.scaling.table import scaling_table
from hpcdl.workloads.registry import spec_to_args
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


def valid_point(path: Path, spec: Spec, np: int) -> bool:
    """A record that may stand for this point: intact (``verify.integrity_problems``: digest,
    steps file, recomputed figures), valid, same spec and rank count."""
    if not path.exists():
        return False
    try:
        rec = load_record(path)
    except (OSError, ValueError):
        return False
    return (
        not integrity_problems(rec, path)
        and rec["validity"]["passed"]
        and rec["spec"] == spec.to_dict()
        and rec["settings"]["world_size"] == np
    )


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
) -> dict[str, Any]:
    """Run every point (unless it already has a valid record), then write and return the
    summary. A failed point is reported and left out; the others still run. A terminated
    point (SIGTERM, e.g. ``scancel``) ends the sweep; the summary of the completed points is
    still written."""
    if mode not in MODES:
        raise InputError("sweep.mode", mode, "allowed: weak, strong")
    specs = {np: point_spec(spec, mode, np) for np in sorted(set(nps))}  # all checked before any runs
    for np, s in specs.items():
        path = out / f"{point_name(prefix, mode, np)}.json"
        if not redo and valid_point(path, s, np):
            say(f"np={np}: valid record {path.name} exists, skipped")
            continue
        say(f"np={np}: running ({s.batch_size} per rank)")
        code = run_point(s, np, point_name(prefix, mode, np), out, run_args, timeout_s)
        if code == TERMINATED:
            say(f"np={np}: terminated; the sweep stops, completed points are kept")
            break
        if code != 0:
            say(f"np={np}: failed with exit code {code}")
    summary = summarize(out, prefix, mode, specs)
    write_record(summary, out / f"{prefix}-{mode}-summary.json")
    return summary


def summarize(out: Path, prefix: str, mode: str, specs: dict[int, Spec]) -> dict[str, Any]:
    """Throughput and efficiency of every point with a valid record."""
    rows = []
    for np, s in specs.items():
        path = out / f"{point_name(prefix, mode, np)}.json"
        if valid_point(path, s, np):
            rec = load_record(path)
            rows.append(
                {
                    "np": np,
                    "record": path.name,
                    "samples_per_s": rec["metrics"]["samples_per_s"],
                    "ai_ops_per_s": rec["metrics"]["ai_ops_per_s"],
                    "batch_per_rank": rec["settings"]["batch_per_rank"],
                    "backend": rec["settings"]["backend"],
                }
            )
        else:
            rows.append({"np": np, "record": None})
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
