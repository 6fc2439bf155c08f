"""Collective microbenchmarks: allreduce, all-gather, reduce-scatter and all-to-all, each swept
over buffer sizes through a backend and through raw mpi4py side by side, in the manner of
nccl-tests (warm-up, timed repetitions, the slowest rank's median, algbw and busbw, and every
result checked: nccl-tests' #wrong).

Sizes are nccl-tests': the buffer of an allreduce, the gathered output of an all-gather, the
input of a reduce-scatter, one rank's send buffer of an all-to-all (``hpcdl.metrics.algbw``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hpcdl import metrics
from hpcdl.device import synchronize
from hpcdl.parallel.backends import Backend
from hpcdl.parallel.world import World

DEFAULT_SIZES = [2**k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB
GPU_SIZES = [2**k for k in range(10, 31, 2)]
"""1 KiB .. 1 GiB: NVLink and InfiniBand reach their bandwidth only past tens of MiB"""


def default_sizes(device: torch.device) -> list[int]:
    return GPU_SIZES if device.type == "cuda" else DEFAULT_SIZES


@dataclass(frozen=True)
class Op:
    """One collective as the benchmark runs it on ``ranks`` ranks and ``n`` float32 elements
    (nccl-tests' size over 4, a multiple of the ranks): what rank r sends, what it must
    receive, and the call through a backend and through mpi4py."""

    name: str
    in_place: bool
    """the call overwrites its input (allreduce): refilled before each timed call, untimed"""
    send: Callable[[int, int, int], np.ndarray]
    """(rank, ranks, n) -> this rank's input"""
    expect: Callable[[int, int, int], np.ndarray]
    """(rank, ranks, n) -> the output this rank must hold"""
    backend: Callable[[Backend, torch.Tensor], torch.Tensor]
    mpi: Callable[[Any, np.ndarray], np.ndarray]
    """(communicator, input) -> output"""


def _chunks(ranks: int, n: int, value: Callable[[int], float]) -> np.ndarray:
    """n elements in ``ranks`` equal chunks, chunk j filled with value(j)."""
    return np.repeat(np.array([value(j) for j in range(ranks)], dtype=np.float32), n // ranks)


def _allreduce(backend: Backend, t: torch.Tensor) -> torch.Tensor:
    backend.allreduce(t)  # in place, like the backends' gradient allreduce
    return t


def _mpi_allreduce(comm: Any, buf: np.ndarray) -> np.ndarray:
    from mpi4py import MPI

    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    return buf


def _mpi_allgather(comm: Any, buf: np.ndarray) -> np.ndarray:
    out = np.empty(buf.size * comm.Get_size(), dtype=buf.dtype)
    comm.Allgather(buf, out)
    return out


def _mpi_reduce_scatter(comm: Any, buf: np.ndarray) -> np.ndarray:
    out = np.empty(buf.size // comm.Get_size(), dtype=buf.dtype)
    comm.Reduce_scatter_block(buf, out)
    return out


def _mpi_alltoall(comm: Any, buf: np.ndarray) -> np.ndarray:
    out = np.empty_like(buf)
    comm.Alltoall(buf, out)
    return out


OPS = {  # one per name of backends.COLLECTIVES
    op.name: op
    for op in (
        Op(
            "allreduce",
            in_place=True,
            send=lambda r, k, n: np.ones(n, np.float32),
            expect=lambda r, k, n: np.full(n, k, np.float32),
            backend=_allreduce,
            mpi=_mpi_allreduce,
        ),
        Op(
            "all_gather",
            in_place=False,
            send=lambda r, k, n: np.full(n // k, r + 1, np.float32),
            expect=lambda r, k, n: _chunks(k, n, lambda j: j + 1),
            backend=lambda b, t: b.all_gather(t),
            mpi=_mpi_allgather,
        ),
        Op(
            "reduce_scatter",
            in_place=False,
            send=lambda r, k, n: np.full(n, r + 1, np.float32),
            expect=lambda r, k, n: np.full(n // k, k * (k + 1) / 2, np.float32),
            backend=lambda b, t: b.reduce_scatter(t),
            mpi=_mpi_reduce_scatter,
        ),
        Op(
            "all_to_all",
            in_place=False,
            send=lambda r, k, n: _chunks(k, n, lambda j: r * k + j),
            expect=lambda r, k, n: _chunks(k, n, lambda i: i * k + r),
            backend=lambda b, t: b.all_to_all(t),
            mpi=_mpi_alltoall,
        ),
    )
}


def elements(nbytes: int, ranks: int) -> int:
    """float32 elements of a buffer of about ``nbytes``, a multiple of the ranks."""
    return max(ranks, nbytes // 4 // ranks * ranks)


def _median_time(
    fn: Callable[[], Any], reps: int, sync: Callable[[], None], refill: Callable[[], None] | None
) -> tuple[float, Any]:
    """Median seconds of ``reps`` timed calls after one warm-up, and the last call's result;
    ``refill`` restores an in-place call's input before each call, outside the timing (a copy
    of a GiB buffer inside it would cost a tenth of an NVLink allreduce)."""
    out = fn()  # warm-up
    times = []
    for _ in range(reps):
        if refill is not None:
            refill()
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(metrics.summarize(times)["median"]), out


def backend_time(
    world: World, backend: Backend, device: torch.device, collective: str, nbytes: int, reps: int = 5
) -> tuple[float, int]:
    """This rank's median seconds of ``collective`` of ``nbytes`` through the backend, and the
    elements it got wrong."""
    op, n = OPS[collective], elements(nbytes, world.size)
    src = torch.from_numpy(op.send(world.rank, world.size, n)).to(device)
    t = src.clone()

    def refill() -> None:
        t.copy_(src)

    seconds, out = _median_time(
        lambda: op.backend(backend, t), reps, lambda: synchronize(device), refill if op.in_place else None
    )
    return seconds, int((out.cpu().numpy() != op.expect(world.rank, world.size, n)).sum())


def mpi_time(world: World, collective: str, nbytes: int, reps: int) -> tuple[float, int]:
    """The same through raw mpi4py on numpy buffers (NaN alone)."""
    if world.comm is None:
        return float("nan"), 0
    op, n = OPS[collective], elements(nbytes, world.size)
    src = op.send(world.rank, world.size, n)
    buf = src.copy()
    refill = (lambda: np.copyto(buf, src)) if op.in_place else None
    seconds, out = _median_time(lambda: op.mpi(world.comm, buf), reps, world.barrier, refill)
    return seconds, int((out != op.expect(world.rank, world.size, n)).sum())


def sweep(
    world: World,
    backend: Backend,
    device: torch.device,
    collective: str,
    sizes: Sequence[int] = DEFAULT_SIZES,
    reps: int = 10,
) -> list[dict[str, Any]] | None:
    """Rows (rank 0; None elsewhere) of one collective: per size, the slowest rank's median time,
    algbw and busbw through the backend and through raw MPI, and the wrong elements of both."""
    rows = []
    for nbytes in sizes:
        t_backend, wrong_backend = backend_time(world, backend, device, collective, nbytes, reps)
        t_mpi, wrong_mpi = mpi_time(world, collective, nbytes, reps)
        slowest = world.allgather((t_backend, t_mpi))
        tb, tm = max(x[0] for x in slowest), max(x[1] for x in slowest)
        size = elements(nbytes, world.size) * 4
        rows.append(
            {
                "collective": collective,
                "bytes": size,
                "backend_s": tb,
                "backend_algbw": metrics.algbw(size, tb),
                "backend_busbw": metrics.busbw(metrics.algbw(size, tb), world.size, collective),
                "mpi_s": tm,
                "mpi_algbw": metrics.algbw(size, tm),
                "mpi_busbw": metrics.busbw(metrics.algbw(size, tm), world.size, collective),
                "wrong": sum(world.allgather(wrong_backend + wrong_mpi)),
            }
        )
    return rows if world.rank == 0 else None
