"""Allreduce microbenchmark: a sweep of buffer sizes through a backend and through raw mpi4py,
side by side, in the manner of nccl-tests (warm-up, timed repetitions, the slowest rank's
median, algbw and busbw)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hpcdl import metrics
from hpcdl.measure.device import synchronize
from hpcdl.parallel.backends import Backend
from hpcdl.parallel.world import World

DEFAULT_SIZES = [2**k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB


def _median_time(fn: Any, reps: int, sync: Any) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(metrics.summarize(times)["median"])


def allreduce_sweep(
    world: World, backend: Backend, device: torch.device, sizes: Sequence[int] = DEFAULT_SIZES, reps: int = 10
) -> list[dict[str, Any]] | None:
    """Rows (rank 0; None elsewhere) of size, time and bandwidths for the backend and for raw MPI.
    Each result is checked: a sum of ones over N ranks must be N everywhere (nccl-tests' #wrong)."""
    rows = []
    for nbytes in sizes:
        n = max(nbytes // 4, 1)
        t = torch.ones(n, device=device)

        def backend_op(t: torch.Tensor = t) -> None:
            t.fill_(1.0)
            backend.allreduce(t)

        t_backend = _median_time(backend_op, reps, lambda: synchronize(device))
        wrong_backend = int((t != world.size).sum())
        buf = np.ones(n, dtype=np.float32)
        if world.comm is not None:
            from mpi4py import MPI

            def mpi_op(buf: np.ndarray = buf) -> None:  # in place, like the backends' allreduce
                buf.fill(1.0)
                world.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

            t_mpi = _median_time(mpi_op, reps, world.barrier)
            wrong_mpi = int((buf != world.size).sum())
        else:
            t_mpi, wrong_mpi = float("nan"), 0
        slowest = world.allgather((t_backend, t_mpi))
        tb, tm = max(x[0] for x in slowest), max(x[1] for x in slowest)
        wrong = sum(world.allgather(wrong_backend + wrong_mpi))
        rows.append(
            {
                "bytes": n * 4,
                "backend_s": tb,
                "backend_algbw": metrics.algbw(n * 4, tb),
                "backend_busbw": metrics.busbw(metrics.algbw(n * 4, tb), world.size),
                "mpi_s": tm,
                "mpi_algbw": metrics.algbw(n * 4, tm),
                "mpi_busbw": metrics.busbw(metrics.algbw(n * 4, tm), world.size),
                "wrong": wrong,
            }
        )
    return rows if world.rank == 0 else None
