"""On-demand benchmark of the analytical scaling model (not part of the test suite).

For each backend: measure an allreduce sweep (fits alpha, beta) and a weak-scaling sweep at
1..N ranks, calibrate gamma on the 1-rank point, predict the other points and print the
prediction error against the measurement (target: within 15 %), and the share of the
communication the model hides behind backward beside the share the run hid
(``1 − exposed_s / allreduce_s``, where the record timed both).

Every rank gets one core (OMP_NUM_THREADS=1): gamma, calibrated on one rank, then describes
the per-rank compute of the multi-rank points too. The model assumes a rank's resources do
not shrink as ranks are added (one rank per core, GPU or node), so this is the setting it
can be checked in on a 2-core machine.

    .venv/bin/python benchmarks/bench_predict.py [--np 1,2] [--duration 10] [-o DIR]

With -o DIR of an earlier run, points and allreduce sweeps already there are reused.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hpcdl.parallel.launch import mpi_env
from hpcdl.results.text import table

WORKLOADS = {
    "mlp": ["--workload", "mlp", "layers=4", "width=1024", "input_size=1024", "batch_size=64"],
    "cnn": [
        "--workload",
        "cnn",
        "image_size=32",
        "stages=3",
        "blocks=2",
        "base_width=32",
        "block=basic",
        "stem=simple",
        "classes=10",
        "batch_size=32",
    ],
}


def hpcdl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**mpi_env(), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "hpcdl", *args], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"hpcdl {' '.join(args)} failed:\n{p.stderr[-2000:]}")
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", default="1,2", help="rank counts (the first calibrates; default 1,2)")
    ap.add_argument("--duration", default="10", help="timed seconds per point (default 10)")
    ap.add_argument("--backends", default="horovod,torch")
    ap.add_argument("-o", "--output", help="keep the records here (default: a temporary directory)")
    args = ap.parse_args()
    nps = [int(x) for x in args.np.split(",")]
    out = Path(args.output or tempfile.mkdtemp(prefix="hpcdl-predict-"))
    rows = []
    for backend in args.backends.split(","):
        comm = out / f"comm-{backend}.json"
        if not comm.exists():  # like the sweeps' points: a rerun reuses what was measured
            shown = hpcdl(
                "comm",
                "--np",
                str(max(nps)),
                "--backend",
                backend,
                "--collective",
                "allreduce",
                "--reps",
                "20",
                "-o",
                str(comm),
            )
            comm.with_suffix(".txt").write_text(shown.stdout)
        for name, workload in WORKLOADS.items():
            prefix = f"{name}-{backend}"
            hpcdl(
                "sweep",
                *workload,
                "--np",
                args.np,
                "--mode",
                "weak",
                "--backend",
                backend,
                "--duration",
                args.duration,
                "--prefix",
                prefix,
                "-o",
                str(out),
            )
            base = out / f"{prefix}-weak-np{nps[0]}.json"
            pred = json.loads(
                hpcdl(
                    "predict",
                    "--base",
                    str(base),
                    "--comm",
                    str(comm),
                    "--nodes",
                    args.np,
                    "--compare",
                    str(out),
                    "--json",
                ).stdout
            )
            for p in pred["points"]:
                if p["np"] == nps[0] or "error" not in p:
                    continue
                rows.append(
                    [
                        backend,
                        name,
                        str(p["np"]),
                        f"{p['measured_samples_per_s']:.1f}",
                        f"{p['samples_per_s']:.1f}",
                        f"{p['compute_s'] * 1e3:.1f}",
                        f"{p['comm_s'] * 1e3:.1f}",
                        "-" if p["overlap"] is None else f"{p['overlap']:.0%}",
                        "-" if p.get("measured_overlap") is None else f"{p['measured_overlap']:.0%}",
                        f"{p['error']:+.1%}",
                        "yes" if abs(p["error"]) <= 0.15 else "NO",
                    ]
                )
    print(f"scaling model against measurement (OMP_NUM_THREADS=1 per rank; records in {out})")
    print(
        table(
            [
                "backend",
                "workload",
                "ranks",
                "measured/s",
                "predicted/s",
                "compute ms",
                "comm ms",
                "hidden",
                "measured hidden",
                "error",
                "within 15%",
            ],
            rows,
        )
    )
    return 0 if all(r[-1] == "yes" for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
