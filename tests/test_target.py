"""Time to target: the loop stops at the first timed step whose recent losses reach the target
(checked against the steps file), the step limit ends a run that does not, bad fractions are one
line, and the score's time-to-quality variant is the geometric mean of real runs' times."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import hpcdl_cli  # beside this file, on pytest's path
import numpy as np
import pytest

import hpcdl
from hpcdl import metrics
from hpcdl.records.audit import audit, gate_problems
from hpcdl.records.loader import read_record
from hpcdl.records.store import read_steps, seal, write_record
from hpcdl.results import ranking as rank_mod
from hpcdl.results.score import QUALITY_TARGET

SPEC = {"family": "mlp", "layers": 2, "width": 64, "input_size": 32, "output_size": 16, "batch_size": 16}


def measure(tmp_path: Path, **run: object) -> hpcdl.RunResult:
    cfg = hpcdl.RunConfig.from_dict({"min_duration_s": 0.0, **run})
    return hpcdl.run(hpcdl.spec_from_dict(SPEC), cfg, output_dir=tmp_path, name="t")


def test_the_window_ends_at_the_first_step_that_reaches_the_target(tmp_path: Path) -> None:
    res = measure(tmp_path, target_loss_fraction=0.5, duration_s=120.0)
    r = res.result
    target = r.metrics.target
    assert target is not None and target.reached and target.fraction == 0.5
    assert res.path is not None and res.steps_path is not None
    steps = read_steps(res.steps_path)
    timed = list(steps["loss"][r.run.warmup_steps :])
    window = target.window_steps  # the run's pool_batches
    assert len(timed) == r.metrics.timed_steps and target.loss_first == timed[0]
    stops = [metrics.reached_target(timed[0], timed[: i + 1][-window:], 0.5) for i in range(len(timed))]
    assert stops[-1] and not any(stops[:-1])  # the first step that reached it, not a later one
    assert target.loss_final == pytest.approx(float(np.mean(timed[-window:])))
    assert target.time_to_target_s == r.metrics.timed_window_s < 120
    assert target.samples_to_target == r.metrics.timed_steps * SPEC["batch_size"]
    assert read_record(res.path).result.metrics.target == target  # as written and read back
    assert not audit(read_record(res.path)).problems and r.validity.passed


def test_the_step_limit_ends_a_run_that_does_not_reach_its_target(tmp_path: Path) -> None:
    r = measure(tmp_path, target_loss_fraction=1e-6, steps=12).result
    target = r.metrics.target
    assert target is not None and not target.reached and r.metrics.timed_steps == 12
    assert target.time_to_target_s is None and target.samples_to_target is None
    assert "shortest timed window" in "; ".join(gate_problems(r))  # a short window that did not reach it


def test_a_target_claimed_reached_is_checked_against_the_losses(tmp_path: Path) -> None:
    """A forger who claims the target (which lifts the 5 s window) and reseals the record is
    caught by rank 0's losses in the steps file."""
    res = measure(tmp_path, target_loss_fraction=1e-6, steps=12)
    assert res.path is not None and not audit(read_record(res.path)).problems
    doc = json.loads(res.path.read_text())
    doc["metrics"]["target"].update(reached=True, time_to_target_s=doc["metrics"]["timed_window_s"])
    write_record(seal({k: v for k, v in doc.items() if k != "digest"}), res.path)
    forged = read_record(res.path)
    assert forged.result.metrics.target.reached  # type: ignore[union-attr]
    assert "target claimed reached, but rank 0's losses" in "; ".join(audit(forged).problems)


def test_runs_without_a_target_have_none(tmp_path: Path) -> None:
    r = measure(tmp_path, steps=3).result
    assert r.metrics.target is None and "target" not in r.raw["metrics"]
    assert r.metrics.window_start_unix is not None and r.metrics.window_end_unix is not None
    span = r.metrics.window_end_unix - r.metrics.window_start_unix
    assert span == pytest.approx(r.metrics.timed_window_s, abs=1e-6)  # epoch floats: ~0.2 µs steps


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.2", "nan", "inf", "half"])
def test_a_target_outside_zero_one_is_one_line(value: str, tmp_path: Path) -> None:
    p = hpcdl_cli.hpcdl(
        "run", "--workload", "mlp", f"--target-loss-fraction={value}", "-o", str(tmp_path / "never")
    )
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "target" in lines[0], p.stderr
    assert not (tmp_path / "never").exists()


def test_random_data_cannot_have_a_target() -> None:
    with pytest.raises(hpcdl.SpecError, match="needs learnable or hdf5 data"):
        hpcdl.RunConfig(target_loss_fraction=0.5, data="random")


@pytest.mark.slow(reason="the class S suite trained to its loss target: minutes")
def test_time_to_quality_score_of_a_class_run_with_the_target(tmp_path: Path) -> None:
    """The class S suite trained to the quality target: every record passes the gate though
    its window is short, and the time-to-quality score is the geomean of their times."""
    out = tmp_path / "sys"
    p = hpcdl_cli.hpcdl(
        "run", "--class", "S", "batch_size=8", "--steps", "3000", "--target-loss-fraction",
        str(QUALITY_TARGET), "-o", str(out), env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.count("reached 0.5 of the first loss") == 5
    targets = [read_record(f).result.metrics.target for f in out.glob("*.json") if "suite" not in f.name]
    times = [t.time_to_target_s for t in targets if t is not None and t.time_to_target_s is not None]
    assert len(targets) == len(times) == 5
    r = rank_mod.rank([("sys", out)])
    assert r.rejected == []
    (s,) = r.systems
    assert s.time_to_quality_s == pytest.approx(math.prod(times) ** (1 / 5), rel=1e-12)
    assert s.score is None and "incomplete" in s.reason  # target runs are not throughput measurements
    table = rank_mod.terminal_table(r)
    assert f"{s.time_to_quality_s:.3g} s" in table
