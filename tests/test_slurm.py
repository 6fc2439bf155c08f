"""hpcdl submit, status and collect against a real Slurm cluster: scripts/slurm/start-cluster.sh
runs four slurmd nodes (n1 ... n4) on the hosts of the emulated cluster (tests/conftest.py: each
node in its own network namespace, on a 200 Mbit/s link), with accounting (sacct) through
slurmdbd; slurmctld runs on the emulated cluster's head, and the tests reach it through the
client wrappers of scripts/slurm/client/ (first on PATH), as users do from a login node.

The cluster is started once for the session and stopped at its end, pass or fail (set
HPCDL_SLURM_KEEP=1 to leave it running). Every job is tiny: the fake nodes share two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hpcdl_cli import hpcdl, one_line

from hpcdl.cli.jobs import status_table
from hpcdl.scaling.sweep import valid_point
from hpcdl.schedulers.jobfile import Job
from hpcdl.schedulers.load import load_job
from hpcdl.schedulers.point import points
from hpcdl.schedulers.protocol import SCHEDULERS
from hpcdl.schedulers.state import load_state
from hpcdl.schedulers.status import PointStatus, status, wait
from hpcdl.workloads import recipes
from hpcdl.workloads.registry import spec_from_dict

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.slurm,
    # the one reason to skip: the cluster's daemons, /etc/hosts and UTS namespaces need root
    pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm test cluster needs root"),
]

MLP = {"family": "mlp", "layers": 2, "width": 64, "input_size": 32, "output_size": 10, "batch_size": 16}
SHORT_RUN = {"steps": 12, "warmup_steps": 2, "min_duration_s": 0.0}
LONG_RUN = {"steps": 10_000_000, "min_duration_s": 0.0}  # runs until cancelled


@pytest.fixture(scope="session")
def cluster(slurm_cluster: None) -> None:
    """The session's 4-node Slurm cluster (tests/conftest.py)."""


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def write_job(path: Path, **fields: Any) -> Path:
    """A job file: scalar fields first, then tables (workload, run, env)."""
    fields = {"workload": MLP, "run": SHORT_RUN, "env": {"OMP_NUM_THREADS": "1"}, "time_min": 5, **fields}
    lines = [f"{k} = {toml_value(v)}" for k, v in fields.items() if not isinstance(v, dict)]
    for k, v in fields.items():
        if isinstance(v, dict):
            lines += [f"[{k}]", *(f"{kk} = {toml_value(vv)}" for kk, vv in v.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def all_job_ids() -> set[str]:
    """Every job Slurm knows of, queued or finished."""
    out = subprocess.run(
        ["sacct", "-a", "-X", "-n", "-P", "-o", "JobID", "-S", "2000-01-01"], capture_output=True, text=True
    )
    queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
    return set(out.stdout.split()) | set(queued.stdout.split())


def hostnames(nodelist: str) -> list[str]:
    """A Slurm node list (``n[1-2,4]``) as host names, in order."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def job_id(out: Path, point: str) -> str:
    return str(load_state(out)["points"][point]["job_id"])


def sbatch_script(job: Job, nodes: int, out: Path) -> str:
    """The batch script of the job's point on ``nodes`` nodes: what --dry-run prints."""
    (point,) = [p for p in points(job, "slurm", out) if p.nodes == nodes]
    return SCHEDULERS.get("slurm")().script(job, point)


def wait_for(out: Path, point: str, ok: Any, timeout_s: float) -> PointStatus:
    """Poll the point's status until ``ok(status)``; fail with the last status after the timeout."""
    end = time.monotonic() + timeout_s
    while True:
        (row,) = status(out, [point])
        if ok(row):
            return row
        if time.monotonic() > end:
            pytest.fail(f"{point}: still {row.state} ({row.detail}) after {timeout_s:.0f} s")
        time.sleep(1)


def record(out: Path, point: str) -> dict[str, Any]:
    return json.loads((out / f"{point}.json").read_text())


# ------------------------------------------------------------------------------ real runs
@pytest.fixture(scope="module")
def sweep(cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three job files into one results directory, submitted through the command line:
    a torch sweep over 1 and 2 nodes, Horovod on 2 nodes with jemalloc preloaded (as an operator
    would for a fitted CPU run), and torch on 2 nodes with mpirun inside the allocation. Returns
    the directory once every point has ended."""
    out = tmp_path_factory.mktemp("slurm")
    files = [
        write_job(out / "torch.toml", name="torch", nodes=[1, 2], backend="torch", output=str(out)),
        write_job(
            out / "horovod.toml",
            name="horovod",
            nodes=[2],
            backend="horovod",
            output=str(out),
            env={"OMP_NUM_THREADS": "1", "LD_PRELOAD": "libjemalloc.so.2"},  # setup.sh --test installs it
        ),
        write_job(
            out / "mpirun.toml", name="mpirun", nodes=[2], backend="torch", launcher="mpirun", output=str(out)
        ),
    ]
    for f in files:
        p = hpcdl("submit", str(f))
        assert p.returncode == 0, p.stderr
        assert "submitted Slurm job" in p.stdout and f"hpcdl status {out}" in p.stdout, p.stdout
    rows = wait(out, timeout_s=300, poll_s=1)
    assert all(r.state == "done" for r in rows), "\n" + status_table(rows)
    return out


@pytest.mark.mpi
@pytest.mark.parametrize(
    "point, backend", [("torch-n2", "torch"), ("horovod-n2", "horovod"), ("mpirun-n2", "torch")]
)
def test_two_nodes_one_rank_each(sweep: Path, point: str, backend: str) -> None:
    rec = record(sweep, point)
    s = rec["settings"]
    assert s["world_size"] == 2 and s["nodes"] == 2
    assert s["hosts"] == hostnames(rec["environment"]["slurm"]["nodelist"])  # the nodes Slurm gave it
    assert s["backend"] == backend
    per_rank = rec["metrics"]["per_rank"]
    assert sorted(r["rank"] for r in per_rank) == [0, 1]  # every rank measured and gathered
    assert sorted(r["host"] for r in per_rank) == s["hosts"]
    assert all(r["torch_threads"] == 1 for r in per_rank)  # [env] OMP_NUM_THREADS reached the ranks
    malloc = "jemalloc" if backend == "horovod" else "glibc"  # [env] LD_PRELOAD reached rank 0
    assert rec["environment"]["malloc"] == malloc
    assert rec["validity"]["passed"], rec["validity"]
    checks = {c["name"] for c in rec["validity"]["checks"]}
    assert {"one_step_equivalence", "parameters_identical"} <= checks
    env = rec["environment"]
    assert env["slurm_job_id"] == job_id(sweep, point)
    assert env["slurm"]["job_id"] == env["slurm_job_id"] and env["slurm"]["job_name"] == point
    assert env["slurm"]["num_nodes"] == "2"


@pytest.mark.mpi
def test_node_count_sweep_status_and_collect(sweep: Path) -> None:
    one = record(sweep, "torch-n1")
    assert one["settings"]["world_size"] == 1 and one["settings"]["hosts"][0] in ("n1", "n2")
    assert one["environment"]["slurm"]["nodelist"] == one["settings"]["hosts"][0]
    p = hpcdl("status", str(sweep))
    assert p.returncode == 0, p.stderr
    for point in ("torch-n1", "torch-n2", "horovod-n2", "mpirun-n2"):
        assert any(line.startswith(point) and " done " in line for line in p.stdout.splitlines()), p.stdout
    p = hpcdl("collect", str(sweep))
    assert p.returncode == 0, p.stderr
    assert "4 of 4 points have a valid record" in p.stdout, p.stdout
    collected = json.loads((sweep / "collected.json").read_text())
    torch_points = {r["point"]: r for r in collected["points"] if r["job"] == "torch"}
    assert torch_points["torch-n1"]["efficiency"] == pytest.approx(1.0)
    assert torch_points["torch-n2"]["efficiency"] > 0 and len(set(torch_points["torch-n2"]["hosts"])) == 2


@pytest.mark.mpi
def test_resubmit_skips_valid_points(sweep: Path) -> None:
    before = all_job_ids()
    p = hpcdl("submit", str(sweep / "torch.toml"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("exists, not submitted") == 2, p.stdout
    assert all_job_ids() == before


@pytest.mark.mpi
def test_dry_run_prints_the_script_sbatch_was_given(sweep: Path) -> None:
    job = load_job(sweep / "torch.toml")
    script = sbatch_script(job, 2, sweep)
    jid = job_id(sweep, "torch-n2")
    assert (sweep / "submitit" / jid / f"{jid}_submission.sh").read_text() == script
    # Slurm's own copy of what it was given (it keeps a finished job for MinJobAge, 300 s)
    kept = subprocess.run(["scontrol", "write", "batch_script", jid, "-"], capture_output=True, text=True)
    assert kept.returncode == 0 and kept.stdout == script, kept.stderr
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --requeue",
        "#SBATCH --time=5",
        "export OMP_NUM_THREADS=1",
        "--mpi=pmix",
    ):
        assert line in script, script


# ------------------------------------------------------------------------------ four nodes
MOE = {
    "family": "attention",
    "layers": 1,
    "width": 32,
    "heads": 2,
    "seq_len": 8,
    "vocab": 64,
    "batch_size": 4,
}
LAYOUTS = {"4x1": (4, 1), "2x2": (2, 2)}  # nodes x ranks per node
SLOW = 2  # the rank the torch 4x1 job slows down on purpose (HPCDL_TEST_SLOW_RANK)


@pytest.fixture(scope="module")
def four_ranks(cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four ranks with each backend, on four nodes (one rank each: a mixture-of-experts
    transformer, one expert per node, its tokens crossing nodes by all-to-all) and on two
    nodes of two ranks (an MLP). The torch 4x1 job slows one rank down. Returns the results
    directory once every point has ended."""
    out = tmp_path_factory.mktemp("slurm4")
    for backend in ("torch", "horovod", "fsdp"):
        for layout, (nodes, per_node) in LAYOUTS.items():
            env = {"OMP_NUM_THREADS": "1"}
            if (backend, layout) == ("torch", "4x1"):
                env["HPCDL_TEST_SLOW_RANK"] = f"{SLOW}:0.2"
            f = write_job(
                out / f"{backend}-{layout}.toml",
                name=f"{backend}-{layout}",
                nodes=[nodes],
                tasks_per_node=per_node,
                backend=backend,
                workload={**MOE, "experts": 4, "batch_size": 4} if per_node == 1 else MLP,
                env=env,
                output=str(out),
            )
            p = hpcdl("submit", str(f))
            assert p.returncode == 0, p.stderr
    rows = wait(out, timeout_s=600, poll_s=2)
    assert all(r.state == "done" for r in rows), "\n" + status_table(rows)
    return out


@pytest.mark.slow(reason="the fixture's six Slurm jobs: about 2.5 minutes")
@pytest.mark.mpi
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("backend", ["torch", "horovod", "fsdp"])
def test_four_ranks_every_node_in_the_record(four_ranks: Path, backend: str, layout: str) -> None:
    nodes, per_node = LAYOUTS[layout]
    rec = record(four_ranks, f"{backend}-{layout}-n{nodes}")
    s, slurm = rec["settings"], rec["environment"]["slurm"]
    assert s["world_size"] == 4 and s["backend"] == backend and s["nodes"] == nodes
    assert s["hosts"] == hostnames(slurm["nodelist"]) and len(s["hosts"]) == nodes
    assert slurm["tasks_per_node"] == f"{per_node}(x{nodes})"
    ranks = rec["metrics"]["per_rank"]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
    assert Counter(r["host"] for r in ranks) == dict.fromkeys(s["hosts"], per_node)  # every node's ranks
    checks = {c["name"] for c in rec["validity"]["checks"]}
    assert {"one_step_equivalence", "parameters_identical"} <= checks
    assert rec["validity"]["passed"], rec["validity"]
    collectives = rec["metrics"]["communication"]["collectives"]
    expected = {"fsdp": {"all_gather", "reduce_scatter"}}.get(backend, {"allreduce"})
    assert set(collectives) == (expected | {"all_to_all"} if per_node == 1 else expected)


@pytest.mark.slow(reason="four ranks on Slurm with one slowed")
@pytest.mark.mpi
def test_a_slow_rank_is_named_with_its_node(four_ranks: Path) -> None:
    rec = record(four_ranks, "torch-4x1-n4")
    ranks = {r["rank"]: r for r in rec["metrics"]["per_rank"]}
    straggler = rec["metrics"]["straggler"]
    assert straggler["rank"] == SLOW and straggler["host"] == ranks[SLOW]["host"]
    assert straggler["host"] in hostnames(rec["environment"]["slurm"]["nodelist"])
    assert straggler["compute_only_s"] - straggler["median_compute_only_s"] > 0.1


# ------------------------------------------------------------------------------ failures
@pytest.mark.mpi
def test_cancelled_point_is_reported_and_other_records_stay(sweep: Path) -> None:
    f = write_job(sweep / "cancel.toml", name="cancel", nodes=[2], run=LONG_RUN, output=str(sweep))
    p = hpcdl("submit", str(f))
    assert p.returncode == 0, p.stderr
    jid = job_id(sweep, "cancel-n2")
    try:
        wait_for(sweep, "cancel-n2", lambda r: r.state == "RUNNING", 60)
    finally:
        subprocess.run(["scancel", jid], check=True)
    wait_for(sweep, "cancel-n2", lambda r: r.state == "CANCELLED", 45)
    p = hpcdl("status", str(sweep))
    line = next(x for x in p.stdout.splitlines() if x.startswith("cancel-n2"))
    assert "CANCELLED" in line and "cancelled by uid 0" in line, p.stdout
    assert not (sweep / "cancel-n2.json").exists()
    spec = spec_from_dict(record(sweep, "torch-n1")["spec"])
    assert valid_point(sweep / "torch-n1.json", spec, 1) and valid_point(sweep / "torch-n2.json", spec, 2)


@pytest.mark.slow(reason="a node taken down mid-job and its job's end awaited")
@pytest.mark.mpi
def test_node_down_mid_job_shows_the_failure(sweep: Path) -> None:
    """Bounded: 85 s from submission to the end, whatever Slurm does."""
    deadline = time.monotonic() + 85
    f = write_job(sweep / "nodefail.toml", name="nodefail", nodes=[2], run=LONG_RUN, output=str(sweep))
    p = hpcdl("submit", str(f))
    assert p.returncode == 0, p.stderr
    jid = job_id(sweep, "nodefail-n2")

    def left(most: float) -> float:
        return max(5.0, min(most, deadline - time.monotonic()))

    victim = "n2"
    try:
        wait_for(sweep, "nodefail-n2", lambda r: r.state == "RUNNING", left(40))
        running_on = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%N"], capture_output=True, text=True)
        victim = hostnames(running_on.stdout.strip())[-1]  # one of the job's nodes, whichever Slurm chose
        subprocess.run(
            ["scontrol", "update", f"NodeName={victim}", "State=DOWN", "Reason=hpcdl-test"], check=True
        )
        # Slurm ends the job (NODE_FAIL) and requeues it: status shows the failure either as
        # the state or in the requeued job's history
        row = wait_for(sweep, "nodefail-n2", lambda r: "NODE_FAIL" in r.state + r.detail, left(30))
        assert row.state == "NODE_FAIL" or "requeued after: NODE_FAIL" in row.detail, row
        p = hpcdl("status", str(sweep))
        line = next(x for x in p.stdout.splitlines() if x.startswith("nodefail-n2"))
        assert "NODE_FAIL" in line, p.stdout
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={victim}", "State=RESUME"], capture_output=True)
        subprocess.run(["scancel", jid], capture_output=True)  # the requeued job would run for minutes
    wait_for(sweep, "nodefail-n2", lambda r: not r.active, left(15))


@pytest.mark.slow(reason="a preempted point requeued and run again")
@pytest.mark.mpi
def test_preempted_point_is_requeued_and_runs_again(sweep: Path) -> None:
    """USR2 is what Slurm sends before the time limit (--signal) or on preemption: submitit
    checkpoints the point and requeues the job, which runs the point again from its start."""
    run = {"steps": 2500, "min_duration_s": 0.0}  # ~8 s of timed steps here
    f = write_job(
        sweep / "resume.toml", name="resume", nodes=[2], backend="torch", run=run, output=str(sweep)
    )
    assert hpcdl("submit", str(f)).returncode == 0
    jid = job_id(sweep, "resume-n2")
    log = sweep / "submitit" / jid / f"{jid}_0_log.out"
    end = time.monotonic() + 60
    while "then timing" not in (log.read_text() if log.exists() else ""):  # submitit's handler is set
        assert time.monotonic() < end, "the point did not start within 60 s"
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=USR2", jid], check=True)
    wait_for(sweep, "resume-n2", lambda r: r.state == "PENDING" and "requeued after" in r.detail, 30)
    # a requeued job waits ~2 minutes before it may start again (BeginTime): let it go now
    subprocess.run(["scontrol", "update", f"JobId={jid}", "StartTime=now"], check=True)
    row = wait_for(sweep, "resume-n2", lambda r: not r.active, 90)
    rec = record(sweep, "resume-n2")
    # this test's own polling shares the 2 cores with the point: a disturbance, rightly flagged
    failed = {c["name"] for c in rec["validity"]["checks"] if not c["passed"]}
    assert failed <= {"quiet_machine", "steady_steps"}, (row, failed)
    assert row.state == ("done" if not failed else "invalid"), row
    assert rec["environment"]["slurm"]["restart_count"] == "1"
    assert rec["environment"]["slurm_job_id"] == jid  # the same job, run a second time


# ------------------------------------------------------------------------------ a class as a job
@pytest.mark.slow(reason="class S's five workloads with rankable windows on two nodes: about 2 minutes")
@pytest.mark.mpi
def test_a_class_job_on_two_nodes_is_collected_and_ranked(cluster: None, tmp_path: Path) -> None:
    """issue 45: a job file naming class S, submitted at 2 nodes, runs the class's workloads
    one after another in one Slurm job, a record each on both nodes; status and collect know
    them, and rank scores them into class S."""
    out = tmp_path / "out"
    f = write_job(
        tmp_path / "class-s.toml",
        name="cls",
        nodes=[2],
        backend="torch",
        output=str(out),
        time_min=15,
        workload={"class": "S", "version": 1},
        run={"duration_s": 5.5, "warmup_steps": 2},
    )
    p = hpcdl("submit", str(f), "--wait", timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cls: class S v1 score: " in p.stdout and "at 2 rank(s) on 2 node(s)" in p.stdout, p.stdout
    assert "cls: rankable: complete, every record valid" in p.stdout
    names = sorted(x.name for x in out.glob("cls-n2-*.json"))
    assert names == sorted(f"cls-n2-{w}.json" for w in recipes.suite("S").workloads)
    for name in names:
        rec = json.loads((out / name).read_text())
        assert (
            rec["validity"]["passed"]
            and hostnames(rec["environment"]["slurm"]["nodelist"]) == rec["settings"]["hosts"]
        )
        assert rec["run"]["suite_class"] == "S" and rec["settings"]["world_size"] == 2
    collect = hpcdl("collect", str(out))
    assert collect.returncode == 0 and "cls-n2/cnn-resnet-small" in collect.stdout
    ranked = hpcdl("rank", f"slurm={out}", "-o", str(tmp_path / "ranking"))
    assert ranked.returncode == 0, ranked.stderr
    (score,) = json.loads((tmp_path / "ranking/ranking.json").read_text())["classes"]["S"]
    assert score["score"] > 0 and score["nodes"] == 2 and score["world_size"] == 2


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"colour": "red"}, "job.colour='red' is invalid: unknown key; valid keys are name, workload, nodes"),
        ({"tasks_per_node": "two"}, "job.tasks_per_node='two' is invalid: expected an integer"),
        ({"nodes": [0]}, "job.nodes=0 is invalid"),
        ({"nodes": 2}, "job.nodes=2 is invalid: expected a non-empty list"),
        (
            {"slurm": {"sbatch_extra": ["--wrap=rm -rf /"]}},
            "job.slurm.sbatch_extra='--wrap=rm -rf /' is invalid",
        ),
        (
            {"slurm": {"sbatch_extra": ["foo"]}},
            "job.slurm.sbatch_extra='foo' is invalid: expected a long option",
        ),
        ({"slurm": {"sbatch_extra": ["--time=10"]}}, "set through job.time_min"),
        ({"slurm": {"partition": "a b"}}, "job.slurm.partition='a b' is invalid"),
        ({"slurm": {"colour": "red"}}, "job.slurm.colour='red' is invalid: valid knobs are partition"),
        ({"partition": "gpu"}, "job.partition='gpu' is invalid: moved to the [slurm] table"),
        (
            {"sbatch_extra": ["--exclusive"]},
            "job.sbatch_extra=['--exclusive'] is invalid: moved to the [slurm]",
        ),
        ({"gpus_per_node": 4, "tasks_per_node": 8}, "job.tasks_per_node=8 is invalid: at most gpus_per_node"),
        ({"run": {"steps": -1}}, "job.run.steps=-1"),
        ({"workload": {"preset": "alexnet"}}, "job.workload.preset='alexnet'"),
        ({"workload": {"family": "mlp", "width": "wide"}}, "job.workload.width='wide'"),
        ({"env": {"SLURM_NTASKS": "3"}}, "job.env.SLURM_NTASKS"),
        ({"env": {"X": "a;b"}}, "job.env.X='a;b'"),
    ],
)
def test_bad_job_file_is_one_line_exit_2_and_submits_nothing(
    cluster: None, tmp_path: Path, fields: dict[str, Any], expected: str
) -> None:
    f = write_job(tmp_path / "bad.toml", name="bad", output=str(tmp_path / "out"), **fields)
    before = all_job_ids()
    assert expected in one_line(hpcdl("submit", str(f)))
    assert all_job_ids() == before and not (tmp_path / "out").exists()


