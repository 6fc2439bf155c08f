"""The scaling model's tensor- and pipeline-parallel terms (hpcdl/scaling/modelparallel.py)
against hand computation, and ``hpcdl predict --layout``."""

from __future__ import annotations

import json

import pytest
from hpcdl_cli import hpcdl, one_line

from hpcdl.errors import InputError
from hpcdl.scaling.collectives import Comm, Hierarchy
from hpcdl.scaling.model import Model, model_for
from hpcdl.scaling.modelparallel import Layout, parse_layout
from hpcdl.workloads.registry import spec_from_dict

SPEC = {"family": "attention", "layers": 2, "width": 64, "heads": 4, "seq_len": 16, "batch_size": 8}
ALPHA, BETA, GAMMA = 1e-5, 1e9, 1e9
ACT = 16 * 64 * 4
"""one sample's block output: seq_len x width fp32 bytes"""


def layered(layout: str, **kw: object) -> Model:
    comm = {
        c: Comm(alpha_s=ALPHA, beta_bytes_per_s=BETA, collective=c) for c in ("allreduce", "reduce_scatter")
    }
    return model_for(SPEC, 8, GAMMA, comm, backend="torch", overlap="none", layout=parse_layout(layout), **kw)


def flops_and_grads(m: Model) -> tuple[float, float]:
    spec = spec_from_dict(dict(SPEC))
    (t,) = m.traffic
    assert t.collective == "allreduce" and t.bytes == 4 * spec.count().params
    return float(spec.count().train_flops), float(t.bytes)


def test_tensor_parallel_step_by_hand() -> None:
    m = layered("tp=2")
    f, g = flops_and_grads(m)
    work = f * 8 / GAMMA / 2  # the replica's batch, half the work on each tp rank
    # 2 blocks x (2 forward + 2 backward) allreduces of 8 samples' activations among 2 ranks:
    # a ring of 2 ranks is 2 steps of alpha and 1 x S / beta
    tp = 2 * 4 * (2 * ALPHA + 8 * ACT / BETA)
    # each rank's half of the gradients over dp = 2 ranks, in one bucket
    reduce = 2 * ALPHA + (g / 2) / BETA
    compute, comm, step = m.parts(4)
    assert compute == pytest.approx(work)
    assert comm == pytest.approx(tp + reduce)
    assert step == pytest.approx(work + tp + reduce)
    assert m.samples_per_step(4) == 16  # two replicas of 8


def test_tensor_parallel_groups_share_the_fabric_and_reduce_after_backward() -> None:
    # 2 nodes of 2 ranks, tp=2 inside each: the 2 dp groups (one rank on each node) run at once
    # through each node's one fabric, and the shards are reduced in one allreduce after backward,
    # whole, even with bucketed overlap (hpcdl's tensor backend)
    intra, inter = Comm(alpha_s=ALPHA, beta_bytes_per_s=10 * BETA), Comm(alpha_s=ALPHA, beta_bytes_per_s=BETA)
    comm = {"allreduce": Hierarchy(intra=intra, inter=inter, ranks_per_node=2)}
    m = model_for(SPEC, 8, GAMMA, comm, backend="torch", layout=parse_layout("dp=2,tp=2"))
    f, g = flops_and_grads(m)
    work = f * 8 / GAMMA / 2
    tp = 2 * 4 * (2 * ALPHA + 8 * ACT / (10 * BETA))  # inside a node: the intra link
    reduce = 2 * ALPHA + (g / 2) / (BETA / 2)  # across nodes, half the fabric each
    compute, comm_s, step = m.parts(4)
    assert compute == pytest.approx(work)
    assert comm_s == pytest.approx(tp + reduce)
    assert step == pytest.approx(work + tp + reduce)


def test_bf16_tensor_parallel_reduces_bf16_forward_and_fp32_backward() -> None:
    # autocast: a product's output is bf16, the layer-norm output's gradient fp32 (tp_traffic)
    comm = {"allreduce": Comm(alpha_s=ALPHA, beta_bytes_per_s=BETA)}
    bf16 = model_for({**SPEC, "precision": "bf16"}, 8, GAMMA, comm, backend="torch", overlap="none",
                     layout=parse_layout("tp=2"))  # fmt: skip
    tp = 2 * 2 * (2 * ALPHA + 8 * ACT / 2 / BETA) + 2 * 2 * (2 * ALPHA + 8 * ACT / BETA)
    assert bf16.parallel is not None and bf16.parallel.tp_s(8, 2) == pytest.approx(tp)


