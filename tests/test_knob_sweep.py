"""``hpcdl sweep --knob NAME=V1,V2,...``: one record per value of a workload knob and a summary
(``scaling.knobsweep``); the first value that does not fit ends the sweep with the points before
it kept; bad input is one line; job files take the same sweep (``job.sweep``); a stopped sweep
keeps its finished points. Real runs of tiny specs, each point its own process."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl, one_line
from test_kills import Launched
from test_schedulers import write_job

from hpcdl.records.loader import load_tree
from hpcdl.schedulers.load import load_job
from hpcdl.schedulers.point import points

TINY = ["--workload", "attention", "layers=1", "width=32", "heads=2", "vocab=50", "batch_size=4"]
RUN = ["--steps", "4", "--warmup", "1", "--min-duration", "0", "--data", "random"]
TOO_BIG = ["--workload", "mlp", "layers=100", "width=100000"]  # no batch fits a rank here
SUMMARY = "sweep-seq_len-np1-summary.json"


@pytest.mark.parametrize(
    ("argv", "named", "allowed"),
    [
        (["--knob", "depth=1,2"], "knob='depth'", "a numeric knob of attention"),
        (["--knob", "precision=1"], "knob='precision'", "a numeric knob of attention"),
        (["--knob", "seq_len"], "knob='seq_len'", "NAME=V1,V2"),
        (["--knob", "seq_len="], "knob='seq_len='", "at least one value"),
        (["--knob", "seq_len=,,"], "knob='seq_len=,,'", "at least one value"),
        (["--knob", "seq_len=8,a"], "attention.seq_len='a'", "an integer"),
        (["--knob", "seq_len=0,8"], "attention.seq_len=0", "must be in [1,"),
        (["--knob", "seq_len=8.5"], "attention.seq_len='8.5'", "an integer"),
        (["--knob", "dropout=nan"], "attention.dropout", "finite"),
        (["--knob", "dropout=0.1,inf"], "attention.dropout", "finite"),
        (["--knob", "dropout=2"], "attention.dropout=2", "must be in"),
        (["--knob", ",".join(["8"] * 65).join(["seq_len=", ""])], "knob='65 values'", "at most 64"),
        (["--knob", "seq_len=8,16", "--np", "1,2"], "np='1,2'", "one rank count"),
        (["--knob", "seq_len=8", "--np", "0"], "np='0'", "one rank count >= 1"),
        (["--knob", "seq_len=8", "--mode", "strong"], "mode='strong'", "a rank sweep's"),
        (["--knob", "seq_len=8", "--power-limit", "100"], "knob='seq_len=8'", "one sweep per command"),
    ],
)
def test_bad_knob_sweeps_are_one_line_and_run_nothing(
    tmp_path: Path, argv: list[str], named: str, allowed: str
) -> None:
    out = tmp_path / "out"
    line = one_line(hpcdl("sweep", *TINY, *argv, *RUN, "-o", str(out)))
    assert named in line and allowed in line, line
    assert not out.exists()


def test_a_first_value_that_does_not_fit_is_refused_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    line = one_line(hpcdl("sweep", *TOO_BIG, "--knob", "batch_size=2,1", *RUN, "-o", str(out)))
    assert "knob='batch_size=1'" in line and "does not fit" in line and "GiB" in line
    assert not out.exists()


def test_a_sweep_writes_a_record_per_value_in_increasing_order(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = hpcdl("sweep", *TINY, "--knob", "seq_len=16,8,16", *RUN, "-o", str(out))
    assert p.returncode in (0, 1), p.stderr[-3000:]  # 1: a disturbed machine failed a point's validity
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["schema"] == "hpcdl.knob-sweep" and summary["knob"] == "seq_len" and summary["np"] == 1
    assert [pt["value"] for pt in summary["points"]] == [8, 16]  # sorted, each value once
    assert summary["left_out"] is None
    records = {r.path.name: r.result for r in load_tree([out]).records}
    assert {records[f"sweep-seq_len{v}-np1.json"].spec["seq_len"] for v in (8, 16)} == {8, 16}
    for pt in summary["points"]:
        assert pt["record"] == f"sweep-seq_len{pt['value']}-np1.json"
        assert pt["valid"] == records[pt["record"]].validity.passed  # a disturbed machine may fail one
        assert pt["batch_per_rank"] == 4 and pt["samples_per_s"] > 0 and 0 < pt["mfu"] < 1
        assert sum(pt["phase_shares"].values()) == pytest.approx(1.0)
        assert pt["peak_memory_bytes"] > 0 and pt["estimated_memory_bytes"] > 0
    assert p.stdout.splitlines()[-4].split()[0] == "seq_len"  # the table's head
    again = hpcdl("sweep", *TINY, "--knob", "seq_len=8,16", *RUN, "-o", str(out))
    standing = [pt for pt in summary["points"] if pt["valid"]]
    assert again.stderr.count("exists, skipped") == len(standing)  # an invalid point runs again


def test_a_batch_sweep_with_fit_stops_at_the_first_batch_past_the_fraction(tmp_path: Path) -> None:
    """With ``--fit F`` the knob sets the batch and F the memory each point must fit in: the
    points before the first that does not are run and kept, the sweep says where it stopped."""
    out = tmp_path / "out"
    mlp = ["--workload", "mlp", "layers=1", "width=64", "input_size=1024", "output_size=1000"]
    p = hpcdl("sweep", *mlp, "--knob", "batch_size=1048576,4,8", "--fit", "0.5", *RUN, "-o", str(out))
    assert p.returncode in (0, 1), p.stderr[-3000:]
    assert "batch_size=1048576 does not fit (an estimated" in p.stderr and "more than 0.5 of the" in p.stderr
    summary = json.loads((out / "sweep-batch_size-np1-summary.json").read_text())
    assert summary["left_out"]["value"] == 1048576 and not summary["fitted"]
    assert [pt["value"] for pt in summary["points"]] == [4, 8, 1048576]
    assert summary["points"][2]["record"] is None
    assert not (out / "sweep-batch_size1048576-np1.json").exists()
    ran = {r.result.settings.batch_per_rank for r in load_tree([out]).records}
    assert ran == {4, 8}  # the knob's batches, not fitted ones


def test_a_job_file_takes_the_same_sweep(tmp_path: Path) -> None:
    workload = {"family": "attention", "layers": 1, "width": 32, "heads": 2, "vocab": 50}
    job = write_job(tmp_path / "j.toml", name="seq", nodes=[1, 2], sweep="seq_len=16,8", workload=workload)
    loaded = load_job(job)
    found = points(loaded, "local", tmp_path / "out")
    assert [p.name for p in found] == ["seq-n1", "seq-n2"]
    assert list(found[0].workloads) == ["seq_len8", "seq_len16"]  # in increasing order
    assert [r[0].name for r in found[0].records()] == ["seq-n1-seq_len8.json", "seq-n1-seq_len16.json"]
    assert [s.seq_len for s in found[1].named_specs().values()] == [8, 16]
    p = hpcdl("submit", str(job), "--dry-run")
    assert p.returncode == 0 and "# sweep: seq_len8, seq_len16, one after another" in p.stdout


@pytest.mark.parametrize(
    ("sweep", "named"),
    [("depth=1", "job.sweep='depth'"), ("seq_len=", "job.sweep='seq_len='"), ("seq_len=0", "seq_len=0")],
)
def test_a_bad_sweep_in_a_job_file_is_one_line(tmp_path: Path, sweep: str, named: str) -> None:
    job = write_job(tmp_path / "j.toml", name="seq", sweep=sweep,
                    workload={"family": "attention", "layers": 1, "width": 32, "heads": 2})  # fmt: skip
    assert named in one_line(hpcdl("submit", str(job), "--dry-run"))


def test_a_class_job_takes_no_knob_sweep(tmp_path: Path) -> None:
    job = write_job(tmp_path / "j.toml", name="c", sweep="batch_size=2,4", workload={"class": "S"})
    assert "job.sweep=" in one_line(hpcdl("submit", str(job), "--dry-run"))


@pytest.mark.slow(reason="three points as processes of several seconds each, the sweep stopped in the second")
def test_a_stopped_sweep_keeps_its_finished_points_and_names_the_missing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["sweep", *TINY, "--knob", "seq_len=8,16,32", "--duration", "6", "--min-duration", "0"]
    run = Launched([*argv, "--data", "random", "-o", str(out)], out)
    end = time.monotonic() + 240
    while not (out / "sweep-seq_len8-np1.json").exists():
        assert run.proc.poll() is None and time.monotonic() < end, run.output[-3000:]
        time.sleep(0.2)
    run.timing()  # the second point measures
    run.proc.send_signal(signal.SIGTERM)
    assert run.ended() == 128 + signal.SIGTERM
    assert "missing: seq_len=16, 32" in run.output, run.output[-2000:]
    summary = json.loads((out / SUMMARY).read_text())
    assert [pt["record"] is not None for pt in summary["points"]][1:] == [False, False]
    assert not (out / "sweep-seq_len16-np1.json").exists()


def test_a_job_sweep_stops_at_the_first_value_that_does_not_fit(tmp_path: Path) -> None:
    """The point runs its values in increasing order in one allocation; the first whose estimated
    memory passes a rank's ends it, and the records before it stand."""
    out = tmp_path / "out"
    job = write_job(tmp_path / "j.toml", name="bs", sweep="batch_size=1048576,4", output=str(out),
                    workload={"family": "mlp", "layers": 1, "width": 64, "input_size": 4096},
                    run={"steps": 4, "warmup_steps": 1, "min_duration_s": 0.0, "data": "random"})  # fmt: skip
    p = hpcdl("submit", str(job), "--executor", "local")
    assert p.returncode == 1 and "1 of 2 records" in p.stdout, p.stdout + p.stderr[-3000:]  # not all ran
    assert [r.path.name for r in load_tree([out]).records] == ["bs-n1-batch_size4.json"]
    (log,) = out.glob("submitit/*/*_log.out")
    assert "bs-n1-batch_size1048576: does not fit (an estimated" in log.read_text()
