"""JSON objects read as typed views (frozen dataclasses) and written back: :func:`parse` checks
every field against its type hint and names the first key that is missing or of the wrong type
(``metrics.per_rank[1].timed_steps: expected an integer, got 'x'``); keys a view does not name
are ignored, so a newer record still reads; fields with a default may be absent.
:func:`to_json` is its inverse. The views themselves are ``records.views``'."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from hpcdl.errors import HpcdlError

T = TypeVar("T")


class MalformedRecord(HpcdlError):
    """A record (or a block of it) lacks a key or holds a value of the wrong type."""


def parse(cls: type[T], data: Any, where: str = "record") -> T:
    """``data`` (a JSON object) as the view ``cls``, checked field by field."""
    if not isinstance(data, Mapping):
        raise MalformedRecord(f"{where}: expected an object, got {_short(data)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        path = f"{where}.{f.name}"
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise MalformedRecord(f"{path}: missing")
            continue
        values[f.name] = _value(hints[f.name], data[f.name], path)
    return cls(**values)


def to_json(view: Any) -> Any:
    """The JSON value of a view: nested views become objects; a field left at its default
    None is left out (it belongs to another kind of run), while a figure that is None without
    a default (an energy nobody could measure) is written as null."""
    if dataclasses.is_dataclass(view) and not isinstance(view, type):
        return {
            f.name: to_json(getattr(view, f.name))
            for f in dataclasses.fields(view)
            if f.compare and not (f.default is None and getattr(view, f.name) is None)
        }
    if isinstance(view, list):
        return [to_json(v) for v in view]
    if isinstance(view, dict):
        return {k: to_json(v) for k, v in view.items()}
    return view


def _value(hint: Any, value: Any, path: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        return _value(hint, value, path)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        return parse(hint, value, path)  # type: ignore[arg-type]
    if origin is list:
        if not isinstance(value, list):
            raise MalformedRecord(f"{path}: expected a list, got {_short(value)}")
        return [_value(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise MalformedRecord(f"{path}: expected an object, got {_short(value)}")
        return {str(k): _value(args[1], v, f"{path}.{k}") for k, v in value.items()}
    return _scalar(hint, value, path)


def _scalar(hint: Any, value: Any, path: str) -> Any:
    if isinstance(value, bool) and hint is not bool:
        raise MalformedRecord(f"{path}: expected {_NAMES.get(hint, hint)}, got {value!r}")
    if hint is float and isinstance(value, int | float):
        return float(value)  # JSON writes 2.0 as 2.0, but a hand-made record may say 2
    if hint in (int, str, bool) and isinstance(value, hint):
        return value
    raise MalformedRecord(f"{path}: expected {_NAMES.get(hint, hint)}, got {_short(value)}")


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
