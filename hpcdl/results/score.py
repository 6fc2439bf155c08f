"""The score of a system in one size class, defined once (docs/rules.md, "The score"): the geometric
mean over the class's standard suite of sustained AI-ops/s at the largest scale where every
workload was measured, with the suite's scaling efficiency, a quality-regulated variant and a
time-to-quality variant (records of runs that trained to a target loss).
Only records of that class and suite version count: classes are ranked apart, like NPB's."""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdl import metrics
from hpcdl.records.audit import Audit
from hpcdl.records.views import Result, finite
from hpcdl.results.best import best_per_rank_count
from hpcdl.workloads import recipes
from hpcdl.workloads.recipes import TUNABLE
from hpcdl.workloads.registry import canonical, spec_from_dict

QUALITY_TARGET = 0.5
"""the loss must fall to half its first-step value for the full quality factor"""


@dataclass
class SystemScore:
    """A system's score in one size class and execution mode, or why it has none (``reason``)."""

    system: str
    size_class: str = recipes.DEFAULT_CLASS
    mode: str = "eager"
    """the records' execution mode (``execution_mode``): modes are scored and ranked apart"""
    score: float | None = None
    regulated: float | None = None
    world_size: int | None = None
    nodes: int | None = None
    device: str = ""
    efficiency: float | None = None
    efficiency_base: int | None = None
    ai_ops_per_watt: float | None = None
    time_to_quality_s: float | None = None
    """geomean over the suite of the fastest time to target (loss at QUALITY_TARGET of its first)"""
    date: str = ""
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    reason: str = ""


def _comparable(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in TUNABLE}


@functools.cache
def _suite_specs(size_class: str) -> dict[str, dict[str, Any]]:
    workloads = recipes.suite(size_class).workloads
    return {name: _comparable(spec_from_dict(dict(d)).to_dict()) for name, d in workloads.items()}


def suite_workload(spec: Mapping[str, Any], size_class: str = recipes.DEFAULT_CLASS) -> str | None:
    """The workload of the class's suite that a spec runs (tunable knobs aside), or None. The
    spec is rebuilt first, so that a knob added later with a default matches older records."""
    rebuilt = canonical(spec)
    if rebuilt is None:
        return None
    mine = _comparable(rebuilt)
    return next((name for name, s in _suite_specs(size_class).items() if s == mine), None)


def record_class(r: Result) -> tuple[str, int] | None:
    """The size class and suite version a record ran, or None for a workload of no class
    (reported, never ranked against a class). A record written before size classes ran the
    default suite's first version (``records.migrate``)."""
    return (r.run.suite_class, r.run.suite_version) if r.run.suite_class else None


def execution_mode(r: Result) -> str:
    """How a record's steps executed, as rankings keep them apart: eager, compile, or
    compile+graphs (CUDA graphs)."""
    e = r.settings.execution
    return f"{e.mode}+graphs" if e.graphs else e.mode


def scored_mode(entries: Sequence[Audit], size_class: str) -> str:
    """The mode a class's records are scored in where nobody named one: the one most of them
    ran in (a run or a job runs one), else the class's own (``recipes.Suite.mode``)."""
    modes = Counter(execution_mode(e.result) for e in entries if e.result.run.suite_class == size_class)
    return modes.most_common(1)[0][0] if modes else recipes.suite(size_class).mode


def list_key(size_class: str, mode: str) -> str:
    """The name of a ranking list: the class for eager records, ``CLASS/MODE`` for the others."""
    return size_class if mode == "eager" else f"{size_class}/{mode}"


def split_key(key: str) -> tuple[str, str]:
    """The class and mode of a ranking list's name (``list_key``)."""
    size_class, _, mode = key.partition("/")
    return size_class, mode or "eager"


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


def _ai_ops(r: Result) -> float:
    return r.metrics.ai_ops_per_s


def score_system(
    system: str, entries: Sequence[Audit], size_class: str = recipes.DEFAULT_CLASS, mode: str = "eager"
) -> SystemScore:
    """Score one system in one size class and execution mode from its records: already audited
    and gated, each with rank 0's losses from its steps file (read by the audit), so that
    scoring reads no file. Records of other classes, suite versions or modes are left out."""
    suite = recipes.suite(size_class)
    workloads = list(suite.workloads)
    out = SystemScore(system, size_class, mode)
    by_workload: dict[str, list[Audit]] = {}
    to_quality: dict[str, list[float]] = {}
    for e in entries:
        name = suite_workload(e.result.spec, size_class)
        if name is None or record_class(e.result) != (size_class, suite.version):
            continue
        if execution_mode(e.result) != mode:
            continue
        target = e.result.metrics.target
        if target is None:
            by_workload.setdefault(name, []).append(e)
        elif target.fraction == QUALITY_TARGET and target.reached and target.time_to_target_s is not None:
            to_quality.setdefault(name, []).append(target.time_to_target_s)
    if all(w in to_quality for w in workloads):
        out.time_to_quality_s = geomean([min(to_quality[w]) for w in workloads])
    best: dict[int, dict[str, Audit]] = {}  # world size -> workload -> best record
    for name, found in by_workload.items():
        for n, e in best_per_rank_count(found, _ai_ops).items():
            best.setdefault(n, {})[name] = e
    complete = sorted(n for n, at in best.items() if len(at) == len(workloads))
    if not complete:
        seen = sorted({w for at in best.values() for w in at})
        missing = [w for w in workloads if all(w not in at for at in best.values())]
        out.reason = (
            f"suite incomplete at every scale (missing {', '.join(missing)})"
            if missing
            else f"no scale with all {len(workloads)} suite workloads (have {', '.join(seen) or 'none'})"
        )
        return out
    top = best[complete[-1]]
    ordered = [top[w].result for w in workloads]
    out.world_size = complete[-1]
    out.nodes = max(r.settings.nodes for r in ordered)
    out.device = ordered[0].environment.device_name
    out.score = geomean([_ai_ops(r) for r in ordered])
    qualities = {w: loss_reduction(top[w].losses) for w in workloads}
    regulated = [_ai_ops(top[w].result) * quality_factor(qualities[w]) for w in workloads]
    out.regulated = geomean(regulated) if min(regulated) > 0 else 0.0  # a workload that never learned
    if len(complete) > 1:
        base_n, base = complete[0], best[complete[0]]
        out.efficiency_base = base_n
        out.efficiency = geomean(
            [
                metrics.scaling_efficiency(
                    _ai_ops(top[w].result), out.world_size, _ai_ops(base[w].result), base_n
                )
                for w in workloads
            ]
        )
    watts = [r.metrics.energy.ai_ops_per_watt for r in ordered]
    measured = [w for w in watts if w is not None and finite(w) and w > 0]
    if len(measured) == len(watts):
        out.ai_ops_per_watt = geomean(measured)
    out.date = max(r.created for r in ordered)[:10]
    out.workloads = {
        w: {
            "record": str(top[w].path),
            "ai_ops_per_s": _ai_ops(top[w].result),
            "samples_per_s": top[w].result.metrics.samples_per_s,
            "mfu": top[w].result.metrics.mfu,
            "flags": top[w].result.metrics.flags,
            "precision": top[w].result.settings.precision,
            "batch_per_rank": top[w].result.settings.batch_per_rank,
            "accumulation_steps": top[w].result.settings.accumulation_steps,
            "loss_reduction": qualities[w],
            "quality_factor": quality_factor(qualities[w]),
        }
        for w in workloads
    }
    return out
