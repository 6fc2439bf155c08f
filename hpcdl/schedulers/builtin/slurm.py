"""Slurm: every point is one batch job, submitted with ``sbatch``.

hpcdl writes the batch script (what ``--dry-run`` prints is byte for byte what sbatch gets) and
submitit runs the point inside it: on USR2, which Slurm sends before the time limit
(``--signal``) and on preemption, submitit checkpoints the point and requeues the job, which
then runs the point again from its start (a measurement cut short is not resumable) unless its
record was written meanwhile. Ranks start one per task with ``srun --mpi=pmix`` (``launcher =
"srun"``), or from the batch step with ``mpirun``, which reads the allocation.

A job's files are in ``OUTPUT/submitit/JOBID/``: the batch script, submitit's pickles and a log
per task. What only Slurm has comes from the job file's ``[slurm]`` table (:class:`SlurmOptions`).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from hpcdl.errors import HpcdlError, SpecError
from hpcdl.schedulers.builtin import submitit_missing
from hpcdl.schedulers.entry import ENTRY, PointTask
from hpcdl.schedulers.point import Point, jobs_folder
from hpcdl.schedulers.protocol import SCHEDULERS, Handle, JobState
from hpcdl.schedulers.sacct import describe, histories
from hpcdl.workloads.knobs import Knobs, knob

if TYPE_CHECKING:
    from hpcdl.schedulers.jobfile import Job
    from hpcdl.schedulers.state import Entry

MAX_TIMEOUTS = 3  # a point that reaches its time limit is requeued at most this often
SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_.,-]*")  # partition, account, qos (comma lists allowed)
CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_.,:&|!*()\[\]-]*")  # Slurm's feature expressions
SBATCH_EXTRA_RE = re.compile(r"--(?P<key>[a-z][a-z0-9-]*)(?:=(?P<value>[A-Za-z0-9_.,:@%+/=-]+))?")
# sbatch options hpcdl sets itself (from the fields named here, or for its own bookkeeping):
# set through sbatch_extra they would contradict the job file or break result collection.
MANAGED_OPTIONS = {
    "nodes": "job.nodes",
    "ntasks": "job.nodes and job.tasks_per_node",
    "ntasks-per-node": "job.tasks_per_node",
    "gpus-per-node": "job.gpus_per_node",
    "gpus": "job.gpus_per_node",
    "cpus-per-task": "job.cpus_per_task",
    "partition": "job.slurm.partition",
    "account": "job.slurm.account",
    "qos": "job.slurm.qos",
    "constraint": "job.slurm.constraint",
    "time": "job.time_min",
    "job-name": "job.name",
    "output": "job.output (hpcdl keeps logs in OUTPUT/submitit)",
    "error": "job.output (hpcdl keeps logs in OUTPUT/submitit)",
    "array": "job.nodes (one job per node count)",
    "wrap": "nothing: hpcdl writes the batch script",
    "signal": "nothing: submitit uses it to checkpoint and requeue",
    "open-mode": "nothing: hpcdl sets it",
    "export": "job.env",
    "chdir": "nothing: jobs run where you submit from",
}


@dataclass(frozen=True, kw_only=True)
class SlurmOptions(Knobs):
    """The job file's ``[slurm]`` table: what only Slurm has."""

    prefix: ClassVar[str] = "job.slurm"

    partition: str = knob("", doc="Slurm partition ('': the cluster's default)")
    account: str = knob("", doc="account to charge ('': your default)")
    qos: str = knob("", doc="quality of service ('': the default)")
    constraint: str = knob("", doc="node features, e.g. 'a100&ib' ('': any node)")
    sbatch_extra: tuple[str, ...] = knob((), doc='more sbatch options, e.g. ["--exclusive", "--mem=0"]')

    def check(self) -> None:
        for key in ("partition", "account", "qos"):
            if not SLURM_NAME_RE.fullmatch(getattr(self, key)):
                raise SpecError(
                    f"{self.prefix}.{key}", getattr(self, key), "letters, digits, '_', '.', ',', '-' only"
                )
        if not CONSTRAINT_RE.fullmatch(self.constraint):
            raise SpecError(
                f"{self.prefix}.constraint", self.constraint, "a Slurm feature expression without spaces"
            )
        for item in self.sbatch_extra:
            m = SBATCH_EXTRA_RE.fullmatch(item)
            if m is None:
                raise SpecError(
                    f"{self.prefix}.sbatch_extra",
                    item,
                    "expected a long option '--key' or '--key=value' (letters, digits, _.,:@%+/=-; "
                    "no spaces or shell characters)",
                )
            if m["key"] in MANAGED_OPTIONS:
                raise SpecError(
                    f"{self.prefix}.sbatch_extra", item, f"set through {MANAGED_OPTIONS[m['key']]}"
                )

    def sbatch_options(self) -> dict[str, str | bool]:
        """``sbatch_extra`` as option name -> value (True for a flag)."""
        out: dict[str, str | bool] = {}
        for item in self.sbatch_extra:
            key, sep, value = item[2:].partition("=")
            out[key] = value if sep else True
        return out


