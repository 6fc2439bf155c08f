"""Starting the ranks of a run on this machine: ``hpcdl run --np N`` re-runs itself under
``mpirun``. Under an existing launcher (mpirun, srun) hpcdl never launches again."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence

from hpcdl.errors import HpcdlError


def mpirun_command(np: int, argv: Sequence[str]) -> list[str]:
    """The mpirun line for ``np`` ranks of ``python -m hpcdl ARGV`` on this machine.

    ``--oversubscribe``: more ranks than cores is allowed (a test machine has 2 cores);
    ``--bind-to none``: hpcdl divides the cores among the ranks itself.
    """
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise HpcdlError("--np needs mpirun (Debian: apt-get install openmpi-bin libopenmpi-dev)")
    return [mpirun, "-np", str(np), "--oversubscribe", "--bind-to", "none",
            sys.executable, "-m", "hpcdl", *argv]


def mpi_env() -> dict[str, str]:
    """This environment, plus what Open MPI needs to run as root (containers, CI)."""
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def launch(np: int, argv: Sequence[str], timeout_s: float | None = None) -> int:
    """Run ``hpcdl ARGV`` as ``np`` MPI ranks and return the exit code. If one rank fails,
    hpcdl aborts the MPI job, so every rank ends; Ctrl-C ends them too."""
    proc = subprocess.Popen(mpirun_command(np, argv), env=mpi_env(), start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"hpcdl: the {np}-rank run exceeded {timeout_s:g} s; ending it", file=sys.stderr, flush=True)
        return _end(proc)
    except KeyboardInterrupt:
        _end(proc)
        raise


def _end(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the launcher's process group, SIGKILL if it is still there 10 s later."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return 124
