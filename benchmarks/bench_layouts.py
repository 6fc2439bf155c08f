"""On-demand benchmark of the scaling model's tensor- and pipeline-parallel terms (issue 22,
part 4) on the emulated cluster: predicted against measured step time of tp=2 x dp=2,
pp=2 x dp=2 and tp=2 x pp=2 at 4 ranks, 2 hosts x 2 ranks (tensor parallelism inside a host, as
the layout places it; the pipeline's stages on the two hosts). Target: within 15 % (the first
two: issue 22).

The model's side is hpcdl/scaling/modelparallel.py; its inputs are
those of benchmarks/bench_emulated.py (the two sweeps inside one host and across two, gamma
from concurrent runs taken from their phases, interleaved rounds, medians): for the pipeline,
1-rank runs of the whole model; for tensor parallelism, runs of one tp group on one host (what a
tp rank computes is measured: on this CPU DTensor's shards are not tp times faster).

    .venv/bin/python benchmarks/bench_layouts.py [--rate 200mbit] [--duration 8] [--reps 3] [-o DIR]

Must run as root (it starts the emulated cluster if none runs, and stops it again).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench_dist import hpcdl  # the CLI in a subprocess, exiting on failure
from bench_emulated import ALGORITHMS, cluster, levels, measured_parts, on_layout
from bench_parallel import gamma_base, record

from hpcdl.records.loader import read_record
from hpcdl.results.text import table
from hpcdl.scaling.fitting import fitted_hierarchy, model_from_records
from hpcdl.scaling.model import relative_error
from hpcdl.scaling.modelparallel import parse_layout

HOSTS, PPN = 2, 2
TRANSFORMER = ["--workload", "attention", "layers=4", "width=256", "heads=4", "seq_len=64", "batch_size=8"]
"""a dense transformer whose blocks tensor parallelism shards (heads and width divisible by 2)
and the pipeline splits (4 blocks, 2 a stage)"""
SIZES = ",".join(str(4096 << (2 * k)) for k in range(7)) + f",{8 << 20}"  # 4 KiB .. 16 MiB
"""the sweeps' message sizes: they span the step's, up to tensor parallelism's data-parallel
allreduce of 6.6 MB (a fit below it takes a rate-limited link's burst for its bandwidth)"""
LAYOUTS = {
    "tp=2 x dp=2": "dp=2,tp=2",
    "pp=2 x dp=2": "dp=2,pp=2,microbatches=4,schedule=1f1b",
    "tp=2 x pp=2": "tp=2,pp=2,microbatches=4,schedule=1f1b",
}


def one_round(out: Path, i: int, duration: str) -> dict[str, tuple[float, float, float]]:
    """(measured step, predicted step, predicted bubble) seconds of each layout, round ``i``."""
    found = {}
    for name, layout in LAYOUTS.items():
        here = out / name.replace(" ", "") / f"round-{i}"
        tp = parse_layout(layout).tp
        if tp > 1:  # runs of one tp group: what a tp rank computes, measured (model_from_records)
            group = [*TRANSFORMER, "--np", str(tp), "--backend", "torch", "--layout", f"tp={tp}"]
            base = gamma_base(here, group, HOSTS * PPN // tp, duration)
        else:
            base = gamma_base(here, [*TRANSFORMER, "--backend", "torch"], HOSTS * PPN, duration)
        hpcdl("run", *TRANSFORMER, "--np", str(HOSTS * PPN), "--backend", "torch", "--layout", layout,
              "--duration", duration, "-o", str(here / "run"), **on_layout(HOSTS, PPN))  # fmt: skip
        got = measured_parts(record(here / "run"))["step_s"]
        intra, inter = levels(out, "torch", SIZES)
        costs = fitted_hierarchy(intra, inter, PPN, ALGORITHMS["torch"])
        model = model_from_records(
            read_record(base).result, costs, backend="torch", layout=parse_layout(layout), gamma_from="phases"
        )
        point = model.point(HOSTS * PPN)
        found[name] = (got, point.step_s, point.bubble_s or 0.0)
        print(f"round {i} {name}: measured {got * 1e3:.1f} ms, predicted {point.step_s * 1e3:.1f} ms",
              file=sys.stderr, flush=True)  # fmt: skip
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="200mbit", help="each host's link, in tc's units (default 200mbit)")
    ap.add_argument("--duration", default="8", help="timed seconds of every run (default 8)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("-o", "--output", help="keep the records here (default: a temporary dir)")
    args = ap.parse_args()
    out = Path(args.output or tempfile.mkdtemp(prefix="hpcdl-layouts-"))
    was_running = cluster("status").returncode == 0
    if cluster("start", "4", args.rate).returncode != 0:
        sys.exit("the emulated cluster did not start")
    try:
        rounds = [one_round(out, i, args.duration) for i in range(args.reps)]
    finally:
        if not was_running:
            cluster("stop")
    rows = []
    for name in LAYOUTS:
        got = statistics.median(r[name][0] for r in rounds)
        want = statistics.median(r[name][1] for r in rounds)
        bubble = statistics.median(r[name][2] for r in rounds)
        error = relative_error(want, got)
        rows.append([name, f"{got * 1e3:.1f}", f"{want * 1e3:.1f}", f"{bubble * 1e3:.1f}", f"{error:+.1%}",
                     "yes" if abs(error) <= 0.15 else "NO"])  # fmt: skip
    load = os.getloadavg()[0]
    print(f"{HOSTS} hosts x {PPN} ranks, links at {args.rate}, load {load:.1f}; medians of {args.reps}")
    print(table(["layout", "step ms", "predicted ms", "predicted bubble ms", "error", "within 15%"], rows))
    print(f"records in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
