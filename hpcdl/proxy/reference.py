"""A real model named by an import reference: ``package.module:callable`` (or
``path/to/file.py:callable``), a callable that returns ``(module, example_batch)`` or
``(module, example_batch, loss_fn)``."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from hpcdl.errors import HpcdlError, InputError
from hpcdl.proxy.training import Batch, LossFn, first_tensor

FIELD = "model"


@dataclass
class RealModel:
    """What an import reference's callable returned."""

    ref: str
    module: nn.Module
    batch: Batch
    loss_fn: LossFn | None


def _import(where: str, ref: str) -> ModuleType:
    if where.endswith(".py"):
        path = Path(where)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if not path.is_file() or spec is None or spec.loader is None:
            raise InputError(FIELD, ref, f"{where} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # as `python -m` does: the current folder's packages
    return importlib.import_module(where)


def resolve_syntax(ref: str) -> tuple[str, str]:
    """(module or file, attribute) of an import reference, checked without importing anything."""
    where, sep, attr = ref.partition(":")
    if not sep or not where or not attr:
        raise InputError(
            FIELD, ref, "expected an import reference MODULE:CALLABLE, e.g. mypkg.models:make_resnet"
        )
    if where.endswith(".py") and not Path(where).is_file():
        raise InputError(FIELD, ref, f"{where} is not a Python file")
    return where, attr


@contextlib.contextmanager
def user_code(ref: str, doing: str) -> Iterator[None]:
    """Around what runs the code a reference names (its import, its callable, its steps): an
    exception of that code is a one-line ``InputError`` naming the reference, what it was
    ``doing`` and the exception (exit 2), not its traceback. hpcdl's own errors (and running out
    of device memory, which the CLI says in its own line) pass as they are."""
    try:
        yield
    except HpcdlError:
        raise
    except Exception as e:
        if type(e).__name__ == "OutOfMemoryError":
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        said = f": {first if len(first) <= 200 else first[:197] + '...'}" if first else ""
        raise InputError(FIELD, ref, f"{doing} raised {type(e).__name__}{said}") from None


def resolve(ref: str) -> Any:
    """The callable an import reference names; a one-line ``InputError`` when it does not resolve.

    Importing runs the module's (or the file's) code: call this only with a reference the user
    gave on the command line or in Python, never with one read from a document (issue 16)."""
    where, attr = resolve_syntax(ref)
    with user_code(ref, f"importing {where}"):
        try:
            obj: Any = _import(where, ref)
        except ImportError as e:
            raise InputError(FIELD, ref, f"cannot be imported ({e})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(FIELD, ref, f"{where} has no attribute {attr}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InputError(FIELD, ref, f"{attr} is not callable")
    return obj


def load_model(ref: str) -> RealModel:
    """Call the reference and check that it returned a module and an example batch."""
    made_by = resolve(ref)
    with user_code(ref, f"calling {ref.rpartition(':')[2]}()"):
        made = made_by()
    shape = "(module, example batch) or (module, example batch, loss_fn)"
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise InputError(FIELD, ref, f"must return {shape}; it returned {type(made).__name__}")
    module, batch = made[0], made[1]
    loss_fn = made[2] if len(made) == 3 else None
    if not isinstance(module, nn.Module):
        raise InputError(FIELD, ref, f"must return {shape}; its first item is {type(module).__name__}")
    if not isinstance(batch, torch.Tensor | tuple | list | dict) or first_tensor(batch) is None:
        raise InputError(FIELD, ref, f"must return {shape}; its batch holds no tensor")
    if loss_fn is not None and not callable(loss_fn):
        raise InputError(FIELD, ref, f"must return {shape}; its loss_fn is not callable")
    return RealModel(ref, module, batch, loss_fn)
