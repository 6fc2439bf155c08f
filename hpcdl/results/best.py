"""The best record at each rank count, chosen in one place: where a workload was measured
several times at one scale, the fastest counts (a submitter may tune and re-run; docs/rules.md,
"The score"). The score, the report's sweeps from loose records and ``hpcdl predict --compare``
choose with it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from hpcdl.records.views import Result


class HasResult(Protocol):
    @property
    def result(self) -> Result: ...


R = TypeVar("R", bound=HasResult)


def best_per_rank_count(records: Iterable[R], figure: Callable[[Result], float]) -> dict[int, R]:
    """World size -> the record with the highest ``figure`` there (the first one found on a tie)."""
    best: dict[int, R] = {}
    for r in records:
        n = r.result.world_size
        if n not in best or figure(r.result) > figure(best[n].result):
            best[n] = r
    return best
