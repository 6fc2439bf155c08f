"""A job file's ``[workload]`` table: a preset with knob overrides, a family with its knobs, a
sampled workload, a spec file, or a size class (its whole suite); every error names the field as
the job file writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcdl.errors import SpecError
from hpcdl.workloads import recipes
from hpcdl.workloads.registry import FAMILIES, family_class, spec_from_dict
from hpcdl.workloads.sampling import sample_spec
from hpcdl.workloads.spec import Spec
from hpcdl.workloads.specfile import spec_file

KINDS = ("preset", "family", "sample", "spec", "class")
"""what a ``[workload]`` table names, exactly one of"""


def workload_fields(
    w: dict[str, Any], *, precision_set: bool = False, base: Path | None = None
) -> dict[str, Any]:
    """The job's fields a ``[workload]`` table gives: ``workload`` (a spec), or for
    ``class = "S"`` (with ``version``, and knobs a class lets a submitter tune) ``size_class`` and
    ``class_knobs``. ``base``: the folder a ``spec = "FILE"`` is relative to (the job file's)."""
    kinds = [k for k in KINDS if k in w]
    if len(kinds) != 1:
        raise SpecError("job.workload", sorted(w), "exactly one of " + ", ".join(f"{k}=" for k in KINDS))
    if kinds == ["class"]:
        if precision_set and "precision" in w:
            raise SpecError("job.workload.precision", w["precision"], "set precision once: job.precision")
        return class_fields(w)
    return {"workload": workload_spec(w, precision_set=precision_set, base=base)}


def class_fields(w: dict[str, Any]) -> dict[str, Any]:
    """``size_class`` and ``class_knobs`` of a class table: the class must exist, its version (if
    given) be the one this hpcdl holds, and every other key a knob the class lets a submitter
    tune (checked by building the suite with it)."""
    from hpcdl.harness.classes import class_specs  # torch: only where a class job is read

    size_class = w["class"]
    if not isinstance(size_class, str) or size_class not in recipes.size_classes():
        raise SpecError("job.workload.class", size_class, "allowed: " + ", ".join(recipes.size_classes()))
    version = recipes.suite(size_class).version
    given = w.get("version", version)
    if given != version:
        raise SpecError(
            "job.workload.version", given, f"class {size_class} is at version {version} in this hpcdl"
        )
    knobs = {k: v for k, v in w.items() if k not in ("class", "version")}
    try:
        class_specs(size_class, knobs, "job.workload")
    except SpecError as e:  # a tunable knob's value: cnn.batch_size -> job.workload.batch_size
        family, _, knob_name = e.field.partition(".")
        raise SpecError(
            f"job.workload.{knob_name}" if family in FAMILIES else e.field, e.value, e.allowed
        ) from None
    return {"size_class": size_class, "class_knobs": tuple(f"{k}={v}" for k, v in knobs.items())}


def workload_spec(w: dict[str, Any], *, precision_set: bool = False, base: Path | None = None) -> Spec:
    """The spec of a ``[workload]`` table: ``preset=`` with knob overrides, ``family=`` with
    knobs, ``sample={family=..., seed=..., ranges={...}}`` with fixed knobs, or ``spec=FILE`` (a
    saved spec, such as ``hpcdl fit -o``'s) with knob overrides."""
    kinds = [k for k in KINDS if k in w and k != "class"]
    if len(kinds) != 1:
        raise SpecError("job.workload", sorted(w), "exactly one of preset=, family=, sample=, spec=")
    (kind,) = kinds
    if precision_set and "precision" in w:
        raise SpecError("job.workload.precision", w["precision"], "set precision once: job.precision")
    if kind != "sample" and not isinstance(w[kind], str):
        raise SpecError(f"job.workload.{kind}", w[kind], "expected a string")
    knobs = {k: v for k, v in w.items() if k != kind}

    def build() -> Spec:
        if kind == "preset":
            return recipes.preset(w["preset"], **knobs)
        if kind == "family":
            return spec_from_dict(w)
        if kind == "spec":  # relative to the job file, not to where hpcdl submit runs
            path = Path(w["spec"])
            return spec_file(
                path if path.is_absolute() or base is None else base / path, "job.workload.spec", knobs
            )
        return sampled(w["sample"], knobs)

    try:
        return build()
    except SpecError as e:
        if e.field.startswith("job."):
            raise
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
