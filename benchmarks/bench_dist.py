"""On-demand benchmark of hpcdl's distributed path (not part of the test suite).

Prints, measured side by side in one run on this machine:
  1. allreduce bus bandwidth of the Horovod and torch.distributed backends against a bare
     mpi4py Allreduce of the same buffers (target: >= 0.9 of raw MPI for large buffers);
  2. weak-scaling efficiency E(2) = X(2) / (2 X(1)) of a workload at 1 and 2 ranks;
  3. a Horovod CNN at N ranks of one core each, with ranks spinning in MPI and yielding
     (OMPI_MCA_mpi_yield_when_idle=0 and 1, alternated): why `hpcdl run --np` sets 1;
  4. the cost of the ranks' per-step agreement to end a timed window (a logical-and
     allreduce of a flag, as hpcdl's loop does it).

    .venv/bin/python benchmarks/bench_dist.py [--np 2] [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from hpcdl.parallel.launch import mpi_env
from hpcdl.results.text import si, table

LARGE = [16 << 20, 64 << 20]
WORKLOAD = ["--workload", "mlp", "layers=4", "width=1024", "input_size=1024", "batch_size=64"]


CNN = ["--workload", "cnn", "image_size=32", "stages=3", "blocks=2", "base_width=32", "batch_size=32"]
FLAG = """
import time
from mpi4py import MPI
c = MPI.COMM_WORLD
for _ in range(100):
    c.allreduce(True, op=MPI.LAND)
ts = []
for _ in range(2000):
    t = time.perf_counter()
    c.allreduce(True, op=MPI.LAND)
    ts.append(time.perf_counter() - t)
ts.sort()
if c.rank == 0:
    print(ts[len(ts) // 2], ts[len(ts) * 9 // 10])
"""


def hpcdl(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(
        [sys.executable, "-m", "hpcdl", *args], capture_output=True, text=True, env={**mpi_env(), **env}
    )
    if p.returncode != 0:
        sys.exit(f"hpcdl {' '.join(args)} failed:\n{p.stderr[-2000:]}")
    return p


def allreduce_rows(np: int, reps: int) -> list[list[str]]:
    rows = []
    for backend in ("horovod", "torch"):
        sizes = ",".join(str(s) for s in LARGE)
        out = json.loads(
            hpcdl(
                "comm",
                "--np",
                str(np),
                "--backend",
                backend,
                "--collective",
                "allreduce",
                "--sizes",
                sizes,
                "--reps",
                str(reps),
                "--json",
            ).stdout
        )
        for r in out["rows"]:
            rows.append(
                [
                    backend,
                    si(r["bytes"], "B"),
                    si(r["backend_busbw"], "B/s"),
                    si(r["mpi_busbw"], "B/s"),
                    f"{r['backend_busbw'] / r['mpi_busbw']:.2f}",
                    ">= 0.9",
                    str(r["wrong"]),
                ]
            )
    return rows


def weak_rows(np: int, seconds: int) -> list[list[str]]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for backend in ("horovod", "torch"):
            out = Path(d) / backend
            hpcdl(
                "sweep",
                *WORKLOAD,
                "--np",
                f"1,{np}",
                "--mode",
                "weak",
                "--backend",
                backend,
                "--duration",
                str(seconds),
                "-o",
                str(out),
            )
            pts = json.loads((out / "sweep-weak-summary.json").read_text())["points"]
            x1, xn = pts[0]["samples_per_s"], pts[-1]["samples_per_s"]
            rows.append([backend, f"{x1:.1f}", f"{xn:.1f}", f"{pts[-1]['efficiency'] * 100:.1f}%"])
    return rows


def yield_rows(np: int, seconds: int, reps: int = 2) -> list[list[str]]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(reps):
            for y in ("0", "1"):
                out = Path(d) / f"{y}-{i}"
                args = ["run", *CNN, "--np", str(np), "--backend", "horovod", "--duration", str(seconds)]
                hpcdl(*args, "-o", str(out), OMP_NUM_THREADS="1", OMPI_MCA_mpi_yield_when_idle=y)
                (rec,) = [json.loads(f.read_text()) for f in out.glob("*.json") if "suite" not in f.name]
                rows.append([f"yield_when_idle={y}", str(i + 1), f"{rec['metrics']['samples_per_s']:.1f}"])
    return rows


def flag_row(np: int) -> list[str]:
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none", sys.executable, "-c", FLAG]
    p = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env(), check=True)
    median, p90 = (float(x) for x in p.stdout.split())
    return [f"{np} ranks", f"{median * 1e6:.1f}", f"{p90 * 1e6:.1f}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--duration", type=int, default=10)
    a = p.parse_args()
    print(
        table(
            ["1. backend", "buffer", "busbw", "mpi4py busbw", "ratio", "target", "#wrong"],
            allreduce_rows(a.np, a.reps),
        )
    )
    print()
    print(
        table(
            ["2. weak scaling", "X(1) samples/s", f"X({a.np}) samples/s", f"E({a.np})"],
            weak_rows(a.np, a.duration),
        )
    )
    print()
    print(table(["3. Horovod cnn, 1 core/rank", "run", f"X({a.np}) samples/s"], yield_rows(a.np, 6)))
    print()
    print(table(["4. stop agreement", "median us", "p90 us"], [flag_row(a.np)]))


if __name__ == "__main__":
    main()
