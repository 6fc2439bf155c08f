"""The scaling model held against published scaling results (``hpcdl/scaling/published.py``;
analytic, nothing runs).

Two kinds of check, named for what they are:
- a claim about the model: every published case predicted within ``MODEL_ACCURACY``, a bound
  chosen before the results and the same for every case (what docs/validation/
  2026-11-25-published-results.md states the model is good for);
- a regression pin: today's predictions, recorded in ``PINNED``; a change to the model that
  moves them fails until the pin is updated on purpose (with a new validation entry)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from hpcdl.metrics import step_cv
from hpcdl.records.loader import load_tree
from hpcdl.scaling.published import CASES, GPU_STEP_CV, TABLES, predicted_efficiency

REF = Path(__file__).resolve().parent.parent / "reference_results"

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


# --- the losses besides communication (issue 49), held against TensorFlow's tables too ------------

PINNED_LOSSES = {  # (without the losses, with them) of each case, the rule of published.model_of
    "Horovod Inception V3, 512 GPUs": (0.916, 0.900),
    "Horovod ResNet-101, 512 GPUs": (0.908, 0.893),
    "Horovod VGG-16, 512 GPUs": (0.681, 0.671),
    "Goyal et al. ResNet-50, 8 -> 256 P100": (0.962, 0.958),
    "TF DGX-1 Inception V3, 8 P100": (0.991, 0.987),
    "TF DGX-1 ResNet-50, 8 P100": (0.985, 0.981),
    "TF DGX-1 ResNet-152, 8 P100": (0.994, 0.990),
    "TF DGX-1 VGG16, 8 P100": (0.998, 0.994),
    "TF EC2 Inception V3, 8 x 8 K80": (0.981, 0.975),
    "TF EC2 ResNet-50, 8 x 8 K80": (0.965, 0.959),
    "TF EC2 ResNet-152, 8 x 8 K80": (0.975, 0.969),
}


def test_regression_pin_with_and_without_the_losses() -> None:
    every = (*CASES, *TABLES)
    assert {c.name for c in every} == set(PINNED_LOSSES)
    got = {
        c.name: (round(predicted_efficiency(c), 3), round(predicted_efficiency(c, losses=True), 3))
        for c in every
    }
    assert got == PINNED_LOSSES


@pytest.mark.parametrize("case", (*CASES, *TABLES), ids=lambda c: c.name)
def test_the_losses_only_lower_a_prediction(case) -> None:  # type: ignore[no-untyped-def]
    assert predicted_efficiency(case, losses=True) <= predicted_efficiency(case)


def test_the_gpu_step_spread_is_the_reference_records_median_not_a_fit() -> None:
    """GPU_STEP_CV is computed from hpcdl's own H200 records, never chosen to fit a table."""
    records = load_tree([REF / "h200-2026-11-27" / "suite-M-bf16"]).records
    spreads = [step_cv(s.p10, s.p90, s.median) for s in (r.result.metrics.step_time_s for r in records)]
    assert len(spreads) == 6
    assert GPU_STEP_CV == pytest.approx(statistics.median(spreads), rel=0.02)


def test_tensorflows_tables_are_read_as_published() -> None:
    """Efficiency = the rate at N GPUs over N times one GPU's, from the tables' own figures."""
    by_name = {c.name: c for c in TABLES}
    assert by_name["TF DGX-1 ResNet-50, 8 P100"].published == pytest.approx(1734 / (8 * 219))
    assert by_name["TF EC2 ResNet-152, 8 x 8 K80"].published == pytest.approx(981 / (64 * 19.4))
    assert all(c.per_device_base and c.images_per_s > 0 for c in TABLES)
