"""Starting the ranks of a run on this machine: ``hpcdl run --np N`` re-runs itself under
``mpirun``. Under an existing launcher (mpirun, srun) hpcdl never launches again."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from hpcdl.errors import HpcdlError


def mpirun_command(np: int, module_args: Sequence[str], *, oversubscribe: bool = True) -> list[str]:
    """The mpirun line for ``np`` ranks of ``python -m MODULE_ARGS``: the one place hpcdl
    builds one (``hpcdl run --np``, sweeps, and scheduler jobs launched with mpirun).

    ``--oversubscribe`` on this machine: more ranks than cores is allowed (a test machine has 2
    cores); inside a batch allocation Open MPI places the ranks on its nodes instead, and must
    not hide a layout that does not fit. ``--bind-to none``: hpcdl divides the cores among the
    ranks itself.
    """
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise HpcdlError("mpirun not found on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev)")
    place = ["--oversubscribe"] if oversubscribe else []
    return [mpirun, "-np", str(np), *place, "--bind-to", "none", sys.executable, "-m", *module_args]


def mpi_env() -> dict[str, str]:
    """This environment, plus what Open MPI needs to run as root (containers, CI), and
    ``mpi_yield_when_idle``: a rank waiting in MPI yields its core instead of spinning.
    Horovod's background thread waits in MPI beside the compute thread; spinning, it took the
    core from it (benchmarks/bench_dist.py, cnn, 2 ranks x 1 core: 126-139 samples/s spinning,
    179-182 yielding)."""
    env = dict(os.environ)
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


class Terminated(Exception):
    """This process was sent SIGTERM (``kill``, ``scancel``, a test harness's timeout)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


TERMINATED = 128 + signal.SIGTERM
"""exit code of a run ended by SIGTERM, as a shell reports it"""


def launch(np: int, argv: Sequence[str], timeout_s: float | None = None) -> int:
    """Run ``hpcdl ARGV`` as ``np`` MPI ranks (one plain process for ``np=1``) and return the
    exit code. If one rank fails, hpcdl aborts the MPI job, so every rank ends."""
    if np == 1:
        return supervise([sys.executable, "-m", "hpcdl", *argv], "1-rank run", timeout_s)
    return supervise(mpirun_command(np, ["hpcdl", *argv]), f"{np}-rank run", timeout_s)


def supervise(cmd: list[str], what: str, timeout_s: float | None) -> int:
    """Run ``cmd`` in its own session and return its exit code; a timeout, Ctrl-C or SIGTERM
    to this process ends the whole session (without it, mpirun and its ranks outlive us)."""
    proc = subprocess.Popen(cmd, env=mpi_env(), start_new_session=True)
    main = threading.current_thread() is threading.main_thread()  # signal handlers live there
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"hpcdl: the {what} exceeded {timeout_s:g} s; ending it", file=sys.stderr, flush=True)
        return _end(proc)
    except Terminated:
        print(f"hpcdl: terminated; ending the {what}", file=sys.stderr, flush=True)
        _end(proc)
        return TERMINATED
    except KeyboardInterrupt:
        _end(proc)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _end(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the launcher's process group, SIGKILL if it is still there 10 s later."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return 124
