"""``hpcdl diagnose``, the measurement: what every rank, node and neighbour link of a world can
do, measured the same way everywhere so that the slow one stands out (the analysis is in
:mod:`hpcdl.results.diagnosis`).

- per device (each rank): the GEMM ceiling in the run's precision (:func:`gemm_ceiling`) and
  the memory bandwidth of a timed copy (median of rounds);
- per node: the bus bandwidth of an allreduce among its ranks (raw MPI, :mod:`commbench`);
- across nodes: each neighbour pair of node leaders (node i and i+1), bandwidth (median) and
  latency (fastest round trip) of an MPI ping-pong;
- per node: the software a site's hangs come from (driver, CUDA, NCCL, MPI, OFED, torch
  versions; NCCL_* and UCX_* settings).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from typing import Any

import numpy as np
import torch

from hpcdl import metrics
from hpcdl.device import rank_threads, synchronize
from hpcdl.measure.peaks import gemm_ceiling
from hpcdl.parallel.commbench import mpi_time
from hpcdl.parallel.world import World, world_of

# One product on a CPU core takes 15 ms or more at n=1024, several scheduler time slices: a core
# shared with another process shows in the ceiling (at n=512 a product fits in one slice and
# its best time hid a core shared with a spinning process). 32 MiB copies: 64 MiB moved.
CPU_GEMM_SIZES = (1024,)
COPY_BYTES = {"cpu": 32 << 20, "cuda": 1 << 30}
ALLREDUCE_BYTES = 16 << 20
PING_BYTES, PONG_REPS = 8 << 20, 5
LATENCY_BYTES, LATENCY_REPS = 8, 50
ROUNDS = 5


def copy_bandwidth(device: torch.device, seconds: float) -> float:
    """Median over ROUNDS of the bandwidth of back-to-back copies of one buffer, each round
    ``seconds / ROUNDS`` long (several scheduler time slices: a shared core shows)."""
    nbytes = COPY_BYTES["cuda" if device.type == "cuda" else "cpu"]
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: pages touched, kernels loaded
    rates = []
    for _ in range(ROUNDS):
        synchronize(device)
        t0, copies = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds / ROUNDS:
            dst.copy_(src)
            copies += 1
            synchronize(device)
        rates.append(metrics.copy_bandwidth(nbytes, copies, time.perf_counter() - t0))
    return float(np.median(rates))


def device_figures(world: World, device: torch.device, precision: str, seconds: float) -> dict[str, Any]:
    """This rank's device figures."""
    sizes = None if device.type == "cuda" else CPU_GEMM_SIZES
    return {
        "rank": world.rank,
        "host": world.hostname,
        "node": world.node,
        "local_rank": world.local_rank,
        "device": str(device),
        "gemm_flops": gemm_ceiling(device, precision, seconds, sizes),
        "copy_bytes_per_s": copy_bandwidth(device, seconds),
    }


