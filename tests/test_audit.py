"""The audit of a record against its own steps file: real reference records and real runs pass;
forgeries whose every figure and digest were recomputed are caught where their claimed window
and step counts disagree with their per-step times; steps files that are sparse giants, FIFOs
or paths outside the record's folder are refused before they are hashed."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

import hpcdl
from hpcdl import metrics
from hpcdl.records.audit import MIN_STEPS_SHARE, audit, steps_file_limit
from hpcdl.records.loader import load_tree, read_record
from hpcdl.records.store import file_sha256, load_record, read_steps, seal, write_record, write_steps

REF = Path(__file__).resolve().parent.parent / "reference_results" / "cpu-epyc-2core-2026-11-22"
SUITE_RECORD = "20261122-082246-mlp-wide.json"


def test_reference_records_pass_and_bring_their_steps() -> None:
    for record in load_tree([REF]).records:
        checked = audit(record)
        assert checked.problems == (), (record.path, checked.problems)
        lead = next(x for x in record.result.metrics.per_rank if x.rank == 0)
        assert len(checked.steps["step_s"]) == lead.timed_steps
        assert len(checked.losses) == record.raw["run"]["warmup_steps"] + lead.timed_steps
        share = float(np.sum(checked.steps["step_s"])) / lead.timed_window_s
        assert MIN_STEPS_SHARE < share <= 1.0


def test_a_real_run_passes(tmp_path: Path) -> None:
    spec = hpcdl.spec_from_dict({"family": "mlp", "layers": 1, "width": 16, "input_size": 8, "batch_size": 4})
    path = hpcdl.run(
        spec, hpcdl.RunConfig(steps=30, warmup_steps=2, min_duration_s=0.0), output_dir=tmp_path
    ).path
    assert path is not None and audit(read_record(path)).problems == ()


def copy_record(tmp_path: Path, name: str = SUITE_RECORD) -> Path:
    src = next(REF.rglob(name))
    rec = load_record(src)
    shutil.copy(src.parent / rec["steps_file"], tmp_path / rec["steps_file"])
    return Path(shutil.copy(src, tmp_path / name))


def forge_window(rec: dict[str, Any], window_s: float) -> dict[str, Any]:
    """The record claiming ``window_s`` for rank 0, every derived figure and the digest recomputed
    as a careful forger would: what the digest and the derived-figure checks cannot catch."""
    m = rec["metrics"]
    lead = next(r for r in m["per_rank"] if r["rank"] == 0)
    lead["timed_window_s"] = window_s
    lead["samples_per_s"] = metrics.throughput(
        rec["settings"]["batch_per_rank"] * lead["timed_steps"], window_s
    )
    windows = [r["timed_window_s"] for r in m["per_rank"]]
    samples = [rec["settings"]["batch_per_rank"] * r["timed_steps"] for r in m["per_rank"]]
    m["timed_window_s"] = max(windows)
    m["samples_per_s"] = metrics.aggregate_throughput(samples, windows)
    m["ai_ops_per_s"] = metrics.ai_ops_per_s(m["train_flops_per_sample"], m["samples_per_s"])
    return seal(rec)


def steps_total(path: Path) -> float:
    rec = load_record(path)
    return float(np.sum(read_steps(path.parent / rec["steps_file"])["step_s"]))


def test_a_window_shorter_than_its_steps_is_a_forgery(tmp_path: Path) -> None:
    """The forgery seen in the wild: a 5.45 s window whose own step times add up to 5.91 s."""
    path = copy_record(tmp_path)
    total = steps_total(path)
    write_record(forge_window(load_record(path), 0.92 * total), path)
    (problem,) = audit(read_record(path)).problems  # every other check passes
    assert f"add up to {total:.6g} s, more than its window" in problem
    write_record(forge_window(load_record(path), total), path)  # to the last timer tick: honest
    assert audit(read_record(path)).problems == ()


def test_steps_that_fill_little_of_their_window_are_a_forgery(tmp_path: Path) -> None:
    path = copy_record(tmp_path)
    write_record(forge_window(load_record(path), steps_total(path) / (0.9 * MIN_STEPS_SHARE)), path)
    (problem,) = audit(read_record(path)).problems
    assert "fill only 45.0% of its" in problem


def test_a_steps_file_with_the_wrong_step_counts_is_caught(tmp_path: Path) -> None:
    path = copy_record(tmp_path)
    rec = load_record(path)
    steps = path.parent / rec["steps_file"]
    columns = {k: v.tolist() for k, v in read_steps(steps).items()}
    write_steps({**columns, "loss": columns["loss"][1:]}, steps)  # one warm-up loss fewer
    rec["steps_sha256"] = file_sha256(steps)
    write_record(seal(rec), path)
    (problem,) = audit(read_record(path)).problems
    lead = rec["metrics"]["per_rank"][0]
    assert (
        f"holds {len(columns['loss']) - 1} losses, the run claims 3 warm-up and {lead['timed_steps']}"
        in problem
    )


def test_a_sparse_giant_steps_file_is_refused_unhashed(tmp_path: Path) -> None:
    path = copy_record(tmp_path)
    steps = path.parent / load_record(path)["steps_file"]
    subprocess.run(["truncate", "-s", "64G", str(steps)], check=True)  # no disk used, 64 GB to hash
    t0 = time.monotonic()
    (problem,) = audit(read_record(path)).problems
    assert time.monotonic() - t0 < 5
    limit, _ = steps_file_limit(read_record(path).result)
    assert limit < 2 << 20 and "68.7 GB, more than the" in problem and "steps and a 12 s window" in problem


def test_a_fifo_or_a_path_elsewhere_is_no_steps_file(tmp_path: Path) -> None:
    path = copy_record(tmp_path)
    rec = load_record(path)
    steps = path.parent / rec["steps_file"]
    steps.unlink()
    os.mkfifo(steps)
    (problem,) = audit(read_record(path)).problems
    assert "a FIFO, not a regular file" in problem
    for name in ("../" + steps.name, str(steps), "/dev/zero"):
        write_record(seal({**rec, "steps_file": name}), path)
        (problem,) = audit(read_record(path)).problems
        assert f"steps file {name!r} is not a file name beside {path.name}" in problem
