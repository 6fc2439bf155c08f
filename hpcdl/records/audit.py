"""Verification of result records before they may rank: is the record intact, do its figures
follow from its own measurements (its steps file included), and does it pass the ranking's
validity gate? (docs/rules.md, "The gate".)

A digest without a secret detects edits, not forgery: someone who edits a figure and
recomputes every derived figure, the steps file and the digest is caught only by re-running
the workload. What this module guarantees is that a record edited by hand (or by a buggy tool)
fails, and that a forgery must be consistent with its own per-step times to pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpcdl import metrics
from hpcdl.errors import HpcdlError
from hpcdl.records import schema
from hpcdl.records.loader import Record, Unreadable, open_regular
from hpcdl.records.store import digest_ok, file_sha256, read_steps
from hpcdl.records.views import RankRow, Result
from hpcdl.workloads.precision import PRECISIONS
from hpcdl.workloads.registry import spec_from_dict

RANK_MIN_WINDOW_S = 5.0
"""a timed window of every rank at least this long, whatever min_duration_s the run used"""
REL_TOL = 1e-9
"""derived figures are recomputed from the same floats: only rounding may differ"""
CORRECTNESS_CHECKS = ("one_step_equivalence", "parameters_identical")
DIGEST_MISMATCH = "digest mismatch: the record was edited after it was written"

TIMER_SLACK_S = 1e-6
"""per step: how far rank 0's step times may add up beyond its window. Each step and the
window are differences of ``time.perf_counter`` readings (1 ns resolution on Linux, 100 ns on
Windows) and the steps lie inside the window, so only resolution and rounding may exceed it"""
MIN_STEPS_SHARE = 0.5
"""rank 0's step times fill at least this share of its window: between steps only the loop's
bookkeeping and the stop agreement run (the reference records' steps fill 99.1-99.98 %)"""
STEPS_FILE_BASE_BYTES = 1 << 20
"""a steps file's size bound: HDF5's metadata of a dozen datasets (about 5 kB written) ..."""
STEPS_FILE_STEP_BYTES = 1 << 10
"""... plus this per step, warm-up included (7 float64 columns: 56 bytes) ..."""
STEPS_FILE_SECOND_BYTES = 4 << 10
"""... plus this per second of window (a GPU trace: 5 float64 columns every 0.1 s, 400 bytes) ..."""
STEPS_FILE_MAX_BYTES = 1 << 30
"""... and never more than this (19 million steps), whatever the record claims"""
MAX_FIGURE = 1e30
"""no figure of a record is larger (AI ops/s of the largest machines: 1e19; bytes: 1e16); a
forged 1e308 would overflow the products and ranges that rank and report compute"""
SIGNED_FIGURES = frozenset({"exposed_s", "excess"})
"""figures that may be negative (communication left exposed, a straggler's excess: noise
makes them slightly so); every other number of a record is >= 0"""
MAX_CAP = {"power": 1e5, "clock": 1e5}
"""a cap above 100 kW or 100 GHz is no device's"""


@dataclass(frozen=True)
class Audit:
    """A record and what its audit found: why it is not what hpcdl wrote (empty when it is),
    and rank 0's per-step columns, read from its steps file once here (empty unless the file
    matched its hash) for whoever needs them next (the score's losses, the report's power)."""

    record: Record
    problems: tuple[str, ...]
    steps: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.record.path

    @property
    def result(self) -> Result:
        return self.record.result

    @property
    def losses(self) -> list[float]:
        """Rank 0's loss of every step, warm-up first (empty when the steps file was not read)."""
        loss = self.steps.get("loss")
        return [] if loss is None else [float(x) for x in loss]


def _close(a: float, b: float, rel: float = REL_TOL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


def audit(record: Record) -> Audit:
    """Check a record of any version this hpcdl reads (``records.migrate``) against itself:
    schema, digest (over the JSON as read), FLOPs and parameters recomputed from the spec, every
    derived figure recomputed from the per-rank measurements, and the steps file (hash, step
    count, median, times within the window)."""
    r = record.result
    if (r.schema, r.schema_version) != (schema.RESULT, schema.RESULT_VERSION):  # read_result upgrades
        kind = f"{r.schema} v{r.schema_version}"
        return Audit(
            record, (f"not a result record of schema {schema.RESULT} v{schema.RESULT_VERSION}: {kind}",)
        )
    problems = [] if digest_ok(r.raw) else [DIGEST_MISMATCH]  # the JSON as written, not upgraded
    ranges = out_of_range(r)
    if ranges:  # nothing below may compute with them
        return Audit(record, (*problems, *ranges))
    problems += _counts(r)
    ranks = _ranks(r)
    if ranks:  # the figures below divide by the ranks' windows and need rank 0
        return Audit(record, (*problems, *ranks))
    problems += _derived_figures(r)
    found, steps = _steps_file(record)
    return Audit(record, (*problems, *found), steps)


def out_of_range(r: Result) -> list[str]:
    """The figures of a record outside what any run can produce, checked before rank and report
    compute anything with them (a record edited and sealed again passes its digest): every
    number of its settings, counts, metrics and cap finite (NaN stands for a figure that could
    not be had) and within :data:`MAX_FIGURE`, none negative but :data:`SIGNED_FIGURES`; a
    timed window > 0; a target's fraction in (0, 1) and its time to target > 0 when reached,
    absent when not; a cap of a known kind with a value in (0, :data:`MAX_CAP`]."""
    raw = r.raw
    problems = [
        f"{where} = {value!r} is not a figure any run produces"
        for part in ("settings", "counts", "metrics")
        for where, value in _numbers(raw.get(part), part)
        if not _plausible(where, value)
    ]
    m = r.metrics
    if not 0 < m.timed_window_s <= MAX_FIGURE:
        problems.append(f"metrics.timed_window_s = {m.timed_window_s!r}: a time > 0")
    t = m.target
    if t is not None:
        if not 0 < t.fraction < 1:
            problems.append(f"metrics.target.fraction = {t.fraction!r}: a fraction in (0, 1)")
        if t.reached and not (t.time_to_target_s is not None and 0 < t.time_to_target_s <= MAX_FIGURE):
            problems.append(f"metrics.target.time_to_target_s = {t.time_to_target_s!r}: a time > 0")
        if not t.reached and t.time_to_target_s is not None:
            why = "for a target not reached"
            problems.append(f"metrics.target.time_to_target_s = {t.time_to_target_s!r} {why}")
    return problems + _cap_range(r.environment.cap)


def _cap_range(cap: Mapping[str, object] | None) -> list[str]:
    if cap is None:
        return []
    kind, value = cap.get("kind"), cap.get("value")
    if kind not in MAX_CAP:
        return [f"environment.cap.kind = {kind!r}: one of {', '.join(MAX_CAP)}"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_CAP[str(kind)]:
        return [f"environment.cap.value = {value!r}: a {kind} cap in (0, {MAX_CAP[str(kind)]:g}]"]
    return [
        f"{where} = {number!r} is not a limit any device holds"
        for where, number in _numbers(cap.get("limits"), "environment.cap.limits")
        if not (math.isfinite(number) and 0 <= number <= MAX_FIGURE)
    ]


def _numbers(value: object, where: str) -> Iterator[tuple[str, float]]:
    """Every number below ``value`` (booleans are not numbers), with where it is."""
    stack = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, Mapping):
            stack += [(v, f"{at}.{k}") for k, v in item.items()]
        elif isinstance(item, list):
            stack += [(v, f"{at}[{i}]") for i, v in enumerate(item)]
        elif isinstance(item, int | float) and not isinstance(item, bool):
            yield at, float(item)


def _plausible(where: str, value: float) -> bool:
    if math.isnan(value):
        return True  # a figure that could not be had (no peak known: MFU)
    low = -MAX_FIGURE if where.rsplit(".", 1)[-1] in SIGNED_FIGURES else 0.0
    return low <= value <= MAX_FIGURE


def _counts(r: Result) -> list[str]:
    try:
        count = spec_from_dict(dict(r.spec)).count()
    except (HpcdlError, TypeError) as e:  # TypeError: a knob of a type no spec has (a list)
        return [f"spec does not rebuild: {e}"]
    problems = []
    if (
        count.train_flops != r.counts.train_flops_per_sample
        or count.train_flops != r.metrics.train_flops_per_sample
    ):
        problems.append(
            f"train FLOPs per sample claimed {r.metrics.train_flops_per_sample}, "
            f"recomputed from the spec {count.train_flops}"
        )
    if count.params != r.counts.params:
        problems.append(f"parameters claimed {r.counts.params}, recomputed {count.params}")
    return problems


def _ranks(r: Result) -> list[str]:
    rows = r.metrics.per_rank
    if r.settings.world_size < 1 or sorted(x.rank for x in rows) != list(range(r.settings.world_size)):
        return [f"per_rank holds ranks {[x.rank for x in rows]}, world size {r.settings.world_size}"]
    if any(x.timed_steps < 1 or not 0 < x.timed_window_s < math.inf for x in rows):
        return ["per_rank: a rank without timed steps or with a window that is not a positive time"]
    return []


def _derived_figures(r: Result) -> list[str]:
    m, rows = r.metrics, r.metrics.per_rank
    samples = [r.settings.samples_per_step * x.timed_steps for x in rows]
    distinct = sum(samples) // r.settings.ranks_per_sample  # a tp group's ranks train on the same samples
    want = metrics.aggregate_throughput([distinct], [x.timed_window_s for x in rows])
    problems = []
    if not _close(m.samples_per_s, want):
        problems.append(f"samples_per_s {m.samples_per_s:.6g} != all ranks' samples / window {want:.6g}")
    if not _close(m.ai_ops_per_s, metrics.ai_ops_per_s(m.train_flops_per_sample, m.samples_per_s)):
        problems.append("ai_ops_per_s != train_flops_per_sample x samples_per_s")
    for x, n in zip(rows, samples, strict=True):
        if not _close(x.samples_per_s, metrics.throughput(n, x.timed_window_s)):
            problems.append(f"rank {x.rank}: samples_per_s does not follow from its steps and window")
    if not _close(m.timed_window_s, max(x.timed_window_s for x in rows)):
        problems.append("timed_window_s is not the slowest rank's window")
    return problems


def steps_file_limit(r: Result) -> tuple[int, str]:
    """The most bytes a steps file of this record's step counts and window may hold, and the
    words that say so."""
    lead = _lead(r)
    steps = lead.timed_steps + r.run.warmup_steps
    claimed = (
        STEPS_FILE_BASE_BYTES + STEPS_FILE_STEP_BYTES * steps + STEPS_FILE_SECOND_BYTES * lead.timed_window_s
    )
    what = f"a steps file of {steps} steps and a {lead.timed_window_s:.3g} s window may hold"
    return int(min(claimed, STEPS_FILE_MAX_BYTES)), what


def _lead(r: Result) -> RankRow:
    return next(x for x in r.metrics.per_rank if x.rank == 0)


def _steps_file(record: Record) -> tuple[list[str], dict[str, np.ndarray]]:
    """The steps file's problems and its columns (read only when it matches its hash). Its size
    is bounded before it is hashed: a huge (even sparse) file is refused unread."""
    r = record.result
    name = r.steps_file
    if not name or Path(name).name != name:  # beside the record, never elsewhere
        return [f"steps file {name!r} is not a file name beside {record.path.name}"], {}
    limit, what = steps_file_limit(r)
    try:
        with open_regular(record.path.parent / name, limit, what) as f:
            if file_sha256(f) != r.steps_sha256:
                return [f"steps file {name} was changed after the record was written"], {}
            f.seek(0)
            steps = read_steps(f, limit)
    except Unreadable as e:
        return [f"steps file {name!r} beside {record.path.name}: {e}"], {}
    except (OSError, ValueError) as e:  # a file hashed as written, but not HDF5 hpcdl wrote
        return [f"steps file {name} does not read as per-step columns: {e}"], {}
    return _step_times(r, steps) or _target(r, steps["loss"]), steps


def _step_times(r: Result, steps: Mapping[str, np.ndarray]) -> list[str]:
    """Rank 0's per-step times against its claimed figures: as many steps as it claims, its
    median, times that add up to at most its window and to not much less, and a loss for every
    step (warm-up included), the first one positive."""
    lead = _lead(r)
    step_s, loss = steps.get("step_s"), steps.get("loss")
    if step_s is None or loss is None:
        return ["steps file lacks step_s or loss"]
    n = len(step_s)
    if n != lead.timed_steps:
        return [f"steps file holds {n} steps, rank 0 claims {lead.timed_steps}"]
    if not _close(float(np.median(step_s)), lead.step_time_median_s, 1e-6):
        return ["rank 0's median step time does not match its steps file"]
    if not np.all(step_s > 0):  # NaN fails too
        return ["steps file: a step time is not a positive number"]
    total, window = float(np.sum(step_s)), lead.timed_window_s
    if total > window + TIMER_SLACK_S * n:
        return [f"rank 0's {n} step times add up to {total:.6g} s, more than its window {window:.6g} s"]
    if total < MIN_STEPS_SHARE * window:
        return [f"rank 0's {n} step times fill only {total / window:.1%} of its {window:.6g} s window"]
    warmup = r.run.warmup_steps
    if len(loss) != warmup + n:
        return [f"steps file holds {len(loss)} losses, the run claims {warmup!r} warm-up and {n} timed steps"]
    if not (len(loss) and loss[0] > 0):  # the quality factor divides by it; cross-entropy is positive
        return ["steps file: the first step's loss is not a positive number"]
    return []


def _target(r: Result, loss: np.ndarray) -> list[str]:
    """A time to target's claims against rank 0's losses (``metrics.reached_target``): a target
    claimed reached must be met by rank 0's last timed steps, in the time of the window (a
    reached target exempts the record from the gate's 5 s window, so it is not taken on trust)."""
    t = r.metrics.target
    if t is None or not t.reached:
        return []
    timed = loss[r.run.warmup_steps :].tolist()
    met = t.window_steps >= 1 and metrics.reached_target(timed[0], timed[-t.window_steps :], t.fraction)
    if not met or t.time_to_target_s is None or not _close(t.time_to_target_s, r.metrics.timed_window_s):
        return ["target claimed reached, but rank 0's losses or window do not show it"]
    return []


def gate_problems(r: Result) -> list[str]:
    """Why an intact record may still not rank: failed validity, a short window, a precision
    below fp16/bf16, no learnable-loss evidence, missing correctness checks."""
    problems = []
    names = {c.name for c in r.validity.checks}
    if r.validity.failed or not r.validity.passed:
        problems.append(
            f"validity checks failed: {'; '.join(dict.fromkeys(r.validity.reasons)) or 'passed is false'}"
        )
    if r.settings.precision not in PRECISIONS:  # no lower than 16 bits
        problems.append(f"precision {r.settings.precision} is below fp16/bf16")
    shortest = min(x.timed_window_s for x in r.metrics.per_rank)
    reached = r.metrics.target is not None and r.metrics.target.reached
    if shortest < RANK_MIN_WINDOW_S and not reached:  # a time to target is as short as it is
        problems.append(f"shortest timed window {shortest:.3g} s < {RANK_MIN_WINDOW_S:g} s")
    if "loss_falls" not in names:
        problems.append(f"no loss_falls check: data {r.run.data!r}; ranking needs learnable or hdf5 data")
    if r.world_size > 1:
        missing = [c for c in CORRECTNESS_CHECKS if c not in names]
        if missing:
            problems.append(f"{r.world_size} ranks without the checks {', '.join(missing)}")
    return problems
