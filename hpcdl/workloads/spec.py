"""The base of every workload spec: frozen, keyword-only dataclasses whose fields ("knobs")
carry their own documentation and limits, validated on construction.

A family subclasses :class:`Spec`, declares its knobs with :func:`knob`, and implements
``build``, ``count``, ``sample_inputs`` and ``target_shape`` in the same module, so that the
network and its analytic FLOP count stay side by side.
"""

from __future__ import annotations

import dataclasses
import math
import random
import types
import typing
from collections.abc import Sequence
from typing import Any, ClassVar, Self

import torch
from torch import nn

from hpcdl import metrics
from hpcdl.errors import SpecError
from hpcdl.workloads.counting import Count
from hpcdl.workloads.precision import PRECISIONS

Ranges = dict[str, list[Any]]
"""knob (or derived quantity) -> the values to draw from"""


def knob(
    default: Any,
    *,
    doc: str,
    lo: float | None = None,
    hi: float | None = None,
    choices: Sequence[Any] | None = None,
) -> Any:
    """A spec field with its documentation and allowed values (``lo``/``hi`` inclusive;
    for tuple-valued knobs the limits apply to each element)."""
    meta = {"doc": doc, "lo": lo, "hi": hi, "choices": tuple(choices) if choices is not None else None}
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Knobs:
    """A frozen set of validated settings; errors are reported as ``{prefix}.{knob}``."""

    prefix: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _checked(self, f, getattr(self, f.name)))
        self.check()

    def check(self) -> None:
        """Cross-knob constraints; raise :class:`SpecError` naming the knob."""

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready dict of the knobs."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def replace(self, **changes: Any) -> Self:
        """A copy with some knobs changed (validated again)."""
        valid = self.knobs()
        for key, value in changes.items():
            if key not in valid:
                raise SpecError(f"{self.prefix}.{key}", value, _valid_keys(type(self)))
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        """Validated instance from a dict of knobs; unknown keys are errors."""
        valid = cls.knobs()
        for key, value in d.items():
            if key not in valid:
                raise SpecError(f"{cls.prefix}.{key}", value, _valid_keys(cls))
        return cls(**d)

    @classmethod
    def knobs(cls) -> dict[str, dataclasses.Field[Any]]:
        """The knobs, by name, in declaration order."""
        return {f.name: f for f in dataclasses.fields(cls)}

    @classmethod
    def parse_knob(cls, name: str, text: str) -> Any:
        """Convert a command-line string (``"3,4,6,3"``, ``"true"``, ``"256"``) to the knob's type."""
        if name not in cls.knobs():
            raise SpecError(f"{cls.prefix}.{name}", text, _valid_keys(cls))
        kind, elem = _kind(cls, name)
        if kind is tuple:
            parts = [p for p in text.replace(" ", "").split(",") if p]
            return tuple(_parse_scalar(cls, name, elem, p) for p in parts)
        return _parse_scalar(cls, name, kind, text)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spec(Knobs):
    """A workload: the knobs common to every family, and what each family must provide."""

    family: ClassVar[str] = ""
    sampling: ClassVar[Ranges] = {}
    """knob -> the values ``hpcdl generate FAMILY --sample SEED`` draws from, uniformly; a
    family may also name derived quantities here and turn them into knobs in ``from_drawn``"""

    batch_size: int = knob(32, lo=1, hi=1 << 20, doc="samples per rank per step")
    precision: str = knob("fp32", choices=PRECISIONS, doc="compute precision (bf16/fp16 use autocast)")
    seed: int = knob(0, lo=0, hi=2**63 - 1, doc="seeds weights and data: same seed, same model and data")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.prefix = cls.family

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready dict with the family name first; ``spec_from_dict`` inverts it."""
        return {"family": self.family, **super().to_dict()}

    # --- to be provided by each family -------------------------------------------------
    def build_module(self) -> nn.Module:
        """The network (on the CPU, in fp32); called by :meth:`build` under the spec's seed.
        Its output is logits of shape ``(batch, *target_shape(), num_classes)``."""
        raise TypeError(f"{type(self).__name__} does not define build_module")

    def count(self) -> Count:
        """Parameters, FLOPs and activations of one sample, from the knobs alone."""
        raise TypeError(f"{type(self).__name__} does not define count")

    def sample_inputs(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        """``n`` random input samples (images, token ids, features, spectrograms)."""
        raise TypeError(f"{type(self).__name__} does not define sample_inputs")

    def target_shape(self) -> tuple[int, ...]:
        """Shape of one sample's labels: ``()`` for one label, ``(T,)`` for one per position."""
        return ()

    @property
    def num_classes(self) -> int:
        """Size of the last dimension of the logits."""
        raise TypeError(f"{type(self).__name__} does not define num_classes")

    @classmethod
    def from_drawn(cls, drawn: dict[str, Any], ranges: Ranges, rng: random.Random) -> dict[str, Any]:
        """Knobs from the values drawn from ``sampling`` (or the caller's ranges): by default the
        values themselves; a family whose ranges name derived quantities (a width per head, a
        block count per stage) turns them into knobs here, drawing more from ``rng`` if needed.
        Knobs the caller fixed are already in ``drawn`` and must be kept."""
        return drawn

    @property
    def logits_elements(self) -> int:
        """Elements of one sample's logits (one row of ``num_classes`` per label)."""
        return math.prod(self.target_shape()) * self.num_classes

    def memory_per_sample(self) -> int:
        """Bytes one sample adds to a training step (``metrics.sample_memory``)."""
        return metrics.sample_memory(self.count().activation_bytes(self.precision), self.logits_elements)

    def build(self) -> nn.Module:
        """The network with weights drawn from ``seed``: the same spec gives the same weights."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self.build_module()


def _valid_keys(cls: type[Knobs]) -> str:
    return "valid knobs are " + ", ".join(cls.knobs())


def _kind(cls: type[Knobs], name: str) -> tuple[type, type]:
    """(container, element) type of a knob: (int, int), (tuple, int), (str, str), ..."""
    hint = typing.get_type_hints(cls)[name]
    origin = typing.get_origin(hint)
    if origin is tuple:
        return tuple, typing.get_args(hint)[0]
    if origin in (types.UnionType, typing.Union):  # "int | None"
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint, hint


def _parse_scalar(cls: type[Knobs], name: str, kind: type, text: str) -> Any:
    field = f"{cls.prefix}.{name}"
    if kind is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise SpecError(field, text, "expected a boolean (true/false)")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise SpecError(field, text, "expected an integer") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise SpecError(field, text, "expected a number") from None
    return text


def _type_ok(kind: type, value: Any) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _describe(kind: type) -> str:
    return {int: "an integer", float: "a number", bool: "a boolean", str: "a string"}.get(kind, kind.__name__)


def _checked(obj: Knobs, f: dataclasses.Field[Any], value: Any) -> Any:
    """Validate one knob's type and range; return it normalised (lists become tuples)."""
    cls = type(obj)
    field = f"{cls.prefix}.{f.name}"
    kind, elem = _kind(cls, f.name)
    if kind is tuple:
        may_be_empty = f.default == ()  # a list knob that defaults to empty (job.env) may stay empty
        if not isinstance(value, list | tuple) or not (value or may_be_empty):
            what = "a list" if may_be_empty else "a non-empty list"
            raise SpecError(field, value, f"expected {what} of {_describe(elem)}s")
        return tuple(_check_scalar(field, f, elem, v) for v in value)
    return _check_scalar(field, f, kind, value)


def _check_scalar(field: str, f: dataclasses.Field[Any], kind: type, value: Any) -> Any:
    if not _type_ok(kind, value):
        raise SpecError(field, value, f"expected {_describe(kind)}")
    if kind is float and not math.isfinite(value):
        raise SpecError(field, value, "must be a finite number")
    choices, lo, hi = f.metadata.get("choices"), f.metadata.get("lo"), f.metadata.get("hi")
    if choices is not None and value not in choices:
        raise SpecError(field, value, "allowed: " + ", ".join(map(str, choices)))
    if lo is not None and value < lo or hi is not None and value > hi:
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        raise SpecError(field, value, f"must be in [{lo_s}, {hi_s}]")
    return float(value) if kind is float else value
