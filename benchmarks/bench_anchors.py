"""Class M measured beside what the best open implementations reach on the same models
(``generators/anchors.toml``, sources in docs/metrics.md "Anchors"): per workload, hpcdl's
samples/s and MFU in each execution mode found, the published figure, and their ratio.

    .venv/bin/python benchmarks/bench_anchors.py DIR [DIR ...]   # folders of class M records
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hpcdl.records.loader import load_tree
from hpcdl.results.score import execution_mode, suite_workload
from hpcdl.results.text import si, table
from hpcdl.workloads import recipes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", type=Path)
    a = p.parse_args()
    best: dict[tuple[str, str], tuple[float, float, str]] = {}
    for r in (x.result for x in load_tree(a.folders).records):
        name = suite_workload(r.spec, "M")
        if name is None:
            continue
        key = (name, execution_mode(r))
        if key not in best or r.metrics.samples_per_s > best[key][0]:
            best[key] = (r.metrics.samples_per_s, r.metrics.mfu, r.environment.device_name)
    rows = []
    for name in recipes.suite("M").workloads:
        anchor = recipes.anchors().get(name)
        for (w, mode), (rate, mfu, device) in sorted(best.items()):
            if w != name:
                continue
            if anchor is None:
                rows.append([name, mode, device, f"{rate:.1f}", f"{mfu:.1%}", "none published", ""])
            elif "samples_per_s" in anchor:
                published = f"{si(anchor['samples_per_s'])} samples/s ({anchor['device']})"
                rows.append([name, mode, device, f"{rate:.1f}", f"{mfu:.1%}", published,
                             f"{rate / anchor['samples_per_s']:.2f}"])  # fmt: skip
            else:
                published = f"MFU {anchor['mfu']:.0%} ({anchor['device']})"
                rows.append(
                    [name, mode, device, f"{rate:.1f}", f"{mfu:.1%}", published, f"{mfu / anchor['mfu']:.2f}"]
                )
    head = ["workload", "mode", "device", "samples/s", "MFU", "best open implementation", "hpcdl / it"]
    print(table(head, rows))
    for name, anchor in recipes.anchors().items():
        print(f"- {name}: {anchor['source']}; {anchor['note']}")


if __name__ == "__main__":
    main()
