"""The analytical scaling model: its formulas, the fit of a collective sweep, calibration from
real reference records, and ``hpcdl predict``."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hpcdl_cli import hpcdl, one_line

from hpcdl.errors import InputError
from hpcdl.measure.datasheets import datasheet_entry
from hpcdl.parallel.backends import Traffic
from hpcdl.records.loader import CommRow, read_comm, read_record
from hpcdl.records.store import load_record
from hpcdl.scaling.collectives import Hierarchy
from hpcdl.scaling.fitting import comm_from_record, fit_comm, model_from_records
from hpcdl.scaling.model import Comm, Model
from hpcdl.scaling.modelparallel import parse_layout
from hpcdl.scaling.system import catalogue, catalogue_dir, load_system, parse_system, read_toml

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
    assert one.comm_s == 0 and one.efficiency == 1.0
    compute = 3e9 * 32 / 1e13
    ring = 2 * 3 * 5e-6 + 2 * 3 / 4 * 100e6 / 20e9
    assert four.compute_s == pytest.approx(compute) and four.comm_s == pytest.approx(ring)
    assert four.samples_per_s == pytest.approx(4 * 32 / (compute + ring))
    assert four.efficiency == pytest.approx(compute / (compute + ring))
    strong = model(mode="strong").point(4)
    assert strong.compute_s == pytest.approx(compute / 4)
    assert model(overlap="full").point(4).step_s == pytest.approx(max(compute, ring))
    many = model(messages=3).point(4)
    assert many.comm_s == pytest.approx(ring + 2 * 2 * 3 * 5e-6)


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


def test_predict_cli_against_measured_points(tmp_path: Path) -> None:
    args = ["predict", "--base", str(REF / "mlp-torch-weak-np1.json"), "--comm", str(REF / "comm-torch.json")]
    p = hpcdl(*args, "--compare", str(REF))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("model [comm-torch]: gamma") and any(
        line.startswith("4096 ") for line in lines
    )
    p = hpcdl(*args, "--compare", str(REF), "--nodes", "1,2", "--json", "-o", str(tmp_path / "p.json"))
    doc = json.loads(p.stdout)
    assert doc["schema"] == "hpcdl.prediction" and json.loads((tmp_path / "p.json").read_text()) == doc
    two = doc["points"][1]
    measured = load_record(REF / "mlp-torch-weak-np2.json")["metrics"]["samples_per_s"]
    assert two["measured_samples_per_s"] == measured
    assert two["error"] == pytest.approx((two["samples_per_s"] - measured) / measured)
    c = load_record(REF / "mlp-torch-weak-np2.json")["metrics"]["communication"]
    assert two["measured_overlap"] == pytest.approx(max(0.0, 1 - c["exposed_s"] / c["allreduce_s"]))
    assert 0 <= two["overlap"] <= 1 and two["exposed_comm_s"] <= two["comm_s"]


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
    code, err = p.returncode, p.stderr  # in-process: the CLI's own exit-code policy, no start-up
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_predict_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "base.json")  # opening it for reading would wait for a writer
    p = hpcdl("predict", "--base", str(tmp_path / "base.json"), "--beta", "1e9")
    code, err = p.returncode, p.stderr
    assert code == 2 and "a FIFO, not a regular file" in err
    assert len(err.strip().splitlines()) == 1, err


def test_the_optimizer_updates_what_a_rank_holds() -> None:
    """γ's step holds the optimizer's; with sharding it updates 1/p of the parameters."""
    one = 3e9 * 32 / 1e13
    plain = model(optimizer_s=0.002)
    assert plain.point(4).compute_s == pytest.approx(one)  # data parallelism: all of them
    sharded = model(optimizer_s=0.002, sharded_fraction=1.0)
    assert sharded.point(4).compute_s == pytest.approx(one - 0.002 + 0.002 / 4)
    strong = model(optimizer_s=0.002, sharded_fraction=0.5, mode="strong")
    assert strong.point(4).compute_s == pytest.approx((one - 0.002) / 4 + 0.002 * (0.5 + 0.5 / 4))
    with pytest.raises(InputError, match="predict.optimizer_s"):
        model(optimizer_s=one)


def test_sharded_fraction_of_each_scheme() -> None:
    from hpcdl.scaling.traffic import sharded_fraction
    from hpcdl.workloads.registry import spec_from_dict

    dense = spec_from_dict({"family": "attention", "layers": 2, "width": 32, "heads": 2})
    sparse = spec_from_dict({"family": "attention", "layers": 2, "width": 32, "heads": 2, "experts": 4})
    assert sharded_fraction(dense, "torch", 4) == 0 and sharded_fraction(dense, "fsdp", 4) == 1
    experts = 2 * 4 * 2 * 32 * 128  # layers x experts x (in and out) x width x hidden
    assert sharded_fraction(sparse, "horovod", 4) == pytest.approx(experts / sparse.count().params)
    assert sharded_fraction(sparse.replace(expert_parallel=False), "torch", 4) == 0


def test_a_step_s_message_size_fits_the_sweep_around_it() -> None:
    """Between two measured sizes the fitted cost at the sweep's rank count is the measurement's
    line; where that line starts below zero, the line from zero through the measurement
    interpolated at the message size."""
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
    at_8 = 2e-3 + (2e-2 - 2e-3) * ((8 << 20) - (4 << 20)) / ((16 << 20) - (4 << 20))  # the two sizes' line
    assert steep.alpha_s == 0 and steep.time(8 << 20, 2) == pytest.approx(at_8)
    assert steep.time(16 << 20, 2) == pytest.approx(2 * at_8)  # from zero: twice the bytes, twice the time
    assert fit_comm(rows, 2, "all_gather", message_bytes=1 << 30) == fit_comm(rows, 2, "all_gather")


# --- two levels, overlap, accumulation, uncertainty, systems (issue 17) ----------------------

INTRA = Comm(alpha_s=1e-6, beta_bytes_per_s=100e9)
INTER = Comm(alpha_s=5e-6, beta_bytes_per_s=10e9)


def hierarchy(r: int = 8, **kw: object) -> Hierarchy:
    return Hierarchy(intra=INTRA, inter=INTER, ranks_per_node=r, **kw)  # type: ignore[arg-type]


def test_one_node_is_the_intra_ring_and_one_level_is_the_flat_ring() -> None:
    h = hierarchy()
    assert h.time(1e8, 8, 2) == pytest.approx(INTRA.time(1e8, 8, 2))
    flat = Hierarchy(intra=INTER, inter=INTER, ranks_per_node=1, algorithms=("ring",))
    for p in (2, 16, 512):  # the one-level special case: what --alpha/--beta give
        assert flat.time(1e8, p, 3) == pytest.approx(INTER.time(1e8, p, 3))


def test_tree_latency_grows_with_log_p_and_the_cheapest_algorithm_is_taken() -> None:
    h = hierarchy()
    tiny, nodes = 1e3, 1024
    costs = h.candidates(tiny, 8 * nodes)
    tree_latency = 2 * (math.log2(nodes) * INTER.alpha_s + 7 * INTRA.alpha_s)
    assert costs["tree"] == pytest.approx(tree_latency + 2 * tiny / INTER.beta_bytes_per_s)
    assert costs["ring"] > 2 * (8 * nodes - 1) * INTER.alpha_s  # p·α: hundreds of times the tree's
    assert h.algorithm(tiny, 8 * nodes) in ("tree", "hierarchical") and h.time(tiny, 8 * nodes) == min(
        costs.values()
    )
    big = hierarchy(r=1)  # at 2 nodes of 1 rank a large message goes round the ring: (p−1)/p of it
    assert big.algorithm(1e9, 2) == "ring" and big.time(1e9, 2) == pytest.approx(
        min(big.candidates(1e9, 2).values())
    )


def test_a_node_s_ranks_all_to_all_at_most_the_fabric_and_each_at_its_own_rate() -> None:
    # 2 nodes of 2 ranks; one rank's all-to-all across nodes reaches 6 GB/s (a library that
    # sends and receives in turn), the node's fabric 10 GB/s: together its 2 ranks move 10, not 6
    one_rank = Comm(alpha_s=0.0, beta_bytes_per_s=6e9, collective="all_to_all")
    fast_in = Comm(alpha_s=0.0, beta_bytes_per_s=1e15, collective="all_to_all")
    capped = Hierarchy(intra=fast_in, inter=one_rank, ranks_per_node=2, collective="all_to_all",
                       fabric_bytes_per_s=10e9)  # fmt: skip
    leaving = 2 * 1e9 * 2 / 4  # each of the node's 2 ranks sends half its 1 GB to the other node
    assert capped.time(1e9, 4) == pytest.approx(leaving / 10e9, rel=1e-4)
    uncapped = replace(capped, fabric_bytes_per_s=0.0)  # inter taken as the node's own rate
    assert uncapped.time(1e9, 4) == pytest.approx(leaving / 6e9, rel=1e-4)
    alone = replace(capped, ranks_per_node=1)  # one rank a node: its own rate, below the fabric
    assert alone.time(1e9, 4) == pytest.approx(1e9 * 3 / 4 / 6e9, rel=1e-4)


def test_bucketed_overlap_hides_all_but_the_last_bucket() -> None:
    """Four buckets, backward long enough to reduce the first three behind it: the last
    bucket's reduction is what remains, between the bounds none and full."""
    bucket = Comm(alpha_s=0.0, beta_bytes_per_s=1e9)
    common = {"comms": {"allreduce": bucket}, "traffic": (Traffic("allreduce", int(400e6), 4),)}
    m = model(**common, overlap="bucketed")  # compute 9.6 ms, backward 2/3 of it; 4 x 75 ms of comm
    last = bucket.time(100e6, 4)
    comm = m.comm_s(4)
    step = m.point(4).step_s
    assert (
        model(**common, overlap="none").point(4).step_s
        >= step
        >= model(**common, overlap="full").point(4).step_s
    )
    long = model(**common, gamma_flops_per_s=1e10, backward_fraction=1.0)  # backward 9.6 s
    assert long.point(4).exposed_comm_s == pytest.approx(last)
    assert long.point(4).overlap == pytest.approx(1 - last / comm)
    assert m.point(4).exposed_comm_s > last  # a short backward hides less


