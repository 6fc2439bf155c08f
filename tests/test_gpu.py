"""What only a GPU shows: compiled steps captured as CUDA graphs, phases read from CUDA events,
the device's own choices (fused optimizer, channels-last, cuDNN's autotuner), and a run whose
host thread was starved flagged as disturbed. Marked ``gpu``: never in CI; run by
``scripts/gpu_reference.sh`` or ``pytest -m gpu`` on a machine with a GPU (they skip elsewhere)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl

from hpcdl.records.store import load_record

pytestmark = pytest.mark.gpu

MLP = ["--workload", "mlp", "layers=4", "width=1024", "input_size=1024", "batch_size=64"]
CNN = ["--workload", "cnn", "image_size=32", "stages=2", "base_width=16", "batch_size=32"]


def run(tmp_path: Path, name: str, *args: str) -> dict:
    p = hpcdl("run", *args, "--device", "cuda", "--steps", "50", "--min-duration", "0", "--name", name,
              "-o", str(tmp_path))  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return load_record(tmp_path / f"{name}.json")


def test_compiled_steps_run_as_cuda_graphs(tmp_path: Path) -> None:
    eager = run(tmp_path, "eager", *MLP, "--eager")
    graphs = run(tmp_path, "graphs", *MLP, "--compile", "--graphs")
    assert graphs["settings"]["execution"]["graphs"] and graphs["settings"]["execution"]["mode"] == "compile"
    assert graphs["metrics"]["compiled"]["graphs"] >= 1 and graphs["validity"]["passed"], graphs["validity"]
    assert graphs["metrics"]["time_to_first_step_s"] > graphs["metrics"]["step_time_s"]["median"]
    # a launch-bound step: replaying a graph takes the host's launches out of it
    assert graphs["metrics"]["step_time_s"]["median"] < eager["metrics"]["step_time_s"]["median"]


def test_phases_come_from_events_within_the_step(tmp_path: Path) -> None:
    rec = run(tmp_path, "events", *MLP)
    phases = rec["metrics"]["phases_s"]
    step = rec["metrics"]["step_time_s"]["mean"]
    assert 0 < sum(p["mean"] for p in phases.values()) <= step * 1.01  # the device's timeline of a step
    assert phases["backward"]["median"] > phases["data"]["median"]


def test_the_device_chooses_its_fast_path(tmp_path: Path) -> None:
    rec = run(tmp_path, "cnn", *CNN)
    assert rec["settings"]["execution"] == {
        "mode": "eager",
        "graphs": False,
        "fused_optimizer": True,
        "memory_format": "channels_last",
        "cudnn_benchmark": True,
    }
    assert rec["validity"]["passed"], rec["validity"]


HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def test_a_starved_host_thread_is_flagged(tmp_path: Path) -> None:
    """Launch-bound steps suffer first when the host thread waits for a CPU: two spinning
    processes per CPU the run may use, for the whole window."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", HOG, str(c)])
        for c in sorted(os.sched_getaffinity(0))
        for _ in range(2)
    ]
    try:
        time.sleep(0.5)
        p = hpcdl(
            "run", *MLP, "--device", "cuda", "--duration", "3", "--name", "starved", "-o", str(tmp_path)
        )
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert p.returncode == 1, p.stderr[-2000:]
    checks = {c["name"]: c for c in load_record(tmp_path / "starved.json")["validity"]["checks"]}
    assert not checks["quiet_machine"]["passed"], checks["quiet_machine"]
