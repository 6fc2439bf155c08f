"""The analytical scaling model: its formulas, the fit of a collective sweep, calibration from
real reference records, and ``hpcdl predict``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.errors import InputError
from hpcdl.parallel.backends import Traffic
from hpcdl.records.loader import CommRow, read_comm, read_record
from hpcdl.records.store import load_record
from hpcdl.scaling.model import Comm, Model, comm_from_record, fit_comm, model_from_records

REF = Path(__file__).resolve().parent.parent / "reference_results" / "cpu-epyc-2core-2026-11-22" / "scaling"


def model(messages: int = 1, **kw: object) -> Model:
    args: dict = {
        "train_flops_per_sample": 3e9,
        "batch": 32,
        "gamma_flops_per_s": 1e13,
        "comms": {"allreduce": Comm(alpha_s=5e-6, beta_bytes_per_s=20e9)},
        "traffic": (Traffic("allreduce", int(100e6), messages),),
    }
    return Model(**{**args, **kw})


@pytest.mark.parametrize("collective", ["allreduce", "all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("ranks", [2, 4, 16])
def test_fit_recovers_alpha_and_beta_of_a_ring(ranks: int, collective: str) -> None:
    truth = Comm(alpha_s=7e-6, beta_bytes_per_s=3e9, collective=collective)
    sizes = (1 << 10, 1 << 16, 1 << 20, 1 << 26)
    rows = [CommRow(bytes=s, backend_s=truth.time(s, ranks), collective=collective) for s in sizes]
    other = [CommRow(bytes=s, backend_s=1.0, collective="elsewhere") for s in sizes]  # never mixed in
    fitted = fit_comm(rows + other, ranks, collective)
    assert fitted.alpha_s == pytest.approx(truth.alpha_s, rel=1e-6)
    assert fitted.beta_bytes_per_s == pytest.approx(truth.beta_bytes_per_s, rel=1e-6)


def test_ring_costs_of_each_collective() -> None:
    """nccl-tests' bus factors: an allreduce crosses the ring twice, the others once."""
    a, b, n = 3e-6, 1e9, 8
    for collective, steps in [
        ("allreduce", 2 * 7),
        ("all_gather", 7),
        ("reduce_scatter", 7),
        ("all_to_all", 7),
    ]:
        comm = Comm(alpha_s=a, beta_bytes_per_s=b, collective=collective)
        assert comm.time(1e6, n, messages=3) == pytest.approx(3 * steps * a + steps / n * 1e6 / b)
        assert comm.time(1e6, 1) == 0.0


def test_weak_and_strong_scaling_formulas() -> None:
    m = model()
    one, four = m.point(1), m.point(4)
    assert one["comm_s"] == 0 and one["efficiency"] == 1.0
    compute = 3e9 * 32 / 1e13
    ring = 2 * 3 * 5e-6 + 2 * 3 / 4 * 100e6 / 20e9
    assert four["compute_s"] == pytest.approx(compute) and four["comm_s"] == pytest.approx(ring)
    assert four["samples_per_s"] == pytest.approx(4 * 32 / (compute + ring))
    assert four["efficiency"] == pytest.approx(compute / (compute + ring))
    strong = model(mode="strong").point(4)
    assert strong["compute_s"] == pytest.approx(compute / 4)
    assert model(overlap="full").point(4)["step_s"] == pytest.approx(max(compute, ring))
    many = model(messages=3).point(4)
    assert many["comm_s"] == pytest.approx(ring + 2 * 2 * 3 * 5e-6)


def test_bad_model_input_names_the_field() -> None:
    with pytest.raises(InputError, match="predict.mode"):
        model(mode="sideways")
    with pytest.raises(InputError, match="predict.gamma_flops_per_s"):
        model(gamma_flops_per_s=0.0)
    with pytest.raises(InputError, match="comm.ranks"):
        fit_comm([CommRow(bytes=1, backend_s=1.0)], 1)


def test_calibration_from_reference_records() -> None:
    base = read_record(REF / "mlp-horovod-weak-np1.json").result
    comm = comm_from_record(read_comm(REF / "comm-horovod.json"))
    m = model_from_records(base, comm)
    assert m.gamma_flops_per_s == base.metrics.ai_ops_per_s
    assert m.traffic == (Traffic("allreduce", 4 * base.counts.params, 1),)
    assert m.batch == base.settings.batch_per_rank
    assert comm.beta_bytes_per_s > 0 and comm.alpha_s >= 0
    with pytest.raises(InputError, match="predict.base"):
        model_from_records(read_record(REF / "mlp-horovod-weak-np2.json").result, comm)


def hpcdl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcdl", *args], capture_output=True, text=True, timeout=120)


