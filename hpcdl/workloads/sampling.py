"""Generative sampling: draw architectures of a family within knob ranges from a seed, in the
spirit of ParaDnn's parameter sweeps and AIPerf's generated networks.

Each family declares its ranges (``Spec.sampling``); a range is a list of allowed values, drawn
uniformly. The same (family, seed, ranges) always gives the same spec, and the spec's seed (the
drawn one) fixes weights and data.
"""

from __future__ import annotations

import random
from typing import Any

from hpcdl.errors import SpecError
from hpcdl.workloads.registry import family_class
from hpcdl.workloads.spec import Ranges, Spec

ATTEMPTS = 100
"""draws that make an impossible network (an image downsampled below one pixel) are redrawn"""


def ranges(family: str) -> Ranges:
    """The family's default ranges."""
    return dict(family_class(family).sampling)


def sample_spec(family: str, seed: int, overrides: Ranges | None = None, **fixed: Any) -> Spec:
    """Draw one spec of ``family``: each knob uniformly from its range (``overrides`` replaces
    some of the family's ranges), then the ``fixed`` knobs set as given."""
    cls = family_class(family)
    table = {**cls.sampling, **(overrides or {})}
    for key, values in table.items():
        if not isinstance(values, list) or not values:
            raise SpecError(f"ranges.{key}", values, "expected a non-empty list of values")
    rng = random.Random(f"{family}:{seed}")
    last: SpecError | None = None
    for _ in range(ATTEMPTS):
        drawn = {key: rng.choice(values) for key, values in table.items()} | fixed
        knobs = cls.from_drawn(drawn, table, rng)
        try:
            return cls.from_dict({"seed": seed, **knobs})
        except SpecError as err:
            last = err
    assert last is not None
    raise last