def test_accumulation_reduces_once_per_n_micro_batches() -> None:
    one, four = model(overlap="none"), model(overlap="none", accumulation_steps=4)
    assert four.compute_s(4) == pytest.approx(4 * one.compute_s(4))
    assert four.comm_s(4) == pytest.approx(one.comm_s(4))  # one reduction per optimizer step
    assert four.point(4).samples_per_s == pytest.approx(4 * 4 * 32 / (four.compute_s(4) + four.comm_s(4)))
    assert four.point(4).efficiency > one.point(4).efficiency
    with pytest.raises(InputError, match="predict.accumulation_steps"):
        model(accumulation_steps=0)


def test_uncertainty_comes_from_the_fit_residuals() -> None:
    truth = Comm(alpha_s=7e-6, beta_bytes_per_s=3e9)
    sizes = (1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 26)
    noisy = [
        CommRow(bytes=s, backend_s=truth.time(s, 4) * (1 + 0.1 * (-1) ** i)) for i, s in enumerate(sizes)
    ]
    fitted = fit_comm(noisy, 4)
    assert fitted.beta_rse > 0 and fitted.alpha_se_s > 0
    exact = fit_comm([CommRow(bytes=s, backend_s=truth.time(s, 4)) for s in sizes], 4)
    assert exact.beta_rse == pytest.approx(0, abs=1e-9)
    assert model().point(4).step_rse == 0  # given figures: nothing fitted, no spread to show
    m = model(comms={"allreduce": fitted}, gamma_rse=0.02, overlap="none")
    rse = m.point(4).step_rse
    share = m.compute_s(4) / m.point(4).step_s
    assert rse > share * 0.02 * 0.9  # γ's share at least; α's and β's add to it


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["intra"].pop("bandwidth_GB_s"), "system.intra.bandwidth_GB_s"),
        (lambda d: d["inter"].update(nic_Gbit_s=0.0), "system.inter.nic_Gbit_s"),
        (lambda d: d["inter"].update(latency_us=float("nan")), "system.inter.latency_us"),
        (lambda d: d["intra"].update(efficiency=1.5), "system.intra.efficiency"),
        (lambda d: d.update(devices_per_node=True), "system.devices_per_node"),
        (lambda d: d.pop("inter"), "system.inter"),
    ],
)
def test_a_bad_system_names_the_field(edit: Any, field: str) -> None:
    doc = read_toml(catalogue_dir() / "dgx-a100.toml")
    edit(doc)
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        parse_system(doc)


