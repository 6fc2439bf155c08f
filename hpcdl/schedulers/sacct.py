"""What Slurm says of its jobs: every run of each job from ``sacct`` (a requeued job has one
row per run), why a pending one waits from ``squeue``, and why a failed one failed from its
logs, turned into a :class:`~hpcdl.schedulers.protocol.JobState` for ``hpcdl status``."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from hpcdl.schedulers.logs import log_error
from hpcdl.schedulers.protocol import JobState
from hpcdl.schedulers.state import Entry

FIELDS = ("JobID", "State", "ExitCode", "Reason", "NodeList", "Elapsed")
Run = dict[str, str]


def run_quietly(cmd: list[str]) -> str:
    """The output of a Slurm client command; '' when it cannot be run (then the job's state
    reads UNKNOWN, and ``hpcdl status`` asks again next time)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def histories(job_ids: Sequence[str]) -> dict[str, list[Run]]:
    """Every run of each job, oldest first, from one ``sacct`` call (``-D``: runs of a requeued
    job too; ``-X``: the allocation, not its steps)."""
    if not job_ids:
        return {}
    out = run_quietly(["sacct", "-j", ",".join(job_ids), "-D", "-X", "-n", "-P", "-o", ",".join(FIELDS)])
    runs: dict[str, list[Run]] = {j: [] for j in job_ids}
    for line in out.splitlines():
        if line.strip():
            run = dict(zip(FIELDS, line.split("|"), strict=False))
            runs.setdefault(run["JobID"], []).append(run)
    return runs


def pending_reason(job_id: str) -> str:
    """Why a job waits, as squeue says (Resources, Priority, BeginTime after a requeue, ...)."""
    reason, _, start = run_quietly(["squeue", "-h", "-j", job_id, "-o", "%r|%S"]).strip().partition("|")
    if not reason or reason == "None":
        return "queued"
    return reason + (f" (expected start {start})" if start and start not in ("N/A", "Unknown") else "")


def describe(entry: Entry, runs: list[Run]) -> JobState:
    """The state of a job from its runs: the last run's state, how earlier runs ended (a
    requeued job has several) and why it failed."""
    if not runs:
        return JobState("UNKNOWN", "not in Slurm's accounting (yet)")
    last = runs[-1]
    state, _, by = (last.get("State") or "UNKNOWN").partition(" ")
    notes = []
    if state == "CANCELLED":
        notes.append(f"cancelled {by.replace('by ', 'by uid ')}".strip())
    elif state == "TIMEOUT":
        notes.append(f"time limit reached ({entry.time_min} min); not requeued")
    elif state == "NODE_FAIL":
        notes.append(f"node failure on {last.get('NodeList', '?')}")
    elif state in ("FAILED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"):
        reason = log_error(entry.logs)
        notes.append(f"exit code {last.get('ExitCode', '?')}" + (f": {reason}" if reason else ""))
    elif state == "PENDING":
        notes.append(f"waiting: {pending_reason(str(entry.job_id))}")
    elif state == "RUNNING":
        notes.append(f"on {last.get('NodeList', '?')}, {last.get('Elapsed', '')}".rstrip(", "))
    elif state == "COMPLETED":
        reason = log_error(entry.logs)
        notes.append("ended without a valid record" + (f": {reason}" if reason else ""))
    elif state == "REQUEUED":
        notes.append("checkpointed near its time limit or preempted; it runs again")
    earlier = [r for r in runs[:-1] if r.get("State")]
    if earlier:
        notes.append(
            "requeued after: "
            + ", ".join(f"{run_end(r['State'])} on {r.get('NodeList', '?')}" for r in earlier)
        )
    return JobState(state, "; ".join(notes))


def run_end(state: str) -> str:
    """How an earlier run of a requeued job ended, in words where sacct's state is terse."""
    state = state.split(" ")[0]
    return "time limit or preemption" if state == "REQUEUED" else state
