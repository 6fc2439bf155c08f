"""The workload families, by name. A family is one module that registers its spec class with
``@FAMILIES.register``: the built-in ones live in ``hpcdl/workloads/families/`` (each module
there is imported), others come from plugins (``hpcdl.plugins``)."""

from __future__ import annotations

from typing import Any

from hpcdl.errors import SpecError
from hpcdl.plugins import Registry
from hpcdl.workloads.spec import Spec

FAMILIES: Registry[type[Spec]] = Registry(
    "family", "hpcdl.workloads.families", key=lambda cls: cls.family, error=SpecError
)


def family_class(name: Any) -> type[Spec]:
    """The spec class of a family name, or a one-line error listing the families."""
    return FAMILIES.get(name)


def spec_from_dict(d: dict[str, Any]) -> Spec:
    """Build a validated spec from ``{"family": ..., **knobs}`` (as ``Spec.to_dict`` writes it)."""
    if not isinstance(d, dict):
        raise SpecError("spec", d, "expected a table of knobs with a 'family' key")
    cls = family_class(d.get("family"))
    return cls.from_dict({k: v for k, v in d.items() if k != "family"})


def canonical(spec: Any) -> dict[str, Any] | None:
    """A spec as a record or manifest wrote it, rebuilt with today's knobs (defaults of knobs
    added since filled in), so that specs compare equal across versions; None when it no
    longer builds."""
    try:
        return spec_from_dict(dict(spec)).to_dict()
    except (SpecError, TypeError, ValueError):
        return None


def parse_assignments(cls: type[Spec], words: list[str]) -> dict[str, Any]:
    """Command-line ``key=value`` words as typed knob values of the family ``cls``."""
    knobs: dict[str, Any] = {}
    for word in words:
        key, sep, text = word.partition("=")
        if not sep or not key:
            raise SpecError("knob", word, "expected key=value, e.g. layers=4")
        knobs[key] = cls.parse_knob(key, text)
    return knobs


def spec_from_args(family: str, words: list[str]) -> Spec:
    """Build a spec from command-line ``key=value`` words."""
    cls = family_class(family)
    return spec_from_dict({"family": family, **parse_assignments(cls, words)})


def spec_to_args(spec: Spec) -> list[str]:
    """The inverse of :func:`spec_from_args`: ``--workload FAMILY key=value ...``."""
    words = []
    for key, value in spec.to_dict().items():
        if key != "family":
            words.append(f"{key}={','.join(map(str, value)) if isinstance(value, list) else value}")
    return ["--workload", spec.family, *words]
