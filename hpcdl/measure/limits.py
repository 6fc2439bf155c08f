"""The limits a cap is set on, each written against its documented interface:

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

Each reads its value and allowed range, writes a value, restores an original and describes
itself for the journal (:class:`Limit`); ``hpcdl.measure.caps`` sets, checks and restores them."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hpcdl.errors import InputError
from hpcdl.measure.telemetry.rapl import rapl_packages

SYSFS_ENV = "HPCDL_SYSFS"
"""the root of sysfs caps are written under (default /sys): tests, and containers that mount
the host's sysfs elsewhere"""


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
class NvmlLimit:
    """A limit of one GPU through NVML (the subclasses: which one)."""

    nvml: Any
    index: int
    """NVML's index of the GPU (not CUDA's: CUDA_VISIBLE_DEVICES renumbers, NVML does not)"""

    @property
    def handle(self) -> Any:
        return self.nvml.nvmlDeviceGetHandleByIndex(self.index)


@dataclass(frozen=True)
class NvmlPowerLimit(NvmlLimit):
    """A GPU's power management limit (W; NVML speaks milliwatts)."""

    @property
    def name(self) -> str:
        return f"GPU {self.index} power limit"

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
class NvmlClockLimit(NvmlLimit):
    """A GPU's graphics clock, locked between its lowest supported clock and the cap (MHz)."""

    @property
    def name(self) -> str:
        return f"GPU {self.index} locked clocks"

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
