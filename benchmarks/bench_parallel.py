"""On-demand benchmark of hpcdl's sharded (FSDP) and mixture-of-experts paths (not part of the
test suite).

Prints, measured on this machine with the runs of each comparison alternated:
  1. per-rank peak memory of FSDP against DDP at 2 ranks on a model whose weights and AdamW
     state dominate memory (target: FSDP <= 0.6 x DDP);
  2. all-gather and reduce-scatter bus bandwidth through torch.distributed (gloo, FSDP's path
     on CPUs) and Horovod (MPI) against raw mpi4py on the same buffers (target >= 0.9), with
     Open MPI on shared memory (its default) and on TCP (gloo's transport);
  3. the scaling model's error at 2 and 4 ranks for an FSDP workload and a mixture-of-experts
     workload (target: within 15 %).

For 3, every rank has one thread, and gamma at p ranks is calibrated with the resources a rank
has at p ranks: p 1-rank runs of the same backend at once (the median one is the base). The
model assumes a rank's resources do not change as ranks are added; on a machine with fewer
cores than ranks they do (4 ranks on 2 cores get half a core each), so one calibration cannot
describe both counts. Alpha and beta of every collective come from an ``hpcdl comm`` sweep at
p ranks. Each point is calibrated, measured and predicted --reps times, the points' rounds
interleaved; the error is given as its median and range.

    .venv/bin/python benchmarks/bench_parallel.py [--reps 3] [--duration 10] [-o DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_dist import hpcdl  # the CLI in a subprocess, exiting on failure

from hpcdl.parallel.launch import mpi_env
from hpcdl.results.text import si, table

BIG = ["--workload", "mlp", "layers=8", "width=4096", "input_size=4096", "output_size=10", "batch_size=2"]
"""134 M parameters, batch 2: weights, gradients and AdamW state are ~all of a rank's memory"""
LARGE = [16 << 20, 64 << 20]
PREDICTED = {
    "fsdp mlp": ("fsdp", ["--workload", "mlp", "layers=4", "width=1024", "input_size=1024", "batch_size=64"]),
    "moe attention": (
        "torch",
        [
            "--workload",
            "attention",
            "layers=2",
            "width=256",
            "heads=4",
            "seq_len=64",
            "experts=4",
            "batch_size=8",
        ],  # fmt: skip
    ),
}
COMM_SIZES = ",".join(str(4096 << (2 * k)) for k in range(7))  # 4 KiB .. 16 MiB


def record(out: Path) -> dict[str, Any]:
    (path,) = [p for p in out.glob("*.json") if "suite" not in p.name]
    return dict(json.loads(path.read_text()))


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """median (min-max)"""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def memory_rows(out: Path, reps: int) -> list[list[str]]:
    peaks: dict[str, list[float]] = {"torch": [], "fsdp": []}
    for i in range(reps):
        for backend in peaks:  # alternated: load from the machine's other users hits both alike
            d = out / f"memory-{backend}-{i}"
            hpcdl("run", *BIG, "--np", "2", "--backend", backend, "--steps", "3", "--warmup", "2",
                  "--data", "random", "--min-duration", "0", "-o", str(d))  # fmt: skip
            peaks[backend].append(max(r["peak_memory_bytes"] for r in record(d)["metrics"]["per_rank"]))
    ratios = [f / t for f, t in zip(peaks["fsdp"], peaks["torch"], strict=True)]
    return [
        ["DDP (torch)", spread([p / 2**30 for p in peaks["torch"]]), ""],
        ["FSDP", spread([p / 2**30 for p in peaks["fsdp"]]), spread(ratios)],
        ["target", "", "<= 0.60"],
    ]


TRANSPORTS = {"shared memory": {}, "TCP": {"OMPI_MCA_btl": "self,tcp"}}
"""Open MPI's transport between ranks of one host: its default (shared memory), or TCP over
loopback, as gloo always uses: with both sides on TCP, the ratio is the library's own cost"""


def bandwidth_rows(reps: int) -> list[list[str]]:
    ratios: dict[tuple[str, str, str, int], list[float]] = {}
    sizes = ",".join(map(str, LARGE))
    for _ in range(reps):
        for transport, env in TRANSPORTS.items():
            for backend in ("torch", "horovod"):
                pair = "all_gather,reduce_scatter"
                shown = hpcdl("comm", "--np", "2", "--backend", backend, "--collective", pair,
                              "--sizes", sizes, "--reps", "10", "--json", **env)  # fmt: skip
                for r in json.loads(shown.stdout)["rows"]:
                    assert r["wrong"] == 0, r
                    key = (backend, transport, r["collective"], r["bytes"])
                    ratios.setdefault(key, []).append(r["backend_busbw"] / r["mpi_busbw"])
    return [[b, t, c, si(n, "B"), spread(v), ">= 0.9"] for (b, t, c, n), v in sorted(ratios.items())]


