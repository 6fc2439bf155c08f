"""The profile: a small JSON document of what one training step of a model costs.

``hpcdl profile`` measures one from a real model; one can also be written by hand from
published figures (only ``input``, ``output`` and two figures are required). Every field is
validated when read, and a bad one is an :class:`~hpcdl.errors.InputError` naming it.

.. code-block:: json

    {"schema": "hpcdl.profile", "schema_version": 1, "name": "gpt2",
     "input": {"kind": "tokens", "shape": [128], "batch_size": 4},
     "output": {"shape": [128, 50257]},
     "precision": "fp32",
     "figures": {"params": 124439808, "train_flops_per_sample": 93000000000,
                 "activation_bytes_per_sample": 160000000, "step_time_s": 2.1},
     "kernel_mix": {"time": {"gemm": 0.6, "attention": 0.2, "elementwise": 0.15, "optimizer": 0.05}},
     "hints": {"dropout": 0.1, "activation": "gelu_tanh_composed", "causal": true}}
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcdl.errors import InputError
from hpcdl.measure.kernels import CLASSES
from hpcdl.proxy.structure import validate as validate_structure
from hpcdl.records.loader import Unreadable, read_object
from hpcdl.records.schema import PROFILE, PROFILE_VERSION
from hpcdl.workloads.precision import PRECISIONS

INPUT_KINDS = ("tokens", "features", "images")
"""what a sample is: token ids (shape ``[T]``), float features (``[F]`` or ``[T, F]``) or
images (``[C, H, W]``)"""
FIGURES = {
    "params": "trainable parameters",
    "forward_flops_per_sample": "forward FLOPs of one sample",
    "train_flops_per_sample": "forward + backward FLOPs of one sample",
    "activation_bytes_per_sample": "bytes autograd keeps for backward, per sample",
    "arithmetic_intensity": "training FLOPs per byte of the step's working set",
    "step_time_s": "median seconds of one training step of the batch",
}
REQUIRED = ("params", "train_flops_per_sample")
HINTS = {
    "dropout": "largest dropout probability in the model",
    "activation": "feed-forward activation (an attention activation name)",
    "causal": "causal self-attention",
    "attention_layers": "scaled-dot-product attention calls in one forward pass",
    "cell": "recurrent cell (lstm, gru, vanilla)",
    "recurrent_layers": "recurrent layers (all stacks)",
    "hidden": "hidden units of the first recurrent layer",
    "bidirectional": "whether the recurrent layers run both ways",
}
"""what each hint says; ``hpcdl profile`` writes those it can see, and a fit fixes the knobs they
name instead of searching them"""


@dataclass(frozen=True)
class Profile:
    """What one training step of a model costs, and the shape of its data."""

    name: str
    input_kind: str
    input_shape: tuple[int, ...]
    """one sample's shape"""
    batch_size: int
    output_shape: tuple[int, ...]
    """one sample's logits: ``[classes]`` or ``[T, classes]``"""
    figures: dict[str, float]
    precision: str = "fp32"
    time_mix: dict[str, float] = field(default_factory=dict)
    """share of the step's time in each operator class (``hpcdl.measure.kernels``); may be empty"""
    flop_mix: dict[str, float] = field(default_factory=dict)
    """share of the step's FLOPs in each kernel class; may be empty"""
    hints: dict[str, Any] = field(default_factory=dict)
    """features seen in the model that fix knobs of the fit (dropout, activation, ...)"""
    source: dict[str, Any] = field(default_factory=dict)
    """where the figures come from: ``{"ref": "pkg.mod:fn"}`` for a measured model, else free text"""
    environment: dict[str, Any] = field(default_factory=dict)
    """the machine that measured it (empty for a profile written by hand)"""
    step_time_spread: dict[str, float] = field(default_factory=dict)
    """p10, p90 and n of the step time, when measured"""
    structure: dict[str, Any] = field(default_factory=dict)
    """the network's layers as one forward pass ran them (``hpcdl.proxy.structure``); may be empty"""

    @property
    def classes(self) -> int:
        return self.output_shape[-1]

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (``from_dict`` reads it back)."""
        doc: dict[str, Any] = {
            "schema": PROFILE,
            "schema_version": PROFILE_VERSION,
            "name": self.name,
            "source": self.source,
            "input": {
                "kind": self.input_kind,
                "shape": list(self.input_shape),
                "batch_size": self.batch_size,
            },
            "output": {"shape": list(self.output_shape)},
            "precision": self.precision,
            "figures": dict(self.figures),
        }
        if self.step_time_spread:
            doc["step_time_spread"] = self.step_time_spread
        if self.time_mix or self.flop_mix:
            doc["kernel_mix"] = {k: v for k, v in (("time", self.time_mix), ("flops", self.flop_mix)) if v}
        if self.hints:
            doc["hints"] = self.hints
        if self.structure:
            doc["structure"] = self.structure
        if self.environment:
            doc["environment"] = self.environment
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> Profile:
        """A validated profile; a missing, negative or mistyped field raises ``InputError``."""
        if not isinstance(doc, dict):
            raise InputError("profile", type(doc).__name__, "expected a JSON object")
        if doc.get("schema") != PROFILE:
            raise InputError("profile.schema", doc.get("schema"), f"expected {PROFILE!r}")
        inp = _table(doc, "input")
        kind = inp.get("kind")
        if kind not in INPUT_KINDS:
            raise InputError("profile.input.kind", kind, "allowed: " + ", ".join(INPUT_KINDS))
        precision = doc.get("precision", "fp32")
        if precision not in PRECISIONS:
            raise InputError("profile.precision", precision, "allowed: " + ", ".join(PRECISIONS))
        mix = doc.get("kernel_mix", {})
        if not isinstance(mix, dict):
            raise InputError("profile.kernel_mix", mix, "expected a table with time and/or flops")
        hints = _hints(doc.get("hints", {}))
        return cls(
            name=str(doc.get("name", "model")),
            input_kind=kind,
            input_shape=_shape(inp.get("shape"), "profile.input.shape"),
            batch_size=_positive_int(inp.get("batch_size"), "profile.input.batch_size"),
            output_shape=_shape(_table(doc, "output").get("shape"), "profile.output.shape"),
            figures=_figures(_table(doc, "figures")),
            precision=precision,
            time_mix=_mix(mix.get("time", {}), "profile.kernel_mix.time"),
            flop_mix=_mix(mix.get("flops", {}), "profile.kernel_mix.flops"),
            hints=hints,
            source=_optional_table(doc, "source"),
            environment=_optional_table(doc, "environment"),
            step_time_spread=_optional_table(doc, "step_time_spread"),
            structure=validate_structure(doc["structure"]) if "structure" in doc else {},
        )


def load(path: Path) -> dict[str, Any]:
    """A JSON object from a file, read with the bounded reader of every hpcdl document (a
    regular file only, a size and a depth bound: a FIFO, ``/dev/zero`` or JSON nested 100,000
    deep is refused, not waited on or recursed into), or a one-line ``InputError``."""
    try:
        return read_object(path)
    except Unreadable as e:
        raise InputError("profile", str(path), str(e)) from None


def save(doc: dict[str, Any], path: Path) -> None:
    """Write a JSON document; a path that cannot be written is a one-line ``InputError``."""
    save_text(json.dumps(doc, indent=1) + "\n", path)


def save_text(text: str, path: Path) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise InputError("output", str(path), f"cannot be written ({e.strerror or e})") from None


def _table(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise InputError(f"profile.{key}", value, "expected a table (JSON object)")
    return value


def _optional_table(doc: dict[str, Any], key: str) -> dict[str, Any]:
    return _table(doc, key) if key in doc else {}


def _positive_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(where, value, "expected a positive integer")
    return value


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise InputError(where, value, "expected a non-empty list of positive integers")
    return tuple(_positive_int(v, where) for v in value)


def _figures(table: dict[str, Any]) -> dict[str, float]:
    for key in table:
        if key not in FIGURES:
            raise InputError(f"profile.figures.{key}", table[key], "allowed: " + ", ".join(FIGURES))
    for key in REQUIRED:
        if key not in table:
            raise InputError(f"profile.figures.{key}", None, f"is required ({FIGURES[key]})")
    out = {}
    for key, value in table.items():
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value <= 0:
            raise InputError(f"profile.figures.{key}", value, "expected a positive number")
        out[key] = value
    return out


def _mix(table: Any, where: str) -> dict[str, float]:
    if not isinstance(table, dict):
        raise InputError(where, table, "expected a table of kernel class -> share")
    for key, value in table.items():
        if key not in CLASSES:
            raise InputError(f"{where}.{key}", value, "allowed classes: " + ", ".join(CLASSES))
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
            raise InputError(f"{where}.{key}", value, "expected a share in [0, 1]")
    if table and not math.isclose(sum(table.values()), 1.0, abs_tol=0.02):
        raise InputError(where, table, f"shares must add up to 1 (they add up to {sum(table.values()):.3f})")
    return {cls: float(table.get(cls, 0.0)) for cls in CLASSES} if table else {}


def _hints(table: Any) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise InputError("profile.hints", table, "expected a table: " + ", ".join(HINTS))
    for key, value in table.items():
        where = f"profile.hints.{key}"
        if key not in HINTS:
            raise InputError(where, value, "allowed hints: " + ", ".join(HINTS))
        if key in ("causal", "bidirectional") and not isinstance(value, bool):
            raise InputError(where, value, "expected true or false")
        if key in ("activation", "cell") and not isinstance(value, str):
            raise InputError(where, value, "expected a name")
        if key in ("attention_layers", "recurrent_layers", "hidden"):
            _positive_int(value, where)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if key == "dropout" and not (number and 0 <= value < 1):
            raise InputError(where, value, "expected a probability in [0, 1)")
    return table
