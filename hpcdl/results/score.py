"""The score of a system, defined once (METRICS.md, "Score"): the geometric mean over the
standard suite's workloads of sustained AI-ops/s at the largest scale where every workload
was measured, with the suite's scaling efficiency and a quality-regulated variant."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpcdl import metrics
from hpcdl.records.store import read_steps
from hpcdl.workloads import recipes
from hpcdl.workloads.registry import spec_from_dict

DEFAULT_SUITE = recipes.suite().workloads

TUNABLE = ("batch_size", "precision", "seed")
"""knobs a submitter may change and still run the standard workload"""
QUALITY_TARGET = 0.5
"""the loss must fall to half its first-step value for the full quality factor"""


@dataclass(frozen=True)
class Entry:
    """One accepted record as the score sees it."""

    path: Path
    record: Mapping[str, Any]

    @property
    def world_size(self) -> int:
        return int(self.record["settings"]["world_size"])

    @property
    def ai_ops_per_s(self) -> float:
        return float(self.record["metrics"]["ai_ops_per_s"])


@dataclass
class SystemScore:
    """A system's score, or why it has none (``reason``)."""

    system: str
    score: float | None = None
    regulated: float | None = None
    world_size: int | None = None
    nodes: int | None = None
    device: str = ""
    efficiency: float | None = None
    efficiency_base: int | None = None
    ai_ops_per_watt: float | None = None
    date: str = ""
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    reason: str = ""


def _comparable(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in TUNABLE}


@functools.cache
def _suite_specs() -> dict[str, dict[str, Any]]:
    return {name: _comparable(spec_from_dict(dict(d)).to_dict()) for name, d in DEFAULT_SUITE.items()}


def suite_workload(spec: Mapping[str, Any]) -> str | None:
    """The suite workload a spec runs (tunable knobs aside), or None."""
    mine = _comparable(spec)
    return next((name for name, s in _suite_specs().items() if s == mine), None)


def geomean(values: Sequence[float]) -> float:
    """Geometric mean: every workload's relative gain counts alike, none dominates by size."""
    return float(math.exp(sum(math.log(v) for v in values) / len(values)))


def loss_reduction(losses: Sequence[float]) -> float:
    """q = 1 − (mean loss of the last quarter of steps) / (loss of the first step)."""
    k = max(1, len(losses) // 4)
    return 1.0 - float(np.mean(losses[-k:])) / float(losses[0])


def quality_factor(q: float, target: float = QUALITY_TARGET) -> float:
    """Q = min(1, max(0, q / target)): HPC AI500's (quality / target)^n with n = 1, capped at
    1 so that training longer than the target needs buys nothing."""
    return min(1.0, max(0.0, q / target))


def record_quality(entry: Entry) -> float:
    """q of a record, from rank 0's losses in its steps file (warm-up steps first)."""
    steps = read_steps(entry.path.parent / entry.record["steps_file"])
    return loss_reduction(steps["loss"].tolist())


def score_system(system: str, entries: Sequence[Entry]) -> SystemScore:
    """Score the suite records of one system (records already verified and gated)."""
    out = SystemScore(system)
    best: dict[int, dict[str, Entry]] = {}  # world size -> workload -> best record
    for e in entries:
        name = suite_workload(e.record["spec"])
        if name is None:
            continue
        at = best.setdefault(e.world_size, {})
        if name not in at or e.ai_ops_per_s > at[name].ai_ops_per_s:
            at[name] = e
    complete = sorted(n for n, at in best.items() if len(at) == len(DEFAULT_SUITE))
    if not complete:
        seen = sorted({w for at in best.values() for w in at})
        missing = [w for w in DEFAULT_SUITE if all(w not in at for at in best.values())]
        out.reason = (
            f"suite incomplete at every scale (missing {', '.join(missing)})"
            if missing
            else f"no scale with all {len(DEFAULT_SUITE)} suite workloads (have {', '.join(seen) or 'none'})"
        )
        return out
    top = best[complete[-1]]
    ordered = [top[w] for w in DEFAULT_SUITE]
    out.world_size = complete[-1]
    out.nodes = max(int(e.record["settings"]["nodes"]) for e in ordered)
    out.device = str(ordered[0].record["environment"].get("device_name", ""))
    out.score = geomean([e.ai_ops_per_s for e in ordered])
    qualities = {w: record_quality(top[w]) for w in DEFAULT_SUITE}
    regulated = [top[w].ai_ops_per_s * quality_factor(qualities[w]) for w in DEFAULT_SUITE]
    out.regulated = geomean(regulated) if min(regulated) > 0 else 0.0  # a workload that never learned
    if len(complete) > 1:
        base_n, base = complete[0], best[complete[0]]
        out.efficiency_base = base_n
        out.efficiency = geomean(
            [
                metrics.scaling_efficiency(top[w].ai_ops_per_s, out.world_size, base[w].ai_ops_per_s, base_n)
                for w in DEFAULT_SUITE
            ]
        )
    watts = [e.record["metrics"]["energy"].get("ai_ops_per_watt") for e in ordered]
    if all(isinstance(w, float | int) and w > 0 for w in watts):
        out.ai_ops_per_watt = geomean([float(w) for w in watts if w])
    out.date = max(str(e.record["created"]) for e in ordered)[:10]
    out.workloads = {
        w: {
            "record": str(top[w].path),
            "ai_ops_per_s": top[w].ai_ops_per_s,
            "samples_per_s": top[w].record["metrics"]["samples_per_s"],
            "mfu": top[w].record["metrics"].get("mfu"),
            "precision": top[w].record["settings"]["precision"],
            "batch_per_rank": top[w].record["settings"]["batch_per_rank"],
            "loss_reduction": qualities[w],
            "quality_factor": quality_factor(qualities[w]),
        }
        for w in DEFAULT_SUITE
    }
    return out
