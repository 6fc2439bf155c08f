"""The scaling table: speed-up and efficiency of throughputs at several rank counts against a
base point, built here only (sweeps, collected jobs, rankings, reports and the model use it).

    S(N) = X(N) / X(N0)            E(N) = X(N) / ((N / N0) · X(N0))

with N0 the smallest rank count measured (``metrics.speedup``, ``metrics.scaling_efficiency``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hpcdl import metrics


@dataclass(frozen=True)
class ScalingRow:
    ranks: int
    samples_per_s: float
    speedup: float
    efficiency: float


def scaling_table(
    points: Iterable[tuple[int, float]], base: tuple[int, float] | None = None
) -> list[ScalingRow]:
    """Rows for ``(ranks, samples/s)`` points, in increasing rank count, against ``base`` (by
    default the point with the fewest ranks). A prediction passes the measured base, so that
    the model's error at N0 shows instead of being normalised away."""
    ordered = sorted(points)
    if not ordered:
        return []
    n0, x0 = base or ordered[0]
    return [
        ScalingRow(n, x, metrics.speedup(x, x0), metrics.scaling_efficiency(x, n, x0, n0)) for n, x in ordered
    ]
