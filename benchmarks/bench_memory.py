"""On-demand benchmark: the memory estimate behind --fit (``metrics.memory_estimate``) against
the memory a real training step takes, over sampled specs of every family, each measured in a
fresh process (the rise of the peak resident set; ``crosscheck.training_step_bytes``).

Prints, per family, the ratio measured / estimate (min, median, max) over the specs whose
estimate exceeds 30 MB (below that the allocator's granularity dominates), for METRICS.md.

    .venv/bin/python benchmarks/bench_memory.py [--seeds 6] [--batch 32]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from hpcdl import metrics
from hpcdl.results.text import si, table
from hpcdl.workloads.registry import FAMILIES
from hpcdl.workloads.sampling import sample_spec

MIN_BYTES = 30 << 20

MEASURE = """
import sys, torch
torch.set_num_threads(1)
from hpcdl.workloads.sampling import sample_spec
from hpcdl.workloads.crosscheck import training_step_bytes
print(training_step_bytes(sample_spec(sys.argv[1], int(sys.argv[2]), batch_size=int(sys.argv[3]))))
"""


def ratios(family: str, seeds: int, batch: int) -> list[float]:
    out = []
    for seed in range(seeds * 3):  # draw until enough specs are large enough to measure
        spec = sample_spec(family, seed, batch_size=batch)
        estimate = metrics.memory_estimate(spec.count().params, spec.memory_per_sample(), batch, "adamw")
        if estimate < MIN_BYTES or estimate > 4 << 30:
            continue
        args = [sys.executable, "-c", MEASURE, family, str(seed), str(batch)]
        measured = int(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
        out.append(measured / estimate)
        if len(out) == seeds:
            break
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=6)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    rows = []
    for family in FAMILIES:
        r = ratios(family, a.seeds, a.batch)
        if r:
            rows.append(
                [family, str(len(r)), f"{min(r):.2f}", f"{statistics.median(r):.2f}", f"{max(r):.2f}"]
            )
    print(
        f"measured / estimated memory of a training step, batch {a.batch}, estimates >= {si(MIN_BYTES, 'B')}"
    )
    print(table(["family", "specs", "min", "median", "max"], rows))


if __name__ == "__main__":
    main()
