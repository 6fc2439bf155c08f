"""Power and clock caps: limits set on the devices a run uses, and the original limits put back
on every way out.

Four kinds of limit, each written against its documented interface:

- a GPU's **power limit** (NVML: ``nvmlDeviceGetPowerManagementLimitConstraints`` gives the
  allowed range, ``nvmlDeviceGetPowerManagementLimit`` the limit in force,
  ``nvmlDeviceSetPowerManagementLimit`` sets it; milliwatts, root only);
- a GPU's **locked clocks** (``nvmlDeviceSetGpuLockedClocks(min, max)`` with the lowest supported
  graphics clock as min, so the cap bounds the clock from above; ``nvmlDeviceResetGpuLockedClocks``
  unlocks it; NVML has no call that reads locked clocks back, so the original state is taken to be
  unlocked, as after a reboot or driver reload);
- a CPU's **maximum frequency** (cpufreq ``scaling_max_freq`` in kHz, within ``cpuinfo_min_freq``
  and ``cpuinfo_max_freq``);
- a CPU package's **RAPL power limit** (powercap ``constraint_0_power_limit_uw`` in µW, at most
  ``constraint_0_max_power_uw`` where the kernel gives it; the zone must be ``enabled``, else
  the kernel keeps the value and enforces nothing).

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
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hpcdl.errors import HpcdlError, InputError
from hpcdl.measure import journal
from hpcdl.measure.telemetry.rapl import rapl_packages

KINDS = {"power": "W", "clock": "MHz"}
"""the cap kinds and their units (``--power-limit``, ``--clock-limit``)"""
SYSFS_ENV = "HPCDL_SYSFS"
"""the root of sysfs caps are written under (default /sys): tests, and containers that mount
the host's sysfs elsewhere"""
CAP_ENV = "HPCDL_CAP"
"""the cap in force for a run (JSON), set by the sweep for the run it launches, kept in the
record's ``environment.cap``"""
TOLERANCE = 0.01
"""a limit read back may differ from the cap by this fraction (rounding to the device's steps)"""


def sysfs_root() -> Path:
    return Path(os.environ.get(SYSFS_ENV, "/sys"))


class Limit(Protocol):
    """One limit of one device, in the cap's unit (W or MHz)."""

    @property
    def name(self) -> str:
        """What it is, e.g. ``GPU 0 power limit`` or ``cpu3 scaling_max_freq``."""

    def read(self) -> float | None:
        """The limit in force (None where the device cannot say)."""

    def allowed(self) -> tuple[float, float]:
        """The range the device accepts."""

    def write(self, value: float) -> None:
        """Set the limit; raises OSError or the NVML error when the device refuses."""

    def restore(self, original: float | None) -> None:
        """Put back what :meth:`read` said before the cap."""

    def journal(self) -> dict[str, Any]:
        """How to find this limit again from another process (:func:`from_journal`)."""


# --- sysfs: cpufreq and RAPL -------------------------------------------------------------------


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


@dataclass(frozen=True)
class SysfsLimit:
    """A limit in a sysfs file that holds an integer in ``scale`` units per cap unit (cpufreq: kHz
    per MHz, 1000; RAPL: µW per W, 10⁶)."""

    name: str
    path: Path
    scale: float
    lo: float
    hi: float

    def read(self) -> float | None:
        return _read_int(self.path) / self.scale

    def allowed(self) -> tuple[float, float]:
        return self.lo, self.hi

    def write(self, value: float) -> None:
        self.path.write_text(f"{round(value * self.scale)}\n")

    def restore(self, original: float | None) -> None:
        if original is not None:
            self.write(original)

    def journal(self) -> dict[str, Any]:
        return {"sysfs": str(self.path), "scale": self.scale, "name": self.name}


def cpufreq_limits(cpus: Sequence[int], root: Path | None = None) -> list[Limit]:
    """``scaling_max_freq`` of each CPU (MHz); InputError where cpufreq is absent."""
    base = (root or sysfs_root()) / "devices/system/cpu"
    limits: list[Limit] = []
    for cpu in sorted(cpus):
        d = base / f"cpu{cpu}" / "cpufreq"
        try:
            lo, hi = (_read_int(d / f) / 1000 for f in ("cpuinfo_min_freq", "cpuinfo_max_freq"))
        except (OSError, ValueError):
            raise InputError(
                "clock-limit", "cpu", f"no cpufreq interface at {d}: this CPU's clock cannot be capped"
            ) from None
        limits.append(SysfsLimit(f"cpu{cpu} scaling_max_freq", d / "scaling_max_freq", 1000.0, lo, hi))
    return limits


def rapl_limits(root: Path | None = None) -> list[Limit]:
    """The package power limit (constraint 0, the long-term one) of each RAPL package (W)."""
    powercap = (root or sysfs_root()) / "class/powercap"
    packages = rapl_packages(powercap) if powercap.is_dir() else []
    if not packages:
        raise InputError(
            "power-limit",
            "cpu",
            f"no RAPL package domains under {powercap}: this CPU's power cannot be capped",
        )
    limits: list[Limit] = []
    for pkg in packages:
        try:
            enabled = _read_int(pkg / "enabled")
            hi = _read_int(pkg / "constraint_0_max_power_uw") / 1e6
        except (OSError, ValueError) as e:
            raise InputError("power-limit", "cpu", f"{pkg} cannot be read: {e}") from None
        if not enabled:
            # the kernel would store a new limit and enforce none: a silent no-op
            raise InputError(
                "power-limit", "cpu", f"RAPL power limiting is disabled on {pkg.name} (enabled=0)"
            )
        path = pkg / "constraint_0_power_limit_uw"
        limits.append(SysfsLimit(f"{pkg.name} package power limit", path, 1e6, 1.0, hi))
    return limits


