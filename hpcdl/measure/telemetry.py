"""Device telemetry over a timed window: GPU power, utilisation, memory and SM clock from NVML,
and CPU package energy from RAPL.

    with TelemetrySampler(device) as s:
        ...  # the timed work, ending with a device synchronisation
    energy = s.summary()  # for the record's metrics block
    trace = s.trace()     # GPU readings over time

Telemetry never fails or slows a run noticeably: a source that is missing (no NVIDIA GPU, no
``pynvml``, no driver, no RAPL, counters not readable) is recorded as unavailable with its
reason, and its figures are None, never 0, which would read as a measurement. Both sources see
the whole device: other processes on the GPU or CPU packages count too.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from hpcdl import metrics

POWERCAP_ROOT = Path("/sys/class/powercap")
TRACE_KEYS = ("time_s", "power_w", "util_pct", "mem_used_bytes", "sm_clock_mhz")
MIG_NOTE = "MIG instance: power, energy and utilisation are those of the whole parent GPU"

# Top-level RAPL domains only: `intel-rapl:N:M` subzones (cores, uncore, DRAM) are parts of, or
# beside, a package, and `intel-rapl-mmio:N` re-exposes the same package counter.
_PACKAGE = re.compile(r"intel-rapl:\d+")


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def _mean(values: Sequence[float]) -> float | None:
    ok = _finite(values)
    return sum(ok) / len(ok) if ok else None


def _max(values: Sequence[float]) -> float | None:
    ok = _finite(values)
    return max(ok) if ok else None


# --- CPU package energy (RAPL) -------------------------------------------------------------


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


# --- GPU (NVML) ---------------------------------------------------------------------------


def _visible_index(index: int) -> int:
    """NVML's index of CUDA device ``index``: CUDA_VISIBLE_DEVICES renumbers devices, NVML does
    not. (A fallback only: CUDA may also order devices differently from NVML's PCI order.)"""
    entries = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if index < len(entries) and entries[index].isdigit():
        return int(entries[index])
    return index


def _cuda_uuid(index: int) -> str | None:
    """The device's UUID as CUDA reports it, without a ``GPU-``/``MIG-`` prefix."""
    try:
        text = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # a CPU-only torch, no driver, or a torch without the field
        return None
    return text.removeprefix("GPU-").removeprefix("MIG-") or None


def nvml_handle(nvml: Any, device: torch.device) -> tuple[Any, str | None]:
    """(NVML handle, note) of a CUDA device: by UUID, which is immune to CUDA_VISIBLE_DEVICES and
    to device order, else by index. A MIG instance has no power reading: its parent GPU's."""
    index = device.index
    if index is None:
        try:
            index = torch.cuda.current_device()
        except Exception:
            index = 0
    uuid = _cuda_uuid(index)
    if uuid:
        for prefix in ("GPU-", "MIG-"):
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(prefix + uuid)
            except Exception:
                continue
            if prefix == "MIG-":
                return nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle), MIG_NOTE
            return handle, None
    return nvml.nvmlDeviceGetHandleByIndex(_visible_index(index)), None


def _reading(get: Callable[[], float]) -> float:
    """One reading; NaN when the query fails (unsupported on this board, or a transient error)."""
    try:
        return float(get())
    except Exception:
        return math.nan


