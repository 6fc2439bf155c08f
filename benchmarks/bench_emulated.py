"""On-demand benchmark of the scaling model on the emulated cluster (not part of the test suite):
predicted against measured step time, with its compute and communication shares, when the
ranks of a run sit on different hosts joined by rate-limited links.

The cluster (scripts/cluster/cluster.sh) is 4 hosts as network namespaces on this machine, each
on a link of --rate (default 200 Mbit/s, where the workloads below spend most of a step
communicating). Two layouts of 4 ranks: 2 hosts x 2 ranks (shared memory inside a host, the
link between them) and 4 hosts x 1 rank (every byte on the links). Four workloads: an MLP under
DDP, Horovod and FSDP, and a mixture-of-experts transformer (experts across the ranks, DDP).

Per layout and workload: gamma from concurrent 1-rank runs (as many as the layout has ranks,
one thread each, on this machine: the resources a rank really has, as bench_parallel.py
calibrates), alpha and beta of every collective from an ``hpcdl comm`` sweep on the same
layout, then the measured run on the cluster. "compute" measured is the slowest rank's
computation alone (forward + backward without waiting for others), the rest of the step is
counted as communication and waiting.

    .venv/bin/python benchmarks/bench_emulated.py [--rate 200mbit] [--duration 8] [-o DIR]

Must run as root (it starts the emulated cluster if none runs, and stops it again).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_dist import hpcdl  # the CLI in a subprocess, exiting on failure
from bench_parallel import gamma_base, record

from hpcdl.records.loader import read_comm, read_record
from hpcdl.results.text import table
from hpcdl.scaling.fitting import model_from_records
from hpcdl.scaling.model import relative_error

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "scripts" / "cluster"
LAYOUTS = [(2, 2), (4, 1)]
"""(hosts, ranks per host): 4 ranks each"""
MLP = ["--workload", "mlp", "layers=2", "width=256", "input_size=256", "output_size=10", "batch_size=128"]
"""134 k parameters (0.5 MB of gradients a step) against ~100 MFLOP of computation a rank"""
MOE = ["--workload", "attention", "layers=2", "width=128", "heads=4", "seq_len=32", "experts=4",
       "batch_size=8"]  # fmt: skip
WORKLOADS = {
    "DDP mlp": ("torch", MLP),
    "Horovod mlp": ("horovod", MLP),
    "FSDP mlp": ("fsdp", MLP),
    "MoE attention": ("torch", MOE),
}
SWEEP_BACKEND = {"torch": "torch", "fsdp": "torch", "horovod": "horovod"}
"""whose collectives a backend's communication goes through (FSDP: torch.distributed's)"""
COMM_SIZES = ",".join(str(4096 << (2 * k)) for k in range(5))  # 4 KiB .. 1 MiB


def predict_step(base: Path, comm: Path, backend: str, hosts: int, ranks_per_host: int) -> dict[str, float]:
    """The scaling model's step at ``hosts`` x ``ranks_per_host`` ranks: ``step_s``, ``compute_s``
    and ``comm_s``. The one call into hpcdl.scaling: the flat model of hpcdl/scaling/model.py,
    calibrated on a 1-rank record and a collective sweep taken on the same layout (so the sweep,
    not the model, knows which messages cross a link)."""
    model = model_from_records(read_record(base).result, read_comm(comm), backend=backend)
    point = model.point(hosts * ranks_per_host)
    return {k: point[k] for k in ("step_s", "compute_s", "comm_s")}


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(CLUSTER / "cluster.sh"), *args], capture_output=True, text=True)


def on_layout(hosts: int, ppn: int) -> dict[str, str]:
    """The environment that places hpcdl's ranks on ``hosts`` emulated hosts, ``ppn`` each."""
    return {
        "HPCDL_MPIRUN": str(CLUSTER / "mpirun"),
        "HPCDL_CLUSTER_HOSTS": str(hosts),
        "HPCDL_CLUSTER_PPN": str(ppn),
        "OMP_NUM_THREADS": "1",
    }


def measured_parts(rec: dict[str, Any]) -> dict[str, float]:
    """Step seconds (the global batch over the aggregate samples/s), the slowest rank's
    computation alone, and the rest of the step."""
    m = rec["metrics"]
    step = rec["settings"]["global_batch"] / m["samples_per_s"]
    # FSDP's computation cannot be timed alone (it gathers parameters inside forward and
    # backward): there, forward + backward with their gathers
    alone = [r.get("compute_only_s") or r["compute_median_s"] for r in m["per_rank"]]
    optimizer = m["phases_s"].get("optimizer", {}).get("median") or 0.0
    compute = max(alone) + optimizer
    return {"step_s": step, "compute_s": compute, "comm_s": max(step - compute, 0.0)}


