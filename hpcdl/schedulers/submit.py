"""Submitting job files to Slurm through submitit, and following what became of them.

Every node count of a job file's sweep is one Slurm job (a *point*). Its record is written by
rank 0 as ``OUTPUT/NAME-nN.json``; a point that already has a valid record is never submitted
or run again. ``OUTPUT/hpcdl-jobs.json`` (the *state file*) maps each point to its Slurm job
id, so that ``hpcdl status`` and ``hpcdl collect`` work later, from another shell.

Two launchers:

- ``srun`` (default): submitit starts one task per rank with ``srun --mpi=pmix``; each task
  calls :func:`hpcdl.run` and finds its MPI world through PMIx.
- ``mpirun``: the function runs once, in the batch step, and starts the ranks with ``mpirun``,
  which reads the Slurm allocation (for clusters without PMIx support in Slurm).

Without Slurm (no ``sbatch`` on PATH) submitit's local executor runs the same job file on this
machine, one point after another, the ranks of a point started by ``mpirun``.

A point's job is checkpointable: on preemption or near its time limit submitit requeues it,
and the requeued job runs the point again from its start (a measurement cut short cannot be
resumed) unless its record was written meanwhile.

``python -m hpcdl.schedulers.submit POINT.json`` is what ``mpirun`` starts on each rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcdl.errors import HpcdlError, InputError
from hpcdl.measure.config import RunConfig
from hpcdl.parallel.backends import resolve_backend_name
from hpcdl.parallel.launch import mpirun_command, supervise
from hpcdl.parallel.world import end_all_ranks, init_world
from hpcdl.records import schema
from hpcdl.records.store import load_record, write_record
from hpcdl.scaling.sweep import valid_point
from hpcdl.scaling.table import scaling_table
from hpcdl.schedulers.jobfile import Job
from hpcdl.workloads.registry import spec_from_dict
from hpcdl.workloads.spec import Spec

if TYPE_CHECKING:
    import submitit

ENTRY = "hpcdl.schedulers.submit"
"""the module mpirun starts on each rank of a point: ``python -m ENTRY POINT.json``"""
STATE_FILE = "hpcdl-jobs.json"
COLLECTED_FILE = "collected.json"
EXECUTORS = ("auto", "slurm", "local")
# Slurm states after which the job may still run (or run again, after a requeue)
ACTIVE = set(
    "PENDING RUNNING REQUEUED REQUEUE_HOLD REQUEUE_FED COMPLETING CONFIGURING RESIZING SUSPENDED "
    "SIGNALING STAGE_OUT SUBMITTED UNKNOWN".split()
)
Say = Callable[[str], None]


@dataclass(frozen=True)
class Point:
    """One point of a sweep: all that its ranks need, pickled into the Slurm job (plain data
    only, so that a job submitted by one hpcdl version still loads in the next)."""

    job: str
    name: str
    nodes: int
    tasks_per_node: int
    spec: dict[str, Any]
    run: dict[str, Any]
    output: str
    launcher: str
    cluster: str

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def record_path(self) -> Path:
        return Path(self.output) / f"{self.name}.json"

    def workload(self) -> Spec:
        return spec_from_dict(self.spec)

    def config(self) -> RunConfig:
        return RunConfig.from_dict(self.run)

    def done(self) -> bool:
        """True when the point already has a valid record (and must not run again)."""
        return valid_point(self.record_path, self.workload(), self.ranks)


def points(job: Job, cluster: str, output: Path) -> list[Point]:
    """The points of a job, in increasing node count."""
    spec, cfg = job.spec(), job.config()
    return [
        Point(
            job=job.name,
            name=job.point_name(n),
            nodes=n,
            tasks_per_node=job.tasks_per_node,
            spec=spec.to_dict(),
            run=cfg.to_dict(),
            output=str(output),
            launcher=job.launcher,
            cluster=cluster,
        )
        for n in sorted(job.nodes)
    ]


# ------------------------------------------------------------------------------ in the job
class PointTask:
    """The callable submitit runs: one point. It has submitit's ``checkpoint`` method, so a
    preempted or timed-out point is requeued instead of failing."""

    def __init__(self, point: Point) -> None:
        self.point = point

    def __call__(self) -> dict[str, Any]:
        if self.point.launcher == "srun" and self.point.cluster == "slurm":
            return run_rank(self.point)  # this task is one rank; srun started the others
        return run_launched(self.point)

    def checkpoint(self) -> Any:
        """What submitit requeues: the same point. It starts over (a measurement cut short is
        not resumable); if the record was written in the meantime, the requeued job skips it."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(PointTask(self.point))


