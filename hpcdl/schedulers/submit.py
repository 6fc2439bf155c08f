"""``hpcdl submit``: every point of a job file that has no valid record becomes one job of the
chosen scheduler, recorded in the state file as soon as it is submitted.

With a batch scheduler this returns once every point is queued. With one that runs points on
this machine (``here``, e.g. submitit's local executor) the points run one after another and
this returns when the last has ended. SIGTERM, SIGHUP or SIGINT to ``hpcdl submit`` stop it
after the point being submitted; a point running here is cancelled with every process of it,
so that no record appears later, and :class:`Stopped` carries the exit code (128 + signal).
Killed with SIGKILL, it cannot cancel: a point running here then finds its launcher gone
(:func:`as_launcher`), ends and writes no record.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hpcdl.parallel.backends import resolve_backend_name
from hpcdl.parallel.launch import LAUNCHERS_ENV, launcher_env
from hpcdl.schedulers.jobfile import Job
from hpcdl.schedulers.point import Point, points
from hpcdl.schedulers.protocol import Scheduler, require
from hpcdl.schedulers.state import Entry, remember
from hpcdl.schedulers.status import status

Say = Callable[[str], None]
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
POLL_S = 0.2  # how often a point running here is looked at
RECANCEL_S = 10.0  # a cancelled point still running after this is cancelled again


class Stopped(Exception):
    """``hpcdl submit`` was sent a signal; ``code`` is its exit code (143 for SIGTERM, as
    :data:`hpcdl.parallel.launch.TERMINATED`)."""

    def __init__(self, signum: int, cancelled: list[str]) -> None:
        self.code = 128 + signum
        what = f"; cancelled {', '.join(cancelled)} (no record written)" if cancelled else ""
        super().__init__(f"{signal.Signals(signum).name}: submission stopped{what}")


@dataclass
class Submitted:
    """What ``hpcdl submit`` did with one point."""

    point: Point
    job_id: str | None  # None: skipped (valid record)
    note: str


def preflight_job(job: Job) -> None:
    """What can refuse a job on the submitting machine, before any point is submitted."""
    for n in job.nodes:
        resolve_backend_name(job.backend, job.ranks(n))


class Signals:
    """The stop signals, noted instead of ending the process while it submits or waits: a
    signal between submitting a job and recording it would leave a job nobody knows of."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def note(self, signum: int, frame: object) -> None:
        self.signum = signum


@contextmanager
def noting_signals() -> Iterator[Signals]:
    """Note SIGTERM, SIGHUP and SIGINT while inside (those this process does not ignore; only
    the main thread can handle signals)."""
    noted = Signals()
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(s, noted.note)
    try:
        yield noted
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def as_launcher(here: bool) -> Iterator[None]:
    """While a point that runs on this machine starts: this process as its launcher in the
    environment it inherits (``launch.LAUNCHERS_ENV``), so that the point ends with ``hpcdl
    submit`` and writes no record, even when SIGKILL leaves it no time to cancel the point.
    Never for a batch scheduler: its jobs outlive the submission by design."""
    if not here:
        yield
        return
    before = os.environ.get(LAUNCHERS_ENV)
    os.environ.update(launcher_env())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LAUNCHERS_ENV, None)
        else:
            os.environ[LAUNCHERS_ENV] = before


def submit(
    job: Job,
    scheduler: Scheduler,
    *,
    redo: bool = False,
    base: Path | None = None,
    job_file: str = "",
    say: Say = print,
) -> list[Submitted]:
    """Submit every point of ``job`` that has no valid record (all with ``redo``)."""
    preflight_job(job)
    require(scheduler)
    output = job.output_dir(base)
    done: list[Submitted] = []
    cancelled: list[str] = []
    with noting_signals() as signals:
        for point in points(job, scheduler.name, output):
            if signals.signum is not None:
                break
            if not redo and point.done():
                say(f"{point.name}: valid record {point.record_path} exists, not submitted")
                remember(output, point, None, job, job_file)
                done.append(Submitted(point, None, "skipped: valid record"))
                continue
            with as_launcher(scheduler.here):
                handle = scheduler.submit(job, point)
            entry = remember(output, point, handle, job, job_file)
            job_id = str(entry.job_id)
            if not scheduler.here:
                layout = f"{point.nodes} node(s) x {point.tasks_per_node} task(s)"
                say(f"{point.name}: submitted {scheduler.title} job {job_id} ({layout})")
                done.append(Submitted(point, job_id, "submitted"))
                continue
            say(f"{point.name}: running here ({scheduler.title}, job {job_id}), {point.ranks} rank(s)")
            if follow_here(scheduler, entry, signals):
                cancelled.append(point.name)
            (row,) = status(output, [point.name])
            done.append(Submitted(point, job_id, f"{row.state}: {row.detail}".rstrip(": ")))
            say(f"{point.name}: {done[-1].note}")
    if signals.signum is not None:
        raise Stopped(signals.signum, cancelled)
    return done


def follow_here(scheduler: Scheduler, entry: Entry, signals: Signals) -> bool:
    """Wait until a point running on this machine has ended; True if it was cancelled. Once a
    stop signal is noted, cancel it, and again every RECANCEL_S while it runs (a signal can
    reach a job before it can act on it)."""
    cancelled_at: float | None = None
    while True:
        if not scheduler.states([entry])[str(entry.job_id)].active:
            return cancelled_at is not None
        if signals.signum is not None and (
            cancelled_at is None or time.monotonic() - cancelled_at > RECANCEL_S
        ):
            scheduler.cancel(entry)
            cancelled_at = time.monotonic()
        time.sleep(POLL_S)
