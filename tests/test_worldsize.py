"""A launch that cannot split silently: processes started as singletons with a launcher's
variables saying 2 ranks each end with one line, exit 2, and write no record; ``hpcdl collect``
refuses a record measured on another world than its point's. Real processes, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl

from hpcdl.harness.runner import run
from hpcdl.parallel.worldsize import EXPECTED_ENV, WorldMismatch, check_world_size, promised_sizes
from hpcdl.schedulers.load import job_from_dict
from hpcdl.schedulers.point import points, write_point_file
from hpcdl.schedulers.state import remember
from hpcdl.schedulers.status import invalid_detail

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--workload", "mlp", "layers=1", "width=16", "input_size=8", "output_size=2", "batch_size=4"]
JOB = {
    "name": "split",
    "nodes": [2],
    "workload": {
        "family": "mlp",
        "layers": 1,
        "width": 16,
        "input_size": 8,
        "output_size": 2,
        "batch_size": 4,
    },
    "run": {"steps": 4, "warmup_steps": 1, "min_duration_s": 0.0},
}
# what srun without a PMIx plugin gives each task (srun --mpi=none); what mpirun gives each rank
SRUN_STEP = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "7"}
MPIRUN = {"OMPI_COMM_WORLD_SIZE": "2"}
LAUNCHER_VARS = ("OMPI_", "PMI_", "PMIX_", "MV2_", "SLURM_", EXPECTED_ENV)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    return {
        **env,
        "PYTHONPATH": str(ROOT),
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        **extra,
    }


@pytest.mark.slow(reason="two singleton processes waiting for their world's bound")
def test_singletons_told_two_ranks_end_with_one_line_and_no_record(tmp_path: Path) -> None:
    """Two processes at once, each alone in its MPI world: rank 0 of a job file's 2-node point
    (hpcdl's job entry, which sets HPCDL_WORLD_SIZE) as a task of an srun step without PMIx, and
    rank 1 as ``hpcdl run`` with mpirun's variable. Each ends itself: one line naming both sizes."""
    out = tmp_path / "out"
    job = job_from_dict({**JOB, "output": str(out)})
    (point,) = points(job, "local", out)
    point_json = write_point_file(point)
    runs = [
        (
            [sys.executable, "-m", "hpcdl.schedulers.entry", str(point_json)],
            clean_env(**SRUN_STEP, SLURM_PROCID="0"),
            "SLURM_STEP_NUM_TASKS=2, HPCDL_WORLD_SIZE=2",
        ),
        (
            [
                sys.executable,
                "-m",
                "hpcdl",
                "run",
                *TINY,
                "--steps",
                "4",
                "--min-duration",
                "0",
                "-o",
                str(out),
            ],
            clean_env(**MPIRUN, OMPI_COMM_WORLD_RANK="1"),
            "OMPI_COMM_WORLD_SIZE=2",
        ),
    ]
    procs = [
        (said, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for cmd, env, said in runs
    ]
    for said, p in procs:
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode == 2, stdout + stderr
        assert stderr.strip() == (
            f"hpcdl: error: this process joined a world of 1 rank(s), but {said}: each process started "
            'alone: the MPI world was not set up (no PMIx plugin?): use launcher = "mpirun" or '
            "srun --mpi=pmix; nothing run"
        ), stderr
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == [point_json.name]  # no record


def test_which_variables_promise_a_size() -> None:
    assert promised_sizes(SRUN_STEP) == {"SLURM_STEP_NUM_TASKS": 2}
    # mpirun in an allocation: its ranks inherit the step of its daemons (one per node)
    assert promised_sizes({**SRUN_STEP, "OMPI_COMM_WORLD_SIZE": "8"}) == {"OMPI_COMM_WORLD_SIZE": 8}
    # the batch script's one process is no task of a step: the allocation's count says nothing
    assert promised_sizes({"SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"}) == {}
    assert promised_sizes({"PMI_SIZE": "4", EXPECTED_ENV: "4"}) == {"PMI_SIZE": 4, EXPECTED_ENV: 4}
    check_world_size(4, {"PMI_SIZE": 4, EXPECTED_ENV: 4})
    with pytest.raises(
        WorldMismatch, match=r"world of 8 rank\(s\), but HPCDL_WORLD_SIZE=4: the launcher started"
    ):
        check_world_size(8, {"OMPI_COMM_WORLD_SIZE": 8, EXPECTED_ENV: 4})


def test_collect_refuses_a_record_of_another_world(tmp_path: Path) -> None:
    """A 1-rank record where the 2-node point's record belongs (what a split launch of an older
    hpcdl wrote) is shown as refused, not collected."""
    job = job_from_dict({**JOB, "output": str(tmp_path)})
    (point,) = points(job, "local", tmp_path)
    remember(tmp_path, point, None, job, "")
    run(point.workload(), point.config(), output_dir=tmp_path, name=point.name)  # one rank, here
    p = hpcdl("collect", str(tmp_path))
    out = p.stdout
    assert p.returncode == 0, p.stderr
    assert "split-n2.json was measured on a world of 1 rank(s), the point has 2: not collected" in out, out
    assert "0 of 1 points have a valid record" in out
    (row,) = json.loads((tmp_path / "collected.json").read_text())["points"]
    assert row["state"] == "refused" and "record" not in row
    # hpcdl status says the same of a finished job's record, not "for another spec"
    detail = invalid_detail(tmp_path / "split-n2.json", point.ranks)
    assert detail == "split-n2.json was measured on a world of 1 rank(s), the point has 2: not collected"


# ------------------------------------------------------------------------------ local Slurm cluster
@pytest.mark.slurm
def test_srun_without_pmix_ends_every_task(slurm_cluster: None, tmp_path: Path) -> None:
    """``srun --mpi=none`` on two nodes: two tasks each alone in its world; both end, no record."""
    cmd = [
        "srun",
        "--mpi=none",
        "-N2",
        "-n2",
        sys.executable,
        "-m",
        "hpcdl",
        "run",
        *TINY,
        "--steps",
        "4",
        "--min-duration",
        "0",
        "-o",
        str(tmp_path / "out"),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=clean_env())
    assert p.returncode == 2, p.stdout + p.stderr
    lines = [s for s in p.stderr.splitlines() if s.startswith("hpcdl: error:")]
    assert len(lines) == 2 and all(
        "joined a world of 1 rank(s), but SLURM_STEP_NUM_TASKS=2" in s for s in lines
    ), p.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.json"))
