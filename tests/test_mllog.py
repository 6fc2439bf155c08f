"""MLPerf-style logs: the lines ``hpcdl run --mllog`` writes are parsed by mlcommons' own parser
(the ``mlperf-logging`` package) and agree with the records they come from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hpcdl_cli import hpcdl
from mlperf_logging.compliance_checker import mlp_parser

from hpcdl.records import mllog
from hpcdl.records.loader import read_record
from hpcdl.records.store import read_steps

TINY = ["--workload", "mlp", "layers=2", "width=64", "input_size=32", "output_size=16", "batch_size=16"]


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs of one workload logged into one file."""
    out = tmp_path_factory.mktemp("mllog")
    p = hpcdl(
        "run", *TINY, "--duration", "2.5", "--repeat", "2", "--mllog", str(out / "log.txt"), "--name", "m",
        "-o", str(out), env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return out


def events(path: Path) -> dict[str, list[mlp_parser.LogLine]]:
    """The parsed lines by namespace (one per run), checked to parse without an error."""
    lines, errors = mlp_parser.parse_file(str(path), ruleset="6.1.0")
    assert errors == [] and lines
    runs: dict[str, list[mlp_parser.LogLine]] = {}
    for x in lines:
        runs.setdefault(json.loads(x.full_string.removeprefix(mllog.PREFIX))["namespace"], []).append(x)
    return runs


def test_every_line_parses_and_each_run_is_complete(logged: Path) -> None:
    runs = events(logged / "log.txt")
    assert sorted(runs) == ["m-r1", "m-r2"]
    for name, lines in runs.items():
        r = read_record(logged / f"{name}.json").result
        keys = Counter(x.key for x in lines)
        for key in (
            "init_start",
            "init_stop",
            "run_start",
            "run_stop",
            "global_batch_size",
            "seed",
            "train_samples",
        ):
            assert keys[key] == 1, (name, key)
        at = {x.key: x for x in lines}
        assert at["init_start"].timestamp <= at["init_stop"].timestamp == at["run_start"].timestamp
        assert at["run_start"].timestamp == round(r.metrics.window_start_unix * 1000)  # type: ignore[operator]
        assert at["run_stop"].timestamp == round(r.metrics.window_end_unix * 1000)  # type: ignore[operator]
        assert at["run_stop"].value["metadata"]["status"] == "success"
        assert at["global_batch_size"].value["value"] == r.settings.global_batch
        assert at["seed"].value["value"] == r.spec["seed"]
        samples = r.metrics.timed_steps * r.settings.global_batch
        assert at["train_samples"].value["value"] == samples


def test_throughput_blocks_cover_the_steps(logged: Path) -> None:
    lines = events(logged / "log.txt")["m-r1"]
    r = read_record(logged / "m-r1.json").result
    steps = read_steps(logged / r.steps_file)["step_s"]
    starts = [x for x in lines if x.key == "block_start"]
    stops = [x for x in lines if x.key == "block_stop"]
    stats = [x for x in lines if x.key == "tracked_stats"]
    assert len(starts) == len(stops) == len(stats) >= 2  # a 2.5 s window: about one block a second
    counts = [
        (a.value["metadata"]["samples_count"], b.value["metadata"]["samples_count"])
        for a, b in zip(starts, stops, strict=True)
    ]
    assert counts[0][0] == 0 and counts[-1][1] == len(steps) * r.settings.global_batch
    assert all(prev[1] == nxt[0] for prev, nxt in zip(counts, counts[1:], strict=False))  # contiguous
    for (lo, hi), a, b, s in zip(counts, starts, stops, stats, strict=True):
        seconds = float(np.sum(steps[lo // r.settings.global_batch : hi // r.settings.global_batch]))
        assert s.value["value"]["throughput"] == pytest.approx((hi - lo) / seconds, rel=1e-9)
        assert b.timestamp - a.timestamp == pytest.approx(seconds * 1000, abs=1.5)  # whole ms


def test_power_readings_where_measured(logged: Path) -> None:
    """A GPU trace in the steps file becomes one reading per finite sample, at its time."""
    view = read_record(logged / "m-r1.json").result
    steps = {
        "step_s": np.array([0.5, 0.5]),
        "gpu_time_s": np.array([0.0, 0.1, 0.2]),
        "gpu_power_w": np.array([300.0, np.nan, 320.0]),
    }
    lines = [json.loads(x.removeprefix(mllog.PREFIX)) for x in mllog.run_lines(view, steps, 0.0)]
    power = [x for x in lines if x["key"] == "power_reading"]
    assert [x["value"] for x in power] == [300.0, 320.0]
    start = view.metrics.window_start_unix
    assert [x["time_ms"] for x in power] == [round(start * 1000), round((start + 0.2) * 1000)]  # type: ignore[operator]


def test_a_log_that_cannot_be_written_is_refused_before_running(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcdl",
            "run",
            *TINY,
            "--mllog",
            str(tmp_path / "no" / "log"),
            "-o",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "mllog=" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