class NvmlGpu:
    """Power, utilisation, memory and SM clock of one NVIDIA GPU, and its energy counter."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reason: str | None = "not started"
        self.note: str | None = None
        self._nvml: Any = None
        self._handle: Any = None
        self._start_mj: int | None = None
        self._end_mj: int | None = None
        self._trace: dict[str, list[float]] = {k: [] for k in TRACE_KEYS}

    @property
    def available(self) -> bool:
        return self.reason is None

    def open(self) -> None:
        """Initialise NVML and find the device (or record why not)."""
        self.reason = None
        if self.device.type != "cuda":
            self.reason = f"run device is {self.device.type}, not an NVIDIA GPU"
        elif torch.version.hip is not None:
            self.reason = "ROCm build: NVML reads NVIDIA GPUs only"
        if self.reason:
            return
        try:
            import pynvml
        except ImportError:
            self.reason = "pynvml is not installed (package nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # no driver or library: NVMLError_LibraryNotFound and the like
            self.reason = f"NVML initialisation failed: {exc}"
            return
        self._nvml = pynvml
        try:
            self._handle, self.note = nvml_handle(pynvml, self.device)
        except Exception as exc:
            self.reason = f"no NVML handle for {self.device}: {exc}"
            self.close()

    def _energy_mj(self) -> int | None:
        # Volta and later; older boards answer NOT_SUPPORTED, then power readings are integrated.
        return None if math.isnan(e := _reading(self._energy_query)) else int(e)

    def _energy_query(self) -> float:
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def begin(self, t: float) -> None:
        if self.available:
            self._start_mj = self._energy_mj()
            self.sample(t)

    def sample(self, t: float) -> None:
        """One reading of every quantity at ``t`` seconds into the window."""
        nv, h = self._nvml, self._handle
        self._trace["time_s"].append(t)
        self._trace["power_w"].append(_reading(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000))
        self._trace["util_pct"].append(_reading(lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu))
        self._trace["mem_used_bytes"].append(_reading(lambda: nv.nvmlDeviceGetMemoryInfo(h).used))
        self._trace["sm_clock_mhz"].append(_reading(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))

    def end(self, t: float) -> None:
        if self.available:
            self.sample(t)
            self._end_mj = self._energy_mj()

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()  # reference-counted by NVML: other users keep theirs
            except Exception:
                pass
            self._nvml = None

    def trace(self) -> dict[str, list[float]]:
        return {k: list(v) for k, v in self._trace.items()}

    def summary(self, window_s: float) -> dict[str, Any]:
        tr = self._trace
        integrated = metrics.energy_from_power(tr["time_s"], tr["power_w"]) if self.available else None
        counted = None
        if self._start_mj is not None and self._end_mj is not None and self._end_mj > self._start_mj:
            # a counter that did not move (a window shorter than its update period) measured nothing
            counted = (self._end_mj - self._start_mj) / 1000
        energy: float | None
        source: str | None
        if counted is not None:
            energy, source = counted, "nvml_total_energy"
        else:
            energy, source = integrated, "integrated_power" if integrated is not None else None
        return {
            "available": self.available,
            "reason": self.reason,
            "note": self.note,
            "energy_j": energy,
            "energy_source": source,
            "integrated_energy_j": integrated,
            "avg_power_w": metrics.average_power(energy, window_s),
            "max_power_w": _max(tr["power_w"]),
            "avg_util_pct": _mean(tr["util_pct"]),
            "max_mem_used_bytes": _max(tr["mem_used_bytes"]),
            "avg_sm_clock_mhz": _mean(tr["sm_clock_mhz"]),
            "samples": len(tr["time_s"]),
        }


# --- the sampler -------------------------------------------------------------------------


class TelemetrySampler:
    """Samples GPU telemetry every ``interval_s`` in a daemon thread, and reads GPU and CPU
    energy counters at the window's ends. The window is the ``with`` block (or start() to
    stop()); synchronise the device before it ends so that queued work falls inside it.
    """

    def __init__(
        self,
        device: torch.device | str,
        interval_s: float = 0.1,
        *,
        powercap_root: str | Path = POWERCAP_ROOT,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        self.device = torch.device(device)
        self.interval_s = interval_s
        self.gpu = NvmlGpu(self.device)
        self.rapl = RaplCounter(powercap_root)
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._t0 = 0.0
        self._window_s: float | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._started:
            raise RuntimeError("a TelemetrySampler measures one window; make a new one")
        self.gpu.open()  # before the window: NVML's initialisation takes tens of milliseconds
        self._t0 = time.perf_counter()
        self.gpu.begin(0.0)
        self.rapl.start()
        self._started = True
        if self.gpu.available or self.rapl.available:  # no thread waking up for nothing
            self._thread = threading.Thread(target=self._run, name="hpcdl-telemetry", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the window: stop the thread, take the final readings. Idempotent."""
        if not self._started or self._window_s is not None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        t = time.perf_counter() - self._t0
        self.gpu.end(t)
        self.rapl.poll()
        self._window_s = t
        self.gpu.close()

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self) -> None:
        due = self._t0 + self.interval_s
        while not self._stop.wait(max(0.0, due - time.perf_counter())):
            now = time.perf_counter()
            try:
                if self.gpu.available:
                    self.gpu.sample(now - self._t0)
                self.rapl.poll()
            except Exception as exc:  # a bug here must not take the run down: keep the end readings
                self.error = f"sampling stopped: {exc!r}"
                return
            # fixed deadlines keep samples evenly spaced; after a stall, skip rather than catch up
            due += self.interval_s
            if due <= (after := time.perf_counter()):
                due = after + self.interval_s

    def summary(self) -> dict[str, Any]:
        """Figures of the window (see METRICS.md); call after the window ends."""
        if self._window_s is None:
            raise RuntimeError("summary() needs a finished window: call it after the with-block")
        return {
            "window_s": self._window_s,
            "interval_s": self.interval_s,
            "gpu": self.gpu.summary(self._window_s),
            "cpu_rapl": self.rapl.summary(self._window_s),
            "sampler_error": self.error,
        }

    def trace(self) -> dict[str, list[float]]:
        """The GPU's readings: equal-length lists under TRACE_KEYS (empty when unavailable);
        a failed reading is NaN."""
        return self.gpu.trace()


def energy_figures(
    energy_j: float | None, window_s: float, samples: int, train_flops_per_sample: float
) -> dict[str, float | None]:
    """Energy figures of the timed work from its energy (None throughout when that is unknown)."""
    return {
        "energy_to_solution_j": energy_j,
        "energy_per_sample_j": metrics.energy_per_sample(energy_j, samples),
        "energy_delay_product_js": metrics.energy_delay_product(energy_j, window_s),
        "ai_ops_per_watt": metrics.ai_ops_per_watt(train_flops_per_sample, samples, energy_j),
    }
