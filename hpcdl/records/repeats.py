"""The summary of a workload run several times in one invocation (``hpcdl run --repeat N``,
a job file's ``repeat``): each run keeps its own record; the summary gives the olympic mean,
median and spread of their throughput, and of their time to target when they had one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpcdl import metrics
from hpcdl.records import schema
from hpcdl.records.views import Result


def repeat_name(name: str, repeat: int, repeats: int) -> str:
    """The record name of repetition ``repeat`` (1-based) of ``repeats``: the name itself for one."""
    return name if repeats == 1 else f"{name}-r{repeat}"


def statistics(values: Sequence[float]) -> dict[str, Any]:
    """Olympic mean, median, min, max and spread (max − min) / median, and the values."""
    s = metrics.summarize(values)
    return {
        "olympic_mean": metrics.olympic_mean(values),
        "median": s["median"],
        "min": s["min"],
        "max": s["max"],
        "spread": metrics.spread(values),
        "values": list(values),
    }


def summarize(workload: str, runs: Sequence[Result]) -> dict[str, Any]:
    """The summary document of one workload's repeated runs (in the order they ran)."""
    out: dict[str, Any] = {
        "schema": schema.REPEATS,
        "workload": workload,
        "spec": runs[0].spec,
        "runs": len(runs),
        "records": [r.name for r in runs],
        "passed": [r.validity.passed for r in runs],
        "samples_per_s": statistics([r.metrics.samples_per_s for r in runs]),
    }
    times = [r.metrics.target.time_to_target_s if r.metrics.target else None for r in runs]
    if any(r.metrics.target for r in runs):
        reached = [t for t in times if t is not None]
        out["targets_reached"] = len(reached)
        out["time_to_target_s"] = statistics(reached) if reached else None
    return out
