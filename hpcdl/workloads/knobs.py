"""Knobs: frozen, keyword-only dataclasses whose fields carry their own documentation and
limits, validated on construction, with one-line errors that name the field, the value and
what is allowed. Workload specs, run settings and job files are all made of knobs."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Sequence
from typing import Any, ClassVar, Self

from hpcdl.errors import SpecError


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
    def numeric(cls) -> list[str]:
        """The knobs that hold one number, an integer or not (what ``hpcdl sweep --knob`` varies)."""
        return [name for name in cls.knobs() if _kind(cls, name)[0] in (int, float)]

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


def _valid_keys(cls: type[Knobs]) -> str:
    return "valid knobs are " + ", ".join(cls.knobs())


_KINDS: dict[tuple[type, str], tuple[type, type]] = {}
"""_kind's answers: get_type_hints evaluates every annotation of the class (milliseconds a call,
once per knob of every spec built: a fit builds thousands)"""


def _kind(cls: type[Knobs], name: str) -> tuple[type, type]:
    """(container, element) type of a knob: (int, int), (tuple, int), (str, str), ..."""
    found = _KINDS.get((cls, name))
    if found is None:
        found = _KINDS[(cls, name)] = _kind_of(cls, name)
    return found


def _kind_of(cls: type[Knobs], name: str) -> tuple[type, type]:
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
