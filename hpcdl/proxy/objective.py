"""The fitting objective: how far a candidate's figures are from a profile's.

Each figure gives a relative error ``e = candidate / target − 1``: parameters, training FLOPs
per sample, activation bytes per sample and step time; the kernel mix gives the total variation
distance of the two time mixes (the FLOP mixes when either side has no time mix), the fraction
of the step that sits in another kernel class. The objective is the weighted mean of their sizes
over the figures both sides have,

    J = Σ w_f · |e_f| / Σ w_f,

with the weights below (``--weights``). Parameters and FLOPs are the analytic counts of a spec
(exact), so the search ranks every candidate by them; memory, mix and time are measured, so only
screened candidates and finalists get them (``hpcdl.proxy.search``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from hpcdl.errors import InputError
from hpcdl.measure.kernels import mix_distance
from hpcdl.proxy.document import Profile

CHEAP = ("params", "flops")
"""figures known for every candidate from its analytic count (the others are measured)"""
PROFILE_FIGURE = {
    "params": "params",
    "flops": "train_flops_per_sample",
    "memory": "activation_bytes_per_sample",
    "time": "step_time_s",
}


@dataclass(frozen=True)
class Weights:
    """Weight of each figure's error in the objective; 0 leaves a figure out."""

    params: float = 1.0
    flops: float = 1.0
    memory: float = 0.5
    """half: autograd's saved bytes vary with kernel choices that a proxy need not copy"""
    mix: float = 1.0
    time: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value < 0:
                raise InputError(f"weights.{f.name}", value, "expected a finite number >= 0")

    @classmethod
    def parse(cls, text: str) -> Weights:
        """``params=1,flops=1,memory=0.5,mix=1,time=1`` (any subset; the rest keep their defaults)."""
        values: dict[str, float] = {}
        names = [f.name for f in fields(cls)]
        for item in filter(None, text.replace(" ", "").split(",")):
            key, sep, num = item.partition("=")
            if not sep or key not in names:
                raise InputError("weights", item, "expected NAME=NUMBER with NAME one of " + ", ".join(names))
            try:
                values[key] = float(num)
            except ValueError:
                raise InputError(f"weights.{key}", num, "expected a number >= 0") from None
        return cls(**values)

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def relative_error(value: float, target: float) -> float:
    """``value / target − 1``: the error with its sign (the objective takes its size)."""
    return value / target - 1.0


def errors(
    profile: Profile,
    figures: dict[str, float],
    time_mix: dict[str, float] | None = None,
    flop_mix: dict[str, float] | None = None,
    reference_s: float | None = None,
) -> dict[str, float]:
    """Each figure's error, for the figures both the profile and the candidate have.

    ``figures`` uses the profile's figure names (``params``, ``train_flops_per_sample``, ...);
    with ``reference_s`` (the candidate's, see ``hpcdl.proxy.measure.reference_work``) and the
    profile's, step times are compared in units of that reference work."""
    out = {}
    for name, key in PROFILE_FIGURE.items():
        if key in profile.figures and key in figures:
            out[name] = relative_error(figures[key], profile.figures[key])
    ref, ref_target = reference_s, profile.step_time_spread.get("reference_s")
    if "time" in out and ref and ref_target:
        # both timed beside the same fixed work: compare the step times in units of it
        out["time"] = relative_error(
            figures["step_time_s"] / ref, profile.figures["step_time_s"] / ref_target
        )
    if profile.time_mix and time_mix:
        out["mix"] = mix_distance(time_mix, profile.time_mix)
    elif profile.flop_mix and flop_mix:
        out["mix"] = mix_distance(flop_mix, profile.flop_mix)
    return out


def objective(errs: dict[str, float], weights: Weights) -> float:
    """The weighted mean of the errors' sizes (0 when none has weight)."""
    w = weights.to_dict()
    total = sum(w[name] for name in errs)
    return sum(w[name] * abs(e) for name, e in errs.items()) / total if total > 0 else 0.0


def describe_errors(errs: dict[str, Any]) -> str:
    return ", ".join(
        f"{name} {e:+.1%}" if name != "mix" else f"mix {e:.3f} apart" for name, e in errs.items()
    )
