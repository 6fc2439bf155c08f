"""The validation set (``hpcdl/scaling/validation.py``): every published point predicted with
the calibration's fits, then the median and worst error by regime and split, the bands and how
many judged points they cover (analytic, nothing runs; about 4 s: the Megatron-LM fit's grid).

    .venv/bin/python benchmarks/bench_validation.py
"""

from __future__ import annotations

import sys

from hpcdl.scaling import validation as v


def main() -> int:
    points = v.judged()
    print("fits:", {k: tuple(round(x, 4) if x < 1e6 else x for x in f) for k, f in v.fits().items()})
    print(f"{'point':<46} {'split':<9} {'regime':<18} {'published':>9} {'predicted':>9} {'error':>7}")
    for j in points:
        p = j.point
        shown = f"{p.name:<46} {p.split:<9} {p.regime:<18}"
        print(f"{shown} {p.published:>9.3f} {j.predicted:>9.3f} {j.error:>+7.1%}")
    bands = v.bands(points)
    print(f"\n{'split':<9} {'regime':<18} {'n':>3} {'median |error|':>14} {'worst':>7} {'band':>6}")
    for s in v.summaries(points):
        shown = f"{s.split:<9} {s.regime:<18} {s.count:>3}"
        print(f"{shown} {s.median:>14.1%} {s.worst:>+7.1%} {bands[s.regime]:>6.1%}")
    judged = [j for j in points if j.point.split == v.JUDGE]
    covered = sum(abs(j.error) <= bands[j.point.regime] for j in judged)
    print(f"\nband covers {covered} of {len(judged)} judged points")
    print(f"largest validated ranks: {v.largest_ranks(points)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