def test_every_catalogue_system_reads_and_cites_its_sources() -> None:
    names = catalogue()
    assert {"dgx1-v100", "dgx-a100", "dgx-h100", "gb200-nvl72", "mi300x-roce", "cpu-100gbe"} <= set(names)
    for name in names:
        s = load_system(name)
        assert s.intra.source and s.inter.source and s.inter.bandwidth_bytes_per_s > 0
    h100 = load_system("dgx-h100")
    assert h100.inter.bandwidth_bytes_per_s == pytest.approx(8 * 400e9 / 8 * 0.9)
    with pytest.raises(InputError, match="predict.ranks_per_node"):
        h100.cost("allreduce", 9)


RESNET = ["--preset", "resnet50", "batch_size=64", "--throughput", "400"]


def test_two_systems_side_by_side_in_json() -> None:
    p = hpcdl(
        "predict",
        *RESNET,
        "accumulation_steps=2",
        "--system",
        "dgx-a100",
        "--system",
        "cpu-100gbe",
        "--nodes",
        "1,4",
        "--json",
    )
    code, out = p.returncode, p.stdout
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == "hpcdl.prediction" and len(doc["points"]) == 4
    for row in doc["points"]:
        assert {
            "system",
            "nodes",
            "ranks",
            "samples_per_s",
            "efficiency",
            "step_s",
            "comm_s",
            "step_rse",
        } <= set(row)
    a100, cpu = doc["points"][1], doc["points"][3]
    assert (a100["system"], a100["ranks"], cpu["ranks"]) == ("dgx-a100", 32, 8)
    assert a100["comm_s"] < cpu["comm_s"]  # NVSwitch and 8 x HDR against shared memory and one 100 GbE
    assert doc["models"][0]["accumulation_steps"] == 2
    assert a100["samples_per_s"] == pytest.approx(32 * 64 * 2 / a100["step_s"])