def test_sequence_parallel_moves_what_allreduce_moves() -> None:
    # a reduce-scatter and an all-gather of S on a ring cost what the allreduce of S costs
    assert layered("tp=2,sp=1").parts(4) == pytest.approx(layered("tp=2").parts(4))


def test_pipeline_step_and_bubble_by_hand() -> None:
    m = layered("pp=2,microbatches=4")
    f, g = flops_and_grads(m)
    work = f * 8 / GAMMA / 2 / 4  # one micro-batch of 2 samples on one stage of two
    p2p = 2 * (ALPHA + 2 * ACT / BETA)  # activations forward, their gradients backward
    slot = work + p2p
    reduce = 2 * ALPHA + (g / 2) / BETA  # after the pipeline's flush: not hidden
    compute, comm, step = m.parts(4)
    assert compute == pytest.approx(4 * work)
    assert comm == pytest.approx(4 * p2p + reduce)
    assert step == pytest.approx((4 + 2 - 1) * slot + reduce)
    assert m.layered(4)[3] == pytest.approx(slot)  # the bubble: pp - 1 = 1 slot of 5
    assert Layout(pp=2, microbatches=4).bubble() == pytest.approx(1 / 5)
    assert Layout(pp=4).bubble() == pytest.approx(3 / 11)  # m = 2 x pp by default


def test_tensor_parallel_pipelines_send_a_copy_per_tp_rank() -> None:
    # 2 nodes of 2 ranks, tp=2 inside each, the 2 stages on the 2 nodes: each tp rank sends its
    # own copy of the activations across, the 2 of them through the node's one fabric
    intra, inter = Comm(alpha_s=ALPHA, beta_bytes_per_s=10 * BETA), Comm(alpha_s=ALPHA, beta_bytes_per_s=BETA)
    comm = {"allreduce": Hierarchy(intra=intra, inter=inter, ranks_per_node=2)}
    m = model_for(SPEC, 8, GAMMA, comm, backend="torch", layout=parse_layout("tp=2,pp=2,microbatches=4"))
    assert m.parallel is not None
    assert m.parallel.p2p_s(2, 4) == pytest.approx(2 * (ALPHA + 2 * ACT * 2 / BETA))
    tp = 4 * (2 * ALPHA + 2 * ACT / (10 * BETA))  # a stage's one block: 2 + 2 allreduces, inside a node
    assert m.parallel.tp_s(2, 4) == pytest.approx(tp)
    _, _, step = m.parts(4)
    f, _ = flops_and_grads(m)
    slot = f * 8 / GAMMA / 4 / 4 + tp + m.parallel.p2p_s(2, 4)  # a quarter of the work a micro-batch
    assert step == pytest.approx((4 + 2 - 1) * slot)  # one replica: no data-parallel term


def test_layout_fits_only_its_rank_counts() -> None:
    m = layered("dp=2,tp=2")
    assert m.predictable(4) and not m.predictable(2) and not m.predictable(8)
    assert layered("tp=2").predictable(8) and not layered("tp=2").predictable(3)


@pytest.mark.parametrize(
    ("text", "field"),
    [("tp=x", "predict.layout.tp"), ("zz=2", "predict.layout"),
     ("pp=2,schedule=zb", "predict.layout.schedule"), ("tp=0", "predict.layout.tp")],
)  # fmt: skip
def test_bad_layouts_name_the_field(text: str, field: str) -> None:
    with pytest.raises(InputError) as e:
        parse_layout(text)
    assert e.value.field == field


def test_predict_cli_layout() -> None:
    args = [
        "predict",
        "--workload",
        "attention",
        "layers=4",
        "width=256",
        "heads=4",
        "seq_len=64",
        "batch_size=8",
    ]
    p = hpcdl(
        *args, "--gamma", "1e12", "--system", "dgx-a100", "--nodes", "1,2", "--layout", "tp=2,pp=2", "--json"
    )
    points = json.loads(p.stdout)["points"]
    assert p.returncode == 0 and [p["ranks"] for p in points] == [8, 16]
    assert all(
        p["layout"].startswith("dp=rest,tp=2,pp=2") and 0 < p["bubble_s"] < p["step_s"] for p in points
    )
    assert "predict.layout.tp" in one_line(
        hpcdl(*args, "--gamma", "1e12", "--beta", "1e9", "--layout", "tp=3")
    )
