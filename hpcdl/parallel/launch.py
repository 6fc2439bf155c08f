"""Starting the ranks of a run on this machine: ``hpcdl run --np N`` re-runs itself under
``mpirun``. Under an existing launcher (mpirun, srun) hpcdl never launches again."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from types import FrameType
from typing import IO

from hpcdl.errors import HpcdlError, InputError
from hpcdl.parallel import mpiflavour


def mpirun_command(np: int, module_args: Sequence[str], *, oversubscribe: bool = True) -> list[str]:
    """The mpirun line for ``np`` ranks of ``python -m MODULE_ARGS``: the one place hpcdl
    builds one (``hpcdl run --np``, sweeps, and scheduler jobs launched with mpirun), in the
    flags of the MPI that ``mpirun`` belongs to (:mod:`hpcdl.parallel.mpiflavour`)."""
    mpirun = mpirun_path()
    program = [sys.executable, "-m", *module_args]
    return mpiflavour.command(mpiflavour.flavour(mpirun), mpirun, np, program, oversubscribe=oversubscribe)


MPIRUN_ENV = "HPCDL_MPIRUN"
"""an mpirun to use instead of the one on PATH: ``scripts/cluster/mpirun`` places the ranks on
the hosts of the emulated cluster (it takes mpirun's arguments and adds its hosts and network)"""


def mpirun_path() -> str:
    """The mpirun hpcdl launches: ``$HPCDL_MPIRUN`` when set, else the one on PATH."""
    chosen = os.environ.get(MPIRUN_ENV)
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise InputError(MPIRUN_ENV, chosen, "an executable file (e.g. scripts/cluster/mpirun)")
        return chosen
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise HpcdlError("mpirun not found on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev)")
    return mpirun


def mpi_env() -> dict[str, str]:
    """This environment, plus what the ranks of any MPI need (:func:`mpiflavour.environment`);
    what is already set wins."""
    return mpiflavour.environment(os.geteuid() == 0) | dict(os.environ)


class Terminated(BaseException):
    """This process was told to stop (SIGTERM: ``kill``, ``scancel``; SIGHUP: its terminal closed).
    Not an ``Exception``, as ``KeyboardInterrupt`` is not: no handler of errors takes it for one
    (a user's model code, a plugin), and every ``finally`` runs on its way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


_received: list[int] = []
"""the stop signals this process received: a handler's exception raised inside a callback that
swallows exceptions (logging's after-fork hook, when the signal lands in ``fork``) is lost, the
signal is not; :func:`raise_if_terminated` raises it again at the next safe point"""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    raise Terminated(signum)


def raise_if_terminated() -> None:
    """Raise :class:`Terminated` if a stop signal arrived whose exception may have been lost."""
    if _received:
        raise Terminated(_received[0])


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` while inside, so that ``finally`` blocks run
    (a process ended by a signal's default action runs none); only the main thread can handle
    signals, elsewhere this does nothing. A signal this process ignores stays ignored: under
    ``nohup`` (SIGHUP ignored, and so in every child) a closed terminal ends nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        s: signal.signal(s, _raise_terminated)
        for s in (signal.SIGTERM, signal.SIGHUP)
        if signal.getsignal(s) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


TERMINATED = 128 + signal.SIGTERM
"""exit code of a run ended by SIGTERM, as a shell reports it (SIGHUP: 129)"""
STOPPED = (TERMINATED, 128 + signal.SIGHUP)
"""exit codes of a run its launcher ended because it was told to stop"""
TIMED_OUT = 124
"""exit code of a run that exceeded its --timeout"""
STOP_ENV = "HPCDL_STOP_FILE"
"""the file whose existence tells rank 0 that its launcher decided to stop the run: a run that
was stopped (a timeout, a signal) never writes a record, even if its ranks go on a little"""
LAUNCHERS_ENV = "HPCDL_LAUNCHERS"
"""the hpcdl processes that launched this one and still want its record (``hpcdl run --np``,
a sweep, ``hpcdl submit`` running points here), comma-separated, each ``SPACE/PID/START``
(SPACE: the kernel's boot id and pid namespace; START: the process's start time, so that a
reused pid is not taken for it). A launcher killed with SIGKILL cannot mark its run stopped;
its absence says so instead."""
SCRATCH_ENV = "HPCDL_SCRATCH"
"""a private folder of the launcher's, for what its run keeps only while it runs (the ranks'
heartbeats): the launcher removes it on every way it ends, so a run never leaves scratch state in
its output folder. Its file ``remove`` lists what the run keeps elsewhere, removed with it."""
PR_SET_PDEATHSIG = 1


class StoppedByLauncher(HpcdlError):
    """The run's launcher decided to stop it, or is gone: its record is not written."""


def stop_requested() -> bool:
    """Whether whoever launched this process no longer wants its record: a launcher decided to
    stop the run (``STOP_ENV``), or one of its launchers is no longer alive."""
    path = os.environ.get(STOP_ENV)
    return (bool(path) and os.path.exists(str(path))) or bool(launchers_gone())


def not_stopped() -> None:
    """Raise :class:`StoppedByLauncher` when the run was stopped (:func:`stop_requested`); called
    by rank 0 just before a record takes its name."""
    gone = launchers_gone()
    if gone:
        raise StoppedByLauncher(f"the run's launcher (pid {gone[0]}) is gone; its record is not written")
    if stop_requested():
        raise StoppedByLauncher("the run was stopped by its launcher; its record is not written")


def _pid_space() -> str | None:
    """This kernel and pid namespace: where a pid names the same process as here (None where
    /proc does not say: then no launcher is named or checked, as before this rule)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}.{os.readlink('/proc/self/ns/pid').strip('pid:[]')}"
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """The start time of a live process (clock ticks since boot), None when there is none or
    it has ended (a zombie not yet reaped by its parent is ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]  # state is field 3, starttime 22


def launcher_env() -> dict[str, str]:
    """``LAUNCHERS_ENV`` for a child of this process: the launchers this one has, and itself."""
    space, start = _pid_space(), _start_time(os.getpid())
    me = f"{space}/{os.getpid()}/{start}" if space and start else ""
    return {LAUNCHERS_ENV: ",".join(filter(None, [os.environ.get(LAUNCHERS_ENV, ""), me]))}


def launchers_gone() -> list[int]:
    """The pids of this process's launchers that are no longer alive. A launcher in another pid
    space (rank 0 on another node than ``mpirun``) cannot be seen from here and is left out:
    there ``mpirun``, which dies with the launcher, ends the ranks."""
    chain = [entry for entry in os.environ.get(LAUNCHERS_ENV, "").split(",") if entry]
    space = _pid_space() if chain else None
    gone = []
    for entry in chain:
        where, _, rest = entry.partition("/")
        pid, _, start = rest.partition("/")
        if where == space and pid.isdigit() and _start_time(int(pid)) != start:
            gone.append(int(pid))
    return gone


LINGER_S = 5.0
"""how long a process whose launcher is gone may take to end on SIGTERM before SIGKILL: a rank
blocked inside a collective (gloo waits in C++, where Python's handler cannot run) would wait
for its peers for the collective's whole timeout"""


def end_with_launchers(poll_s: float = 0.25, linger_s: float = LINGER_S) -> None:
    """SIGTERM to this process as soon as one of its launchers is gone (checked every
    ``poll_s`` by a daemon thread), SIGKILL ``linger_s`` later if it is still there: for a
    process whose parent is not its launcher (a point that submitit's local controller started
    for ``hpcdl submit``, a rank whose mpirun was stopped), which no parent-death signal reaches."""

    def watch() -> None:
        while not launchers_gone():
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(linger_s)
        os.kill(os.getpid(), signal.SIGKILL)

    if os.environ.get(LAUNCHERS_ENV):
        threading.Thread(target=watch, name="hpcdl-launchers", daemon=True).start()


def die_with_parent(parent: int | None = None) -> None:
    """SIGTERM to this process when its parent dies, even by SIGKILL (Linux's parent-death
    signal). Called in a launcher's child before it runs, so that mpirun and its ranks never
    outlive it, and by a process started by another's hand (a point of ``hpcdl submit``).
    ``parent``: the pid the parent had; gone already (it died before this call), SIGTERM now."""
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def dies_with_this_process() -> Callable[[], None]:
    """A ``preexec_fn`` for every child hpcdl starts (mpirun, a rank, a fit's trial): it gets the
    parent-death signal before it runs, so it never outlives this process (even killed with
    SIGKILL). libc is loaded here, before the fork: the child only calls it."""
    _libc()
    return partial(die_with_parent, os.getpid())


def launch(np: int, argv: Sequence[str], timeout_s: float | None = None) -> int:
    """Run ``hpcdl ARGV`` as ``np`` MPI ranks (one plain process for ``np=1``) and return the
    exit code. If one rank fails, hpcdl aborts the MPI job, so every rank ends."""
    if np == 1:
        return supervise([sys.executable, "-m", "hpcdl", *argv], "1-rank run", timeout_s)
    return supervise(mpirun_command(np, ["hpcdl", *argv]), f"{np}-rank run", timeout_s)


def supervise(cmd: list[str], what: str, timeout_s: float | None) -> int:
    """Run ``cmd`` in its own session and return its exit code. A timeout, SIGTERM, SIGHUP (unless
    ignored: ``nohup``) or Ctrl-C to this process first marks the run stopped (``STOP_ENV``),
    then ends the whole session; the child also dies with this process, and its rank 0 writes
    no record once this process is gone (``LAUNCHERS_ENV``): without these, mpirun and its ranks
    would outlive us and a stopped run could still write its record."""
    with private_folder("launch") as private, _removed_after(private):
        stop = os.path.join(private, "stop")
        env = {**mpi_env(), **launcher_env(), STOP_ENV: stop, SCRATCH_ENV: private}
        die = dies_with_this_process()
        raise_if_terminated()  # a signal whose exception an earlier fork's callback swallowed
        # mpirun's stderr passes through relay_errors (a single process has no MPI to abort,
        # and keeps its terminal: a progress bar draws there)
        errors = None if cmd[0] == sys.executable else subprocess.PIPE
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=die, stderr=errors)
        relay = threading.Thread(target=relay_errors, args=(proc.stderr,), name="hpcdl-stderr", daemon=True)
        relay.start()
        with stop_signals_raise(), _relayed(relay):
            try:
                raise_if_terminated()  # ... or this fork's
                return proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                print(f"hpcdl: the {what} exceeded {timeout_s:g} s; ending it", file=sys.stderr, flush=True)
                _end(proc, stop)
                return TIMED_OUT
            except Terminated as e:
                print(f"hpcdl: terminated ({e}); ending the {what}", file=sys.stderr, flush=True)
                _end(proc, stop)
                return e.code
            except BaseException:  # Ctrl-C, or any other way out of here: the child ends first
                _end(proc, stop)
                raise


