"""Power and clock caps: limits set on the devices a run uses, and the original limits put back
on every way out.

The limits themselves (GPU power and clocks through NVML, CPU frequency and RAPL power through
sysfs) are ``hpcdl.measure.limits``'.

:func:`check` refuses a cap before anything changes: out of range, unreadable, or not writable
(each limit is written with the value it already holds, which changes nothing and fails where
privileges are missing). :func:`capped` sets the cap, reads it back (a device that keeps another
value refused it) and restores every original in its ``finally``. Before the first change the
originals go to a journal file, removed once they are back: a process killed with SIGKILL leaves
it behind, and the next :func:`check` restores those originals first. The journal is also a
lock: a journal whose process still lives means another sweep holds caps on this host.

A journal tells a privileged process what to write where, so it lives where only its owner can
write (``hpcdl.measure.journal``); and restoring writes only to the limits hpcdl itself finds on
this machine (the cpufreq and RAPL files under sysfs, the NVML devices present), within their
documented ranges. Any other entry is reported in one line and ignored.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hpcdl.errors import HpcdlError, InputError
from hpcdl.measure import journal
from hpcdl.measure.limits import Limit, NvmlClockLimit, NvmlPowerLimit, SysfsLimit, known_sysfs_limits, nvml

KINDS = {"power": "W", "clock": "MHz"}
"""the cap kinds and their units (``--power-limit``, ``--clock-limit``)"""
CAP_ENV = "HPCDL_CAP"
"""the cap in force for a run (JSON), set by the sweep for the run it launches, kept in the
record's ``environment.cap``"""
TOLERANCE = 0.01
"""a limit read back may differ from the cap by this fraction (rounding to the device's steps)"""


class Ignored(Exception):
    """A journal entry that names no limit hpcdl knows, or a value outside its range."""


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Ignored(f"original {value!r} is not a finite number")
    return float(value)


def from_journal(
    entry: Any, sysfs: dict[str, SysfsLimit], lib: Callable[[], Any]
) -> tuple[Limit, float | None]:
    """The limit a journal entry names and the original to restore, when it is one hpcdl knows
    (a sysfs file of :func:`known_sysfs_limits`, an NVML device present) and the original lies
    within its range; :class:`Ignored` says why not. ``lib`` gives NVML (only asked when an
    entry names a GPU)."""
    if not isinstance(entry, dict):
        raise Ignored(f"{entry!r} is not a table")
    if "sysfs" in entry:
        limit = sysfs.get(str(entry["sysfs"]))
        if limit is None:
            raise Ignored(f"{entry['sysfs']!r} is not a cpufreq or RAPL limit of this machine")
        original = _number(entry.get("original"))
        if not limit.lo <= original <= limit.hi:
            raise Ignored(f"{limit.name}: original {original:g} outside {limit.lo:g} to {limit.hi:g}")
        return limit, original
    kind, index = entry.get("nvml"), entry.get("index")
    if kind not in ("power", "clock") or isinstance(index, bool) or not isinstance(index, int):
        raise Ignored(f"{entry!r} names no sysfs file and no NVML device")
    try:
        nv = lib()
        count = int(nv.nvmlDeviceGetCount())
    except Exception as e:
        raise Ignored(f"GPU {index}: NVML unavailable ({e})") from None
    if not 0 <= index < count:
        raise Ignored(f"GPU {index}: no such device ({count} present)")
    if kind == "clock":
        return NvmlClockLimit(nv, index), None  # restoring unlocks: no value is written
    gpu = NvmlPowerLimit(nv, index)
    original = _number(entry.get("original"))
    lo, hi = gpu.allowed()
    if not lo <= original <= hi:
        raise Ignored(f"{gpu.name}: original {original:g} outside {lo:g} to {hi:g} W")
    return gpu, original


# --- checking, setting and restoring ------------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    """What one limit was before the cap and what it holds under it."""

    name: str
    original: float | None
    applied: float | None
    """read back after the cap was set (None where the device cannot say: GPU locked clocks)"""


def _flag(kind: str) -> str:
    return f"{kind}-limit"


