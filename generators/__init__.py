"""Standard workload recipes: the default suite, presets that mimic known models, and
generative sampling of architectures within knob ranges."""

from __future__ import annotations

from typing import Any

from generators.presets import PRESETS
from generators.sampling import RANGES, sample_spec
from generators.suite import DEFAULT_SUITE
from hpcdl.errors import SpecError
from hpcdl.workloads.registry import spec_from_dict
from hpcdl.workloads.spec import Spec


def preset(name: str, **overrides: Any) -> Spec:
    """The spec of a named preset (``resnet50``, ``gpt2_small``, ...) with knobs overridden."""
    if name not in PRESETS:
        raise SpecError("preset", name, "allowed: " + ", ".join(PRESETS))
    return spec_from_dict({**PRESETS[name], **overrides})


def default_suite(**overrides: Any) -> dict[str, Spec]:
    """The default suite's specs by name; ``overrides`` (e.g. precision) apply to each."""
    return {name: spec_from_dict({**d, **overrides}) for name, d in DEFAULT_SUITE.items()}


__all__ = ["DEFAULT_SUITE", "PRESETS", "RANGES", "default_suite", "preset", "sample_spec"]