# --- NVML: GPU power limit and locked clocks -----------------------------------------------------


@dataclass(frozen=True)
class NvmlPowerLimit:
    """A GPU's power management limit (W; NVML speaks milliwatts)."""

    nvml: Any
    index: int
    """NVML's index of the GPU (not CUDA's: CUDA_VISIBLE_DEVICES renumbers, NVML does not)"""

    @property
    def name(self) -> str:
        return f"GPU {self.index} power limit"

    @property
    def handle(self) -> Any:
        return self.nvml.nvmlDeviceGetHandleByIndex(self.index)

    def read(self) -> float | None:
        return float(self.nvml.nvmlDeviceGetPowerManagementLimit(self.handle)) / 1000

    def allowed(self) -> tuple[float, float]:
        lo, hi = self.nvml.nvmlDeviceGetPowerManagementLimitConstraints(self.handle)
        return lo / 1000, hi / 1000

    def write(self, value: float) -> None:
        self.nvml.nvmlDeviceSetPowerManagementLimit(self.handle, round(value * 1000))

    def restore(self, original: float | None) -> None:
        if original is not None:
            self.write(original)

    def journal(self) -> dict[str, Any]:
        return {"nvml": "power", "index": self.index, "name": self.name}


@dataclass(frozen=True)
class NvmlClockLimit:
    """A GPU's graphics clock, locked between its lowest supported clock and the cap (MHz)."""

    nvml: Any
    index: int

    @property
    def name(self) -> str:
        return f"GPU {self.index} locked clocks"

    @property
    def handle(self) -> Any:
        return self.nvml.nvmlDeviceGetHandleByIndex(self.index)

    def read(self) -> float | None:
        return None  # NVML cannot read locked clocks back

    def allowed(self) -> tuple[float, float]:
        h = self.handle
        memory = max(self.nvml.nvmlDeviceGetSupportedMemoryClocks(h))
        clocks = self.nvml.nvmlDeviceGetSupportedGraphicsClocks(h, memory)
        return float(min(clocks)), float(max(clocks))

    def write(self, value: float) -> None:
        self.nvml.nvmlDeviceSetGpuLockedClocks(self.handle, round(self.allowed()[0]), round(value))

    def restore(self, original: float | None) -> None:
        self.nvml.nvmlDeviceResetGpuLockedClocks(self.handle)

    def journal(self) -> dict[str, Any]:
        return {"nvml": "clock", "index": self.index, "name": self.name}


def nvml() -> Any:
    """pynvml, initialised; InputError when it is missing or finds no driver."""
    try:
        import pynvml
    except ImportError:
        raise InputError("power-limit", "gpu", "pynvml is not installed (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise InputError("power-limit", "gpu", f"NVML initialisation failed: {e}") from None
    return pynvml


def gpu_limits(kind: str, lib: Any, indices: Sequence[int]) -> list[Limit]:
    """The ``kind`` limit of each GPU, by NVML index."""
    cls = NvmlPowerLimit if kind == "power" else NvmlClockLimit
    return [cls(lib, i) for i in sorted(set(indices))]


def cpu_limits(kind: str, cpus: Sequence[int], root: Path | None = None) -> list[Limit]:
    """The ``kind`` limit of the CPU: RAPL package power limits, or each CPU's maximum frequency."""
    return rapl_limits(root) if kind == "power" else cpufreq_limits(cpus, root)


def known_sysfs_limits(root: Path | None = None) -> dict[str, SysfsLimit]:
    """Every cpufreq ``scaling_max_freq`` and RAPL package power limit of this machine, by path,
    with its documented range: the only sysfs files a journal may have hpcdl write."""
    base = root or sysfs_root()
    known: dict[str, SysfsLimit] = {}
    cpus = base / "devices/system/cpu"
    for d in sorted(cpus.glob("cpu*/cpufreq")) if cpus.is_dir() else []:
        if not re.fullmatch(r"cpu\d+", d.parent.name):
            continue
        with contextlib.suppress(OSError, ValueError):
            lo, hi = (_read_int(d / f) / 1000 for f in ("cpuinfo_min_freq", "cpuinfo_max_freq"))
            path = d / "scaling_max_freq"
            known[str(path)] = SysfsLimit(f"{d.parent.name} scaling_max_freq", path, 1000.0, lo, hi)
    powercap = base / "class/powercap"
    for pkg in rapl_packages(powercap) if powercap.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            hi = _read_int(pkg / "constraint_0_max_power_uw") / 1e6
            path = pkg / "constraint_0_power_limit_uw"
            known[str(path)] = SysfsLimit(f"{pkg.name} package power limit", path, 1e6, 1.0, hi)
    return known


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