def test_submission_refused_by_sbatch_is_one_line_exit_2(cluster: None, tmp_path: Path) -> None:
    f = write_job(
        tmp_path / "gpu.toml", name="nogpu", slurm={"partition": "gpu"}, output=str(tmp_path / "out")
    )
    err = one_line(hpcdl("submit", str(f)))
    assert "nogpu-n1: submission failed: sbatch: error: Batch job submission failed: Invalid partition" in err


def test_dry_run_submits_nothing(cluster: None, tmp_path: Path) -> None:
    f = write_job(tmp_path / "dry.toml", name="dry", nodes=[1, 2], output=str(tmp_path / "out"))
    before = all_job_ids()
    p = hpcdl("submit", str(f), "--dry-run")
    text = p.stdout
    assert p.returncode == 0, p.stderr
    assert "#SBATCH --nodes=1" in text and "#SBATCH --nodes=2" in text and "--mpi=pmix" in text
    assert "#SBATCH --job-name=dry-n2" in text
    assert all_job_ids() == before and not (tmp_path / "out").exists()


def test_shipped_job_files_are_valid() -> None:
    local = load_job(ROOT / "jobs/local-test.toml")
    assert local.nodes == (1, 2) and local.tasks_per_node == 1 and local.backend == "torch"
    gpu = load_job(ROOT / "jobs/gpu-cluster-example.toml")
    assert gpu.nodes == (1, 2, 4, 8) and gpu.gpus_per_node == 4 and gpu.spec().precision == "bf16"
    script = sbatch_script(gpu, 8, Path("/scratch/results"))
    for line in (
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj-hpcdl",
        "#SBATCH --qos=normal",
        "#SBATCH --exclusive",
        "#SBATCH --mem=0",
        "#SBATCH --nodes=8",
        "export OMP_NUM_THREADS=8",
        "export NCCL_DEBUG=WARN",
    ):
        assert line in script, script