def say_rank0(rank: int) -> Say:
    if rank != 0:
        return lambda _m: None
    return lambda m: print(f"hpcdl: {m}", flush=True)  # into the job's log (OUTPUT/submitit/JOBID_0_log.out)


def run_rank(point: Point) -> dict[str, Any]:
    """One rank of the point (every rank calls this): run it unless it is already done."""
    from hpcdl.measure.runner import run

    world = init_world()
    say = say_rank0(world.rank)
    if world.size != point.ranks:
        # without a working MPI launch every task would think it is alone and run its own copy
        raise HpcdlError(
            f"{point.name}: this task sees {world.size} rank(s), the point needs {point.ranks}: "
            'the MPI world was not set up (srun --mpi=pmix, or launcher = "mpirun")'
        )
    if world.bcast(point.done() if world.rank == 0 else None):
        say(f"{point.name}: a valid record exists ({point.record_path}); not run again")
        return {"point": point.name, "skipped": True, "record": str(point.record_path)}
    try:
        result = run(
            point.workload(),
            point.config(),
            output_dir=point.output,
            name=point.name,
            progress=lambda m: say(f"{point.name}: {m}"),
            world=world,
        )
    except HpcdlError:
        raise  # every rank meets the same bad input and stops: nothing hangs
    except Exception as e:
        end_all_ranks(e)  # said where status finds it, then every rank ends
        raise
    if world.rank != 0:
        return {"point": point.name, "rank": world.rank}
    rate = result.metrics["samples_per_s"]
    say(f"{point.name}: {rate:.1f} samples/s, valid: {result.passed} -> {result.path}")
    return summary(point, result.record)


def run_launched(point: Point) -> dict[str, Any]:
    """The point from a single process: alone for one rank, else through ``mpirun`` (inside the
    Slurm allocation, or on this machine with the local executor)."""
    if point.done():
        return {"point": point.name, "skipped": True, "record": str(point.record_path)}
    if point.ranks == 1:
        return run_rank(point)
    folder = Path(point.output) / "submitit"
    folder.mkdir(parents=True, exist_ok=True)
    point_file = folder / f"{point.name}.point.json"
    point_file.write_text(json.dumps(dataclasses.asdict(point), indent=1))
    # inside an allocation Open MPI places the ranks on its nodes; locally all are here
    cmd = mpirun_command(point.ranks, [ENTRY, str(point_file)], oversubscribe=point.cluster == "local")
    code = supervise(cmd, f"{point.ranks}-rank point {point.name}", timeout_s=None)
    if code != 0:
        raise HpcdlError(f"{point.name}: mpirun of {point.ranks} ranks exited with code {code}")
    return summary(point, load_record(point.record_path))


