"""On-demand benchmark of hpcdl's distributed path (not part of the test suite).

Prints, measured side by side in one run on this machine:
  1. allreduce bus bandwidth of the Horovod and torch.distributed backends against a bare
     mpi4py Allreduce of the same buffers (target: >= 0.9 of raw MPI for large buffers);
  2. weak-scaling efficiency E(2) = X(2) / (2 X(1)) of a workload at 1 and 2 ranks.

    .venv/bin/python benchmarks/bench_dist.py [--np 2] [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from hpcdl.dist.launch import mpi_env
from hpcdl.report_text import si, table

LARGE = [16 << 20, 64 << 20]
WORKLOAD = ["--workload", "mlp", "layers=4", "width=1024", "input_size=1024", "batch_size=64"]


def hpcdl(*args: str) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, "-m", "hpcdl", *args], capture_output=True, text=True, env=mpi_env())
    if p.returncode != 0:
        sys.exit(f"hpcdl {' '.join(args)} failed:\n{p.stderr[-2000:]}")
    return p


def allreduce_rows(np: int, reps: int) -> list[list[str]]:
    rows = []
    for backend in ("horovod", "torch"):
        sizes = ",".join(str(s) for s in LARGE)
        out = json.loads(
            hpcdl(
                "comm", "--np", str(np), "--backend", backend, "--sizes", sizes, "--reps", str(reps), "--json"
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


if __name__ == "__main__":
    main()
