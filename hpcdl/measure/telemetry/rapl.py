"""CPU package energy from RAPL (Linux powercap) counters."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hpcdl import metrics

POWERCAP_ROOT = Path("/sys/class/powercap")
# Top-level RAPL domains only: `intel-rapl:N:M` subzones (cores, uncore, DRAM) are parts of, or
# beside, a package, and `intel-rapl-mmio:N` re-exposes the same package counter.
_PACKAGE = re.compile(r"intel-rapl:\d+")


def rapl_packages(root: str | Path = POWERCAP_ROOT) -> list[Path]:
    """The package domains under a powercap root, in order: top-level ``intel-rapl:N`` only, and
    not a ``psys`` (platform) domain, whose energy includes the packages'."""
    root = Path(root)
    found = [p for p in root.glob("intel-rapl:*") if _PACKAGE.fullmatch(p.name)]
    packages = []
    for p in sorted(found, key=lambda p: int(p.name.split(":")[1])):
        name = p / "name"
        if name.is_file() and name.read_text().strip() == "psys":
            continue
        packages.append(p)
    return packages


def rapl_delta_uj(start: int, end: int, max_range_uj: int) -> int:
    """Microjoules between two readings of a counter that wraps to 0 after ``max_range_uj``
    (at most one wrap between the readings)."""
    return end - start if end >= start else end + max_range_uj - start


def _read_uj(path: Path) -> int:
    return int(path.read_text().strip())


def _unreadable(path: Path, exc: Exception) -> str:
    if isinstance(exc, PermissionError):
        # The Platypus fix (CVE-2020-8694, Linux 5.10 and stable backports) made energy_uj 0400.
        return f"{path} not readable: permission denied (RAPL energy is root-only on patched kernels)"
    return f"{path} not readable: {exc}"


class RaplCounter:
    """CPU package energy from RAPL counters, summed over packages.

    The counters are read at the window's start and end and at every poll between: a counter
    wraps every few minutes to hours, and reading it more often than that keeps a long window
    right across several wraps.
    """

    def __init__(self, root: str | Path = POWERCAP_ROOT) -> None:
        self.root = Path(root)
        self.reason: str | None = "not started"
        self._packages: list[Path] = []
        self._max_uj: list[int] = []
        self._last_uj: list[int] = []
        self._total_uj = 0

    @property
    def available(self) -> bool:
        return self.reason is None

    def start(self) -> None:
        """Find the packages and take the first reading (or record why there is none)."""
        self.reason, self._total_uj, self._last_uj = None, 0, []
        if not self.root.is_dir():
            self.reason = f"no powercap interface at {self.root}"
            return
        self._packages = rapl_packages(self.root)
        if not self._packages:
            self.reason = f"no intel-rapl package domains under {self.root}"
            return
        self._max_uj = []
        for pkg in self._packages:
            try:
                self._max_uj.append(_read_uj(pkg / "max_energy_range_uj"))
            except (OSError, ValueError) as exc:
                self.reason = _unreadable(pkg / "max_energy_range_uj", exc)
                return
        self._last_uj = self._read_all()

    def _read_all(self) -> list[int]:
        readings = []
        for pkg in self._packages:
            try:
                readings.append(_read_uj(pkg / "energy_uj"))
            except (OSError, ValueError) as exc:
                self.reason = _unreadable(pkg / "energy_uj", exc)
                return []
        return readings

    def poll(self) -> None:
        """Add the energy since the last reading."""
        if not self.available:
            return
        now = self._read_all()
        if not self.available:
            return
        for last, end, top in zip(self._last_uj, now, self._max_uj, strict=True):
            self._total_uj += rapl_delta_uj(last, end, top)
        self._last_uj = now

    def summary(self, window_s: float) -> dict[str, Any]:
        energy = self._total_uj / 1e6 if self.available else None
        return {
            "available": self.available,
            "reason": self.reason,
            "packages": len(self._packages) if self.available else 0,
            "energy_j": energy,
            "avg_power_w": metrics.average_power(energy, window_s),
        }
