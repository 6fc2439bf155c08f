"""A launch that cannot split silently: the world this process joined against the one promised.

An MPI started without a usable process-management interface (Open MPI under ``srun`` without
its PMIx plugin, open-mpi/ompi#13523) starts N processes that each think they are rank 0 of 1:
each would measure and write a 1-rank record of an N-rank run. Every launcher says how many
ranks it started, before MPI is initialised; :func:`promised_sizes` reads those variables and
:func:`check_world_size` ends the process with one line when the world differs.

Which variables count:

- an MPI launcher's (``OMPI_COMM_WORLD_SIZE``, ``PMI_SIZE``, ``PMIX_SIZE``,
  ``MV2_COMM_WORLD_SIZE``): the ranks it started;
- Slurm's ``SLURM_STEP_NUM_TASKS`` (or ``SLURM_NTASKS`` inside a step): the tasks ``srun``
  started, but only when no MPI launcher's variable is set (the ranks an ``mpirun`` starts in
  an allocation inherit the variables of the step that started its daemons, one per node) and
  only in a step (the batch script's one process is not a task of a step);
- ``HPCDL_WORLD_SIZE``, which hpcdl's job entry sets from the job file's nodes x tasks per node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol, TypeVar

from hpcdl.errors import HpcdlError

EXPECTED_ENV = "HPCDL_WORLD_SIZE"
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")


class HasSize(Protocol):
    @property
    def size(self) -> int: ...


W = TypeVar("W", bound=HasSize)


class WorldMismatch(HpcdlError):
    """The world this process joined is not the one its launcher promised (exit code 2). Said
    by every process: in a split world each is alone, whatever rank its launcher gave it."""

    every_rank = True


def promised_sizes(env: Mapping[str, str] | None = None) -> dict[str, int]:
    """The world sizes promised to this process, by the variable that promised each. Read it
    before MPI is initialised: an MPI may set variables of its own while it starts."""
    env = os.environ if env is None else env
    names = [v for v in MPI_SIZE_VARS if v in env]
    if not names and "SLURM_STEP_NUM_TASKS" in env:
        names = ["SLURM_STEP_NUM_TASKS"]
    elif not names and "SLURM_STEP_ID" in env and "SLURM_NTASKS" in env:
        names = ["SLURM_NTASKS"]
    if EXPECTED_ENV in env:
        names.append(EXPECTED_ENV)
    out = {}
    for name in names:
        try:
            out[name] = int(env[name])
        except ValueError:
            continue  # not a number: says nothing about the world
    return out


def check_world_size(size: int, promised: Mapping[str, int]) -> None:
    """Raise :class:`WorldMismatch` (one line: both sizes and the likely cause) when ``size``,
    the world this process joined, is not every promised size."""
    wrong = {name: n for name, n in promised.items() if n != size}
    if not wrong:
        return
    said = ", ".join(f"{name}={n}" for name, n in wrong.items())
    if size == 1:
        cause = (
            "each process started alone: the MPI world was not set up (no PMIx plugin?): "
            'use launcher = "mpirun" or srun --mpi=pmix'
        )
    else:
        cause = "the launcher started another number of ranks than the job asked for"
    raise WorldMismatch(f"this process joined a world of {size} rank(s), but {said}: {cause}; nothing run")


def checked_world(world: W, promised: Mapping[str, int]) -> W:
    """``world``, once its size is every promised one (:func:`check_world_size`)."""
    check_world_size(world.size, promised)
    return world


__all__ = ["EXPECTED_ENV", "WorldMismatch", "check_world_size", "checked_world", "promised_sizes"]