def node_allreduce(world: World) -> dict[str, Any] | None:
    """The bus bandwidth of an allreduce among this node's ranks (on its local rank 0; None
    elsewhere, and alone on a node)."""
    if world.comm is None:
        return None
    from mpi4py import MPI

    local = world_of(world.comm.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank))
    if local.size < 2:
        return None
    seconds, wrong = mpi_time(local, "allreduce", ALLREDUCE_BYTES, reps=5)
    slowest = max(local.allgather(seconds))
    if local.rank != 0:
        return None
    algbw = metrics.algbw(ALLREDUCE_BYTES // 4 // local.size * local.size * 4, slowest)
    return {
        "host": world.hostname,
        "node": world.node,
        "ranks": local.size,
        "allreduce_busbw": metrics.busbw(algbw, local.size),
        "wrong": wrong,
    }


def round_trips(comm: Any, me: int, peer: int, nbytes: int, reps: int, budget_s: float) -> list[float]:
    """Seconds of each ping-pong of ``nbytes`` between ranks ``me`` and ``peer``: a warm-up,
    then ``reps`` timed, fewer where the warm-up says they would last over ``budget_s`` (8 MiB
    takes 0.7 s a round trip on a 200 Mbit/s link; the lower rank decides, and tells its peer)."""
    buf = np.ones(nbytes, dtype=np.uint8)

    def once() -> float:
        t0 = time.perf_counter()
        if me < peer:
            comm.Send(buf, dest=peer, tag=7)
            comm.Recv(buf, source=peer, tag=7)
        else:
            comm.Recv(buf, source=peer, tag=7)
            comm.Send(buf, dest=peer, tag=7)
        return time.perf_counter() - t0

    warm = once()
    if me < peer:
        reps = max(1, min(reps, int(budget_s / max(warm, 1e-9))))
        comm.send(reps, dest=peer, tag=8)
    else:
        reps = comm.recv(source=peer, tag=8)
    return [once() for _ in range(reps)]


def quiet_barrier(comm: Any) -> None:
    """A barrier that sleeps while it waits: the ranks not in a ping-pong leave the cores to
    those that are (spinning in MPI's barrier, they take them where ranks outnumber cores)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.001)


def neighbour_links(world: World, seconds: float) -> list[dict[str, Any]]:
    """Ping-pong between the leaders (local rank 0) of nodes i and i+1, even pairs then odd
    pairs so that no rank is in two at once, about ``seconds`` a figure; every rank gets the
    rows."""
    if world.comm is None or world.nodes < 2:
        return []
    leaders = world.allgather((world.node, world.rank, world.hostname) if world.local_rank == 0 else None)
    lead = {node: (rank, host) for node, rank, host in (x for x in leaders if x is not None)}
    rows = []
    for parity in (0, 1):
        for a in range(parity, world.nodes - 1, 2):
            (ra, ha), (rb, hb) = lead[a], lead[a + 1]
            if world.rank in (ra, rb):
                peer = rb if world.rank == ra else ra
                # latency: the fastest round trip, as a ceiling is the fastest product; a rank
                # waiting for a core (more ranks than cores, a busy node) gave medians of 5-10 ms
                # beside 6 us on the same link. Bandwidth: the median (each lasts many slices).
                rt_lat = min(round_trips(world.comm, world.rank, peer, LATENCY_BYTES, LATENCY_REPS, seconds))
                rt_bw = float(
                    np.median(round_trips(world.comm, world.rank, peer, PING_BYTES, PONG_REPS, seconds))
                )
                if world.rank == ra:
                    latency, _ = metrics.pingpong(LATENCY_BYTES, rt_lat)
                    _, bandwidth = metrics.pingpong(PING_BYTES, rt_bw)
                    rows.append(
                        {"hosts": [ha, hb], "ranks": [ra, rb], "bandwidth": bandwidth, "latency_s": latency}
                    )
        quiet_barrier(world.comm)
    return [row for part in world.allgather(rows) for row in part]


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def software() -> dict[str, Any]:
    """This node's versions (None: not present) and its NCCL_* and UCX_* settings."""
    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
        except (AttributeError, RuntimeError):
            nccl = None
    mpi = None
    try:
        from mpi4py import MPI

        mpi = MPI.Get_library_version().strip("\x00 \n").splitlines()[0]
    except ImportError:
        pass
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "mpi": mpi,
        "driver": driver,
        "ofed": _run(["ofed_info", "-s"]),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "UCX_"))},
    }


def measure(world: World, device: torch.device, precision: str, seconds: float) -> dict[str, Any] | None:
    """Every figure of the world, gathered on rank 0 (None elsewhere)."""
    torch.set_num_threads(rank_threads(world.local_size))  # as a training rank would
    world.barrier()  # the ranks measure their devices together, as a training step would
    mine = device_figures(world, device, precision, seconds)
    nodes = world.gather(node_allreduce(world))
    links = neighbour_links(world, seconds)
    devices = world.gather(mine)
    soft = world.gather(software() if world.local_rank == 0 else None)
    if world.rank != 0:
        return None
    assert devices is not None and nodes is not None and soft is not None
    return {
        "devices": devices,
        "nodes": [n for n in nodes if n is not None],
        "links": links,
        "software": {s["host"]: s for s in soft if s is not None},
    }