def test_two_sweeps_fit_two_levels() -> None:
    p = hpcdl(
        "predict",
        "--base",
        str(REF / "mlp-torch-weak-np1.json"),
        "--comm",
        str(REF / "comm-torch.json"),
        "--comm-inter",
        str(REF / "comm-horovod.json"),
        "--ranks-per-node",
        "2",
        "--nodes",
        "1,2",
        "--json",
    )
    code, out = p.returncode, p.stdout  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert set(doc["model"]["comms"]["allreduce"]) >= {"intra", "inter", "ranks_per_node"}
    assert doc["points"][1]["ranks"] == 4 and doc["points"][1]["step_rse"] > 0  # γ, α, β fitted


@pytest.mark.parametrize(
    "bad",
    [
        [*RESNET, "--system", "dgx-a100", "--nodes", "1" + "0" * 400],
        [*RESNET, "--system", "dgx-a100", "--nodes", "4097"],
        [*RESNET, "--system", "no-such-system"],
        [*RESNET, "--system", "dgx-a100", "--ranks-per-node", "9"],
        [*RESNET, "accumulation_steps=0", "--system", "dgx-a100"],
        [*RESNET, "--system", "dgx-a100", "--gamma", "1e12"],
        ["--preset", "resnet50", "--throughput", "nan", "--system", "dgx-a100"],
    ],
)
def test_predict_system_bad_input_is_one_line(bad: list[str]) -> None:
    p = hpcdl("predict", *bad)
    code, out, err = p.returncode, p.stdout, p.stderr
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert len(err) < 300


def test_a_system_file_of_zero_bandwidth_is_refused(tmp_path: Path) -> None:
    text = (
        (catalogue_dir() / "cpu-100gbe.toml")
        .read_text()
        .replace("bandwidth_GB_s = 20.0", "bandwidth_GB_s = 0")
    )
    (tmp_path / "zero.toml").write_text(text)
    p = hpcdl("predict", *RESNET, "--system", str(tmp_path / "zero.toml"))
    code, err = p.returncode, p.stderr
    assert code == 2 and "system.intra.bandwidth_GB_s=0" in err
    os.mkfifo(tmp_path / "fifo.toml")
    p = hpcdl("predict", *RESNET, "--system", str(tmp_path / "fifo.toml"))
    code, err = p.returncode, p.stderr
    assert code == 2 and "a FIFO, not a regular file" in err