def _refusal(kind: str, value: float, limit: Limit, e: BaseException) -> InputError:
    text = str(e)
    if isinstance(e, PermissionError) or "ermission" in text:
        why = f"{limit.name} needs privileges to change (root): {text}"
    else:
        why = f"{limit.name} cannot be changed: {text}"
    return InputError(_flag(kind), value, why)


def check(kind: str, values: Sequence[float], limits: Sequence[Limit]) -> list[str]:
    """Refuse caps that cannot be set, before anything changes: a value that is not a finite
    number > 0 or outside any limit's range, a limit that cannot be read, or one that cannot be
    written (probed by writing the value it already holds; GPU clocks by unlocking them, the
    state they are restored to). First restores what a journal left behind; returns the names
    of the limits it restored."""
    unit = KINDS[kind]
    for v in values:
        if not (math.isfinite(v) and v > 0):
            raise InputError(_flag(kind), v, f"a cap in {unit} > 0")
    if not limits:
        raise InputError(_flag(kind), list(values), "no device to cap")
    restored = recover()
    for limit in limits:
        try:
            lo, hi = limit.allowed()
            now = limit.read()
        except Exception as e:
            raise _refusal(kind, values[0], limit, e) from None
        for v in values:
            if not lo <= v <= hi:
                raise InputError(_flag(kind), v, f"{limit.name} accepts {lo:g} to {hi:g} {unit}")
        try:
            limit.restore(now)  # what it holds already (GPU clocks: unlocked): a change-free probe
        except Exception as e:
            raise _refusal(kind, values[0], limit, e) from None
    return restored


def recover(say: Callable[[str], None] | None = None, lib: Callable[[], Any] | None = None) -> list[str]:
    """Put back the originals a journal holds (a sweep that died without restoring them); the
    names of the limits restored. Entries that name no limit hpcdl knows are reported through
    ``say`` (default: stderr) in one line and ignored. InputError when the journal's folder is
    not private, the journal is malformed, or its process still runs."""
    path = journal.journal_path()
    entries = journal.read_journal(path)
    if entries is None:
        return []
    sysfs, known, ignored = known_sysfs_limits(), [], []
    for entry in entries:
        try:
            known.append(from_journal(entry, sysfs, lib or nvml))
        except Ignored as e:
            ignored.append(str(e))
    if ignored:
        (say or _stderr)(f"caps journal {path}: ignored {len(ignored)} entries: {'; '.join(ignored)}")
    restored = _restore(known)
    journal.remove_journal(path)
    return restored


def _stderr(message: str) -> None:
    print(f"hpcdl: {message}", file=sys.stderr, flush=True)


def _restore(originals: Sequence[tuple[Limit, float | None]]) -> list[str]:
    """Restore each limit; every one is tried even when one fails, then the failures are raised."""
    failed, done = [], []
    for limit, original in originals:
        try:
            limit.restore(original)
            done.append(limit.name)
        except Exception as e:
            failed.append(f"{limit.name} (to {original}): {e}")
    if failed:
        raise HpcdlError("could not restore " + "; ".join(failed))
    return done


@contextlib.contextmanager
def capped(kind: str, value: float, limits: Sequence[Limit]) -> Iterator[list[Applied]]:
    """Set every limit to ``value`` while inside, and restore every original on the way out,
    whatever the way (an exception, :class:`hpcdl.parallel.launch.Terminated` from a signal).
    A device that reads back another value (beyond :data:`TOLERANCE`) refused the cap: an
    InputError, raised after the originals are back."""
    originals = [(limit, limit.read()) for limit in limits]
    path = journal.journal_path()
    entries = [{**limit.journal(), "original": original} for limit, original in originals]
    journal.write_journal(path, {"pid": os.getpid(), "kind": kind, "value": value, "limits": entries})
    try:
        applied = []
        for limit, original in originals:
            try:
                limit.write(value)
                now = limit.read()
            except Exception as e:
                raise _refusal(kind, value, limit, e) from None
            if now is not None and abs(now - value) > TOLERANCE * value:
                unit = KINDS[kind]
                why = f"{limit.name} holds {now:g} {unit} after it was set: the device refused the cap"
                raise InputError(_flag(kind), value, why)
            applied.append(Applied(limit.name, original, now))
        yield applied
    finally:
        _restore(originals)
        journal.remove_journal(path)