def gamma_base(out: Path, args: list[str], ranks: int, duration: str) -> Path:
    """``ranks`` runs of ``args`` at once, one thread a rank (1-rank runs unless ``args`` say
    ``--np``): the median one's record (gamma as a rank has it when that many share this
    machine)."""
    env = {**mpi_env(), "OMP_NUM_THREADS": "1"}
    dirs = [out / f"gamma-{i}" for i in range(ranks)]
    procs = [
        subprocess.Popen([sys.executable, "-m", "hpcdl", "run", *args, "--duration", duration, "-o", str(d)],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for d in dirs
    ]  # fmt: skip
    for p in procs:
        if p.wait() != 0:
            sys.exit(f"gamma calibration failed:\n{p.stderr.read() if p.stderr else ''}")
    by_rate = sorted(dirs, key=lambda d: record(d)["metrics"]["ai_ops_per_s"])
    return next(by_rate[len(by_rate) // 2].glob("*.json"))


def prediction_rows(out: Path, duration: str, reps: int) -> list[list[str]]:
    """Per workload and rank count, ``reps`` rounds of: gamma calibrated, the run measured,
    the prediction's error; the rounds of all points interleaved."""
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for ranks in (2, 4):
        comm = out / f"comm-np{ranks}.json"
        if not comm.exists():
            hpcdl("comm", "--np", str(ranks), "--backend", "torch", "--sizes", COMM_SIZES, "--reps", "10",
                  "-o", str(comm), OMP_NUM_THREADS="1")  # fmt: skip
    for i in range(reps):
        for ranks in (2, 4):
            for name, (backend, args) in PREDICTED.items():
                here = out / name.replace(" ", "-") / f"np{ranks}-{i}"
                # gamma from 1-rank runs of the same backend: its own work per step (FSDP's
                # copies in and out of every all-gather and reduce-scatter) is not communication
                base = gamma_base(here, [*args, "--backend", backend], ranks, duration)
                hpcdl("run", *args, "--np", str(ranks), "--backend", backend, "--duration", duration,
                      "-o", str(here / "run"), OMP_NUM_THREADS="1")  # fmt: skip
                shown = hpcdl("predict", "--base", str(base), "--comm", str(out / f"comm-np{ranks}.json"),
                              "--backend", backend, "--nodes", str(ranks), "--compare", str(here / "run"),
                              "--json")  # fmt: skip
                (p,) = json.loads(shown.stdout)["points"]
                found.setdefault((name, ranks), []).append(p)
    rows = []
    for (name, ranks), points in found.items():
        errors = [p["error"] for p in points]
        rows.append(
            [
                name,
                PREDICTED[name][0],
                str(ranks),
                spread([p["measured_samples_per_s"] for p in points], "{:.1f}"),
                spread([p["samples_per_s"] for p in points], "{:.1f}"),
                f"{statistics.median(p['compute_s'] for p in points) * 1e3:.1f}",
                f"{statistics.median(p['comm_s'] for p in points) * 1e3:.1f}",
                spread(errors, "{:+.1%}"),
                "yes" if abs(statistics.median(errors)) <= 0.15 else "NO",
            ]
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="alternated repetitions of each section (default 3)")
    ap.add_argument("--duration", default="15", help="timed seconds of each run of 3 (default 15)")
    ap.add_argument("--only", default="1,2,3", help="sections to run (default 1,2,3)")
    ap.add_argument("-o", "--output", help="keep the records here (default: a temporary directory)")
    args = ap.parse_args()
    out = Path(args.output or tempfile.mkdtemp(prefix="hpcdl-parallel-"))
    only = set(args.only.split(","))
    if "1" in only:
        print(table(["1. peak memory per rank, 2 ranks", "GiB: median (min-max)", "FSDP / DDP"],
                    memory_rows(out, args.reps)))  # fmt: skip
        print()
    if "2" in only:
        print(table(["2. backend", "MPI transport", "collective", "buffer", "busbw / mpi4py busbw", "target"],
                    bandwidth_rows(args.reps)))  # fmt: skip
        print()
    if "3" in only:
        head = ["3. workload", "backend", "ranks", "measured/s", "predicted/s", "compute ms", "comm ms",
                "error: median (min-max)", "within 15%"]  # fmt: skip
        print(table(head, prediction_rows(out, args.duration, args.reps)))
    print(f"records in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
