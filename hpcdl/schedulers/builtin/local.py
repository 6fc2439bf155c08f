"""This machine, through submitit's local executor: each point is one process here (its
ranks started by ``mpirun``), run one after another; what hpcdl uses where no batch scheduler
is installed. The job id is the pid of submitit's controller process, which starts the point's
process and forwards SIGTERM to it; the point ends on SIGTERM (its ``mpirun`` and ranks too),
which is how :meth:`Local.cancel` works. The point also ends, writing no record, when
``hpcdl submit`` dies (``submit.as_launcher``) or the controller does (parent-death signal).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from hpcdl.schedulers.builtin import submitit_missing
from hpcdl.schedulers.entry import PointTask, launch_command
from hpcdl.schedulers.logs import error_line, log_error
from hpcdl.schedulers.point import Point, jobs_folder, point_file
from hpcdl.schedulers.protocol import SCHEDULERS, Handle, JobState

if TYPE_CHECKING:
    from hpcdl.schedulers.jobfile import Job
    from hpcdl.schedulers.state import Entry
    from hpcdl.workloads.knobs import Knobs


@SCHEDULERS.register
class Local:
    """Points as processes on this machine."""

    name: ClassVar[str] = "local"
    title: ClassVar[str] = "submitit's local executor"
    here: ClassVar[bool] = True
    options: ClassVar[type[Knobs] | None] = None

    def missing(self) -> str:
        return submitit_missing()

    def script(self, job: Job, point: Point) -> str:
        command = launch_command(point, point_file(point), oversubscribe=True)
        return "\n".join(
            [
                f"# hpcdl point {point.name}: {point.ranks} rank(s) here, through submitit's local executor",
                *job.export_lines(),
                shlex.join(command),
                "",
            ]
        )

    def submit(self, job: Job, point: Point) -> Handle:
        import submitit

        ex = submitit.LocalExecutor(folder=jobs_folder(point))
        # one process, which starts the point's ranks with mpirun (the local executor has no MPI)
        ex.update_parameters(timeout_min=job.time_min, gpus_per_node=job.gpus_per_node, tasks_per_node=1)
        # the controller inherits this process's environment: the job's variables go there,
        # not into submitit's setup commands, which would put a shell between hpcdl and the
        # controller that does not pass SIGTERM on
        with exported(job.environment()):
            sub = ex.submit(PointTask(point, "here"))
        return Handle(str(sub.job_id), sub.paths.folder)

    def states(self, entries: Sequence[Entry]) -> dict[str, JobState]:
        return {str(e.job_id): state(e) for e in entries}

    def cancel(self, entry: Entry) -> None:
        if running(str(entry.job_id)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(str(entry.job_id)), signal.SIGTERM)


def running(pid: str) -> bool:
    """True while submitit's controller with this pid runs: a live process (not a zombie)
    whose command is the controller's, or, just forked, this process's child not yet become it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False
    state, ppid = stat.rpartition(")")[2].split()[:2]  # after "pid (comm)", comm may hold spaces
    return state not in ("Z", "X") and ("submitit" in command or int(ppid) == os.getpid())


def state(entry: Entry) -> JobState:
    """A local job's state: running, or how it ended (from submitit's result file)."""
    from submitit.core.utils import JobPaths, pickle_load

    job_id = str(entry.job_id)
    if running(job_id):
        return JobState("RUNNING", f"process {job_id} on this machine")
    result = JobPaths(entry.logs, job_id=job_id).result_pickle
    if not result.exists():
        return JobState("FAILED", "ended without a result: " + (log_error(entry.logs) or "killed?"))
    outcome, value = pickle_load(result)
    if outcome != "success":
        return JobState("FAILED", error_line(str(value)))
    if value.get("cancelled"):
        return JobState("CANCELLED", "ended with hpcdl submit, which was stopped; no record written")
    return JobState("COMPLETED", "ended without a valid record")


@contextlib.contextmanager
def exported(env: dict[str, str]) -> Iterator[None]:
    """These variables in this process's environment while inside."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
