"""On-demand benchmark: how two emulated hosts move data both ways at once, through plain TCP and
through Open MPI, and what Open MPI's allreduce algorithms cost at 2 and 4 hosts
(docs/validation/2026-11-25-scaling-model-emulated-cluster.md: why Open MPI's allreduce does not
extrapolate from 2 ranks there).

- TCP: 8 MiB one way, then 8 MiB each way at once on one connection (a thread sends while
  another receives), between hosts h1 and h2;
- MPI: 4 MiB one way (``Send``/``Recv``), then both ways at once (``Sendrecv``), between h1 and
  h2, one rank each;
- ``MPI_Allreduce`` of 4 MiB on 2 and 4 hosts of one rank, with Open MPI's own choice and with
  the ring (4) and Rabenseifner's algorithm (6) forced (``coll_tuned_use_dynamic_rules``);
- MPI on 2 hosts x 2 ranks: both pairs (each rank and its peer on the other host) move 1 MiB at
  once, one way, then both ways (how a host's pairs share its link; more ranks than 2 a host
  would outnumber this machine's cores).

Every figure is the median of 5 timed calls after one untimed, each between barriers.

    .venv/bin/python benchmarks/bench_duplex.py [--rate 200mbit]

Must run as root (it starts the emulated cluster if none runs, and stops it again).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench_emulated import CLUSTER, cluster, on_layout

from hpcdl.parallel.launch import mpi_env
from hpcdl.results.text import table

MIB = 1 << 20
PORT = 5555
TCP = """
import socket, statistics, sys, threading, time
role, peer, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
chunk = b"x" * 65536
def pump(s, size):
    sent = 0
    while sent < size:
        sent += s.send(chunk[: min(len(chunk), size - sent)])
def drain(s, size):
    got = 0
    while got < size:
        got += len(s.recv(min(1 << 20, size - got)))  # never the next round's byte
if role == "server":
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", PORT)); srv.listen(1); s = srv.accept()[0]
else:
    for _ in range(100):
        try:
            s = socket.create_connection((peer, PORT)); break
        except OSError:
            time.sleep(0.05)
out = {}
for mode in ("one way", "both ways"):
    times = []
    for i in range(6):
        s.sendall(b"g"); s.recv(1)  # a barrier of one byte each way
        t0 = time.perf_counter()
        if mode == "one way":
            (pump if role == "client" else drain)(s, n)
            if role == "server": s.sendall(b"d")
            else: s.recv(1)
        else:
            ts = [threading.Thread(target=pump, args=(s, n)), threading.Thread(target=drain, args=(s, n))]
            [t.start() for t in ts]; [t.join() for t in ts]
        if i: times.append(time.perf_counter() - t0)
    out[mode] = statistics.median(times)
if role == "client":
    print(out["one way"], out["both ways"])
""".replace("PORT", str(PORT))
MPI_PAIRS = """
import statistics, sys, time, numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD; r = c.rank; half = c.size // 2; n = int(sys.argv[1])
peer = (r + half) % c.size  # the same local rank on the other host (ranks fill a host first)
a = np.ones(n // 4, dtype=np.float32); b = np.empty_like(a)
out = {}
for mode in ("one way", "both ways"):
    times = []
    for i in range(6):
        c.Barrier(); t0 = time.perf_counter()
        if mode == "both ways":
            c.Sendrecv(a, dest=peer, recvbuf=b, source=peer)
        elif r < half:
            c.Send(a, dest=peer)
        else:
            c.Recv(b, source=peer)
        c.Barrier()
        if i: times.append(time.perf_counter() - t0)
    out[mode] = statistics.median(times)
if r == 0:
    print(out["one way"], out["both ways"])
"""
MPI_ALLREDUCE = """
import statistics, sys, time, numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD; n = int(sys.argv[1])
a = np.ones(n // 4, dtype=np.float32); b = np.empty_like(a)
times = []
for i in range(6):
    c.Barrier(); t0 = time.perf_counter(); c.Allreduce(a, b, op=MPI.SUM); c.Barrier()
    if i: times.append(time.perf_counter() - t0)
if c.rank == 0:
    print(statistics.median(times))
"""


def tcp(nbytes: int) -> tuple[float, float]:
    """(one way, both ways) seconds of ``nbytes`` between h1 and h2 over plain TCP."""
    run = ["bash", str(CLUSTER / "cluster.sh"), "exec"]
    server = subprocess.Popen([*run, "h2", sys.executable, "-c", TCP, "server", "", str(nbytes)])
    try:
        time.sleep(0.5)
        client = subprocess.run([*run, "h1", sys.executable, "-c", TCP, "client", "h2", str(nbytes)],
                                capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    finally:
        server.wait(timeout=60)
    one, both = client.stdout.split()
    return float(one), float(both)


def mpi(script: str, hosts: int, nbytes: int, *mca: str, ppn: int = 1) -> list[float]:
    """The figures rank 0 of ``script`` prints, ``ppn`` ranks on each of ``hosts`` hosts."""
    env = {**mpi_env(), **on_layout(hosts, ppn)}
    cmd = [str(CLUSTER / "mpirun"), "-np", str(hosts * ppn), *mca, sys.executable, "-c", script, str(nbytes)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if p.returncode != 0:
        sys.exit(f"mpirun failed:\n{p.stderr[-2000:]}")
    return [float(x) for x in p.stdout.split()]


def forced(algorithm: int) -> list[str]:
    return [
        "--mca",
        "coll_tuned_use_dynamic_rules",
        "1",
        "--mca",
        "coll_tuned_allreduce_algorithm",
        str(algorithm),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="200mbit", help="each host's link, in tc's units (default 200mbit)")
    args = ap.parse_args()
    was_running = cluster("status").returncode == 0
    if cluster("start", "4", args.rate).returncode != 0:
        sys.exit("the emulated cluster did not start")
    rows = []
    try:
        one, both = tcp(8 * MIB)
        rows.append(
            ["TCP, 2 hosts", "8 MiB one way / each way at once", f"{one * 1e3:.0f}", f"{both * 1e3:.0f}"]
        )
        one, both = mpi(MPI_PAIRS, 2, 4 * MIB)
        rows.append(
            ["Open MPI, 2 hosts", "4 MiB one way / each way at once", f"{one * 1e3:.0f}", f"{both * 1e3:.0f}"]
        )
        for ppn in (1, 2):
            one, both = mpi(MPI_PAIRS, 2, MIB, ppn=ppn)
            pairs = f"{ppn} pair{'s' if ppn > 1 else ''} at once"
            rows.append(["Open MPI, 2 hosts", f"1 MiB, {pairs}: one way / each way", f"{one * 1e3:.0f}",
                         f"{both * 1e3:.0f}"])  # fmt: skip
        for hosts in (2, 4):
            for name, mca in (
                ("its own choice", []),
                ("ring (4)", forced(4)),
                ("Rabenseifner (6)", forced(6)),
            ):
                (t,) = mpi(MPI_ALLREDUCE, hosts, 4 * MIB, *mca)
                rows.append([f"Open MPI, {hosts} hosts", f"allreduce of 4 MiB, {name}", f"{t * 1e3:.0f}", ""])
    finally:
        if not was_running:
            cluster("stop")
    print(f"links at {args.rate}; medians of 5 calls, ms")
    print(table(["transport", "what", "ms", "ms both ways"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
