"""Validity checks recorded with every run: a fast wrong answer is not a result."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

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


def block(checks: Sequence[Check]) -> Validity:
    """The record's ``validity`` block: every check, and ``passed`` when all passed."""
    return Validity(checks=list(checks), passed=all(c.passed for c in checks))
