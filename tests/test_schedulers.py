"""Schedulers without Slurm: submitit's local executor, a scheduler added as one file outside the
package (HPCDL_PLUGINS), and signals to ``hpcdl submit`` while its point runs here. Real
processes, real signals; the Slurm scheduler itself is tested in test_slurm.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hpcdl_cli import hears_signals, hpcdl, hpcdl_process

from hpcdl.schedulers.status import status

MLP = {"family": "mlp", "layers": 2, "width": 64, "input_size": 32, "output_size": 10, "batch_size": 16}
SHORT_RUN = {"steps": 12, "warmup_steps": 2, "min_duration_s": 0.0}

PLUGIN = '''
"""A scheduler in one file: each point runs on this machine as a plain process."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from hpcdl.schedulers.entry import ENTRY
from hpcdl.schedulers.point import point_file, write_point_file
from hpcdl.schedulers.protocol import SCHEDULERS, Handle, JobState
from hpcdl.workloads.knobs import Knobs, knob


@dataclass(frozen=True, kw_only=True)
class PlainOptions(Knobs):
    prefix: ClassVar[str] = "job.plain"
    nice: int = knob(0, lo=0, hi=19, doc="niceness of the point's process")


@SCHEDULERS.register
class Plain:
    name: ClassVar[str] = "plain"
    title: ClassVar[str] = "plain process"
    here: ClassVar[bool] = True
    options: ClassVar[type[Knobs] | None] = PlainOptions
    procs: ClassVar[dict[str, subprocess.Popen[bytes]]] = {}

    def missing(self) -> str:
        return ""

    def command(self, job, point) -> list[str]:
        nice = ["nice", "-n", str(job.table(PlainOptions).nice)]
        return [*nice, sys.executable, "-m", ENTRY, "--start", "here", str(point_file(point))]

    def script(self, job, point) -> str:
        return shlex.join(self.command(job, point))

    def submit(self, job, point) -> Handle:
        write_point_file(point)
        logs = Path(point.output) / "plain"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{point.name}.log", "ab") as log:
            env = {**os.environ, **job.environment()}
            proc = subprocess.Popen(self.command(job, point), stdout=log, stderr=log, env=env)
        self.procs[str(proc.pid)] = proc
        return Handle(str(proc.pid), logs)

    def states(self, entries) -> dict[str, JobState]:
        out = {}
        for e in entries:
            proc = self.procs.get(str(e.job_id))
            code = 0 if proc is None else proc.poll()  # a job of another hpcdl process has ended
            if code is None:
                out[str(e.job_id)] = JobState("RUNNING")
            elif code == 0:
                out[str(e.job_id)] = JobState("COMPLETED")
            else:
                out[str(e.job_id)] = JobState("FAILED", f"exit code {code}")
        return out

    def cancel(self, entry) -> None:
        self.procs[str(entry.job_id)].send_signal(signal.SIGTERM)
