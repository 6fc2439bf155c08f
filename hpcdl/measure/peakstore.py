"""One peak per machine: the store of CPU peaks that MFU divides by.

A CPU's theoretical peak is an estimate (cores x clock x FLOPs per cycle), and where the clock
read is low (a VM's base clock) the measured GEMM ceiling raises it (``peaks.raised_to_ceiling``).
Raised anew in every run, the denominator moved with each run's ceiling, and MFU could not be
compared between runs of one machine. So the peak is stored once per machine and precision:
``hpcdl info --probe`` stores it (again, when the user re-probes), or a run's first probe does
where none is stored; every later run on that machine reads it and raises nothing, and its
record says where its peak came from (``metrics.peak_inputs``: ``stored``, ``probed``,
``probed_by``).

The store is one JSON file, ``$HPCDL_PEAK_STORE`` or ``$XDG_DATA_HOME/hpcdl/peaks.json``
(``~/.local/share/hpcdl/peaks.json``); a machine is its host name and CPU model. A GPU's peak
is its datasheet's and needs no store. The figure kept is per core, so that a process bound to
fewer cores of the machine gets its share.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hpcdl import reader

STORE_ENV = "HPCDL_PEAK_STORE"
SCHEMA = "hpcdl.peaks"


def store_path() -> Path:
    """Where the store is: ``$HPCDL_PEAK_STORE``, else under ``$XDG_DATA_HOME`` (or ~/.local/share)."""
    given = os.environ.get(STORE_ENV)
    if given:
        return Path(given)
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "hpcdl" / "peaks.json"


def machine_key(cpu_model: str) -> str:
    """A machine as the store knows it: its host name and CPU model (nodes of a cluster that
    share a home folder each keep their own)."""
    return f"{platform.node()}/{cpu_model}"


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = reader.read_json(path)
    except reader.Unreadable:
        return {}  # none yet, or damaged: a run derives its peak and stores it anew
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else {}


def stored(cpu_model: str, precision: str, path: Path | None = None) -> dict[str, Any] | None:
    """The stored entry of this machine at ``precision``, or None."""
    machines = _read(path or store_path()).get("machines", {})
    entry = machines.get(machine_key(cpu_model), {}).get(precision) if isinstance(machines, dict) else None
    if not isinstance(entry, dict):
        return None
    per_core = entry.get("flops_per_core")
    ok = isinstance(per_core, int | float) and not isinstance(per_core, bool) and 0 < per_core < 1e30
    return entry if ok else None


def store(cpu_model: str, precision: str, entry: dict[str, Any], by: str, path: Path | None = None) -> Path:
    """Store (or replace) this machine's entry at ``precision``, dated and with what stored it;
    returns the store's path. Concurrent writers (ranks, nodes sharing a home) take turns."""
    path = path or store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        doc = _read(path) or {"schema": SCHEMA, "machines": {}}
        when = datetime.now(UTC).isoformat(timespec="seconds")
        doc["machines"].setdefault(machine_key(cpu_model), {})[precision] = {
            **entry,
            "probed": when,
            "probed_by": by,
        }
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    return path


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