def test_predict_cli_against_measured_points(tmp_path: Path) -> None:
    args = ["predict", "--base", str(REF / "mlp-torch-weak-np1.json"), "--comm", str(REF / "comm-torch.json")]
    p = hpcdl(*args, "--compare", str(REF))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("model: gamma") and any(line.startswith("4096 ") for line in lines)
    p = hpcdl(*args, "--compare", str(REF), "--nodes", "1,2", "--json", "-o", str(tmp_path / "p.json"))
    doc = json.loads(p.stdout)
    assert doc["schema"] == "hpcdl.prediction" and json.loads((tmp_path / "p.json").read_text()) == doc
    two = doc["points"][1]
    measured = load_record(REF / "mlp-torch-weak-np2.json")["metrics"]["samples_per_s"]
    assert two["measured_samples_per_s"] == measured
    assert two["error"] == pytest.approx((two["samples_per_s"] - measured) / measured)


@pytest.mark.parametrize(
    "bad",
    [
        ["--workload", "mlp", "--gamma", "1e12", "--beta", "1e9", "--nodes", "0"],
        ["--workload", "mlp", "--beta", "1e9"],
        ["--workload", "mlp", "--gamma", "1e12", "--beta", "1e9", "--alpha", "-1"],
        ["--workload", "mlp", "--gamma", "1e12", "--beta", "1e9", "--ranks-per-node", "0"],
        ["--workload", "mlp", "--gamma", "1e12", "--beta", "1e9", "--mode", "sideways"],
        ["--base", str(REF / "mlp-torch-weak-np1.json")],
        ["--base", str(REF / "missing.json"), "--beta", "1e9"],
        ["--base", str(REF / "mlp-torch-weak-np1.json"), "--comm", str(REF / "mlp-torch-weak-np1.json")],
    ],
)
def test_predict_bad_input_is_one_line_and_exit_2(bad: list[str]) -> None:
    p = hpcdl("predict", *bad)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr


def test_predict_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "base.json")  # opening it for reading would wait for a writer
    p = hpcdl("predict", "--base", str(tmp_path / "base.json"), "--beta", "1e9")
    assert p.returncode == 2 and "a FIFO, not a regular file" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_the_optimizer_updates_what_a_rank_holds() -> None:
    """γ's step holds the optimizer's; with sharding it updates 1/p of the parameters."""
    one = 3e9 * 32 / 1e13
    plain = model(optimizer_s=0.002)
    assert plain.point(4)["compute_s"] == pytest.approx(one)  # data parallelism: all of them
    sharded = model(optimizer_s=0.002, sharded_fraction=1.0)
    assert sharded.point(4)["compute_s"] == pytest.approx(one - 0.002 + 0.002 / 4)
    strong = model(optimizer_s=0.002, sharded_fraction=0.5, mode="strong")
    assert strong.point(4)["compute_s"] == pytest.approx((one - 0.002) / 4 + 0.002 * (0.5 + 0.5 / 4))
    with pytest.raises(InputError, match="predict.optimizer_s"):
        model(optimizer_s=one)


def test_sharded_fraction_of_each_scheme() -> None:
    from hpcdl.scaling.model import sharded_fraction
    from hpcdl.workloads.registry import spec_from_dict

    dense = spec_from_dict({"family": "attention", "layers": 2, "width": 32, "heads": 2})
    sparse = spec_from_dict({"family": "attention", "layers": 2, "width": 32, "heads": 2, "experts": 4})
    assert sharded_fraction(dense, "torch", 4) == 0 and sharded_fraction(dense, "fsdp", 4) == 1
    experts = 2 * 4 * 2 * 32 * 128  # layers x experts x (in and out) x width x hidden
    assert sharded_fraction(sparse, "horovod", 4) == pytest.approx(experts / sparse.count().params)
    assert sharded_fraction(sparse.replace(expert_parallel=False), "torch", 4) == 0


def test_a_step_s_message_size_fits_the_sweep_around_it() -> None:
    """Between two measured sizes the fitted cost at the sweep's rank count is the measurement's
    line; where that line starts below zero, the line from zero through the larger size."""
    rows = [
        CommRow(bytes=1 << 10, backend_s=1e-4, collective="all_gather"),
        CommRow(bytes=1 << 20, backend_s=8e-4, collective="all_gather"),
        CommRow(bytes=4 << 20, backend_s=2e-3, collective="all_gather"),  # 0.4 ms + slope
        CommRow(bytes=16 << 20, backend_s=2e-2, collective="all_gather"),  # falls off: below zero
    ]
    between = fit_comm(rows, 2, "all_gather", message_bytes=2 << 20)
    line = 8e-4 + (2e-3 - 8e-4) * ((2 << 20) - (1 << 20)) / ((4 << 20) - (1 << 20))
    assert between.time(2 << 20, 2) == pytest.approx(line)
    steep = fit_comm(rows, 2, "all_gather", message_bytes=8 << 20)
    assert steep.alpha_s == 0 and steep.time(16 << 20, 2) == pytest.approx(2e-2)
    assert fit_comm(rows, 2, "all_gather", message_bytes=1 << 30) == fit_comm(rows, 2, "all_gather")