def test_compare_matches_strong_scaling_points_on_the_global_micro_batch() -> None:
    from hpcdl.cli.predict import compared_batch, measured_points
    from hpcdl.records.views import EAGER, Settings

    spec = read_record(REF / "mlp-torch-weak-np1.json").result.spec  # batch 64
    assert sorted(measured_points(REF, spec, "weak", "torch")) == [1, 2]  # 64 a rank at both
    assert sorted(measured_points(REF, spec, "strong", "torch")) == [1]  # 64 in all: np1 only
    assert sorted(measured_points(REF, {**spec, "batch_size": 128}, "strong", "torch")) == [2]
    # 4 micro-batches a step: global_batch counts them, the model's strong batch does not
    s = Settings("fp32", 16, 4, 256, "torch", "cpu", 1, ["a"], accumulation_steps=4, execution=EAGER)
    assert compared_batch(s, "strong") == 64 and compared_batch(s, "weak") == 16


def test_gamma_from_phases_is_the_step_the_phases_compute() -> None:
    base = read_record(REF / "mlp-torch-weak-np1.json").result
    comm = Comm(alpha_s=1e-6, beta_bytes_per_s=1e9)
    m = model_from_records(base, comm, backend="torch", gamma_from="phases")
    phases = sum(base.metrics.phases_s[k].median for k in ("data", "forward", "backward", "optimizer"))
    assert m.step_s(1) == pytest.approx(phases)
    assert model_from_records(base, comm, backend="torch").gamma_flops_per_s == base.metrics.ai_ops_per_s
    with pytest.raises(InputError, match="predict.gamma_from"):
        model_from_records(base, comm, gamma_from="guess")


def test_a_tensor_parallel_group_calibrates_what_a_tp_rank_computes() -> None:
    # the phases of a tp=2 record (its tp allreduces inside them) stand for a whole model on
    # one rank twice as slow: the model's tp rank then computes what the record's rank did
    from hpcdl.records.views import Collective

    one = read_record(REF / "mlp-torch-weak-np1.json").result
    tp_s = 1e-3
    tp_ar = Collective(1000, 4, tp_s, 1.0, 1.0, "after training", ranks=2)
    comms = replace(one.metrics.communication, collectives={"tp.allreduce": tp_ar})
    base = replace(
        one,
        settings=replace(one.settings, world_size=2, layout="dp=1,tp=2,pp=1"),
        metrics=replace(one.metrics, communication=comms),
    )
    comm = Comm(alpha_s=1e-6, beta_bytes_per_s=1e9)
    m = model_from_records(base, comm, backend="torch", gamma_from="phases", layout=parse_layout("tp=2"))
    phases = sum(base.metrics.phases_s[k].median for k in ("data", "forward", "backward", "optimizer"))
    assert m.step_s(1) == pytest.approx(2 * (phases - tp_s))
    assert m.optimizer_s == pytest.approx(2 * base.metrics.phases_s["optimizer"].median)
    compute, _, _ = m.parts(2)
    assert compute == pytest.approx(phases - tp_s)  # one tp rank's own computation, as measured
    with pytest.raises(InputError, match="predict.gamma_from"):
        model_from_records(base, comm, backend="torch")  # throughput holds the tp collectives
    dp = replace(base, settings=replace(base.settings, world_size=4, layout="dp=2,tp=2,pp=1"))
    with pytest.raises(InputError, match="tensor-parallel group"):
        model_from_records(dp, comm, backend="torch", gamma_from="phases")


