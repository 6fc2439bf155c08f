"""Verification of result records before they may rank: is the record intact, do its figures
follow from its own measurements, and does it pass the ranking's validity gate?

A digest without a secret detects edits, not forgery: someone who edits a figure and
recomputes every derived figure and the digest is caught only by re-running the workload.
What this module guarantees is that a record edited by hand (or by a buggy tool) fails.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hpcdl import metrics
from hpcdl.errors import HpcdlError
from hpcdl.records import schema
from hpcdl.records.store import digest_ok, file_sha256, read_steps
from hpcdl.workloads.precision import PRECISIONS
from hpcdl.workloads.registry import spec_from_dict

RANK_MIN_WINDOW_S = 5.0
"""a timed window of every rank at least this long, whatever min_duration_s the run used"""
REL_TOL = 1e-9
"""derived figures are recomputed from the same floats: only rounding may differ"""
CORRECTNESS_CHECKS = ("one_step_equivalence", "parameters_identical")
DIGEST_MISMATCH = "digest mismatch: the record was edited after it was written"


def _close(a: float, b: float, rel: float = REL_TOL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


def _malformed(check: Callable[..., list[str]]) -> Callable[..., list[str]]:
    """A record with missing or mistyped keys is a problem to report, not a crash."""

    @functools.wraps(check)
    def guarded(rec: Mapping[str, Any], *args: Any) -> list[str]:
        try:
            return check(rec, *args)
        except (KeyError, TypeError, ValueError, AttributeError, StopIteration, OSError) as e:
            return [f"malformed record: {type(e).__name__} {e}"]

    return guarded


@_malformed
def integrity_problems(rec: Mapping[str, Any], path: Path | None = None) -> list[str]:
    """Why this record is not what hpcdl wrote, or [] if it is: schema, digest, the steps
    file's hash, FLOPs recomputed from the spec, and every derived figure recomputed from
    the per-rank measurements."""
    if rec.get("schema") != schema.RESULT or rec.get("schema_version") != schema.RESULT_VERSION:
        return [
            f"not a result record of schema {schema.RESULT} v{schema.RESULT_VERSION}: {rec.get('schema')!r}"
        ]
    problems = []
    if not digest_ok(rec):
        problems.append(DIGEST_MISMATCH)
    try:
        count = spec_from_dict(dict(rec["spec"])).count()
    except HpcdlError as e:
        return [*problems, f"spec does not rebuild: {e}"]
    m = rec["metrics"]
    if count.train_flops != rec["counts"]["train_flops_per_sample"] or count.train_flops != m.get(
        "train_flops_per_sample"
    ):
        problems.append(
            f"train FLOPs per sample claimed {m.get('train_flops_per_sample')}, "
            f"recomputed from the spec {count.train_flops}"
        )
    if count.params != rec["counts"]["params"]:
        problems.append(f"parameters claimed {rec['counts']['params']}, recomputed {count.params}")
    problems += _derived_figures(rec)
    if path is not None:
        problems += _steps_file(rec, path)
    return problems


def _derived_figures(rec: Mapping[str, Any]) -> list[str]:
    m, s = rec["metrics"], rec["settings"]
    rows = m["per_rank"]
    problems = []
    if sorted(r["rank"] for r in rows) != list(range(s["world_size"])):
        problems.append(f"per_rank holds ranks {[r['rank'] for r in rows]}, world size {s['world_size']}")
        return problems
    samples = [s["batch_per_rank"] * r["timed_steps"] for r in rows]
    windows = [r["timed_window_s"] for r in rows]
    want = metrics.aggregate_throughput(samples, windows)
    if not _close(m["samples_per_s"], want):
        problems.append(f"samples_per_s {m['samples_per_s']:.6g} != all ranks' samples / window {want:.6g}")
    if not _close(m["ai_ops_per_s"], metrics.ai_ops_per_s(m["train_flops_per_sample"], m["samples_per_s"])):
        problems.append("ai_ops_per_s != train_flops_per_sample x samples_per_s")
    for r, n in zip(rows, samples, strict=True):
        if not _close(r["samples_per_s"], metrics.throughput(n, r["timed_window_s"])):
            problems.append(f"rank {r['rank']}: samples_per_s does not follow from its steps and window")
    if not _close(m["timed_window_s"], max(windows)):
        problems.append("timed_window_s is not the slowest rank's window")
    return problems


def _steps_file(rec: Mapping[str, Any], path: Path) -> list[str]:
    steps = path.parent / str(rec.get("steps_file", ""))
    if not rec.get("steps_file") or not steps.is_file():
        return [f"steps file {rec.get('steps_file')!r} missing beside {path.name}"]
    if file_sha256(steps) != rec.get("steps_sha256"):
        return [f"steps file {steps.name} was changed after the record was written"]
    lead = next(r for r in rec["metrics"]["per_rank"] if r["rank"] == 0)
    step_s = read_steps(steps)["step_s"]
    if len(step_s) != lead["timed_steps"]:
        return [f"steps file holds {len(step_s)} steps, rank 0 claims {lead['timed_steps']}"]
    if not _close(float(np.median(step_s)), lead["step_time_median_s"], 1e-6):
        return ["rank 0's median step time does not match its steps file"]
    return []


@_malformed
def gate_problems(rec: Mapping[str, Any]) -> list[str]:
    """Why an intact record may still not rank: failed validity, a short window, a precision
    below fp16/bf16, no learnable-loss evidence, missing correctness checks."""
    problems = []
    checks = {c["name"]: c for c in rec["validity"]["checks"]}
    failed = [name for name, c in checks.items() if not c["passed"]]
    if failed or not rec["validity"]["passed"]:
        problems.append(f"validity checks failed: {', '.join(failed) or 'passed is false'}")
    if rec["settings"]["precision"] not in PRECISIONS:  # no lower than 16 bits
        problems.append(f"precision {rec['settings']['precision']} is below fp16/bf16")
    shortest = min(r["timed_window_s"] for r in rec["metrics"]["per_rank"])
    if shortest < RANK_MIN_WINDOW_S:
        problems.append(f"shortest timed window {shortest:.3g} s < {RANK_MIN_WINDOW_S:g} s")
    if "loss_falls" not in checks:
        problems.append(
            f"no loss_falls check: data {rec['run']['data']!r}; ranking needs learnable or hdf5 data"
        )
    if rec["settings"]["world_size"] > 1:
        missing = [c for c in CORRECTNESS_CHECKS if c not in checks]
        if missing:
            problems.append(f"{rec['settings']['world_size']} ranks without the checks {', '.join(missing)}")
    return problems
