"""The search: the spec of one family (or of every family that takes the data) whose costs are
closest to a profile's.

Three stages, all seeded, over each family's space (``hpcdl.proxy.space``), in which the
profile's hints and the network's own structure (``hpcdl.proxy.layout``) have already fixed what
they say -- for a CNN whose layout the family can express, everything:

1. **Counting.** A candidate whose estimated training memory (:func:`training_bytes`) exceeds
   the memory available is left out before it is built. Candidates are ranked by the cheap
   figures, parameters and training FLOPs (the spec's exact analytic count, microseconds each):
   ``DRAWS`` random points of each family's space, then a compass search (every axis in turn
   steps by ±32, ±16, ... ±1 positions while that lowers the objective) from the points nearest
   to the family's presets (real architectures: a model like one of them is found again) and
   from the best ``STARTS`` distinct draws. Each compass search ends in its own local optimum. A
   second pass adds activation memory: it measures the best optimum's saved bytes once, scales
   every candidate's analytic estimate by measured / estimated (each family's estimate has its
   own bias) and searches again from the first pass's optima. The same seed and profile give the
   same optima.
2. **Screening.** Many networks share a parameter count and FLOPs (a ResNet and a wider plain
   CNN, an LSTM and a transformer); their activation memory and FLOP mix tell them apart. The
   best ``SCREENED`` optima of each family that reach the profile are built and their saved
   activations measured in one forward pass; their FLOP mix is counted on the meta device.
3. **Finalists.** The best of each family, then the second best of each, ... up to
   ``FINALISTS`` are measured as the profile was (kernel mix, step time) while the time budget
   lasts, and ranked by the whole objective. Which finalist wins can depend on these timings;
   the budget may be overrun by one finalist's measurement.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import torch

from hpcdl import metrics
from hpcdl.device import memory_capacity
from hpcdl.errors import HpcdlError
from hpcdl.measure import kernels
from hpcdl.proxy import objective as obj
from hpcdl.proxy import space as spaces
from hpcdl.proxy.document import Profile
from hpcdl.proxy.measure import measure, saved_bytes
from hpcdl.proxy.result import TOLERANCE, Candidate, FamilySearch, FitResult, Point
from hpcdl.proxy.training import spec_trainee
from hpcdl.workloads.crosscheck import decomposed
from hpcdl.workloads.spec import Spec

DRAWS = 400
STARTS = 16
STRIDES = (32, 16, 8, 4, 2, 1)
EVALUATIONS = 20000
"""candidates counted per family at most"""
SCREENED = 6
FINALISTS = 3
COUNTING_SHARE = 0.2
SCREENING_SHARE = 0.4
"""counting stops at this share of the budget, screening at this one"""


class FitError(HpcdlError):
    """No candidate of the family (or of any family) can be built here: none is a valid network,
    or none fits in the memory there is. (A fit that misses the tolerance is not an error: it
    returns the closest spec, see :attr:`FitResult.reached`.)"""


def training_bytes(spec: Spec) -> int:
    """Bytes training the spec with AdamW needs, estimated from its analytic count (weights,
    gradients, two moments, the batch's activations and loss tensors): known before it is built."""
    count = spec.count()
    sample = metrics.sample_memory(count.activation_bytes(spec.precision), spec.logits_elements)
    return metrics.memory_estimate(count.params, sample, spec.batch_size, "adamw")


def cheap_errors(profile: Profile, spec: Spec, memory_scale: float | None = None) -> dict[str, float]:
    """Errors of the analytic count: parameters, training FLOPs, and with ``memory_scale`` the
    activation estimate times that scale (the family's measured / estimated bytes)."""
    count = spec.count()
    figures: dict[str, float] = {"params": count.params, "train_flops_per_sample": count.train_flops}
    if memory_scale:
        figures["activation_bytes_per_sample"] = count.activation_bytes(spec.precision) * memory_scale
    return obj.errors(profile, figures)


def search_family(
    profile: Profile,
    sp: spaces.Space,
    weights: obj.Weights,
    *,
    seed: int,
    evaluations: int,
    deadline: float,
    memory_scale: float | None = None,
    starts: list[Point] | None = None,
    capacity: int | None = None,
) -> FamilySearch:
    """Stage 1 in one family's space: compass searches from ``starts`` (default: the presets'
    points and the best random draws) ranked by the analytic figures. A candidate whose
    estimated training memory exceeds ``capacity`` bytes is not a candidate: it is never built."""
    rng = random.Random(f"hpcdl.fit:{sp.family}:{seed}")
    result = FamilySearch(sp.family)
    cheap = obj.Weights(
        params=weights.params,
        flops=weights.flops,
        memory=weights.memory if memory_scale else 0,
        mix=0,
        time=0,
    )
    scores: dict[Point, float] = {}
    specs: dict[Point, Candidate] = {}

    def score(point: Point) -> float:
        if point in scores:
            return scores[point]
        # the random draws are always counted (microseconds each): a deadline met before them,
        # on a loaded machine or with a tiny budget, would leave a random point as the best
        late = result.evaluations >= min(DRAWS, evaluations) and time.monotonic() > deadline
        if result.evaluations >= evaluations or late:
            result.cut_by_budget = True
            return float("inf")
        result.evaluations += 1
        spec = sp.spec(point)
        value = float("inf")
        if spec is not None and capacity is not None and training_bytes(spec) > capacity:
            result.too_large += 1
            spec = None
        if spec is not None:
            errs = cheap_errors(profile, spec, memory_scale)
            value = obj.objective(errs, cheap)
            specs[point] = Candidate(spec, errs, value)
        scores[point] = value
        return value

    if starts is None:
        sizes = [len(axis) for axis in sp.axes.values()]
        draws = sorted({tuple(rng.randrange(n) for n in sizes) for _ in range(DRAWS)}, key=score)
        starts = sp.anchors() + [d for d in draws if scores.get(d, float("inf")) < float("inf")][:STARTS]
    optima: dict[str, tuple[Point, Candidate]] = {}
    for start in starts:
        end = _compass(start, [len(axis) for axis in sp.axes.values()], score)
        if end in specs:
            optima.setdefault(repr(specs[end].spec.to_dict()), (end, specs[end]))
    ranked = sorted(optima.values(), key=lambda pc: pc[1].objective)
    result.ends = [p for p, _ in ranked]
    result.optima = [c for _, c in ranked]
    return result


def memory_scale(profile: Profile, spec: Spec) -> float | None:
    """Measured / estimated activation bytes of one spec: the family's estimate's bias, by
    which the second counting pass scales every candidate's estimate."""
    estimate = spec.count().activation_bytes(spec.precision)
    if "activation_bytes_per_sample" not in profile.figures or estimate <= 0:
        return None
    return saved_bytes(spec_trainee(spec.replace(batch_size=2))) / 2 / estimate


def _compass(point: Point, sizes: list[int], score: Callable[[Point], float]) -> Point:
    """Step each axis by ±stride while that improves the score, strides shrinking to 1."""
    best = score(point)
    for stride in STRIDES:
        improved = True
        while improved:
            improved = False
            for axis, size in enumerate(sizes):
                for move in (stride, -stride):
                    i = point[axis] + move
                    if not 0 <= i < size:
                        continue
                    trial = (*point[:axis], i, *point[axis + 1 :])
                    value = score(trial)
                    if value < best:
                        point, best, improved = trial, value, True
    return point


def flop_mix(spec: Spec) -> dict[str, float]:
    """The spec's FLOP mix, counted on the meta device: shapes only, no memory, no arithmetic."""
    with torch.device("meta"):
        model = spec.build_module().train()
    # two samples: batch norm refuses one when a map has shrunk to one pixel
    inputs = spec.sample_inputs(2, torch.Generator(), torch.device("cpu")).to("meta")
    with decomposed(), kernels.counter() as count:
        model(inputs).float().sum().backward()
    return kernels.flop_shares(count.get_flop_counts(), model)


def screen(profile: Profile, c: Candidate, weights: obj.Weights) -> None:
    """Add the memory and FLOP-mix errors: saved activations in one forward pass of two samples
    (batch norm needs two when a map shrinks to one pixel), the mix counted on the meta device."""
    figures: dict[str, float] = {}
    if "activation_bytes_per_sample" in profile.figures:
        figures["activation_bytes_per_sample"] = saved_bytes(spec_trainee(c.spec.replace(batch_size=2))) / 2
    mix = flop_mix(c.spec) if profile.flop_mix else None
    c.errors |= {
        k: v for k, v in obj.errors(profile, figures, flop_mix=mix).items() if k in ("memory", "mix")
    }
    c.objective = obj.objective(c.errors, weights)


def measure_candidate(profile: Profile, c: Candidate, weights: obj.Weights, device: Any, steps: int) -> None:
    """Measure a finalist as the profile was measured, and score it on every figure."""
    m = measure(spec_trainee(c.spec, device), name=c.spec.family, steps=steps)
    c.errors = obj.errors(profile, m.figures, m.time_mix, m.flop_mix, m.step_time_spread["reference_s"])
    c.objective = obj.objective(c.errors, weights)
    c.measured = {
        "figures": m.figures,
        "step_time_spread": m.step_time_spread,
        "time_mix": m.time_mix,
        "flop_mix": m.flop_mix,
    }


def count_family(
    profile: Profile,
    sp: spaces.Space,
    weights: obj.Weights,
    seed: int,
    evaluations: int,
    tolerance: float,
    deadlines: list[float],
    capacity: int | None = None,
) -> FamilySearch:
    """Stage 1 in one family: the first pass by parameters and FLOPs, then, when its best
    optimum reaches the profile, the second pass with memory from the first pass's optima."""
    first = search_family(
        profile, sp, weights, seed=seed, evaluations=evaluations, deadline=deadlines[0], capacity=capacity
    )
    if not (first.optima and weights.memory and _reaches(first.optima[0], tolerance)):
        return first
    scale = memory_scale(profile, first.optima[0].spec)
    if not scale:
        return first
    second = search_family(
        profile,
        sp,
        weights,
        seed=seed,
        evaluations=evaluations,
        deadline=deadlines[1],
        memory_scale=scale,
        starts=first.ends,
        capacity=capacity,
    )
    second.evaluations += first.evaluations
    second.too_large += first.too_large
    second.cut_by_budget |= first.cut_by_budget
    second.memory_scale = scale
    return second


def fit(
    profile: Profile,
    family: str | None = None,
    *,
    weights: obj.Weights | None = None,
    seed: int = 0,
    budget_s: float = 300.0,
    finalists: int = FINALISTS,
    evaluations: int = EVALUATIONS,
    tolerance: float = TOLERANCE,
    device: torch.device | str = "cpu",
    steps: int = 5,
    memory_bytes: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> FitResult:
    """Search one family's knobs (or every family's that takes the profile's data) for the spec
    that best matches ``profile`` under the objective of :mod:`hpcdl.proxy.objective`, within
    ``budget_s`` seconds; finalists are measured on ``device`` with ``steps`` timed steps.

    Candidates whose estimated training memory exceeds ``memory_bytes`` (default: the memory
    available on ``device``, ``hpcdl.device.memory_capacity``) are left out before any
    is built. A miss is still an answer: when no candidate reaches parameters and training FLOPs
    within ``tolerance``, the closest ones are measured all the same and the result says so
    (``FitResult.reached`` is False, ``FitResult.miss`` says by how much). Only when no valid
    candidate exists at all (none fits in memory) does it raise :class:`FitError`."""
    say = progress or (lambda _: None)
    weights = weights or obj.Weights()
    capacity = memory_bytes if memory_bytes is not None else memory_capacity(torch.device(device))
    start = time.monotonic()

    def left(share: float = 1.0) -> float:
        return start + budget_s * share - time.monotonic()

    searches = []
    chosen = [spaces.space(profile, family)] if family else spaces.spaces(profile)
    for n, sp in enumerate(chosen):
        # each family gets an equal share of the counting time, each of its two passes half
        ends = [start + budget_s * COUNTING_SHARE * (n + k) / len(chosen) for k in (0.5, 1)]
        s = count_family(profile, sp, weights, seed, evaluations, tolerance, ends, capacity)
        summary = obj.describe_errors(s.optima[0].errors) if s.optima else "none valid"
        say(f"{sp.family}: {s.evaluations} candidates counted, {len(s.optima)} optima, best: {summary}")
        searches.append(s)
    if not any(s.optima for s in searches):
        raise FitError(_nothing_fits(searches, family, capacity))
    reaching = [[c for c in s.optima if _reaches(c, tolerance)][:SCREENED] for s in searches]
    reached = any(reaching)
    if not reached:  # the closest of each family instead: a miss is still an answer
        reaching = [s.optima[:SCREENED] for s in searches]
        say(_unreachable(profile, searches, family, tolerance) + "; measuring the closest")
    say(f"screening {sum(map(len, reaching))} candidates by activation memory and FLOP mix")
    screened: list[list[Candidate]] = [[] for _ in reaching]
    for i in range(SCREENED):  # the families in turn, best first
        for done, family_optima in zip(screened, reaching, strict=True):
            if i < len(family_optima) and (not any(screened) or left(SCREENING_SHARE) > 0):
                screen(profile, family_optima[i], weights)
                done.append(family_optima[i])
    # finalists: the best of each family (the closest family first), then the second of each, ...
    ranked = sorted(
        (sorted(done, key=lambda c: c.objective) for done in screened if done), key=lambda d: d[0].objective
    )
    order = [done[i] for i in range(finalists) for done in ranked if i < len(done)]
    measured: list[Candidate] = []
    slowest = 0.0
    for c in order[:finalists]:
        if measured and left() < slowest * 1.2:
            break
        began = time.monotonic()
        say(f"measuring finalist {len(measured) + 1}: {c.spec.family} {describe_spec(c.spec)}")
        measure_candidate(profile, c, weights, device, steps)
        slowest = max(slowest, time.monotonic() - began)
        measured.append(c)
    best = min(measured, key=lambda c: c.objective)
    return FitResult(
        profile,
        best,
        measured,
        searches,
        weights,
        seed,
        budget_s,
        time.monotonic() - start,
        tolerance=tolerance,
        reached=_reaches(best, tolerance),
        memory_bytes=capacity,
    )


def _reaches(c: Candidate, tolerance: float) -> bool:
    return all(abs(c.errors.get(name, 0.0)) <= tolerance for name in obj.CHEAP)


def describe_spec(spec: Spec) -> str:
    """The knobs that differ from the family's defaults, as ``key=value`` words."""
    base = type(spec)().to_dict()
    return " ".join(f"{k}={v}" for k, v in spec.to_dict().items() if k != "family" and base.get(k) != v)


def _nothing_fits(searches: list[FamilySearch], family: str | None, capacity: int) -> str:
    refused = sum(s.too_large for s in searches)
    who = f"family {family} has no" if family else "no family has a"
    why = (
        f"{refused} candidates would need more than the {capacity / 2**30:.1f} GiB available"
        if refused
        else "no candidate is a valid network"
    )
    return f"fit: {who} candidate that can be built here: {why}"


def _unreachable(profile: Profile, searches: list[FamilySearch], family: str | None, tolerance: float) -> str:
    parts = []
    for s in searches:
        if not s.optima:
            parts.append(f"{s.family}: no valid spec")
            continue
        params, flops = s.optima[0].errors["params"], s.optima[0].errors["flops"]
        parts.append(
            f"{s.family}'s best fit is off by {params:+.1%} in parameters, {flops:+.1%} in training FLOPs"
        )
    who = f"family {family} cannot reach" if family else "no family reaches"
    return f"fit: {who} the profile within {tolerance:.0%}: {'; '.join(parts)}"
