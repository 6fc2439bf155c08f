"""What a prediction loses besides communication (``Model.losses``): the slowest of N ranks from
a record's step spread, a per-step synchronisation, and a node's shared input pipeline; each its
own column of ``hpcdl predict``. Analytic: nothing runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl, one_line

from hpcdl import metrics
from hpcdl.parallel.backends import Traffic
from hpcdl.records.loader import read_record
from hpcdl.records.views import Io, IoFigures
from hpcdl.scaling.fitting import model_from_records
from hpcdl.scaling.model import SYNC_BYTES, Comm, Model

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "reference_results" / "cpu-epyc-2core-2026-11-23" / "scaling" / "mlp-torch-weak-np1.json"
RING = Comm(alpha_s=5e-6, beta_bytes_per_s=10e9)


def model(**kw: object) -> Model:
    args: dict = {
        "train_flops_per_sample": 1e9,
        "batch": 32,
        "gamma_flops_per_s": 1e11,  # 0.32 s a step
        "comms": {"allreduce": RING},
        "traffic": (Traffic("allreduce", int(50e6), 2),),
    }
    return Model(**{**args, **kw})


def test_the_expected_slowest_of_n_normal_draws() -> None:
    assert metrics.expected_max_normal(1) == 0.0
    assert metrics.expected_max_normal(2) == pytest.approx(0.564, abs=0.01)  # exact: 1/sqrt(pi)
    assert metrics.expected_max_normal(8) == pytest.approx(1.42, abs=0.01)
    assert metrics.expected_max_normal(512) == pytest.approx(3.04, abs=0.03)
    zs = [metrics.expected_max_normal(n) for n in (2, 4, 16, 256, 4096)]
    assert zs == sorted(zs)


def test_a_steps_spread_from_its_percentiles() -> None:
    assert metrics.step_cv(0.9, 1.1, 1.0) == pytest.approx(0.2 / 2.5631)
    assert metrics.step_cv(1.0, 1.0, 1.0) == 0.0 and metrics.step_cv(float("nan"), 1.0, 1.0) == 0.0


def test_each_loss_is_its_own_figure_and_adds_to_the_step() -> None:
    plain = model()
    lossy = model(step_cv=0.02, sync_calls=3)
    for p in (2, 8, 64):
        a, b = plain.point(p), lossy.point(p)
        assert a.straggler_s == a.sync_s == a.data_s == 0.0
        assert b.straggler_s == pytest.approx(metrics.expected_max_normal(p) * 0.02 * lossy.compute_s(p))
        assert b.sync_s == pytest.approx(3 * RING.time(SYNC_BYTES, p, 1))
        assert b.step_s == pytest.approx(a.step_s + b.straggler_s + b.sync_s)
        assert b.efficiency < a.efficiency
    assert lossy.point(1).step_s == plain.point(1).step_s  # one rank waits for nobody


def test_a_node_input_pipeline_shared_by_its_ranks() -> None:
    """8 ranks a node each need 32 samples a step: at 500 samples/s a node loads for 0.512 s,
    longer than the 0.32 s step (and than one rank's own 0.064 s, which γ already holds)."""
    m = model(data_rate=500.0, ranks_per_node=8)
    straggler, sync, data = m.losses(8, 0.32)
    assert straggler == sync == 0.0 and data == pytest.approx(8 * 32 / 500 - 0.32)
    assert m.losses(8, 0.6)[2] == 0.0  # a step longer than the loading hides it
    assert model(data_rate=1e9, ranks_per_node=8).losses(8, 0.32)[2] == 0.0


def test_a_record_calibrates_the_straggler_and_its_hdf5_read_rate() -> None:
    base = read_record(BASE).result
    steps = base.metrics.step_time_s
    m = model_from_records(base, RING, backend="torch")
    assert m.step_cv == pytest.approx(metrics.step_cv(steps.p10, steps.p90, steps.median)) and m.step_cv > 0
    assert m.data_rate == 0.0  # its data lived in memory: no read rate
    read = IoFigures(samples=1234, bytes=1234 * 4096, seconds=1.0, samples_per_s=1234.0, bytes_per_s=5e6)
    hdf5 = replace(base, metrics=replace(base.metrics, io=Io(read=read)))
    assert model_from_records(hdf5, RING, backend="torch").data_rate == 1234.0


def test_predict_shows_each_loss_as_its_own_column() -> None:
    p = hpcdl(
        "predict", "--base", str(BASE), "--alpha", "2e-5", "--beta", "1e9", "--nodes", "1,4", "--sync", "2"
    )
    assert p.returncode == 0, p.stderr
    head = next(line for line in p.stdout.splitlines() if line.startswith("nodes"))
    assert "straggler ms" in head and "sync ms" in head and "data ms" in head
    given = ["predict", "--base", str(BASE), "--alpha", "2e-5", "--beta", "1e9", "--json"]
    one, four = json.loads(hpcdl(*given, "--nodes", "1,4", "--sync", "2").stdout)["points"]
    assert one["straggler_s"] == one["sync_s"] == 0.0
    ring = Comm(alpha_s=2e-5, beta_bytes_per_s=1e9)
    assert four["straggler_s"] > 0 and four["sync_s"] == pytest.approx(2 * ring.time(SYNC_BYTES, 4, 1))
    given = json.loads(hpcdl(*given, "--nodes", "4", "--step-cv", "0").stdout)
    assert given["points"][0]["straggler_s"] == 0.0  # the option over the record's


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("--step-cv", "-0.1", "[0, 1)"),
        ("--step-cv", "1", "[0, 1)"),
        ("--step-cv", "nan", "[0, 1)"),
        ("--sync", "-1", "0..1048576"),
        ("--data-rate", "0", "> 0"),
        ("--data-rate", "inf", "> 0"),
    ],
)
def test_bad_losses_are_one_line(option: str, value: str, allowed: str) -> None:
    argv = ["predict", "--workload", "mlp", "--gamma", "1e12", "--beta", "1e9", f"{option}={value}"]
    line = one_line(hpcdl(*argv))
    assert option.lstrip("-").replace("-", "_") in line and allowed in line, line