'''


def toml_value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(v)  # a JSON string or number is a valid TOML one


def write_job(path: Path, **fields: Any) -> Path:
    """A job file: scalar fields first, then tables (workload, run, env, a scheduler's)."""
    fields = {"workload": MLP, "run": SHORT_RUN, "env": {"OMP_NUM_THREADS": "1"}, "time_min": 5, **fields}
    lines = [f"{k} = {toml_value(v)}" for k, v in fields.items() if not isinstance(v, dict)]
    for k, v in fields.items():
        if isinstance(v, dict):
            lines += [f"[{k}]", *(f"{kk} = {toml_value(vv)}" for kk, vv in v.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def record(out: Path, point: str) -> dict[str, Any]:
    return json.loads((out / f"{point}.json").read_text())


# ------------------------------------------------------------------------------ local executor
@pytest.mark.mpi
def test_local_executor_runs_the_same_job_file(tmp_path: Path) -> None:
    """submitit's local executor (what hpcdl uses where sbatch is missing): the 2-node point's
    ranks start on this machine through mpirun."""
    workload = {**MLP, "accumulation_steps": 2}  # a knob of the [workload] table like any other
    f = write_job(
        tmp_path / "local.toml",
        name="here",
        nodes=[2],
        backend="torch",
        output=str(tmp_path),
        workload=workload,
    )
    p = hpcdl("submit", str(f), "--executor", "local")
    assert p.returncode == 0, p.stdout + p.stderr
    rec = record(tmp_path, "here-n2")
    assert rec["settings"]["world_size"] == 2 and rec["validity"]["passed"]
    assert rec["settings"]["accumulation_steps"] == 2 and rec["settings"]["global_batch"] == 16 * 2 * 2
    assert rec["environment"]["slurm"] is None
    (row,) = status(tmp_path)
    assert row.state == "done"


def test_not_toml_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("name = 'x'\nnodes = [1,\n")
    p = hpcdl("submit", str(tmp_path / "bad.toml"))
    err = p.stderr
    assert p.returncode == 2
    assert "not valid TOML" in err and len(err.strip().splitlines()) == 1, err


def test_unknown_executor_is_one_line_exit_2(tmp_path: Path) -> None:
    f = write_job(tmp_path / "job.toml", name="x", output=str(tmp_path / "out"))
    p = hpcdl("submit", str(f), "--executor", "pbs")
    err = p.stderr
    assert p.returncode == 2
    assert "executor='pbs' is invalid: allowed: auto, local, slurm" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_slurm_dry_run_needs_no_slurm_but_submission_does(tmp_path: Path) -> None:
    """A job file can be checked on a laptop; auto picks the local executor there."""
    bare = {"PATH": str(Path(sys.executable).parent)}  # no sbatch or srun on it
    f = write_job(tmp_path / "job.toml", name="x", output=str(tmp_path / "out"), slurm={"partition": "gpu"})
    p = hpcdl("submit", str(f), "--executor", "slurm", "--dry-run", env={**os.environ, **bare})
    assert p.returncode == 0 and "#SBATCH --partition=gpu" in p.stdout, p.stdout + p.stderr
    p = hpcdl("submit", str(f), "--executor", "slurm", env={**os.environ, **bare})
    assert p.returncode == 2 and p.stderr.strip() == (
        "hpcdl: error: --executor slurm: sbatch and srun are not on PATH (run from a login node)"
    ), p.stderr
    p = hpcdl("submit", str(f), "--dry-run", env={**os.environ, **bare})
    assert p.returncode == 0 and "not submitted (--dry-run, local)" in p.stdout, p.stdout + p.stderr
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ one-file scheduler
@pytest.fixture
def plugin(tmp_path: Path) -> dict[str, str]:
    """The environment that loads the one-file scheduler ``plain`` from outside the package (in
    commands run as processes: a plugin registers itself in its process's registries for good)."""
    path = tmp_path / "plain_scheduler.py"
    path.write_text(PLUGIN)
    return {"HPCDL_PLUGINS": str(path)}


def test_one_file_scheduler_dry_run_and_table(tmp_path: Path, plugin: dict[str, str]) -> None:
    f = write_job(
        tmp_path / "job.toml", name="ext", nodes=[1, 2], output=str(tmp_path / "out"), plain={"nice": 5}
    )
    p = hpcdl_process("submit", str(f), "--executor", "plain", "--dry-run", env={**os.environ, **plugin})
    assert p.returncode == 0, p.stderr
    assert "# ---- ext-n2: 2 node(s) x 1 task(s), not submitted (--dry-run, plain)" in p.stdout, p.stdout
    assert "nice -n 5 " in p.stdout and "-m hpcdl.schedulers.entry --start here" in p.stdout, p.stdout
    assert not (tmp_path / "out").exists()
    bad = write_job(tmp_path / "bad.toml", name="ext", plain={"nice": 50})
    p = hpcdl_process("submit", str(bad), "--executor", "plain", env={**os.environ, **plugin})
    assert p.returncode == 2 and p.stderr.strip() == (
        "hpcdl: error: job.plain.nice=50 is invalid: must be in [0, 19]"
    ), p.stderr
    p = hpcdl("submit", str(bad), "--executor", "plain")  # without the plugin: an unknown table
    assert p.returncode == 2 and "job.plain={'nice': 50} is invalid: unknown key" in p.stderr, p.stderr


def test_one_file_scheduler_runs_a_point(tmp_path: Path, plugin: dict[str, str]) -> None:
    f = write_job(tmp_path / "job.toml", name="ext", nodes=[1], output=str(tmp_path))
    p = hpcdl_process("submit", str(f), "--executor", "plain", env={**os.environ, **plugin})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ext-n1: running here (plain process, job" in p.stdout and "ext-n1: done:" in p.stdout, p.stdout
    rec = record(tmp_path, "ext-n1")
    assert rec["validity"]["passed"] and rec["settings"]["world_size"] == 1
    state = json.loads((tmp_path / "hpcdl-jobs.json").read_text())["points"]["ext-n1"]
    assert state["cluster"] == "plain" and state["job_id"]
    p = hpcdl_process("status", str(tmp_path), env={**os.environ, **plugin})
    assert p.returncode == 0 and any(
        line.startswith("ext-n1") and " done " in line for line in p.stdout.splitlines()
    ), p.stdout


# ------------------------------------------------------------------------------ signals
def processes_with(mark: str) -> list[str]:
    """The live processes whose environment holds ``mark`` (a zombie's environment is empty)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark.encode() in environ.read_bytes():
                found.append(f"{environ.parent.name}: {(environ.parent / 'cmdline').read_bytes()!r}")
        except OSError:
            pass  # gone meanwhile, or not ours to read
    return found


@pytest.mark.parametrize(
    "sig, nodes",
    [
        # mpirun and its ranks end too
        pytest.param(
            signal.SIGTERM,
            2,
            marks=(pytest.mark.mpi, pytest.mark.slow(reason="mpirun's two ranks under submit, signalled")),
        ),
        (signal.SIGINT, 1),
        (signal.SIGHUP, 1),
    ],
)
def test_signal_to_submit_cancels_the_point_running_here(tmp_path: Path, sig: int, nodes: int) -> None:
    """A signal to ``hpcdl submit`` while its point runs here: every process of the job ends,
    no record is written, and submit exits with 128 + the signal (143 for SIGTERM)."""
    mark = f"hpcdl-test-{uuid.uuid4().hex}"
    run = {"steps": 1_000_000, "warmup_steps": 2, "min_duration_s": 0.0}
    env = {"OMP_NUM_THREADS": "1", "HPCDL_TEST_MARK": mark}  # every process of the job inherits it
    f = write_job(tmp_path / "job.toml", name="sig", nodes=[nodes], backend="torch", run=run, env=env)
    out = tmp_path / "results" / "sig"
    submit = subprocess.Popen(
        [sys.executable, "-m", "hpcdl", "submit", str(f), "--executor", "local"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=hears_signals,
    )
    try:
        end = time.monotonic() + 120
        while not any("then timing" in log.read_text() for log in out.glob("submitit/*/*_log.out")):
            assert submit.poll() is None and time.monotonic() < end, "the point did not start"
            time.sleep(0.5)
        submit.send_signal(sig)
        stdout, stderr = submit.communicate(timeout=60)
    finally:
        submit.kill()
    assert submit.returncode == 128 + sig, stdout + stderr
    assert f"{signal.Signals(sig).name}: submission stopped; cancelled sig-n{nodes}" in stderr, stderr
    assert processes_with(mark) == []
    assert not (out / f"sig-n{nodes}.json").exists()
    (row,) = status(out)
    assert row.state == "CANCELLED", row
