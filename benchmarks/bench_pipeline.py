"""On-demand benchmark of hpcdl's pipeline parallelism (not part of the test suite).

Prints, for one attention workload on 2 ranks (``--layout pp=2``), each schedule and number of
micro-batches against the theoretical bubble ``(p - 1) / (v m + p - 1)``: the bubble measured
(each rank's idle share of the schedule, ``metrics.pipeline_bubble``, averaged over the ranks),
the busy and span seconds of the busier rank, the point-to-point bytes of a step and the
samples/s. The runs alternate over --reps rounds; each cell is the median over the rounds.

The measured bubble exceeds the theoretical one by what the theory leaves out: the stages'
imbalance (the first holds the embeddings, the last the head and the loss), the
point-to-point time and the schedule's own work between actions. It approaches the theory as
each action's computation grows against those (wider models, larger micro-batches).

    .venv/bin/python benchmarks/bench_pipeline.py [--reps 1] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench_dist import hpcdl  # the CLI in a subprocess, exiting on failure

from hpcdl import metrics
from hpcdl.results.text import si, table

WORKLOAD = ["--workload", "attention", "layers=4", "width=256", "heads=4", "seq_len=128", "vocab=1000"]
BATCH = 16
POINTS = [("gpipe", 2), ("gpipe", 4), ("gpipe", 8), ("1f1b", 4), ("interleaved", 4)]


def run(out: Path, steps: int, layout: str) -> dict[str, Any]:
    args = [*WORKLOAD, f"batch_size={BATCH}", "--steps", str(steps), "--min-duration", "0", "-o", str(out)]
    hpcdl("run", *args, "--np", "2", "--layout", layout)
    (path,) = out.glob("*.json")
    record: dict[str, Any] = json.loads(path.read_text())
    path.unlink()
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    cells: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.reps):
            for schedule, m in POINTS:
                key = f"{schedule} m={m}"
                cells.setdefault(key, []).append(
                    run(Path(tmp), args.steps, f"pp=2,schedule={schedule},microbatches={m}")
                )
    rows = []
    for key, records in cells.items():
        rate = statistics.median(r["metrics"]["samples_per_s"] for r in records)
        pipes = [r["metrics"]["pipeline"] for r in records]
        slow = [max(p["per_rank"], key=lambda x: x["busy_s"]) for p in pipes]
        rows.append(
            [
                key,
                f"{pipes[0]['bubble_theoretical']:.3f}",
                f"{statistics.median(p['bubble_measured'] for p in pipes):.3f}",
                f"{statistics.median(s['busy_s'] for s in slow) * 1e3:.1f}",
                f"{statistics.median(s['span_s'] for s in slow) * 1e3:.1f}",
                si(pipes[0]["p2p_bytes_per_step"], "B"),
                f"{rate:.1f}",
            ]
        )
    head = ["run", "bubble theory", "measured", "busy ms", "span ms", "p2p/step", "samples/s"]
    print(f"attention {' '.join(WORKLOAD[2:])} batch_size={BATCH}, 2 ranks, {args.reps} round(s)")
    print(table(head, rows))
    print(f"theory: (p - 1) / (v m + p - 1), e.g. {metrics.theoretical_bubble(2, 4):.3f} at p=2, m=4")


if __name__ == "__main__":
    main()
