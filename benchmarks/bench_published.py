"""The scaling model held against published scaling results (analytic: nothing runs).

Prints published vs predicted efficiency of every case in ``hpcdl/scaling/published.py`` (the
published results and TensorFlow's tables), without and with the losses besides communication
(a straggler of ``GPU_STEP_CV`` and ``SYNC_CALLS`` synchronisations a step), and the error of
each; ``tests/test_published.py`` pins them (docs/validation/2026-11-25-published-results.md,
docs/validation/2026-12-02-prediction-losses.md).

    .venv/bin/python benchmarks/bench_published.py
"""

from __future__ import annotations

import sys

from hpcdl.scaling.published import CASES, GPU_STEP_CV, SYNC_CALLS, TABLES, predicted_efficiency


def main() -> int:
    every = (*CASES, *TABLES)
    width = max(len(c.name) for c in every)
    print(f"losses: step spread {GPU_STEP_CV:.2%} per rank, {SYNC_CALLS} synchronisation(s) per step")
    print(f"{'case':<{width}}  published  predicted   error  with losses   error  (overlap none .. full)")
    for case in every:
        plain, lossy = predicted_efficiency(case), predicted_efficiency(case, losses=True)
        low, high = predicted_efficiency(case, "none"), predicted_efficiency(case, "full")
        e_plain, e_lossy = error(plain, case.published), error(lossy, case.published)
        shown = f"{case.name:<{width}}  {case.published:>9.1%}  {plain:>9.1%}  {e_plain:+6.1%}"
        print(f"{shown}  {lossy:>11.1%}  {e_lossy:+6.1%}  ({low:.1%} .. {high:.1%})")
    print()
    for case in every:
        print(f"- {case.name}: {case.source}; one device: {case.rate_source}. {case.explained}")
    return 0


def error(predicted: float, published: float) -> float:
    return (predicted - published) / published


if __name__ == "__main__":
    sys.exit(main())