def _space_tag() -> str:
    """This kernel and pid namespace, short (a temporary folder may be shared with others)."""
    return hashlib.sha256(str(_pid_space()).encode()).hexdigest()[:8]


def _owned(kind: str, hidden: bool) -> str:
    return f"{'.' if hidden else ''}hpcdl-{kind}-{_space_tag()}"


@contextlib.contextmanager
def private_folder(kind: str, where: str | Path | None = None, hidden: bool = False) -> Iterator[str]:
    """A new folder (in ``where``, else the temporary folder) for what a command keeps only
    while it runs: a launcher's scratch, an archive extracted, a package staged. It goes when the
    command ends, however (SIGTERM unwinds every command); one left by a process killed with
    SIGKILL, which removes nothing, is named for that process (pid space, pid, start time) and
    removed by the next command of its ``kind`` (:func:`remove_stale`)."""
    remove_stale(kind, where, hidden)
    prefix = f"{_owned(kind, hidden)}.{os.getpid()}.{_start_time(os.getpid())}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=where) as folder:
        yield folder


def remove_stale(kind: str, where: str | Path | None = None, hidden: bool = False) -> None:
    """Remove the private folders of ``kind`` in ``where`` (and what a launcher's lists) whose
    process is gone."""
    pattern = re.compile(rf"{re.escape(_owned(kind, hidden))}\.(\d+)\.(\d+)-[^/]+")
    with contextlib.suppress(OSError):
        for entry in os.scandir(where or tempfile.gettempdir()):
            named = pattern.fullmatch(entry.name)
            if named and entry.is_dir(follow_symlinks=False) and _start_time(int(named[1])) != named[2]:
                with _removed_after(entry.path):
                    pass
                shutil.rmtree(entry.path, ignore_errors=True)


