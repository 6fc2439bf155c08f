"""Against a baseline (issue 45): ``--baseline DIR`` on ``hpcdl rank``, ``run --class`` and
``status`` prints each class workload's AI-ops/s over the baseline's at the same scale and fails
any workload below 95 % of it (DGX Cloud Exemplar's acceptance rule), exit 1. Checked with the
project's two reference runs of class S on one 2-core machine, a day apart."""

from __future__ import annotations

from pathlib import Path

import pytest
from hpcdl_cli import hpcdl, one_line

from hpcdl.records.loader import load_tree
from hpcdl.results.baseline import THRESHOLD
from hpcdl.results.score import suite_workload

REF = Path(__file__).resolve().parent.parent / "reference_results"
OLD = REF / "cpu-epyc-2core-2026-11-22" / "suite-np1"
NEW = REF / "cpu-epyc-2core-2026-11-23" / "suite-np1"


def ai_ops(folder: Path) -> dict[str, float]:
    return {
        str(suite_workload(r.result.spec, "S")): r.result.metrics.ai_ops_per_s
        for r in load_tree([folder]).records
    }


def rows(stdout: str) -> dict[str, list[str]]:
    names = ai_ops(NEW)
    return {
        line.split()[0]: line.split()
        for line in stdout.splitlines()
        if line.split()[:1] in [[n] for n in names]
    }


def test_rank_fails_a_system_below_95_percent_of_the_baseline(tmp_path: Path) -> None:
    p = hpcdl("rank", f"old={OLD}", "--baseline", NEW, "-o", tmp_path)
    assert p.returncode == 1, p.stderr
    old, new = ai_ops(OLD), ai_ops(NEW)
    found = rows(p.stdout.split("against the baseline")[1])
    for workload, cells in found.items():
        ratio = old[workload] / new[workload]
        assert cells[-2] == f"{ratio:.1%}" and cells[-1] == ("pass" if ratio >= THRESHOLD else "FAIL")
    assert len(found) == 5 and "baseline check: FAIL (5 of 5 workloads)" in p.stdout
    assert "at least 95 % of the baseline on every workload" in p.stdout


def test_rank_passes_a_system_at_or_above_the_baseline(tmp_path: Path) -> None:
    p = hpcdl("rank", f"new={NEW}", "--baseline", OLD, "-o", tmp_path)
    assert p.returncode == 0, p.stderr
    assert "baseline check: pass;" in p.stdout and "FAIL" not in p.stdout


def test_a_run_whose_records_do_not_count_fails_the_baseline(tmp_path: Path) -> None:
    p = hpcdl("run", "--class", "S", "batch_size=2", "--steps", "4", "--warmup", "1", "--min-duration", "0",
              "--baseline", NEW, "-o", tmp_path)  # fmt: skip
    assert p.returncode == 1
    assert p.stdout.count("no accepted record") == 5 and "baseline check: FAIL (5 of 5 workloads)" in p.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["run", "--workload", "mlp", "--baseline", str(NEW)],
            "compares a class run: hpcdl run --class NAME",
        ),
        (
            ["run", "--class", "S", "--baseline", "/nonexistent"],
            "baseline='/nonexistent' is invalid: an existing",
        ),
        (["run", "--class", "M", "--baseline", str(NEW)], "holds no accepted record of class M"),
        (["rank", str(NEW), "--baseline", "{empty}"], "holds no record hpcdl rank accepts"),
    ],
)
def test_a_bad_baseline_is_one_line_before_anything_runs(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    (tmp_path / "empty").mkdir()
    args = [a.replace("{empty}", str(tmp_path / "empty")) for a in args]
    assert expected in one_line(hpcdl(*args, "-o", tmp_path / "out"))
    assert not (tmp_path / "out").exists()
