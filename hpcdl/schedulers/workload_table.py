"""A job file's ``[workload]`` table as a spec: a preset with knob overrides, a family with its
knobs, or a sampled workload; every error names the field as the job file writes it."""

from __future__ import annotations

from typing import Any

from hpcdl.errors import SpecError
from hpcdl.workloads import recipes
from hpcdl.workloads.registry import FAMILIES, family_class, spec_from_dict
from hpcdl.workloads.sampling import sample_spec
from hpcdl.workloads.spec import Spec


def workload_spec(w: dict[str, Any], *, precision_set: bool = False) -> Spec:
    """The spec of a ``[workload]`` table: ``preset=`` with knob overrides, ``family=`` with
    knobs, or ``sample={family=..., seed=..., ranges={...}}`` with fixed knobs."""
    kinds = [k for k in ("preset", "family", "sample") if k in w]
    if len(kinds) != 1:
        raise SpecError("job.workload", sorted(w), "exactly one of preset=, family=, sample= is required")
    if precision_set and "precision" in w:
        raise SpecError("job.workload.precision", w["precision"], "set precision once: job.precision")
    (kind,) = kinds
    if kind != "sample" and not isinstance(w[kind], str):
        raise SpecError(f"job.workload.{kind}", w[kind], "expected a string")
    knobs = {k: v for k, v in w.items() if k != kind}

    def build() -> Spec:
        if kind == "preset":
            return recipes.preset(w["preset"], **knobs)
        if kind == "family":
            return spec_from_dict(w)
        return sampled(w["sample"], knobs)

    try:
        return build()
    except SpecError as e:
        # cnn.batch_size -> job.workload.batch_size; preset -> job.workload.preset
        family, _, knob_name = e.field.partition(".")
        raise SpecError(
            f"job.workload.{knob_name if family in FAMILIES else e.field}", e.value, e.allowed
        ) from None


def sampled(sample: Any, fixed: dict[str, Any]) -> Spec:
    if not isinstance(sample, dict):
        raise SpecError("sample", sample, "expected a table {family=..., seed=...}")
    unknown = set(sample) - {"family", "seed", "ranges"}
    if unknown:
        raise SpecError(
            f"sample.{sorted(unknown)[0]}", sample, "unknown key; valid keys are family, seed, ranges"
        )
    family_class(sample.get("family"))
    seed = sample.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError("sample.seed", seed, "expected an integer >= 0")
    ranges = sample.get("ranges", {})
    if not isinstance(ranges, dict):
        raise SpecError("sample.ranges", ranges, "expected a table of knob = [values...]")
    return sample_spec(sample["family"], seed, ranges, **fixed)