def keep_until_launcher_ends(path: Path) -> None:
    """Have this process's launcher remove ``path`` (a folder) when it ends, however the run
    ends (a rank killed cannot remove what it made); nothing without a launcher here."""
    scratch = os.environ.get(SCRATCH_ENV)
    if scratch and os.path.isdir(scratch):
        with open(os.path.join(scratch, "remove"), "a") as f:
            f.write(f"{path}\n")


@contextlib.contextmanager
def _removed_after(scratch: str) -> Iterator[None]:
    """On the way out, the folders the run asked to be removed (``keep_until_launcher_ends``)."""
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            for line in Path(scratch, "remove").read_text().splitlines():
                shutil.rmtree(line, ignore_errors=True)
                with contextlib.suppress(OSError):  # the folder of all runs' ones, once empty
                    Path(line).parent.rmdir()


ABORT_BANNER = re.compile(
    rb"MPI_ABORT was invoked on rank|help-mpi-api\.txt / mpi-abort|orte_base_help_aggregate"
    rb"|application called MPI_Abort\("
)
"""what Open MPI says after a rank called MPI_Abort: a boxed banner (``MPI_ABORT was invoked on
rank ...``) and, from several ranks, a count of the same; MPICH's one line per rank
(``application called MPI_Abort(MPI_COMM_WORLD, 1) - process 1``); hpcdl said why in its own
line first"""
RULE = b"-" * 74
"""the rule above and below each of Open MPI's boxed messages"""


def relay_errors(source: IO[bytes] | None, sink_fd: int = 2) -> None:
    """Copy a child's stderr to ``sink_fd`` line by line as it comes, without Open MPI's banner
    after an abort (``ABORT_BANNER``): the failure stays hpcdl's one line. Every other block of
    Open MPI's (why a launch failed, which rank died of which signal) passes."""
    if source is None:
        return
    block: list[bytes] = []
    for line in iter(source.readline, b""):
        rule = line.rstrip() == RULE
        if block or rule:  # inside one of Open MPI's boxed messages, or its start
            block.append(line)
            if len(block) == 1 or not rule:
                continue
            line, block = b"".join(block), []
        if not ABORT_BANNER.search(line):
            os.write(sink_fd, line)
    if block:
        os.write(sink_fd, b"".join(block))


@contextlib.contextmanager
def _relayed(relay: threading.Thread) -> Iterator[None]:
    """Wait, on the way out, until the child's stderr is all relayed (the child has ended)."""
    try:
        yield
    finally:
        relay.join(timeout=10)


def _end(proc: subprocess.Popen[bytes], stop: str) -> None:
    """Mark the run stopped, then SIGTERM to the child's process group, SIGKILL if it is still
    there 10 s later."""
    Path(stop).touch()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
