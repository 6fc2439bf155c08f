"""A size class run as the class asks, wherever it runs (``hpcdl run --class``, a class job's
point): its suite with the knobs a submitter may tune, its precision on this device, and each
workload's learning rate and default layout from the class's file. One place, so that a class
run on a login shell and one submitted to Slurm train the same way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hpcdl.errors import SpecError
from hpcdl.measure.config import RunConfig
from hpcdl.measure.peaks import has_bf16
from hpcdl.parallel.layout import parse_layout
from hpcdl.parallel.world import World
from hpcdl.workloads import recipes
from hpcdl.workloads.recipes import TUNABLE
from hpcdl.workloads.spec import Spec


def class_specs(size_class: str, overrides: Mapping[str, Any], field: str) -> dict[str, Spec]:
    """The class's suite by workload name, each with ``overrides`` (tunable knobs only); a knob
    the class fixes is refused in one line as ``FIELD.KNOB``."""
    for key, value in overrides.items():
        if key not in TUNABLE:
            allowed = f"class {size_class} fixes it; a class takes only {', '.join(TUNABLE)}"
            raise SpecError(f"{field}.{key}", value, allowed)
    return recipes.suite(size_class).specs(**overrides)


def stamped(cfg: RunConfig, size_class: str) -> RunConfig:
    """The run settings with the class and its version: what makes its records rank in its list."""
    return cfg.replace(suite_class=size_class, suite_version=recipes.suite(size_class).version)


def on_device(specs: Mapping[str, Spec], device: torch.device) -> tuple[dict[str, Spec], str]:
    """The specs as this device trains them: bf16 where it computes bf16, else fp32 (each
    record keeps the precision it ran); and the note that says so, or ''."""
    if not any(s.precision == "bf16" for s in specs.values()) or has_bf16(device):
        return dict(specs), ""
    out = {n: fp32_fallback(s) for n, s in specs.items()}
    return out, f"{device} has no bf16 arithmetic; running the class's bf16 workloads in fp32"


def fp32_fallback(spec: Spec) -> Spec:
    """The spec a device without bf16 trains instead of a bf16 one (the one rule, also for
    telling whether a point's record stands for its spec)."""
    return spec.replace(precision="fp32") if spec.precision == "bf16" else spec


def workload_settings(
    cfg: RunConfig, name: str, world: World, lr_given: bool = False, mode_given: bool = False
) -> RunConfig:
    """The run settings of a class's workload ``name``: its learning rate from the class's file
    (``Suite.settings``) unless ``--lr`` set one (``lr_given``), the class's execution mode
    (``Suite.mode``) unless ``--compile`` or ``--eager`` set one (``mode_given``), and the class's
    default layout for this job (``Suite.default_layout``) unless ``--layout`` names one; data
    parallelism where tp x pp of that layout does not divide the ranks."""
    if not cfg.suite_class:
        return cfg
    suite = recipes.suite(cfg.suite_class)
    if not mode_given:
        cfg = cfg.replace(mode=suite.mode)
    if not lr_given and "lr" in suite.settings.get(name, {}):
        cfg = cfg.replace(lr=float(suite.settings[name]["lr"]))
    if cfg.layout or world.size == 1:
        return cfg
    text = suite.default_layout(name, world.nodes)
    layout = parse_layout(text)
    return cfg.replace(layout=text) if world.size % (layout.tp * layout.pp) == 0 else cfg
