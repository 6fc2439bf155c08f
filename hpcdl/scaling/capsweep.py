"""Sweeps over power or clock caps (``hpcdl sweep --power-limit W,... | --clock-limit MHz,...``):
the same work at every cap, one record per cap, the devices back at their own limits after each
point and on every way out (``measure.caps``).

The cap is set by this process, never by the ranks: it outlives any rank (a rank that dies ends
its point, not the restore), and SIGTERM or SIGHUP raise here so that ``caps.capped`` restores
before the sweep exits with the signal's code. Points finished before a stop are kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from hpcdl import metrics
from hpcdl.errors import InputError
from hpcdl.measure import caps
from hpcdl.measure.limits import Limit, cpu_limits, gpu_limits, nvml
from hpcdl.measure.telemetry.nvml import nvml_handle
from hpcdl.parallel.launch import STOPPED, Terminated, stop_signals_raise
from hpcdl.records import schema
from hpcdl.records.loader import Record
from hpcdl.records.store import write_record
from hpcdl.scaling.sweep import run_point, valid_record
from hpcdl.workloads.spec import Spec


def limits_for(kind: str, device: torch.device, np: int) -> list[Limit]:
    """The limits a run of ``np`` ranks here depends on: the GPUs its ranks drive (rank i on GPU
    i), or this CPU's packages (power) and the CPUs it may run on (clock)."""
    if device.type != "cuda":
        return cpu_limits(kind, sorted(os.sched_getaffinity(0)))
    if np > torch.cuda.device_count():
        raise InputError(
            "np", np, f"{torch.cuda.device_count()} GPU(s) visible here: at most one rank per GPU"
        )
    lib = nvml()
    indices = [lib.nvmlDeviceGetIndex(nvml_handle(lib, torch.device("cuda", i))[0]) for i in range(np)]
    return gpu_limits(kind, lib, indices)


def point_name(prefix: str, kind: str, value: float, np: int) -> str:
    return f"{prefix}-{kind}-{value:g}{caps.KINDS[kind]}-np{np}"


def cap_of(record: Record) -> tuple[str, float] | None:
    """The kind and value of the cap a record was measured under, or None (none, or not one
    hpcdl knows: records are data written by whoever ran them)."""
    cap = record.result.environment.cap or {}
    kind, value = cap.get("kind"), cap.get("value")
    if kind not in caps.KINDS or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return str(kind), float(value)


@contextlib.contextmanager
def exported(name: str, value: str) -> Iterator[None]:
    """``name=value`` in this process's environment while inside (the point's ranks inherit it)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def cap_sweep(
    spec: Spec,
    kind: str,
    values: Sequence[float],
    np: int,
    out: Path,
    run_args: Sequence[str],
    limits: Sequence[Limit],
    *,
    prefix: str = "sweep",
    redo: bool = False,
    timeout_s: float | None = None,
    say: Callable[[str], None] = print,
) -> tuple[dict[str, Any], int | None]:
    """Run the workload at every cap (skipping caps that have a valid record), write the summary
    and return it with the exit code of a stop (None when the sweep was not stopped). Caps the
    devices cannot take are refused before anything changes (``caps.check``)."""
    if kind not in caps.KINDS:
        raise InputError("sweep.cap", kind, "allowed: " + ", ".join(caps.KINDS))
    values = sorted(set(values))
    restored = caps.check(kind, values, limits)
    if restored:
        say(f"restored the limits a stopped sweep left in force: {', '.join(restored)}")
    unit, stopped = caps.KINDS[kind], None
    with stop_signals_raise():
        try:
            for value in values:
                name = point_name(prefix, kind, value, np)
                record = valid_record(out / f"{name}.json", spec, np)
                if not redo and record is not None and cap_of(record) == (kind, value):
                    say(f"{kind} cap {value:g} {unit}: valid record {name}.json exists, skipped")
                    continue
                code = capped_point(spec, kind, value, np, name, out, run_args, limits, timeout_s, say)
                if code in STOPPED:
                    raise Terminated(code - 128)
                if code != 0:
                    say(f"{kind} cap {value:g} {unit}: failed with exit code {code}")
        except Terminated as e:
            say(f"stopped ({e}); the limits are restored and completed points kept")
            stopped = e.code
    summary = summarize(out, spec, kind, values, np, prefix)
    write_record(summary, out / f"{prefix}-{kind}-np{np}-summary.json")
    return summary, stopped


def capped_point(
    spec: Spec,
    kind: str,
    value: float,
    np: int,
    name: str,
    out: Path,
    run_args: Sequence[str],
    limits: Sequence[Limit],
    timeout_s: float | None,
    say: Callable[[str], None],
) -> int:
    """One point under the cap; its exit code. The record notes the cap (``environment.cap``)."""
    unit = caps.KINDS[kind]
    with caps.capped(kind, value, limits) as applied:
        held = ", ".join(f"{a.name} {value if a.applied is None else a.applied:g}" for a in applied)
        say(f"{kind} cap {value:g} {unit}: running ({held})")
        limits_held = [dataclasses.asdict(a) for a in applied]
        note = {"kind": kind, "value": value, "unit": unit, "limits": limits_held}
        with exported(caps.CAP_ENV, json.dumps(note)):
            return run_point(spec, np, name, out, run_args, timeout_s)


def summarize(
    out: Path, spec: Spec, kind: str, values: Sequence[float], np: int, prefix: str
) -> dict[str, Any]:
    """Time, energy to solution, average power, EDP, samples per joule and time per step at every
    cap with a valid record, and the cap of the lowest EDP."""
    points: list[dict[str, Any]] = []
    for value in values:
        name = point_name(prefix, kind, value, np)
        record = valid_record(out / f"{name}.json", spec, np)
        if record is None or cap_of(record) != (kind, value):
            points.append({"cap": value, "record": None})
            continue
        points.append({"cap": value, "record": f"{name}.json", **cap_figures(record)})
    measured = [p for p in points if p.get("energy_delay_product_js") is not None]
    best = min(measured, key=lambda p: p["energy_delay_product_js"]) if measured else None
    return {
        "schema": schema.CAPS,
        "kind": kind,
        "unit": caps.KINDS[kind],
        "np": np,
        "spec": spec.to_dict(),
        "points": points,
        "best_edp_cap": best["cap"] if best else None,
    }


def cap_figures(record: Record) -> dict[str, Any]:
    """A capped record's figures, for the summary and the report (docs/metrics.md, "Summaries")."""
    r = record.result
    m, e = r.metrics, r.metrics.energy
    samples = round(m.samples_per_s * m.timed_window_s)
    return {
        "time_s": m.timed_window_s,
        "time_per_step_s": m.step_time_s.median,
        "samples": samples,
        "samples_per_s": m.samples_per_s,
        "energy_to_solution_j": e.energy_to_solution_j,
        "avg_power_w": e.avg_power_w,
        "energy_delay_product_js": e.energy_delay_product_js,
        "samples_per_joule": metrics.samples_per_joule(samples, e.energy_to_solution_j),
        "measured": e.measured,
    }