def kept_base(here: Path, ranks: int) -> Path | None:
    """The calibration of an interrupted run into the same -o, as gamma_base chooses it."""
    dirs = [here / f"gamma-{i}" for i in range(ranks)]
    if not all(list(d.glob("*.json")) for d in dirs):
        return None
    by_rate = sorted(dirs, key=lambda d: record(d)["metrics"]["ai_ops_per_s"])
    return next(by_rate[len(by_rate) // 2].glob("*.json"))


def rows_for(out: Path, hosts: int, ppn: int, duration: str) -> list[list[str]]:
    env = on_layout(hosts, ppn)
    ranks = hosts * ppn
    layout = f"{hosts} x {ppn}"
    comms = {}
    for sweep in sorted(set(SWEEP_BACKEND.values())):
        comms[sweep] = out / f"comm-{hosts}x{ppn}-{sweep}.json"
        if not comms[sweep].exists():  # kept from an interrupted run into the same -o
            hpcdl("comm", "--np", str(ranks), "--backend", sweep, "--sizes", COMM_SIZES, "--reps", "5",
                  "-o", str(comms[sweep]), **env)  # fmt: skip
    rows = []
    for name, (backend, args) in WORKLOADS.items():
        here = out / f"{hosts}x{ppn}" / name.replace(" ", "-")
        base = kept_base(here, ranks) or gamma_base(here, [*args, "--backend", backend], ranks, duration)
        if not list((here / "run").glob("*.json")):
            hpcdl("run", *args, "--np", str(ranks), "--backend", backend, "--duration", duration,
                  "-o", str(here / "run"), **env)  # fmt: skip
        rec = record(here / "run")
        got = measured_parts(rec)
        hosts_seen = sorted({r["host"] for r in rec["metrics"]["per_rank"]})
        assert len(hosts_seen) == hosts, f"{name}: ranks ran on {hosts_seen}, not {hosts} hosts"
        pred = predict_step(base, comms[SWEEP_BACKEND[backend]], backend, hosts, ppn)
        error = relative_error(pred["step_s"], got["step_s"])
        rows.append(
            [
                layout,
                name,
                f"{got['step_s'] * 1e3:.1f}",
                f"{got['compute_s'] * 1e3:.1f} ({got['compute_s'] / got['step_s']:.0%})",
                f"{got['comm_s'] * 1e3:.1f} ({got['comm_s'] / got['step_s']:.0%})",
                f"{pred['step_s'] * 1e3:.1f}",
                f"{pred['compute_s'] * 1e3:.1f} ({pred['compute_s'] / pred['step_s']:.0%})",
                f"{pred['comm_s'] * 1e3:.1f} ({pred['comm_s'] / pred['step_s']:.0%})",
                f"{error:+.1%}",
                "yes" if abs(error) <= 0.10 else "NO",
            ]
        )
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="200mbit", help="each host's link, in tc's units (default 200mbit)")
    ap.add_argument("--duration", default="8", help="timed seconds of every run (default 8)")
    ap.add_argument("--layouts", default="2x2,4x1", help="HOSTSxRANKS of 4 ranks each (default 2x2,4x1)")
    ap.add_argument("-o", "--output", help="keep the records here and reuse them (default: a temporary dir)")
    args = ap.parse_args()
    out = Path(args.output or tempfile.mkdtemp(prefix="hpcdl-emulated-"))
    layouts = [tuple(int(x) for x in lay.split("x")) for lay in args.layouts.split(",")]
    was_running = cluster("status").returncode == 0
    started = cluster("start", "4", args.rate)
    if started.returncode != 0:
        sys.exit(f"the emulated cluster did not start:\n{started.stderr}")
    try:
        rows = [row for hosts, ppn in layouts for row in rows_for(out, hosts, ppn, args.duration)]
    finally:
        if not was_running:
            cluster("stop")
    head = ["hosts x ranks", "workload", "step ms", "compute ms", "comm ms", "predicted step ms",
            "compute ms", "comm ms", "error", "within 10%"]  # fmt: skip
    print(f"measured on the emulated cluster, links at {args.rate}; predicted: hpcdl/scaling/model.py")
    print(table(head, rows))
    errors = [float(r[8].rstrip("%")) / 100 for r in rows]
    print(f"median |error| {statistics.median(abs(e) for e in errors):.1%}; records in {out}")
    print("compute measured: the slowest rank's forward + backward alone (timed before warm-up) and the")
    print("optimizer; predicted: training FLOPs over gamma of the concurrent 1-rank runs. Where these two")
    print("disagree, a step time within 10 % is two errors cancelling, not a model that holds.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
