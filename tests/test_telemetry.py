"""Telemetry: RAPL on a fake sysfs tree, NVML through a fake pynvml, and the unavailable paths."""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hpcdl import metrics
from hpcdl.measure.telemetry import TRACE_KEYS, RaplCounter, TelemetrySampler
from hpcdl.measure.telemetry import nvml as nvml_mod
from hpcdl.measure.telemetry import rapl as rapl_mod
from hpcdl.metrics import energy_figures

MAX_UJ = 262_143_328_850  # a real package's max_energy_range_uj


# --- a fake powercap tree -------------------------------------------------------------------


def write_domain(root: Path, name: str, label: str, energy_uj: int, max_uj: int = MAX_UJ) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


def set_energy(domain: Path, energy_uj: int) -> None:
    (domain / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture
def powercap(tmp_path: Path) -> Path:
    """Two packages, plus domains that must not be counted: a subzone, the MMIO copy, psys."""
    root = tmp_path / "powercap"
    write_domain(root, "intel-rapl:0", "package-0", 1_000_000)
    write_domain(root, "intel-rapl:1", "package-1", 5_000_000)
    write_domain(root, "intel-rapl:0:0", "core", 0)
    write_domain(root, "intel-rapl-mmio:0", "package-0", 0)
    write_domain(root, "intel-rapl:2", "psys", 0)
    return root


def test_rapl_packages_are_top_level_package_domains_only(powercap: Path) -> None:
    assert [p.name for p in rapl_mod.rapl_packages(powercap)] == ["intel-rapl:0", "intel-rapl:1"]


def test_rapl_energy_is_the_sum_over_packages(powercap: Path) -> None:
    rapl = RaplCounter(powercap)
    rapl.start()
    set_energy(powercap / "intel-rapl:0", 3_000_000)  # +2 J
    set_energy(powercap / "intel-rapl:1", 8_500_000)  # +3.5 J
    for noise in ("intel-rapl:0:0", "intel-rapl-mmio:0", "intel-rapl:2"):
        set_energy(powercap / noise, 99_000_000)
    rapl.poll()
    s = rapl.summary(2.0)
    assert s["available"] and s["reason"] is None and s["packages"] == 2
    assert s["energy_j"] == pytest.approx(5.5)
    assert s["avg_power_w"] == pytest.approx(2.75)


def test_rapl_wraparound_once_and_across_polls(powercap: Path) -> None:
    assert rapl_mod.rapl_delta_uj(MAX_UJ - 500_000, 1_500_000, MAX_UJ) == 2_000_000
    pkg = powercap / "intel-rapl:0"
    set_energy(pkg, MAX_UJ - 500_000)
    rapl = RaplCounter(powercap)
    rapl.start()
    set_energy(pkg, 1_500_000)  # wrapped: +2 J
    rapl.poll()
    set_energy(pkg, MAX_UJ - 1_000_000)  # almost a whole range later
    rapl.poll()
    set_energy(pkg, 0)  # wrapped again: +1 J
    rapl.poll()
    assert rapl.summary(1.0)["energy_j"] == pytest.approx(MAX_UJ / 1e6 - 0.5 + 1.0)


def test_rapl_in_the_sampler_window(powercap: Path) -> None:
    with TelemetrySampler("cpu", interval_s=0.02, powercap_root=powercap) as s:
        set_energy(powercap / "intel-rapl:0", 11_000_000)  # +10 J
        time.sleep(0.1)
    summary = s.summary()
    assert summary["cpu_rapl"]["energy_j"] == pytest.approx(10.0)
    assert summary["cpu_rapl"]["avg_power_w"] == pytest.approx(10.0 / summary["window_s"])
    assert not s.running


def unreadable(summary: dict[str, Any]) -> str:
    assert not summary["available"] and summary["energy_j"] is None and summary["avg_power_w"] is None
    return str(summary["reason"])


def test_rapl_permission_denied(powercap: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = rapl_mod._read_uj

    def denied(path: Path) -> int:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(rapl_mod, "_read_uj", denied)
    with TelemetrySampler("cpu", powercap_root=powercap) as s:
        pass
    assert "permission denied" in unreadable(s.summary()["cpu_rapl"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_rapl_unreadable_by_mode(powercap: Path) -> None:
    (powercap / "intel-rapl:1" / "energy_uj").chmod(0o000)
    rapl = RaplCounter(powercap)
    rapl.start()
    assert "not readable" in unreadable(rapl.summary(1.0))


def test_rapl_garbage_missing_and_unreadable_mid_window(powercap: Path, tmp_path: Path) -> None:
    set_energy(powercap / "intel-rapl:1", 0)
    (powercap / "intel-rapl:1" / "energy_uj").write_text("n/a\n")
    rapl = RaplCounter(powercap)
    rapl.start()
    assert "not readable" in unreadable(rapl.summary(1.0))

    rapl = RaplCounter(tmp_path / "absent")
    rapl.start()
    assert "no powercap" in unreadable(rapl.summary(1.0))
    (tmp_path / "empty").mkdir()
    rapl = RaplCounter(tmp_path / "empty")
    rapl.start()
    assert "no intel-rapl" in unreadable(rapl.summary(1.0))

    (powercap / "intel-rapl:1" / "energy_uj").write_text("7\n")
    rapl = RaplCounter(powercap)
    rapl.start()
    (powercap / "intel-rapl:1" / "energy_uj").unlink()  # a counter lost mid-window: no partial sum
    rapl.poll()
    assert "not readable" in unreadable(rapl.summary(1.0))


def test_rapl_on_this_machine() -> None:
    rapl = RaplCounter()
    rapl.start()
    time.sleep(0.05)
    rapl.poll()
    s = rapl.summary(0.05)
    if s["available"]:
        assert s["energy_j"] >= 0 and s["packages"] >= 1
    else:
        assert s["reason"] and s["energy_j"] is None


# --- the unavailable GPU --------------------------------------------------------------------


def assert_gpu_unavailable(gpu: dict[str, Any]) -> str:
    assert gpu["available"] is False and gpu["reason"]
    for key in ("energy_j", "avg_power_w", "max_power_w", "avg_util_pct", "energy_source"):
        assert gpu[key] is None, key
    assert gpu["samples"] == 0
    return str(gpu["reason"])


def test_cpu_run_has_no_gpu_telemetry(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with TelemetrySampler("cpu", powercap_root=tmp_path) as s:
            assert not s.running  # nothing to sample: no thread
    summary = s.summary()
    assert "cpu" in assert_gpu_unavailable(summary["gpu"])
    assert summary["window_s"] >= 0 and s.trace() == {k: [] for k in TRACE_KEYS}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_device_without_gpu_here_is_unavailable_quietly() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with TelemetrySampler(torch.device("cuda:0")) as s:
            pass
    assert_gpu_unavailable(s.summary()["gpu"])  # no pynvml, or NVML finds no driver


def test_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with TelemetrySampler("cuda:0") as s:
        pass
    assert "pynvml" in assert_gpu_unavailable(s.summary()["gpu"])


# --- a fake pynvml ------------------------------------------------------------------------


class FakeNvml:
    """The part of pynvml the sampler calls, with power ``watts(t)`` and an energy counter
    that runs at ``counter_watts`` (None: not supported, as before Volta)."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(
        self,
        watts: Callable[[float], float] = lambda t: 100.0,
        counter_watts: float | None = None,
        init_error: str | None = None,
    ) -> None:
        self.t0 = time.perf_counter()
        self.watts = watts
        self.counter_watts = counter_watts
        self.init_error = init_error
        self.inits = self.shutdowns = 0
        self.uuids: list[str] = []
        self.indices: list[int] = []
        self.power_reads: list[float] = []

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self.indices.append(index)
        return f"gpu{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.uuids.append(uuid)
        if uuid != "MIG-0000" and uuid != "GPU-abcd":
            raise self.NVMLError("Not Found")
        return uuid

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: str) -> str:
        return "parent-of-" + handle

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return "GPU-of-" + handle

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        t = time.perf_counter() - self.t0
        self.power_reads.append(t)
        return round(self.watts(t) * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        if self.counter_watts is None:
            raise self.NVMLError("Not Supported")
        return 10**9 + round(self.counter_watts * (time.perf_counter() - self.t0) * 1000)

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=75, memory=20)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(used=2**30, free=2**30, total=2**31)

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        if clock != self.NVML_CLOCK_SM:
            raise self.NVMLError("Invalid Argument")
        return 1410


@pytest.fixture
def no_rapl(tmp_path: Path) -> Path:
    return tmp_path / "no-powercap"


def fake(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml) -> FakeNvml:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


def test_integrated_power_without_energy_counter(monkeypatch: pytest.MonkeyPatch, no_rapl: Path) -> None:
    nvml = fake(monkeypatch, FakeNvml(lambda t: 100.0))
    with TelemetrySampler("cuda:0", interval_s=0.05, powercap_root=no_rapl) as s:
        time.sleep(0.5)
        assert s.running
    assert not s.running and nvml.inits == nvml.shutdowns == 1
    summary = s.summary()
    gpu = summary["gpu"]
    assert gpu["available"] and gpu["reason"] is None and gpu["energy_source"] == "integrated_power"
    assert gpu["energy_j"] == pytest.approx(100.0 * summary["window_s"], rel=0.02)
    assert gpu["energy_j"] == pytest.approx(50.0, rel=0.1)
    assert gpu["avg_power_w"] == pytest.approx(100.0, rel=0.02) and gpu["max_power_w"] == 100.0
    assert gpu["avg_util_pct"] == 75 and gpu["avg_sm_clock_mhz"] == 1410
    assert gpu["avg_mem_util_pct"] == 20  # NVML's memory utilisation, beside the GPU's
    assert gpu["max_mem_used_bytes"] == 2**30
    assert gpu["device_uuid"] == "GPU-of-gpu0"  # what the record counts each GPU's energy once by
    assert gpu["samples"] >= 5  # 0.5 s at 0.05 s on a busy machine, plus both ends
    trace = s.trace()
    assert set(trace) == set(TRACE_KEYS) and all(len(v) == gpu["samples"] for v in trace.values())
    assert trace["time_s"][0] == 0.0 and trace["time_s"][-1] == pytest.approx(summary["window_s"])
    assert trace["time_s"] == sorted(trace["time_s"])
    assert summary["cpu_rapl"]["available"] is False and summary["sampler_error"] is None


def test_power_changing_over_time_is_integrated(monkeypatch: pytest.MonkeyPatch, no_rapl: Path) -> None:
    # a ramp, 400 W more every second: trapezoids are exact for a line
    nvml = fake(monkeypatch, FakeNvml(lambda t: 400.0 * t))
    with TelemetrySampler("cuda:0", interval_s=0.02, powercap_root=no_rapl) as s:
        time.sleep(0.3)
    assert len(set(s.trace()["power_w"])) > 3
    first, last = nvml.power_reads[0], nvml.power_reads[-1]
    assert s.summary()["gpu"]["energy_j"] == pytest.approx(200.0 * (last**2 - first**2), rel=0.05)


def test_energy_counter_preferred(monkeypatch: pytest.MonkeyPatch, no_rapl: Path) -> None:
    # counter and power disagree on purpose, to show which one the energy comes from
    fake(monkeypatch, FakeNvml(lambda t: 100.0, counter_watts=150.0))
    with TelemetrySampler("cuda:0", interval_s=0.05, powercap_root=no_rapl) as s:
        time.sleep(0.3)
    summary = s.summary()
    gpu, window = summary["gpu"], summary["window_s"]
    assert gpu["energy_source"] == "nvml_total_energy"
    assert gpu["energy_j"] == pytest.approx(150.0 * window, rel=0.05)
    assert gpu["integrated_energy_j"] == pytest.approx(100.0 * window, rel=0.02)
    assert gpu["avg_power_w"] == pytest.approx(150.0, rel=0.05)


def test_exception_in_the_window_stops_the_thread(monkeypatch: pytest.MonkeyPatch, no_rapl: Path) -> None:
    nvml = fake(monkeypatch, FakeNvml())
    s = TelemetrySampler("cuda:0", interval_s=0.02, powercap_root=no_rapl)
    with pytest.raises(ZeroDivisionError), s:
        time.sleep(0.05)
        assert s.running
        _ = 1 / 0
    assert not s.running and nvml.shutdowns == 1
    assert s.summary()["gpu"]["samples"] >= 2
    s.stop()  # idempotent
    with pytest.raises(RuntimeError, match="one window"):
        s.start()


def test_failing_queries_are_nan_not_failures(monkeypatch: pytest.MonkeyPatch, no_rapl: Path) -> None:
    nvml = fake(monkeypatch, FakeNvml())

    def lost(handle: str) -> int:
        raise nvml.NVMLError("GPU is lost")

    nvml.nvmlDeviceGetPowerUsage = lost  # type: ignore[method-assign]
    with TelemetrySampler("cuda:0", interval_s=0.02, powercap_root=no_rapl) as s:
        time.sleep(0.05)
    gpu = s.summary()["gpu"]
    assert gpu["available"] and gpu["energy_j"] is None and gpu["energy_source"] is None
    assert gpu["max_power_w"] is None and gpu["avg_util_pct"] == 75
    assert all(math.isnan(p) for p in s.trace()["power_w"])


def test_nvml_init_failure_is_unavailable(monkeypatch: pytest.MonkeyPatch, no_rapl: Path) -> None:
    fake(monkeypatch, FakeNvml(init_error="Driver Not Loaded"))
    with TelemetrySampler("cuda:0", powercap_root=no_rapl) as s:
        pass
    assert "Driver Not Loaded" in assert_gpu_unavailable(s.summary()["gpu"])


def test_handle_by_index_respects_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert nvml_mod.nvml_handle(nvml, torch.device("cuda:0")) == ("gpu3", None)
    assert nvml_mod.nvml_handle(nvml, torch.device("cuda:1")) == ("gpu1", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml_mod.nvml_handle(nvml, torch.device("cuda:2")) == ("gpu2", None)


def test_handle_by_uuid_and_mig_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    uuid = {"value": "abcd"}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=uuid["value"]))
    assert nvml_mod.nvml_handle(nvml, torch.device("cuda:0")) == ("GPU-abcd", None)
    uuid["value"] = "0000"  # a MIG instance: GPU- is not found, MIG- is, and the parent is read
    assert nvml_mod.nvml_handle(nvml, torch.device("cuda:0")) == ("parent-of-MIG-0000", nvml_mod.MIG_NOTE)
    assert nvml.uuids == ["GPU-abcd", "GPU-0000", "MIG-0000"] and nvml.indices == []


# --- formulas ---------------------------------------------------------------------------


def test_energy_formulas() -> None:
    assert metrics.energy_from_power([0.0, 1.0, 2.0], [100.0, 200.0, 100.0]) == pytest.approx(300.0)
    assert metrics.energy_from_power([0.0, 1.0, 2.0], [100.0, math.nan, 100.0]) == pytest.approx(200.0)
    assert metrics.energy_from_power([0.0], [100.0]) is None
    fig = energy_figures(500.0, 10.0, 1000, 2e9)
    assert fig == {
        "energy_to_solution_j": 500.0,
        "energy_per_sample_j": 0.5,
        "energy_delay_product_js": 5000.0,
        "ai_ops_per_watt": pytest.approx(4e9),  # 2e12 FLOPs / 500 J = 2e11 FLOP/s / 50 W
    }
    assert set(energy_figures(None, 10.0, 1000, 2e9).values()) == {None}
    assert metrics.average_power(None, 1.0) is None and metrics.average_power(10.0, 0.0) is None


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TelemetrySampler("cpu", interval_s=0)


def test_a_failing_poll_stops_sampling_but_not_the_run(
    monkeypatch: pytest.MonkeyPatch, no_rapl: Path
) -> None:
    fake(monkeypatch, FakeNvml(lambda t: 100.0, counter_watts=100.0))
    with TelemetrySampler("cuda:0", interval_s=0.02, powercap_root=no_rapl) as s:
        real = s.gpu.sample

        def boom(t: float) -> None:
            raise KeyError("bug")

        s.gpu.sample = boom  # type: ignore[method-assign]
        time.sleep(0.1)
        assert not s.running  # the thread ended on the error, quietly
        s.gpu.sample = real  # type: ignore[method-assign]
    summary = s.summary()
    assert "KeyError" in summary["sampler_error"]
    assert summary["gpu"]["samples"] == 2  # the window's two ends
    assert summary["gpu"]["energy_j"] == pytest.approx(100.0 * summary["window_s"], rel=0.05)
