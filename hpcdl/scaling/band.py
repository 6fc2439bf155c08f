"""How far a prediction may be off: the band of its regime and whether it extrapolates.

The bands are the validation set's (``hpcdl.scaling.validation.bands``: the largest relative
error of each regime's calibration points), kept here as figures so that ``hpcdl predict`` does
not refit the set on every call; ``tests/test_validation.py`` recomputes them and fails if they
drift (docs/validation/2026-12-07-validation-set.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BANDS = {
    "data, one node": 0.104,
    "data, 2-16 nodes": 0.104,
    "data, 32+ nodes": 0.208,
    "tensor + pipeline": 0.049,
}
"""relative half-width of each regime's band, from ``validation.bands`` (rounded to 0.1 %)"""
LARGEST_RANKS = {"data": 512, "model": 3072}
"""the largest rank counts the validation set holds, data-parallel and model-parallel"""
EXTRAPOLATED_FACTOR = 2.0
"""beyond the validated scale the band doubles: an assumed widening (no point measures it)"""


@dataclass(frozen=True)
class Band:
    regime: str
    half_width: float
    """relative: the samples/s may be this fraction above or below"""
    extrapolated: bool


def regime_of(nodes: int, model_parallel: bool) -> str:
    """The regime of a run on ``nodes`` nodes (model-parallel: tensor or pipeline parallel)."""
    if model_parallel:
        return "tensor + pipeline"
    return "data, one node" if nodes <= 1 else "data, 2-16 nodes" if nodes <= 16 else "data, 32+ nodes"


def band_of(ranks: int, ranks_per_node: int, model_parallel: bool, fit_rse: float = 0.0) -> Band:
    """The band at ``ranks``: its regime's, with the fits' standard error added in quadrature;
    one rank is its own calibration (the fits' error alone)."""
    regime = regime_of(math.ceil(ranks / max(ranks_per_node, 1)), model_parallel)
    if ranks <= 1:
        return Band(regime, fit_rse, False)
    extrapolated = ranks > LARGEST_RANKS["model" if model_parallel else "data"]
    width = BANDS[regime] * (EXTRAPOLATED_FACTOR if extrapolated else 1.0)
    return Band(regime, math.hypot(width, fit_rse), extrapolated)