# ------------------------------------------------------------------------------ devices (issue 45)
def test_one_measured_record_gives_each_device_its_own_speed() -> None:
    """predict on dgx-a100 and dgx-h100 from one measured record: the same MFU on each device's
    peak (an assumption, printed), so the per-device speeds differ by their peaks' ratio."""
    base = REF / "mlp-torch-weak-np1.json"
    args = ["predict", "--base", str(base), "--system", "dgx-a100", "--system", "dgx-h100", "--nodes", "1"]
    p = hpcdl(*args, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    a100, h100 = doc["models"]
    record = read_record(base).result
    mfu = record.metrics.ai_ops_per_s / record.metrics.peak_flops  # a 1-rank record: one device
    assert a100["gamma_flops_per_s"] == pytest.approx(mfu * 19.5e12)  # the A100's fp32 datasheet peak
    assert h100["gamma_flops_per_s"] == pytest.approx(mfu * 66.9e12)
    one = {pt["system"]: pt for pt in doc["points"]}
    assert one["dgx-h100"]["compute_s"] == pytest.approx(one["dgx-a100"]["compute_s"] * 19.5 / 66.9)
    text = " ".join(hpcdl(*args).stdout.split())  # the rule lines are wrapped notes
    rules = [r.split(" per step and rank")[0] for r in text.split(" gamma: ")[1:]]
    assert len(rules) == 2 and all("assumed: the same MFU as record " in r for r in rules), text
    assert (
        f"on AMD EPYC, {mfu:.1%} of its " in rules[0]
        and "on NVIDIA H100 80GB HBM3's 66.9 TFLOP/s" in rules[1]
    )


def test_a_throughput_given_per_system_is_used_as_given() -> None:
    p = hpcdl("predict", "--preset", "resnet50", "--throughput", "dgx-a100=400", "--throughput",
              "dgx-h100=1300", "--system", "dgx-a100", "--system", "dgx-h100", "--nodes", "1")  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("gamma: given for this system (--throughput") == 2
    plain = hpcdl("predict", "--preset", "resnet50", "--throughput", "400", "--throughput", "dgx-h100=1300",
                  "--system", "dgx-a100", "--system", "dgx-h100", "--nodes", "1", "--json")  # fmt: skip
    a100, h100 = json.loads(plain.stdout)["models"]
    assert a100["gamma_rule"].startswith("as measured on this device (--throughput 400 samples/s)")
    assert h100["gamma_rule"] == "given for this system (--throughput dgx-h100=...)"
    assert h100["gamma_flops_per_s"] / a100["gamma_flops_per_s"] == pytest.approx(1300 / 400)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (  # a preset without a published rate (generators/rates.toml)
            ["--preset", "gpt2_small", "--system", "dgx-a100"],
            "give --base RECORD (a 1-rank record), --throughput",
        ),
        (["--preset", "resnet50", "--beta", "1e9"], "or --gamma FLOP/s"),
        (
            [
                "--preset",
                "resnet50",
                "precision=bf16",
                "--throughput",
                "400",
                "--system",
                "dgx-a100",
                "--system",
                "dgx1-v100",
            ],
            "its Tesla V100-SXM2-32GB has no bf16 peak: give --throughput dgx1-v100=SAMPLES/s",
        ),  # fmt: skip
        (
            [
                "--preset",
                "resnet50",
                "--throughput",
                "dgx-a100=400",
                "--system",
                "dgx-a100",
                "--system",
                "dgx-h100",
            ],
            "predict.throughput='dgx-h100' is invalid: give --throughput dgx-h100=SAMPLES/s too",
        ),  # fmt: skip
        (
            ["--preset", "resnet50", "--throughput", "h100=9", "--system", "dgx-a100"],
            "NAME is one of the --system",
        ),
    ],
)
def test_a_missing_speed_says_which_option_to_give(args: list[str], expected: str) -> None:
    assert expected in one_line(hpcdl("predict", *args))


def test_every_catalogue_system_names_its_device_with_sources() -> None:
    for name in catalogue():
        device = load_system(name).device
        assert device is not None and device.source and device.peak_source, name
        assert device.peak_flops["fp32"] > 0 and device.memory_bytes > 0 and device.power_w > 0
        if device.peak_source.startswith("datasheet: "):  # one place per fact: hpcdl's table
            assert device.peak_flops == datasheet_peaks(device.name)
    assert load_system("dgx-h100").device.peak_flops["bf16"] == 989.4e12  # type: ignore[union-attr]
    doc = read_toml(catalogue_dir() / "dgx-a100.toml")
    doc["device"]["name"] = "Unheard-of GPU"
    with pytest.raises(InputError, match="system.device.peak_TFLOPs"):
        parse_system(doc)


def datasheet_peaks(name: str) -> dict[str, float]:
    found = datasheet_entry(name)
    assert found is not None, name
    return found[0]