@SCHEDULERS.register
class Slurm:
    """Points as Slurm batch jobs."""

    name: ClassVar[str] = "slurm"
    title: ClassVar[str] = "Slurm"
    here: ClassVar[bool] = False
    options: ClassVar[type[Knobs] | None] = SlurmOptions

    def missing(self) -> str:
        if not (shutil.which("sbatch") and shutil.which("srun")):
            return "sbatch and srun are not on PATH (run from a login node)"
        return submitit_missing()  # it runs the point inside the job

    def script(self, job: Job, point: Point) -> str:
        folder = jobs_folder(point)
        opts = job.table(SlurmOptions)
        directives: dict[str, object] = {
            "job-name": point.name,
            "nodes": point.nodes,
            "ntasks-per-node": point.tasks_per_node,
            "gpus-per-node": job.gpus_per_node,
            "cpus-per-task": job.cpus_per_task,
            "time": job.time_min,
            "partition": opts.partition,
            "account": opts.account,
            "qos": opts.qos,
            "constraint": opts.constraint,
            "requeue": True,  # after a node failure or preemption (clusters may default to JobRequeue=0)
            "signal": f"USR2@{signal_delay_s(job)}",
            "open-mode": "append",  # the runs of a requeued job add to the same logs
            "output": f"{folder}/%j_0_log.out",
            "error": f"{folder}/%j_0_log.err",
            **opts.sbatch_options(),
        }
        args = ["-u", "-m", ENTRY, "--submitit", str(folder)]
        command = [sys.executable, *args]
        box = job.container
        passed = list(job.environment())  # the [env] table reaches the ranks inside an image too
        if job.launcher == "srun":  # one task per rank, each with its own log; PMIx makes their world
            logs = ["--output", f"{folder}/%j_%t_log.out", "--error", f"{folder}/%j_%t_log.err"]
            srun = ["srun", "--unbuffered", *logs, "--mpi=pmix"]
            command = [*srun, *command]
            if box.runtime:
                command = box.wrap(
                    srun, args, name=point.name, output=point.output, gpus=job.gpus_per_node, env=passed
                )
        layout = f"{point.nodes} node(s) x {point.tasks_per_node} task(s)"
        return "\n".join(
            [
                "#!/bin/bash",
                f"# hpcdl point {point.name}: {layout}",
                *(sbatch_line(k, v) for k, v in directives.items() if v),
                "",
                *job.export_lines(),
                *box.export_lines(passed),
                "export SUBMITIT_EXECUTOR=slurm  # submitit's Slurm environment: checkpoint and requeue",
                shlex.join(command),
                "",
            ]
        )

    def submit(self, job: Job, point: Point) -> Handle:
        from submitit.core.utils import DelayedSubmission, JobPaths

        folder = jobs_folder(point)
        folder.parent.mkdir(parents=True, exist_ok=True)
        task = DelayedSubmission(PointTask(point, "rank" if job.launcher == "srun" else "allocation"))
        task.set_timeout(job.time_min, MAX_TIMEOUTS)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{point.name}.") as tmp:
            script, pickled = Path(tmp) / "submission.sh", Path(tmp) / "submitted.pkl"
            script.write_text(self.script(job, point))
            task.dump(pickled)
            paths = JobPaths(folder, job_id=sbatch(point, script))
            # as with submitit's own executor, the job's folder (its logs) appears just after
            # sbatch returns, well before Slurm can start the job; the job waits for its pickle
            paths.move_temporary_file(pickled, "submitted_pickle")
            paths.move_temporary_file(script, "submission_file")
        return Handle(str(paths.job_id), paths.folder)

    def states(self, entries: Sequence[Entry]) -> dict[str, JobState]:
        runs = histories([str(e.job_id) for e in entries])
        return {str(e.job_id): describe(e, runs[str(e.job_id)]) for e in entries}

    def cancel(self, entry: Entry) -> None:
        subprocess.run(["scancel", str(entry.job_id)], capture_output=True, timeout=30)


def signal_delay_s(job: Job) -> int:
    """Seconds before the time limit at which Slurm signals the job (submitit then requeues
    it): 90 s, or a quarter of very short limits."""
    return min(90, job.time_min * 15)


def sbatch_line(key: str, value: object) -> str:
    """One ``#SBATCH`` directive (True: a flag)."""
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def sbatch(point: Point, script: Path) -> str:
    """Submit a batch script; its job id, or a one-line error with sbatch's reason."""
    try:
        done = subprocess.run(
            ["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise HpcdlError(f"{point.name}: submission failed: {e}") from None
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job_id.isdigit():
        lines = [s for s in (done.stderr + done.stdout).splitlines() if s.strip()]
        raise HpcdlError(
            f"{point.name}: submission failed: {lines[-1] if lines else f'exit code {done.returncode}'}"
        )
    return job_id
