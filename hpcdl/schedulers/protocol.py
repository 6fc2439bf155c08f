"""What a scheduler is to hpcdl, and the schedulers there are.

A scheduler is one class in one file that registers itself with :data:`SCHEDULERS`; hpcdl's
own are :mod:`hpcdl.schedulers.builtin.slurm` and :mod:`hpcdl.schedulers.builtin.local`,
others come from ``HPCDL_PLUGINS`` (a module name or a ``.py`` path) or from entry points
(:mod:`hpcdl.plugins`). Submitting, following, waiting and collecting are the same for every
scheduler (:mod:`hpcdl.schedulers.submit`, :mod:`~hpcdl.schedulers.status`,
:mod:`~hpcdl.schedulers.collect`); a scheduler only says how one point becomes one job::

    from hpcdl.schedulers.protocol import SCHEDULERS, Handle, JobState

    @SCHEDULERS.register
    class Pbs:
        name = "pbs"          # --executor pbs, and the job file's [pbs] table
        title = "PBS"
        here = False          # a batch system: hpcdl submit returns once the points are queued
        options = PbsOptions  # the Knobs of [pbs] (queue, account, ...), or None

        def missing(self) -> str: ...                      # '' when qsub is on PATH
        def script(self, job, point) -> str: ...           # what --dry-run prints
        def submit(self, job, point) -> Handle: ...        # qsub it
        def states(self, entries) -> dict[str, JobState]: ...   # qstat
        def cancel(self, entry) -> None: ...               # qdel

Inside the job, ``python -m hpcdl.schedulers.entry --start allocation POINT.json`` (see
:func:`hpcdl.schedulers.point.write_point_file`) runs the point and writes its record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from hpcdl.errors import HpcdlError, InputError
from hpcdl.plugins import Registry
from hpcdl.schedulers.state import Handle  # here too: a scheduler imports what it returns from here

if TYPE_CHECKING:
    from hpcdl.schedulers.jobfile import Job
    from hpcdl.schedulers.point import Point
    from hpcdl.schedulers.state import Entry
    from hpcdl.workloads.knobs import Knobs

AUTO = "auto"
LOCAL = "local"
# Slurm's words for a job that may still run (or run again, after a requeue); every scheduler
# reports its jobs' states in Slurm's words (RUNNING, PENDING, COMPLETED, FAILED, CANCELLED...)
ACTIVE = frozenset(
    "PENDING RUNNING REQUEUED REQUEUE_HOLD REQUEUE_FED COMPLETING CONFIGURING RESIZING SUSPENDED "
    "SIGNALING STAGE_OUT SUBMITTED UNKNOWN".split()
)


@dataclass(frozen=True)
class JobState:
    """Where a job stands, as its scheduler says: a state in Slurm's words and why."""

    state: str
    detail: str = ""

    @property
    def active(self) -> bool:
        """Still queued or running (or requeued): its outcome is not known yet."""
        return self.state in ACTIVE


class Scheduler(Protocol):
    """Turns the points of a job file into jobs, and says what became of them."""

    name: ClassVar[str]
    """``--executor NAME``; the job file's table ``[NAME]``; the state file's ``cluster``"""
    title: ClassVar[str]
    """its name in messages (``submitted Slurm job 42``)"""
    here: ClassVar[bool]
    """True: points run on this machine, one after another (``hpcdl submit`` waits for each and
    cancels it if it is itself terminated); False: a batch system queues them"""
    options: ClassVar[type[Knobs] | None]
    """the settings of its job-file table (prefix ``job.NAME``), or None"""

    def missing(self) -> str:
        """What this machine lacks to submit with it ('' when nothing)."""
        ...

    def script(self, job: Job, point: Point) -> str:
        """The text that would run the point (a batch script): what ``--dry-run`` prints.
        Needs nothing installed, writes nothing."""
        ...

    def submit(self, job: Job, point: Point) -> Handle:
        """Submit the point (a refusal is an :class:`~hpcdl.errors.HpcdlError` of one line)."""
        ...

    def states(self, entries: Sequence[Entry]) -> dict[str, JobState]:
        """The state of each submitted entry's job, by job id (entries from any process)."""
        ...

    def cancel(self, entry: Entry) -> None:
        """End the entry's job and every process of it; no record may appear afterwards."""
        ...


SCHEDULERS: Registry[type[Scheduler]] = Registry(
    "scheduler", "hpcdl.schedulers.builtin", key=lambda cls: cls.name
)
"""the schedulers, by name: the built-in ones and the plugins'"""


def choose(name: str) -> Scheduler:
    """The scheduler ``--executor NAME`` picks; ``auto`` is the first batch scheduler that can
    submit from here, else the local one."""
    if name == AUTO:
        batch = (cls() for _, cls in SCHEDULERS.items() if not cls.here)
        return next((s for s in batch if not s.missing()), SCHEDULERS.get(LOCAL)())
    if name not in SCHEDULERS:
        raise InputError("executor", name, "allowed: " + ", ".join([AUTO, *SCHEDULERS.names()]))
    return SCHEDULERS.get(name)()


def require(scheduler: Scheduler) -> None:
    """A one-line error when the scheduler cannot submit from this machine."""
    if lack := scheduler.missing():
        raise HpcdlError(f"--executor {scheduler.name}: {lack}")
