"""The sampler: one window of GPU samples and CPU and GPU energy readings."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from hpcdl.measure.telemetry.nvml import NvmlGpu
from hpcdl.measure.telemetry.rapl import POWERCAP_ROOT, RaplCounter


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
        """Figures of the window (see docs/metrics.md, "Energy"); call after the window ends."""
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
