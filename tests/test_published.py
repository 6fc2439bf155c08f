"""The scaling model held against published scaling results (``hpcdl/scaling/published.py``;
analytic, nothing runs).

Two kinds of check, named for what they are:
- a claim about the model: every published case predicted within ``MODEL_ACCURACY``, a bound
  chosen before the results and the same for every case (what docs/validation/
  2026-11-25-published-results.md states the model is good for);
- a regression pin: today's predictions, recorded in ``PINNED``; a change to the model that
  moves them fails until the pin is updated on purpose (with a new validation entry)."""

from __future__ import annotations

import pytest

from hpcdl.scaling.published import CASES, predicted_efficiency

MODEL_ACCURACY = 0.10
"""|predicted - published| / published for any case: the model leaves out stragglers, data
loading and framework overheads, which published runs lose a few percent to"""

PINNED = {  # predicted efficiency of each case on the model as of 2026-11-25
    "Horovod Inception V3, 512 GPUs": 0.916,
    "Horovod ResNet-101, 512 GPUs": 0.908,
    "Horovod VGG-16, 512 GPUs": 0.681,
    "Goyal et al. ResNet-50, 8 -> 256 P100": 0.962,
}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_published_case_is_within_the_models_stated_accuracy(case) -> None:  # type: ignore[no-untyped-def]
    predicted = predicted_efficiency(case)
    assert abs(predicted - case.published) / case.published <= MODEL_ACCURACY, (predicted, case.published)
    none, full = predicted_efficiency(case, "none"), predicted_efficiency(case, "full")
    assert none <= predicted <= full  # the bucketed model lies between its bounds


def test_regression_pin_of_the_predictions() -> None:
    assert {c.name for c in CASES} == set(PINNED)
    got = {c.name: round(predicted_efficiency(c), 3) for c in CASES}
    assert got == PINNED


def test_the_case_that_is_communication_bound_is_the_one_that_loses_most() -> None:
    by_name = {c.name: predicted_efficiency(c) for c in CASES}
    assert by_name["Horovod VGG-16, 512 GPUs"] < min(v for k, v in by_name.items() if "VGG" not in k)
