"""Which MPI an ``mpirun`` belongs to, and the command line each wants.

Open MPI, MPICH's Hydra (``mpiexec.hydra``, also under Cray MPICH and MVAPICH) and Intel MPI
(Hydra too) take different flags for the same launch: Hydra refuses Open MPI's
``--oversubscribe``, and Open MPI refuses Hydra's ``-bind-to``. The flavour is read from
``mpirun --version`` once per launcher (``HPCDL_MPI_FLAVOUR`` names it where that cannot tell,
e.g. a site's wrapper script); inside a Slurm job ``srun`` starts the ranks instead and needs
none of this (:mod:`hpcdl.schedulers.builtin.slurm`).
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Sequence

from hpcdl.errors import HpcdlError, InputError

FLAVOUR_ENV = "HPCDL_MPI_FLAVOUR"
FLAVOURS = ("openmpi", "mpich", "intel")
"""Open MPI; MPICH's Hydra (and the MPIs built on it: Cray MPICH, MVAPICH); Intel MPI"""

_SIGNS = (("openmpi", ("Open MPI", "OpenRTE")), ("intel", ("Intel(R) MPI",)), ("mpich", ("HYDRA", "MPICH")))
"""what each flavour's ``mpirun --version`` prints, tried in this order (Intel's Hydra says HYDRA too)"""


def flavour(mpirun: str) -> str:
    """The flavour of ``mpirun``: ``$HPCDL_MPI_FLAVOUR`` when set, else what its version says."""
    chosen = os.environ.get(FLAVOUR_ENV)
    if chosen:
        if chosen not in FLAVOURS:
            raise InputError(FLAVOUR_ENV, chosen, " or ".join(FLAVOURS))
        return chosen
    return _asked(mpirun)


@functools.cache
def _asked(mpirun: str) -> str:
    try:
        done = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        known = ", ".join(FLAVOURS)
        raise HpcdlError(f"{mpirun} --version failed ({e}); set {FLAVOUR_ENV} to one of {known}") from e
    said = done.stdout + done.stderr
    for name, signs in _SIGNS:
        if any(sign in said for sign in signs):
            return name
    first = said.strip().splitlines()[0][:80] if said.strip() else "nothing"
    raise HpcdlError(
        f"{mpirun} is no MPI launcher hpcdl knows (--version said: {first!r}); "
        f"set {FLAVOUR_ENV} to one of {', '.join(FLAVOURS)}"
    )


def command(name: str, mpirun: str, np: int, program: Sequence[str], *, oversubscribe: bool) -> list[str]:
    """The line that starts ``np`` ranks of ``program`` with ``mpirun`` of flavour ``name``.

    Ranks are never bound to cores (hpcdl divides the cores among the ranks itself: Open MPI's
    and Hydra's ``bind-to none``; Intel MPI's ``I_MPI_PIN=0``, :func:`environment`).
    ``oversubscribe``: more ranks than cores is allowed (a test machine has 2 cores); inside a
    batch allocation Open MPI places the ranks on its nodes instead and must not hide a layout
    that does not fit. Hydra always allows it on a host of its own and places ranks on an
    allocation's nodes by itself.
    """
    if name == "openmpi":
        place = ["--oversubscribe"] if oversubscribe else []
        return [mpirun, "-np", str(np), *place, "--bind-to", "none", *program]
    if name == "mpich":
        return [mpirun, "-n", str(np), "-bind-to", "none", *program]
    return [mpirun, "-n", str(np), *program]


def environment(root: bool) -> dict[str, str]:
    """What every flavour's ranks need from the environment (each MPI ignores the others'):
    Open MPI's consent to run as root (containers, CI) and ``mpi_yield_when_idle``, a rank waiting
    in MPI yielding its core instead of spinning (Horovod's background thread waits in MPI beside
    the compute thread; spinning, it took the core from it: benchmarks/bench_dist.py); Intel
    MPI's ``I_MPI_PIN=0``, no pinning."""
    env = {"OMPI_MCA_mpi_yield_when_idle": "1", "I_MPI_PIN": "0"}
    if root:
        env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return env
