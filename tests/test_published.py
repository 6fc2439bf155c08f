"""The scaling model held against published scaling results (benchmarks/bench_published.py):
analytic, nothing runs. Each case stays within the error that
docs/validation/2026-11-25-published-results.md documents for it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_published.py"

ERRORS = {  # the documented bound on (predicted - published) / published of each case
    "Horovod Inception V3, 512 GPUs": 0.03,
    "Horovod ResNet-101, 512 GPUs": 0.03,
    "Horovod VGG-16, 512 GPUs": 0.03,
    "Goyal et al. ResNet-50, 8 -> 256 P100": 0.08,
}


def bench() -> object:
    spec = importlib.util.spec_from_file_location("bench_published", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_published"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_published_case_is_within_its_documented_error() -> None:
    b = bench()
    cases = b.CASES  # type: ignore[attr-defined]
    assert {c.name for c in cases} == set(ERRORS)
    for case in cases:
        predicted = b.predicted_efficiency(case)  # type: ignore[attr-defined]
        error = (predicted - case.published) / case.published
        assert abs(error) <= ERRORS[case.name], (case.name, predicted, case.published)
        none = b.predicted_efficiency(case, "none")  # type: ignore[attr-defined]
        full = b.predicted_efficiency(case, "full")  # type: ignore[attr-defined]
        assert none <= predicted <= full  # the bucketed model lies between its bounds


def test_the_case_that_is_communication_bound_is_the_one_that_loses_most() -> None:
    b = bench()
    by_name = {c.name: b.predicted_efficiency(c) for c in b.CASES}  # type: ignore[attr-defined]
    assert by_name["Horovod VGG-16, 512 GPUs"] < min(v for k, v in by_name.items() if "VGG" not in k)
