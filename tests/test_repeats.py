"""Repeats: ``hpcdl run --repeat N`` runs each workload N times in one invocation, each run with
its own record, and a summary whose olympic mean, median and spread follow from the records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hpcdl_cli import hpcdl
from test_schedulers import write_job

from hpcdl import metrics
from hpcdl.records import schema
from hpcdl.records.audit import audit
from hpcdl.records.loader import read_record
from hpcdl.schedulers.status import status

TINY = ["--workload", "mlp", "layers=1", "width=32", "input_size=16", "output_size=4", "batch_size=8"]


ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_olympic_mean_drops_the_fastest_and_the_slowest() -> None:
    assert metrics.olympic_mean([10.0, 1.0, 4.0, 5.0, 100.0]) == pytest.approx(19 / 3)
    assert metrics.olympic_mean([3.0, 5.0]) == 4.0  # too few to drop any
    assert metrics.olympic_mean([7.0]) == 7.0


def test_repeats_keep_their_records_and_the_summary_follows_from_them(tmp_path: Path) -> None:
    p = hpcdl(
        "run", *TINY, "--steps", "40", "--min-duration", "0", "--repeat", "4", "--name", "rep",
        "-o", str(tmp_path), env=ONE_THREAD,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    records = [read_record(tmp_path / f"rep-r{i}.json") for i in range(1, 5)]
    assert all(not audit(r).problems for r in records)
    assert len({r.result.id for r in records}) == 4
    (path,) = tmp_path.glob("*-mlp-repeats.json")
    summary = json.loads(path.read_text())
    assert summary["schema"] == schema.REPEATS and summary["runs"] == 4
    assert summary["records"] == [f"rep-r{i}" for i in range(1, 5)]
    rates = sorted(r.result.metrics.samples_per_s for r in records)
    x = summary["samples_per_s"]
    assert x["olympic_mean"] == pytest.approx(float(np.mean(rates[1:-1])), rel=1e-12)
    assert x["median"] == pytest.approx(float(np.median(rates)), rel=1e-12)
    assert x["spread"] == pytest.approx((rates[-1] - rates[0]) / float(np.median(rates)), rel=1e-12)
    assert "olympic mean samples/s" in p.stdout and f"{x['olympic_mean']:.1f}" in p.stdout
    assert "time_to_target_s" not in summary


@pytest.mark.parametrize("value", ["0", "-2", "x", "1.5"])
def test_a_bad_repeat_count_is_one_line(value: str, tmp_path: Path) -> None:
    p = hpcdl("run", *TINY, f"--repeat={value}", "-o", str(tmp_path / "never"))
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "repeat" in lines[0], p.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.mpi
@pytest.mark.slow(reason="three runs of two ranks to the loss target")
def test_repeats_of_a_multi_rank_run_with_a_target(tmp_path: Path) -> None:
    """Two ranks started once, three runs each to the target: the summary's time to target."""
    p = hpcdl(
        "run",
        *TINY,
        "--np",
        "2",
        "--backend",
        "torch",
        "--repeat",
        "3",
        "--target-loss-fraction",
        "0.5",
        "--duration",
        "60",
        "--name",
        "mr",
        "-o",
        str(tmp_path),
        env=ONE_THREAD,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    views = [read_record(tmp_path / f"mr-r{i}.json").result for i in range(1, 4)]
    assert all(v.world_size == 2 and v.metrics.target and v.metrics.target.reached for v in views)
    (path,) = tmp_path.glob("*-mlp-repeats.json")
    summary = json.loads(path.read_text())
    times = sorted(v.metrics.target.time_to_target_s for v in views)  # type: ignore[union-attr,type-var]
    assert summary["targets_reached"] == 3
    assert summary["time_to_target_s"]["olympic_mean"] == pytest.approx(times[1], rel=1e-12)


@pytest.mark.mpi
@pytest.mark.slow(reason="a job of three repeats of two ranks through the local executor")
def test_a_job_file_repeats_its_point_in_one_allocation(tmp_path: Path) -> None:
    f = write_job(
        tmp_path / "rep.toml", name="rep", nodes=[2], repeat=3, backend="torch", output=str(tmp_path)
    )
    p = hpcdl("submit", str(f), "--executor", "local", timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    views = [read_record(tmp_path / f"rep-n2-r{i}.json").result for i in range(1, 4)]
    assert all(v.world_size == 2 and v.validity.passed for v in views)
    summary = json.loads((tmp_path / "rep-n2-repeats.json").read_text())
    rates = sorted(v.metrics.samples_per_s for v in views)
    assert summary["samples_per_s"]["olympic_mean"] == pytest.approx(rates[1], rel=1e-12)
    (row,) = status(tmp_path)
    assert row.state == "done"
