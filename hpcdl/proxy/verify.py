"""Verification: a proxy's step time against the real model's, timed interleaved in one process.

On a shared or throttling machine two runs minutes apart differ by more than a proxy's error,
so the two models take turns: round ``i`` times ``steps`` steps (default one) of one, then of the other
(the order alternates, ABBA, so that a drift in the machine's speed falls on both), and each
round gives one ratio of median step times. The result is the median ratio over the rounds
with its spread (p10-p90, min-max)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hpcdl import metrics
from hpcdl.device import device_name
from hpcdl.measure.environment import environment
from hpcdl.proxy.reference import RealModel
from hpcdl.proxy.training import Trainee, spec_trainee
from hpcdl.workloads.spec import Spec

ROUNDS = 10
STEPS = 1
WARMUP = 2


@dataclass(frozen=True)
class Comparison:
    """Step time of ``a`` over that of ``b``, measured interleaved."""

    ratio: dict[str, float]
    """median, p10, p90, min, max, n of the per-round ratios"""
    a_step_s: float
    """median step time of ``a`` over every timed step"""
    b_step_s: float
    fastest_ratio: float
    """fastest step of ``a`` over fastest step of ``b``: other people's load only ever adds time,
    so on a shared machine the fastest steps are the least disturbed (a second opinion)"""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "fastest_ratio": self.fastest_ratio,
            "proxy_step_s": self.a_step_s,
            "real_step_s": self.b_step_s,
        }

    def describe(self) -> str:
        r = self.ratio
        spread = f"p10-p90 {r['p10']:.3f}-{r['p90']:.3f}, min-max {r['min']:.3f}-{r['max']:.3f}"
        return f"{r['median']:.3f} ({spread}, {int(r['n'])} rounds; fastest steps {self.fastest_ratio:.3f})"


def interleaved(
    a: Trainee, b: Trainee, *, rounds: int = ROUNDS, steps: int = STEPS, warmup: int = WARMUP
) -> Comparison:
    """Time ``a`` and ``b`` in alternating blocks of ``steps`` steps after ``warmup`` steps each."""
    a.steps(warmup)
    b.steps(warmup)
    ratios, times_a, times_b = [], [], []
    for i in range(rounds):
        order = (a, b) if i % 2 == 0 else (b, a)
        blocks = {id(t): t.steps(steps) for t in order}
        ta, tb = blocks[id(a)], blocks[id(b)]
        ratios.append(statistics.median(ta) / statistics.median(tb))
        times_a += ta
        times_b += tb
    return Comparison(
        metrics.summarize(ratios),
        statistics.median(times_a),
        statistics.median(times_b),
        min(times_a) / min(times_b),
    )


def verification_entry(comparison: Comparison, proxy: Trainee) -> dict[str, Any]:
    """The fit record's entry for one verification: the ratio, where and when it was measured."""
    env = environment(proxy.device)
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": env["host"],
        "device": device_name(proxy.device),
        "torch": env["torch"],
        "precision": proxy.precision.name,
        **comparison.to_dict(),
    }


def verify(
    spec: Spec, real: RealModel, *, device: Any = "cpu", rounds: int = ROUNDS
) -> tuple[Comparison, dict[str, Any]]:
    """Time a fitted spec against the real model, interleaved, same batch size and precision
    (the spec's); returns the comparison and its fit-record entry."""
    proxy = spec_trainee(spec, device)
    original = Trainee(real.module, real.batch, real.loss_fn, precision=spec.precision, device=device)
    comparison = interleaved(proxy, original, rounds=rounds)
    return comparison, verification_entry(comparison, proxy)
