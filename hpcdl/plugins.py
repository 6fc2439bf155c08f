"""Extensions: families, gradient backends and schedulers, each one file that registers itself.

A registry holds the extensions of one kind by name. It finds the built-in ones by importing
every module of its package (a new built-in family is a file dropped into
``hpcdl/workloads/families/``; no list to edit), and the others by importing the plugins:

* ``HPCDL_PLUGINS``: comma-separated module names (``site_ext.pbs``) or paths to Python files
  (``/opt/site/pbs.py``). MPI ranks inherit it and batch jobs export it, so every rank of a
  run loads the same extensions.
* entry points of installed packages in the group ``hpcdl.plugins``.

A module registers what it defines with the registry's decorator, e.g.::

    from hpcdl.workloads.registry import FAMILIES

    @FAMILIES.register
    @dataclass(frozen=True, kw_only=True)
    class TinySpec(Spec):
        family: ClassVar[str] = "tiny"
        ...
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
import pkgutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

from hpcdl.errors import HpcdlError, InputError

ENV = "HPCDL_PLUGINS"
GROUP = "hpcdl.plugins"
T = TypeVar("T")


@functools.cache
def load_plugins() -> tuple[str, ...]:
    """Import every plugin once per process; returns what was loaded. A plugin that cannot be
    imported is a one-line error naming it."""
    loaded = []
    for item in (s.strip() for s in os.environ.get(ENV, "").split(",")):
        if item:
            _import(item)
            loaded.append(item)
    for ep in importlib.metadata.entry_points(group=GROUP):
        try:
            ep.load()
        except Exception as e:
            raise HpcdlError(f"plugin entry point {ep.name} ({ep.value}) failed to load: {e}") from None
        loaded.append(ep.value)
    return tuple(loaded)


def _import(item: str) -> None:
    try:
        if item.endswith(".py"):
            path = Path(item)
            name = f"hpcdl_plugin_{path.stem}"
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None or not path.is_file():
                raise FileNotFoundError(f"no Python file at {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses and pickling look classes up by module
            spec.loader.exec_module(module)
        else:
            importlib.import_module(item)
    except HpcdlError:
        raise
    except Exception as e:
        raise InputError(ENV, item, f"a module or .py file that imports ({type(e).__name__}: {e})") from None


class Registry(Generic[T]):
    """The extensions of one kind, by name: the built-in ones (every module of ``package``) and
    the plugins'. ``key`` gives the name an extension registers under."""

    def __init__(
        self, kind: str, package: str, key: Callable[[T], str], error: type[InputError] = InputError
    ) -> None:
        self.kind = kind
        self.package = package
        self.key = key
        self.error = error
        self._items: dict[str, T] = {}
        self._loaded = False

    def register(self, item: T) -> T:
        """Add ``item`` under its name (a decorator); a name taken by another is an error."""
        name = self.key(item)
        if not name:
            raise HpcdlError(f"a {self.kind} needs a name to register: {item!r}")
        if name in self._items and self._items[name] is not item:
            raise HpcdlError(f"two {self.kind}s are named {name!r}: {self._items[name]!r} and {item!r}")
        self._items[name] = item
        return item

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True  # before importing: the modules call register() on this registry
        package = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")
        load_plugins()

    def get(self, name: object) -> T:
        """The extension called ``name``, or a one-line error listing the names there are."""
        self._load()
        if not isinstance(name, str) or name not in self._items:
            raise self.error(self.kind, name, "allowed: " + ", ".join(self.names()))
        return self._items[name]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def names(self) -> list[str]:
        self._load()
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def items(self) -> list[tuple[str, T]]:
        self._load()
        return list(self._items.items())
