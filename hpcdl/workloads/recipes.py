"""Recipes: named workloads read from the TOML files of the repository's ``generators/`` folder
(installed with the package as its data, ``hpcdl/recipes``, a link to that folder).

* ``generators/presets.toml``: presets that mimic known models (ResNet-50, BERT-base, ...);
* ``generators/rates.toml``: published training rates of some presets on one device;
* ``generators/suites/<CLASS>.toml``: the standard suite of each size class, a fixed and
  versioned list of workloads (``S`` is the default of ``hpcdl run``).
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

from hpcdl.errors import InputError, SpecError
from hpcdl.workloads.registry import spec_from_dict
from hpcdl.workloads.spec import Spec

DEFAULT_CLASS = "S"
TUNABLE = ("batch_size", "accumulation_steps", "precision", "seed")
"""the knobs a submitter may change and still run a class's workload (docs/rules.md, 3.2);
every other knob the class fixes"""
NODE_DEVICES = 8
"""the devices of the node a class's default layouts are made for"""


def _folder() -> Traversable:
    return files("hpcdl") / "recipes"


def _read(item: Traversable) -> dict[str, Any]:
    return tomllib.loads(item.read_text(encoding="utf-8"))


@functools.cache
def presets() -> dict[str, dict[str, Any]]:
    """Preset name -> ``{"family": ..., **knobs}``."""
    return _read(_folder() / "presets.toml")


@functools.cache
def anchors() -> dict[str, dict[str, Any]]:
    """Class M workload name -> what the best open implementation of its model reaches per GPU
    (``samples_per_s`` or ``mfu``, with ``device``, ``source`` and ``note``): ``anchors.toml``."""
    return _read(_folder() / "anchors.toml")


@functools.cache
def rates() -> dict[str, dict[str, Any]]:
    """Preset name -> a published training rate of one device (``samples_per_s``, ``device``,
    ``precision``, ``batch``, ``source``): where ``hpcdl predict`` starts when given no rate
    (``rates.toml``)."""
    return _read(_folder() / "rates.toml")


def preset(name: str, **overrides: Any) -> Spec:
    """The spec of a named workload with knobs overridden: a preset (``resnet50``,
    ``gpt2_small``, ...) or any size class's workload (``cnn-resnet-small``, ``gpt2-small``), as
    ``hpcdl generate`` takes them (:func:`named_workloads`)."""
    table = named_workloads()
    if name not in table:
        classes = ", ".join(size_classes())
        raise SpecError(
            "preset", name, f"a preset ({', '.join(presets())}) or a workload of class {classes} (hpcdl list)"
        )
    return spec_from_dict({**table[name], **overrides})


def named_workloads() -> dict[str, dict[str, Any]]:
    """Every name ``hpcdl generate`` takes besides a family: each size class's workloads
    (``deepspeech2``, ``gpt2-small``, ...; smallest class first) and the presets, which win a
    shared name."""
    found: dict[str, dict[str, Any]] = {}
    for size_class in size_classes():
        for name, d in suite(size_class).workloads.items():
            found.setdefault(name, d)
    return {**found, **presets()}


@dataclass(frozen=True)
class Suite:
    """One size class of the standard suite."""

    size_class: str
    version: int
    description: str
    workloads: dict[str, dict[str, Any]]
    """workload name -> ``{"family": ..., **knobs}``, in the file's order"""
    published: dict[str, dict[str, Any]]
    """workload name -> the original model's figures (``params``, ``forward_macs``, ``source``)
    that its analytic counts must match within 2 %"""
    layouts: dict[str, dict[str, str]] = field(default_factory=dict)
    """workload name -> its default parallel layout for one node of ``NODE_DEVICES`` devices
    (``node``) and for several (``multi_node``): ``[layouts.NAME]`` of the class's file"""
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    """workload name -> run settings it trains with unless the command line sets them (``lr``):
    ``[settings.NAME]`` of the class's file"""
    mode: str = "eager"
    """how the class's steps execute unless the command line says (``--compile``, ``--eager``):
    ``mode`` of the class's file (``measure.execution``)"""

    def default_layout(self, name: str, nodes: int) -> str:
        """The default layout of workload ``name`` for a job on ``nodes`` nodes: its ``node``
        or ``multi_node`` layout, or '' (data parallelism) where it names none."""
        return self.layouts.get(name, {}).get("node" if nodes == 1 else "multi_node", "")

    def specs(self, **overrides: Any) -> dict[str, Spec]:
        """The specs by workload name; ``overrides`` (e.g. precision) apply to each."""
        return {name: spec_from_dict({**d, **overrides}) for name, d in self.workloads.items()}


def size_classes() -> list[str]:
    """The classes there are, smallest first (S, M, L, ...: by the files in ``suites/``)."""
    order = {"S": 0, "M": 1, "L": 2}
    names = [
        f.name.removesuffix(".toml") for f in (_folder() / "suites").iterdir() if f.name.endswith(".toml")
    ]
    return sorted(names, key=lambda n: (order.get(n, len(order)), n))


@functools.cache
def suite(size_class: str = DEFAULT_CLASS) -> Suite:
    """The standard suite of a size class."""
    if size_class not in size_classes():
        raise InputError("class", size_class, "allowed: " + ", ".join(size_classes()))
    doc = _read(_folder() / "suites" / f"{size_class}.toml")
    return Suite(
        doc["class"],
        int(doc["version"]),
        str(doc.get("description", "")),
        dict(doc["workloads"]),
        dict(doc.get("published", {})),
        dict(doc.get("layouts", {})),
        dict(doc.get("settings", {})),
        str(doc.get("mode", "eager")),
    )
