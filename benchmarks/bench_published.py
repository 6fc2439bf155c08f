"""The scaling model held against published scaling results (analytic: nothing runs).

Prints published vs predicted efficiency of every case in ``hpcdl/scaling/published.py`` and
the error of each; ``tests/test_published.py`` keeps every case within the error
docs/validation/2026-11-25-published-results.md documents.

    .venv/bin/python benchmarks/bench_published.py
"""

from __future__ import annotations

import sys

from hpcdl.scaling.published import CASES, predicted_efficiency


def main() -> int:
    rows = []
    for case in CASES:
        predicted = predicted_efficiency(case)
        error = (predicted - case.published) / case.published
        bounds = predicted_efficiency(case, "none"), predicted_efficiency(case, "full")
        rows.append((case, predicted, error, bounds))
    width = max(len(c.name) for c in CASES)
    print(f"{'case':<{width}}  published  predicted   error  (overlap none .. full)")
    for case, predicted, error, (low, high) in rows:
        print(
            f"{case.name:<{width}}  {case.published:>9.0%}  {predicted:>9.1%}  {error:+6.1%}"
            f"  ({low:.1%} .. {high:.1%})"
        )
    print()
    for case, *_ in rows:
        print(f"- {case.name}: {case.source}; one device: {case.rate_source}. {case.explained}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
