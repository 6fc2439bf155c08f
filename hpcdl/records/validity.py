"""Validity checks recorded with every run: a fast wrong answer is not a result."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hpcdl.measure.measurement import Check
from hpcdl.records.views import Validity


def loss_finite(losses: Sequence[float]) -> Check:
    bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    detail = "all finite" if not bad else f"{len(bad)} non-finite losses, first at step {bad[0]}"
    return Check("loss_finite", not bad and len(losses) > 0, detail)


def loss_falls(losses: Sequence[float]) -> Check:
    """On learnable data the median loss of the last quarter of steps is below the first
    quarter's. Medians, not means: one spike of a still-learning model (13.8 among losses of
    about 2, seen in a 2-rank DDP transformer) made a mean rise over a training that fell."""
    k = max(1, len(losses) // 4)
    if len(losses) < 4:
        return Check("loss_falls", False, f"only {len(losses)} steps; need at least 4")
    first, last = statistics.median(losses[:k]), statistics.median(losses[-k:])
    return Check(
        "loss_falls", last < first, f"median loss of first {k} steps {first:.4g}, last {k} {last:.4g}"
    )


def min_duration(seconds: float, minimum: float) -> Check:
    return Check("min_duration", seconds >= minimum, f"timed {seconds:.3g} s, minimum {minimum:g} s")


QUIET_MARGIN = 0.10
"""the share of its timed window a rank's main thread may wait for a CPU before the run counts
as disturbed: quiet runs here waited at most a few percent, runs beside a CPU hog half their
window or more (docs/validation/2026-12-02-disturbed-runs.md)"""
QUIET_MIN_WINDOW_S = 1.0
"""windows shorter than this are not judged: a few scheduler ticks (4 ms each) would be a large
share of them; the ranking's gate wants longer windows anyway"""
SPREAD_LIMIT = 3.0
"""p90 / p10 of the timed steps above which the steps were not steady"""
SPREAD_MIN_STEP_S = 0.005
"""the spread is judged where the median step takes this long or longer: below it the clock and
the operating system's jitter make the spread, and waiting for a CPU is judged directly"""
SPREAD_MIN_STEPS = 30
"""the spread is judged over this many timed steps or more (p10 and p90 of fewer are the
fastest and slowest few steps)"""


@dataclass(frozen=True)
class Waited:
    """How long one rank's main thread waited for a CPU in its timed window."""

    rank: int
    host: str
    waited_s: float
    window_s: float
    own_share: float
    """the share its own run explains: 1 - CPUs / threads of the run's ranks on its node (0 where
    the node has a CPU for every thread)"""


def quiet_machine(ranks: Sequence[Waited]) -> Check:
    """No rank waited for a CPU more than ``QUIET_MARGIN`` of its window: a rank kept from
    running by other work on its machine (a CPU hog, another job, a throttled cgroup) does not
    measure the system. Passes, saying so, where the kernel keeps no scheduler statistics, and
    where the run's own threads outnumber its CPUs (they wait for each other, by how much
    depends on how they wait: not a disturbance this check can tell apart)."""
    if not ranks:
        return Check("quiet_machine", True, "not judged: no scheduler statistics (schedstat) here")
    own = max(r.own_share for r in ranks)
    if own > 0:
        return Check("quiet_machine", True, f"not judged: the run's own threads wait {own:.0%} for a CPU")
    shortest = min(r.window_s for r in ranks)
    if shortest < QUIET_MIN_WINDOW_S:
        return Check("quiet_machine", True, f"not judged: window {shortest:.2g} s < {QUIET_MIN_WINDOW_S:g} s")
    share = [r.waited_s / r.window_s if r.window_s > 0 else 0.0 for r in ranks]
    worst = max(range(len(ranks)), key=lambda i: share[i])
    w = ranks[worst]
    passed = share[worst] <= QUIET_MARGIN
    detail = (
        f"rank {w.rank} on {w.host} waited for a CPU {w.waited_s:.1f} s of its {w.window_s:.1f} s "
        f"window ({share[worst]:.0%}, allowed {QUIET_MARGIN:.0%})"
    )
    return Check("quiet_machine", passed, detail)


def steady_steps(step_s: Sequence[float], own_share: float = 0.0) -> Check:
    """The timed steps' p90 / p10 within ``SPREAD_LIMIT`` where it says something (steps of
    ``SPREAD_MIN_STEP_S`` or more, ``SPREAD_MIN_STEPS`` of them or more, a run with a CPU for
    each of its threads: ``own_share`` 0): steps that wander by more were disturbed, whatever by
    (a neighbour's memory traffic, a throttled device)."""
    if own_share > 0:
        return Check(
            "steady_steps", True, f"not judged: the run's own threads wait {own_share:.0%} for a CPU"
        )
    if len(step_s) < SPREAD_MIN_STEPS:
        return Check("steady_steps", True, f"not judged: {len(step_s)} steps (needs {SPREAD_MIN_STEPS})")
    p10, median, p90 = (float(q) for q in np.percentile(step_s, [10, 50, 90]))
    if median < SPREAD_MIN_STEP_S:
        return Check("steady_steps", True, f"not judged: median step {median * 1e3:.2f} ms (jitter)")
    ratio = p90 / p10 if p10 > 0 else math.inf
    spread = f"{p10 * 1e3:.1f}-{p90 * 1e3:.1f} ms"
    detail = f"p90/p10 of {len(step_s)} steps {ratio:.2f} ({spread}), limit {SPREAD_LIMIT:g}"
    return Check("steady_steps", ratio <= SPREAD_LIMIT, detail)


def block(checks: Sequence[Check]) -> Validity:
    """The record's ``validity`` block: every check, and ``passed`` when all passed."""
    return Validity(checks=list(checks), passed=all(c.passed for c in checks))
