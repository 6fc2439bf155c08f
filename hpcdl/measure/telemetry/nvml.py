"""One NVIDIA GPU through NVML: power, GPU and memory utilisation, memory used and SM clock
samples, and its energy counter."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hpcdl import metrics
from hpcdl.device import cuda_uuid

TRACE_KEYS = ("time_s", "power_w", "util_pct", "mem_util_pct", "mem_used_bytes", "sm_clock_mhz")
MIG_NOTE = "MIG instance: power, energy and utilisation are those of the whole parent GPU"


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def _mean(values: Sequence[float]) -> float | None:
    ok = _finite(values)
    return sum(ok) / len(ok) if ok else None


def _max(values: Sequence[float]) -> float | None:
    ok = _finite(values)
    return max(ok) if ok else None


def _visible_index(index: int) -> int:
    """NVML's index of CUDA device ``index``: CUDA_VISIBLE_DEVICES renumbers devices, NVML does
    not. (A fallback only: CUDA may also order devices differently from NVML's PCI order.)"""
    entries = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if index < len(entries) and entries[index].isdigit():
        return int(entries[index])
    return index


def nvml_handle(nvml: Any, device: torch.device) -> tuple[Any, str | None]:
    """(NVML handle, note) of a CUDA device: by UUID, which is immune to CUDA_VISIBLE_DEVICES and
    to device order, else by index. A MIG instance has no power reading: its parent GPU's."""
    index = device.index
    if index is None:
        try:
            index = torch.cuda.current_device()
        except Exception:
            index = 0
    uuid = cuda_uuid(index)
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


def _uuid(nvml: Any, handle: Any) -> str | None:
    """The GPU's UUID as NVML gives it (``GPU-...``), or None where the query fails."""
    try:
        value = nvml.nvmlDeviceGetUUID(handle)
    except Exception:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _reading(get: Callable[[], float]) -> float:
    """One reading; NaN when the query fails (unsupported on this board, or a transient error)."""
    try:
        return float(get())
    except Exception:
        return math.nan


def _utilization(nvml: Any, handle: Any) -> tuple[float, float]:
    """(GPU, memory) utilisation in percent (``nvmlDeviceGetUtilizationRates``); NaN where the
    query fails."""
    try:
        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        return float(rates.gpu), float(rates.memory)
    except Exception:
        return math.nan, math.nan


class NvmlGpu:
    """Power, utilisation, memory and SM clock of one NVIDIA GPU, and its energy counter."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reason: str | None = "not started"
        self.note: str | None = None
        self.uuid: str | None = None
        """the UUID of the GPU whose power is read (a MIG instance's parent): ranks that share
        one GPU read the same energy, which the record counts once"""
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
            self.uuid = _uuid(pynvml, self._handle)
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
        # one query: NVML's share of the last sample period with a kernel running (gpu) and with
        # device memory being read or written (memory)
        rates = _utilization(nv, h)
        self._trace["util_pct"].append(rates[0])
        self._trace["mem_util_pct"].append(rates[1])
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
            "device_uuid": self.uuid,
            "energy_j": energy,
            "energy_source": source,
            "integrated_energy_j": integrated,
            "avg_power_w": metrics.average_power(energy, window_s),
            "max_power_w": _max(tr["power_w"]),
            "avg_util_pct": _mean(tr["util_pct"]),
            "avg_mem_util_pct": _mean(tr["mem_util_pct"]),
            "max_mem_used_bytes": _max(tr["mem_used_bytes"]),
            "avg_sm_clock_mhz": _mean(tr["sm_clock_mhz"]),
            "samples": len(tr["time_s"]),
        }
