"""Who this process is among the ranks of a run, from MPI (mpi4py), and the collectives hpcdl
uses on host objects: gather of results, agreement checks, abort.

Without an MPI launcher (no mpirun/srun environment) the world is this process alone, and
mpi4py is not even imported: a plain ``hpcdl run`` needs no MPI.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hpcdl.parallel.worldsize import checked_world, promised_sizes

# Environment variables an MPI launcher sets for every rank it starts.
LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")


def under_mpi() -> bool:
    """True when this process was started by an MPI launcher (mpirun, srun --mpi, horovodrun)."""
    return any(v in os.environ for v in LAUNCHER_VARS)


@dataclass(frozen=True)
class World:
    """This rank's place in the run. ``comm`` is an mpi4py communicator, or None alone."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node: int = 0
    nodes: int = 1
    hostname: str = socket.gethostname()
    comm: Any = None

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere)."""
        return [obj] if self.comm is None else self.comm.gather(obj, root=0)

    def allgather(self, obj: Any) -> list[Any]:
        return [obj] if self.comm is None else list(self.comm.allgather(obj))

    def bcast(self, obj: Any) -> Any:
        return obj if self.comm is None else self.comm.bcast(obj, root=0)

    def all_true(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on every rank (a logical-and allreduce)."""
        if self.comm is None:
            return flag
        from mpi4py import MPI

        return bool(self.comm.allreduce(flag, op=MPI.LAND))

    def barrier(self) -> None:
        if self.comm is not None:
            self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        """End every rank of the run now (used when one rank fails, so none hangs)."""
        if self.comm is not None:
            self.comm.Abort(code)


def rank_of_process() -> int:
    """This process's rank as the launcher set it (0 when not launched by MPI)."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def abort_mpi(code: int) -> None:
    """Abort the whole MPI job (every rank), if MPI is in use."""
    if under_mpi():
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(code)


def end_all_ranks(error: BaseException, code: int = 1) -> None:
    """The one way a failed rank ends a multi-rank job: say which rank on which host failed and
    why, then abort every rank, which would otherwise wait for it in a collective forever.
    Outside MPI it does nothing (the caller re-raises)."""
    if not under_mpi():
        return
    print(
        f"hpcdl: rank {rank_of_process()} on {socket.gethostname()} failed: {type(error).__name__}: {error}",
        file=sys.stderr,
        flush=True,
    )
    abort_mpi(code)


@contextlib.contextmanager
def others_wait(world: World) -> Iterator[None]:
    """Around what one rank does while the others wait for it (rank 0 writing the record or the
    data): an exception there ends every rank at once (:func:`end_all_ranks`), with its one
    line, instead of leaving the others waiting in a collective forever."""
    try:
        yield
    except Exception as e:
        if world.size > 1:
            end_all_ranks(e, getattr(e, "exit_code", 1))
        raise


def init_world() -> World:
    """The world of this process: from MPI when launched by an MPI launcher, else alone."""
    promised = promised_sizes()  # before MPI starts: it may set variables of its own
    if not under_mpi():
        return checked_world(World(), promised)
    from mpi4py import MPI

    return checked_world(world_of(MPI.COMM_WORLD), promised)


def world_of(comm: Any) -> World:
    """This rank's place among the ranks of an mpi4py communicator (a part of the MPI world:
    the concurrent instances of ``hpcdl capacity``)."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    host = MPI.Get_processor_name()
    hosts = comm.allgather(host)
    node_names = sorted(set(hosts), key=hosts.index)  # in order of first rank
    return World(
        rank=comm.Get_rank(),
        size=comm.Get_size(),
        local_rank=local.Get_rank(),
        local_size=local.Get_size(),
        node=node_names.index(host),
        nodes=len(node_names),
        hostname=host,
        comm=comm,
    )
