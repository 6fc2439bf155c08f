"""One peak per machine (issue 45): the CPU peak MFU divides by is stored once, by ``hpcdl info
--probe`` or a run's first probe, and every later run on the machine reads it, whatever its own
GEMM ceiling; records say where their peak came from. The store is the test's own
(``tests/conftest.py``: ``HPCDL_PEAK_STORE``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hpcdl_cli import hpcdl, unwrapped

from hpcdl.harness import runner
from hpcdl.measure import peakstore
from hpcdl.measure.peaks import cpu_info, cpu_peak
from hpcdl.records.loader import load_tree

MLP = [
    "run",
    "--workload",
    "mlp",
    "layers=1",
    "width=64",
    "batch_size=8",
    "--steps",
    "4",
    "--min-duration",
    "0",
]


def estimate_or_skip() -> float:
    peak = cpu_peak("fp32", use_store=False)
    if peak is None:
        pytest.skip("this machine's clock cannot be read: no CPU estimate")
    return peak.flops


def ceilings(monkeypatch: pytest.MonkeyPatch, flops: float) -> None:
    """The one synthetic figure: every rank's measured GEMM ceiling, as if measured with a
    thread per core (so that it speaks for the whole machine)."""
    cores = cpu_info().cores

    def ceiling(device: torch.device, precision: str, threads: int) -> float:
        return flops * min(threads, cores) / cores

    monkeypatch.setattr(runner, "measured_ceiling", ceiling)


def peaks_of(folder: Path) -> list[tuple[float, dict]]:
    records = sorted(load_tree([folder]).records, key=lambda r: r.result.created)
    return [(r.result.metrics.peak_flops, r.result.metrics.peak_inputs) for r in records]


def test_two_runs_on_one_machine_report_the_same_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_peak_store: Path
) -> None:
    """The first run raises the estimate to its ceiling (a VM's clock reads low) and stores it;
    the second, whose ceiling is higher still, divides by the stored peak and flags its ceiling
    instead of moving the denominator (three runs once reported 203, 211 and 220 GFLOP/s)."""
    estimate = estimate_or_skip()
    ceilings(monkeypatch, 1.2 * estimate)
    first = hpcdl(*MLP, "-o", tmp_path / "a")
    assert first.returncode == 0, first.stderr
    assert "stored this machine's fp32 peak" in first.stderr and str(own_peak_store) in first.stderr
    ceilings(monkeypatch, 3 * estimate)  # above the stored peak even measured with one thread
    second = hpcdl(*MLP, "-o", tmp_path / "b")
    assert second.returncode == 0, second.stderr
    assert "stored this machine" not in second.stderr  # stored once
    (a, a_inputs), (b, b_inputs) = peaks_of(tmp_path / "a") + peaks_of(tmp_path / "b")
    assert a == b == pytest.approx(1.2 * estimate)
    assert "stored" not in a_inputs and b_inputs["probed_by"] == "hpcdl run (its first probe)"
    assert b_inputs["stored"] == str(own_peak_store)
    assert "stored by hpcdl run (its first probe) on" in unwrapped(second.stdout)  # the MFU line: where
    (record,) = load_tree([tmp_path / "b"]).records
    assert any("stored peak is low (hpcdl info --probe" in f for f in record.result.metrics.flags)


def test_info_probe_stores_the_peak_every_run_then_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_peak_store: Path
) -> None:
    estimate = estimate_or_skip()
    monkeypatch.setattr("hpcdl.measure.peaks.gemm_ceiling", lambda device, prec: 1.5 * estimate)
    info = hpcdl("info", "--probe")
    assert info.returncode == 0, info.stderr
    fp32 = next(line for line in info.stdout.splitlines() if line.startswith("fp32"))
    assert "stored by hpcdl info --probe" in fp32 and "implied by the measured GEMM ceiling" in fp32
    assert f"kept per machine in {own_peak_store}" in info.stdout
    entry = peakstore.stored(cpu_info().model_name, "fp32")
    assert entry is not None and entry["gemm_ceiling_flops"] == 1.5 * estimate
    assert entry["flops_per_core"] * cpu_info().cores == pytest.approx(1.5 * estimate)
    again = hpcdl("info")  # without --probe: the stored peak, not the estimate
    assert "stored by hpcdl info --probe" in next(
        x for x in again.stdout.splitlines() if x.startswith("fp32")
    )
    ceilings(monkeypatch, 0.5 * estimate)  # a loaded machine's run: the peak does not move down either
    run = hpcdl(*MLP, "-o", tmp_path)
    assert run.returncode == 0, run.stderr
    ((flops, inputs),) = peaks_of(tmp_path)
    assert flops == pytest.approx(1.5 * estimate) and inputs["probed_by"] == "hpcdl info --probe"


def test_a_damaged_store_is_derived_again(tmp_path: Path, own_peak_store: Path) -> None:
    estimate_or_skip()
    own_peak_store.write_text("{not json")
    assert peakstore.stored(cpu_info().model_name, "fp32") is None
    assert cpu_peak("fp32") == cpu_peak("fp32", use_store=False)
    path = peakstore.store(cpu_info().model_name, "fp32", {"flops_per_core": 1e9}, "test")
    doc = json.loads(path.read_text())
    assert doc["schema"] == "hpcdl.peaks" and cpu_peak("fp32").flops == 1e9 * cpu_info().cores  # type: ignore[union-attr]


def test_the_store_is_where_the_environment_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(peakstore.STORE_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert peakstore.store_path() == tmp_path / "hpcdl" / "peaks.json"
    monkeypatch.setenv(peakstore.STORE_ENV, str(tmp_path / "x.json"))
    assert peakstore.store_path() == tmp_path / "x.json"