def summary(point: Point, record: dict[str, Any]) -> dict[str, Any]:
    return {
        "point": point.name,
        "record": str(point.record_path),
        "passed": bool(record["validity"]["passed"]),
        "samples_per_s": record["metrics"]["samples_per_s"],
        "world_size": record["settings"]["world_size"],
        "hosts": record["settings"]["hosts"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry of each rank that ``mpirun`` starts: ``python -m hpcdl.schedulers.submit POINT.json``."""
    args = list(sys.argv[1:] if argv is None else argv)
    point = Point(**json.loads(Path(args[0]).read_text()))
    try:
        out = run_rank(point)
    except HpcdlError as e:
        print(f"hpcdl: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0 if out.get("passed", True) else 1


# ------------------------------------------------------------------------------ submitting
def which_cluster(choice: str = "auto") -> str:
    """``slurm`` where sbatch and srun are on PATH, else ``local`` (submitit's local executor)."""
    if choice not in EXECUTORS:
        raise InputError("executor", choice, "allowed: " + ", ".join(EXECUTORS))
    have_slurm = shutil.which("sbatch") is not None and shutil.which("srun") is not None
    if choice == "slurm" and not have_slurm:
        raise HpcdlError("--executor slurm: sbatch and srun are not on PATH (run from a login node)")
    if choice == "auto":
        return "slurm" if have_slurm else "local"
    return choice


def setup_lines(job: Job) -> list[str]:
    """``export`` lines run in the batch script before the ranks start (values are validated
    to contain no shell characters, and quoted anyway)."""
    return [f"export {k}={shlex.quote(v)}" for k, v in job.environment().items()]


def signal_delay_s(job: Job) -> int:
    """Seconds before the time limit at which Slurm signals the job (submitit then
    requeues it): 90 s, or a quarter of very short limits."""
    return min(90, job.time_min * 15)


def slurm_parameters(job: Job, nodes: int) -> dict[str, Any]:
    """The point's parameters for submitit's Slurm executor (sbatch's own option names)."""
    params: dict[str, Any] = {
        "job_name": job.point_name(nodes),
        "time": job.time_min,
        "nodes": nodes,
        "ntasks_per_node": job.tasks_per_node,
        "use_srun": job.launcher == "srun",
        "signal_delay_s": signal_delay_s(job),
        # requeue after a node failure or preemption (clusters may default to JobRequeue=0)
        "additional_parameters": {"requeue": True, **job.sbatch_options()},
    }
    if job.launcher == "srun":
        params["srun_args"] = ["--mpi=pmix"]  # PMIx: each task finds its MPI world
    if setup_lines(job):
        params["setup"] = setup_lines(job)
    optional = {
        "cpus_per_task": job.cpus_per_task,
        "gpus_per_node": job.gpus_per_node,
        "partition": job.partition,
        "account": job.account,
        "qos": job.qos,
        "constraint": job.constraint,
    }
    params.update({k: v for k, v in optional.items() if v})
    return params


def submitit_folder(output: Path) -> Path:
    """Where submitit keeps each job's pickles, batch script and logs (``%j``: the job id)."""
    return output / "submitit" / "%j"


def need_submitit() -> None:
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise HpcdlError("hpcdl submit needs submitit: pip install 'hpcdl[slurm]'") from None


def sbatch_script(job: Job, nodes: int, output: Path) -> str:
    """The batch script submitit writes for this point: the text ``--dry-run`` prints. It is
    what the Slurm executor's ``_make_submission_file_text`` returns (the same function and
    parameters), made without an executor so that it works where Slurm is not installed."""
    need_submitit()
    from submitit.slurm import slurm

    folder = submitit_folder(output)
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return slurm._make_sbatch_string(command=command, folder=folder, **slurm_parameters(job, nodes))


def make_executor(job: Job, nodes: int, cluster: str, output: Path) -> submitit.AutoExecutor:
    """submitit's executor for one point: Slurm with the job's layout, or local."""
    need_submitit()
    import submitit

    ex = submitit.AutoExecutor(folder=submitit_folder(output), cluster=cluster, slurm_max_num_timeout=3)
    if cluster == "slurm":
        ex.update_parameters(**{f"slurm_{k}": v for k, v in slurm_parameters(job, nodes).items()})
    else:
        # one process that starts the point's ranks with mpirun (the local executor has no MPI)
        ex.update_parameters(
            name=job.point_name(nodes),
            timeout_min=job.time_min,
            nodes=1,
            tasks_per_node=1,
            gpus_per_node=job.gpus_per_node,
            local_setup=setup_lines(job),
        )
    return ex


def preflight_job(job: Job) -> None:
    """What can refuse a job on the submitting machine, before any point is submitted."""
    for n in job.nodes:
        resolve_backend_name(job.backend, job.ranks(n))


@dataclass
class Submitted:
    """What ``hpcdl submit`` did with one point."""

    point: Point
    job_id: str | None  # None: skipped (valid record), or a dry run
    note: str


def submit(
    job: Job,
    *,
    executor: str = "auto",
    redo: bool = False,
    base: Path | None = None,
    job_file: str = "",
    say: Say = print,
) -> list[Submitted]:
    """Submit every point of ``job`` that has no valid record (all with ``redo``); record each
    in the state file as soon as it is submitted. With the local executor the points run one
    after another, and this returns when the last has ended."""
    preflight_job(job)
    cluster = which_cluster(executor)
    output = job.output_dir(base)
    done: list[Submitted] = []
    for point in points(job, cluster, output):
        if not redo and point.done():
            say(f"{point.name}: valid record {point.record_path} exists, not submitted")
            remember(output, point, None, job, job_file, keep_job_id=True)
            done.append(Submitted(point, None, "skipped: valid record"))
            continue
        ex = make_executor(job, point.nodes, cluster, output)
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # submitit echoes sbatch's errors itself
                sub = ex.submit(PointTask(point))
        except Exception as e:  # sbatch refused (bad partition, account, limits) -> one line
            lines = [s for s in str(e).strip().splitlines() if s.strip()]
            raise HpcdlError(
                f"{point.name}: submission failed: {lines[-1] if lines else type(e).__name__}"
            ) from None
        job_id = str(sub.job_id)
        remember(output, point, job_id, job, job_file)
        if cluster == "local":
            say(f"{point.name}: running here (local executor, process {job_id}), {point.ranks} rank(s)")
            done.append(Submitted(point, job_id, wait_local(sub)))
            say(f"{point.name}: {done[-1].note}")
        else:
            layout = f"{point.nodes} node(s) x {point.tasks_per_node} task(s)"
            say(f"{point.name}: submitted Slurm job {job_id} ({layout})")
            done.append(Submitted(point, job_id, "submitted"))
    return done


def wait_local(sub: Any) -> str:
    """Wait for a local job; a short note of how it ended."""
    try:
        out = sub.result()
    except Exception as e:  # the job's own error, as submitit reports it
        return f"failed: {error_line(str(e))}"
    if out.get("skipped"):
        return "skipped: valid record"
    return f"done: {out['samples_per_s']:.1f} samples/s, valid: {out['passed']}"


# ------------------------------------------------------------------------------ state file
def state_path(output: Path) -> Path:
    return output / STATE_FILE


def load_state(output: Path) -> dict[str, Any]:
    """The state file of a results directory (a one-line error when there is none)."""
    path = state_path(output)
    if not path.exists():
        raise InputError(
            "dir", str(output), f"no {STATE_FILE} here: hpcdl submit writes it into the job's output"
        )
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError("dir", str(output), f"{STATE_FILE} cannot be read: {e}") from None
    if state.get("schema") != schema.JOBS or not isinstance(state.get("points"), dict):
        raise InputError("dir", str(output), f"{STATE_FILE} is not an hpcdl state file")
    return state


def remember(
    output: Path, point: Point, job_id: str | None, job: Job, job_file: str, keep_job_id: bool = False
) -> None:
    """Add or update a point in the state file (written atomically)."""
    path = state_path(output)
    state: dict[str, Any] = load_state(output) if path.exists() else {"schema": schema.JOBS, "points": {}}
    old = state["points"].get(point.name, {})
    if keep_job_id and old.get("job_id"):
        return  # a skipped point keeps the job that made its record
    state["points"][point.name] = {
        **dataclasses.asdict(point),
        "ranks": point.ranks,
        "job_id": job_id,
        "folder": str(submitit_folder(Path(point.output))),
        "submitted": datetime.now(UTC).isoformat(timespec="seconds") if job_id else None,
        "job_file": job_file,
        "time_min": job.time_min,
    }
    write_record(state, path)


# ------------------------------------------------------------------------------ status
@dataclass
class PointStatus:
    """Where one point stands."""

    name: str
    nodes: int
    ranks: int
    job_id: str | None
    state: str  # done, invalid, not submitted, or the Slurm state (RUNNING, CANCELLED, ...)
    detail: str
    samples_per_s: float | None = None

    @property
    def active(self) -> bool:
        """Still queued or running (or requeued): its outcome is not known yet."""
        return self.state in ACTIVE

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "active": self.active}


def sacct_history(job_id: str) -> list[dict[str, str]]:
    """Every run of a job, oldest first (``-D``: a requeued job has one row per run)."""
    fields = ["JobID", "State", "ExitCode", "Reason", "NodeList", "Elapsed"]
    try:
        out = subprocess.run(
            ["sacct", "-j", job_id, "-D", "-X", "-n", "-P", "-o", ",".join(fields)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [dict(zip(fields, line.split("|"), strict=False)) for line in out.splitlines() if line.strip()]


def pending_reason(job_id: str) -> str:
    """Why a job waits, as squeue says (Resources, Priority, BeginTime after a requeue, ...)."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%r|%S"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "queued"
    reason, _, start = out.partition("|")
    if not reason or reason == "None":
        return "queued"
    return reason + (f" (expected start {start})" if start and start not in ("N/A", "Unknown") else "")


ERROR_LINE = re.compile(r"^(hpcdl: .*|[\w.]*(Error|Exception|Interrupt)\b.*)$")


def error_line(text: str) -> str:
    """The most telling line of a log or traceback: hpcdl's own message, else the last
    exception line."""
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    ours = [s for s in lines if s.startswith("hpcdl: error") or (s.startswith("hpcdl: ") and "failed" in s)]
    if ours:
        return ours[-1]
    errors = [s for s in lines if ERROR_LINE.match(s) and not s.startswith("hpcdl: ")]
    return errors[-1] if errors else (lines[-1] if lines else "")


def log_error(folder: Path) -> str:
    """The error line of a job's logs (every task's stderr), if any."""
    found = ""
    for path in sorted(folder.glob("*_log.err")):
        with contextlib.suppress(OSError):
            line = error_line(path.read_text(errors="replace")[-20000:])
            if line.startswith("hpcdl: ") or (line and not found):
                found = line
    return found


def slurm_infos(entries: Iterable[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """sacct's current JobID, State and NodeList of these jobs, read through submitit's
    watcher in one call. Its cache is cleared first: a job it saw end (NODE_FAIL) may have been
    requeued since."""
    entries = list(entries)
    if not entries:
        return {}
    need_submitit()
    import submitit

    jobs: list[submitit.SlurmJob[Any]] = [
        submitit.SlurmJob(folder=e["folder"], job_id=str(e["job_id"])) for e in entries
    ]
    watcher = submitit.SlurmJob.watcher
    watcher.clear()
    watcher.update()
    return {j.job_id: watcher.get_info(j.job_id, mode="cache") for j in jobs}


def slurm_status(entry: dict[str, Any], info: dict[str, str]) -> tuple[str, str]:
    """(state, detail) of a Slurm job from its sacct ``info``: the state, the history of its
    runs (a requeued job has several) and why it failed."""
    job_id = str(entry["job_id"])
    raw = info.get("State") or "UNKNOWN"
    state, _, by = raw.partition(" ")
    history = sacct_history(job_id)
    earlier = [h for h in history[:-1] if h.get("State")]
    last = history[-1] if history else {}
    notes = []
    if state == "CANCELLED":
        notes.append(f"cancelled {by.replace('by ', 'by uid ')}".strip())
    elif state == "TIMEOUT":
        notes.append(f"time limit reached ({entry.get('time_min', '?')} min); not requeued")
    elif state == "NODE_FAIL":
        notes.append(f"node failure on {last.get('NodeList') or info.get('NodeList', '?')}")
    elif state in ("FAILED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"):
        reason = log_error(Path(str(entry["folder"]).replace("%j", job_id)))
        notes.append(f"exit code {last.get('ExitCode', '?')}" + (f": {reason}" if reason else ""))
    elif state == "PENDING":
        notes.append(f"waiting: {pending_reason(job_id)}")
    elif state == "RUNNING":
        notes.append(
            f"on {info.get('NodeList') or last.get('NodeList', '?')}, {last.get('Elapsed', '')}".rstrip(", ")
        )
    elif state == "COMPLETED":
        reason = log_error(Path(str(entry["folder"]).replace("%j", job_id)))
        notes.append("ended without a valid record" + (f": {reason}" if reason else ""))
    if state == "REQUEUED":
        notes.append("checkpointed near its time limit or preempted; it runs again")
    if earlier:
        runs = ", ".join(f"{run_end(h['State'])} on {h.get('NodeList', '?')}" for h in earlier)
        notes.append(f"requeued after: {runs}")
    return state, "; ".join(notes)


def run_end(state: str) -> str:
    """How an earlier run of a requeued job ended, in words where sacct's state is terse."""
    state = state.split(" ")[0]
    return "time limit or preemption" if state == "REQUEUED" else state


def local_status(entry: dict[str, Any]) -> tuple[str, str]:
    """(state, detail) of a job of submitit's local executor (its id is the controller's pid)."""
    need_submitit()
    from submitit.core.utils import pickle_load

    job_id = str(entry["job_id"])
    folder = Path(str(entry["folder"]).replace("%j", job_id))
    with contextlib.suppress(OSError):
        if "submitit" in Path(f"/proc/{job_id}/cmdline").read_text():
            return "RUNNING", f"process {job_id} on this machine"
    result = folder / f"{job_id}_0_result.pkl"
    if not result.exists():
        return "FAILED", "ended without a result: " + (log_error(folder) or "killed?")
    outcome, value = pickle_load(result)
    if outcome == "success":
        return "COMPLETED", "ended without a valid record"
    return "FAILED", error_line(str(value))


def point_status(
    output: Path, name: str, entry: dict[str, Any], info: dict[str, str] | None = None
) -> PointStatus:
    point = Point(**{f.name: entry[f.name] for f in dataclasses.fields(Point)})
    row = PointStatus(name, point.nodes, point.ranks, entry.get("job_id"), "", "")
    path = output / f"{name}.json"  # where the results directory is now (it may have moved)
    if valid_point(path, point.workload(), point.ranks):
        row.state = "done"
        row.samples_per_s = load_record(path)["metrics"]["samples_per_s"]
        row.detail = f"{row.samples_per_s:.1f} samples/s"
        return row
    if row.job_id is None:
        row.state, row.detail = "not submitted", ""
        return row
    if point.cluster == "slurm":
        row.state, row.detail = slurm_status(
            entry, info if info is not None else slurm_infos([entry])[str(row.job_id)]
        )
    else:
        row.state, row.detail = local_status(entry)
    if not row.active and path.exists():
        row.state, row.detail = "invalid", invalid_detail(path)
    return row


def invalid_detail(path: Path) -> str:
    try:
        rec = load_record(path)
        failed = [c["name"] for c in rec["validity"]["checks"] if not c["passed"]]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{path.name} is damaged"
    return (
        f"record {path.name} fails: {', '.join(failed)}"
        if failed
        else f"record {path.name} is for another spec"
    )


def status(output: Path, names: Iterable[str] | None = None) -> list[PointStatus]:
    """Every point of the state file (or those named), in order of job and node count."""
    entries = load_state(output)["points"]
    chosen = entries if names is None else {n: entries[n] for n in names}
    order = sorted(chosen, key=lambda n: (chosen[n]["job"], chosen[n]["nodes"]))
    infos = slurm_infos(e for e in chosen.values() if e["cluster"] == "slurm" and e.get("job_id"))
    return [point_status(output, n, chosen[n], infos.get(str(chosen[n].get("job_id")))) for n in order]


def wait(
    output: Path, names: Iterable[str] | None = None, timeout_s: float | None = None, poll_s: float = 2.0
) -> list[PointStatus]:
    """Poll until no point is queued or running (a requeued point is waited for again)."""
    names = list(names) if names is not None else None
    t0 = time.monotonic()
    while True:
        rows = status(output, names)
        if not any(r.active for r in rows) or (timeout_s is not None and time.monotonic() - t0 > timeout_s):
            return rows
        time.sleep(poll_s)


# ------------------------------------------------------------------------------ collect
def collect(output: Path) -> dict[str, Any]:
    """The valid records of the state file's points, with speed-up and weak-scaling efficiency
    against each job's smallest node count measured; written to ``OUTPUT/collected.json``."""
    entries = load_state(output)["points"]
    rows = []
    for st in status(output):
        row: dict[str, Any] = {
            "point": st.name,
            "job": entries[st.name]["job"],
            "nodes": st.nodes,
            "ranks": st.ranks,
            "job_id": st.job_id,
            "state": st.state,
        }
        if st.state == "done":
            rec = load_record(output / f"{st.name}.json")
            row.update(
                record=f"{st.name}.json",
                samples_per_s=rec["metrics"]["samples_per_s"],
                ai_ops_per_s=rec["metrics"]["ai_ops_per_s"],
                mfu=rec["metrics"]["mfu"],
                hosts=rec["settings"]["hosts"],
                slurm_job_id=rec["environment"].get("slurm_job_id"),
            )
        rows.append(row)
    for name in {r["job"] for r in rows}:
        done = sorted((r for r in rows if r["job"] == name and "record" in r), key=lambda r: r["ranks"])
        table = scaling_table((r["ranks"], r["samples_per_s"]) for r in done)
        for r, t in zip(done, table, strict=True):
            r.update(speedup=t.speedup, efficiency=t.efficiency)
    collected = {
        "schema": schema.COLLECTED,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "points": rows,
    }
    write_record(collected, output / COLLECTED_FILE)
    return collected


if __name__ == "__main__":
    sys.exit(main())
