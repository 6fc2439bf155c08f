"""Mixture-of-experts layers of the attention family: the analytic count against the built
network and FlopCounterMode, routing (reproducible, per sequence, dropping over capacity), bad
knobs, and expert parallelism across real MPI ranks through every built-in backend."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from hpcdl_cli import hpcdl

from hpcdl.scaling.traffic import step_traffic
from hpcdl.workloads import moe
from hpcdl.workloads.crosscheck import counted_flops, saved_activation_elements
from hpcdl.workloads.families.attention import AttentionSpec
from hpcdl.workloads.registry import spec_from_dict

pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration:UserWarning")


def exact_spec(i: int) -> AttentionSpec:
    """A drawn MoE spec whose buffers hold exactly seq_len x top_k slots per sequence
    (capacity_factor 1, seq_len x top_k a multiple of experts): what runs is what is counted."""
    rng = random.Random(i)
    experts = rng.choice((2, 4, 8))
    top_k = rng.randint(1, min(experts, 3))
    heads = rng.choice((1, 2))
    return AttentionSpec(
        experts=experts,
        top_k=top_k,
        capacity_factor=1.0,
        seq_len=experts * rng.randint(1, 3),
        layers=rng.randint(1, 2),
        heads=heads,
        width=heads * rng.randint(2, 8),
        ffn_mult=rng.choice((1.0, 2.0, 4.0)),
        vocab=rng.randint(8, 40),
        causal=bool(i % 2),
        norm=("pre", "post")[i % 2],
        seed=i,
    )


SPECS = [exact_spec(i) for i in range(10)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"E{s.experts}k{s.top_k}T{s.seq_len}")
def test_count_matches_module_and_flop_counter(spec: AttentionSpec) -> None:
    model = spec.build()
    assert spec.count().params == sum(p.numel() for p in model.parameters())
    forward, total = counted_flops(spec)
    assert spec.count().forward_flops == forward and spec.count().train_flops == total


def test_flops_count_the_active_experts_not_all_of_them() -> None:
    dense = AttentionSpec(width=32, heads=2, ffn_mult=2.0, seq_len=16, layers=1)
    two_of_eight = dense.replace(experts=8, top_k=2, capacity_factor=1.0)
    d, h, t = 32, 64, 16
    router, ffn = 2 * t * d * 8, 2 * t * d * h + 2 * t * h * d
    # the experts' work is that of top_k = 2 dense networks, whatever the number of experts
    assert two_of_eight.count().forward_flops - dense.count().forward_flops == router + 2 * ffn - ffn
    assert two_of_eight.replace(experts=64).count().forward_flops - two_of_eight.count().forward_flops == (
        2 * t * d * (64 - 8)  # only the router grows
    )
    # parameters are every expert's: they all sit in memory and train
    expert_params = 8 * 2 * d * h + d * 8
    dense_ffn = d * h + h + h * d + d
    assert two_of_eight.count().params - dense.count().params == expert_params - dense_ffn


def test_capacity_padding_runs_but_is_not_counted() -> None:
    spec = AttentionSpec(width=16, heads=2, seq_len=12, layers=2, experts=4, top_k=2, capacity_factor=1.5)
    slots = 4 * moe.capacity(12, 4, 2, 1.5)  # 4 x ceil(9) = 36 slots for 24 token choices
    padding = (slots - 12 * 2) * 2 * (2 * 16 * spec.ffn_hidden)  # the padded slots' forward products
    forward, total = counted_flops(spec)
    assert forward - spec.count().forward_flops == 2 * padding  # two layers
    assert total - spec.count().train_flops == 2 * padding * 3  # backward: weight and input gradients


def test_activation_estimate() -> None:
    spec = AttentionSpec(width=32, heads=4, seq_len=16, vocab=64, experts=4, top_k=2)
    assert 0.5 <= spec.count().activation_elements / saved_activation_elements(spec) <= 3


def test_routing_is_reproducible_and_seeded() -> None:
    spec = AttentionSpec(width=16, heads=2, seq_len=8, experts=4, top_k=2, vocab=32)
    ids = spec.sample_inputs(4, torch.Generator().manual_seed(1), torch.device("cpu"))
    assert torch.equal(spec.build()(ids), spec.build()(ids))
    assert not torch.equal(spec.build()(ids), spec.replace(seed=1).build()(ids))


def _layer(capacity_factor: float) -> moe.MoE:
    spec = AttentionSpec(width=8, heads=1, seq_len=16, experts=4, top_k=1, capacity_factor=capacity_factor)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return moe.MoE(spec, torch.nn.GELU())


def test_routing_is_per_sequence_whatever_the_batch() -> None:
    """Capacity is per sequence, so a sequence is routed alike alone or in any batch: N ranks on
    N shards compute what one process computes on the whole batch."""
    layer = _layer(1.0)
    x = torch.randn(6, 16, 8)
    whole = layer(x)
    for i in range(6):
        assert torch.allclose(layer(x[i : i + 1]), whole[i : i + 1], atol=1e-6)


def test_tokens_over_capacity_skip_the_experts() -> None:
    x = torch.randn(1, 16, 8)
    tight, roomy = _layer(0.25), _layer(4.0)  # 1 slot per expert, or room for every token
    dropped = (tight(x).abs().sum(-1) == 0).sum()
    assert dropped >= 16 - 4 and (roomy(x).abs().sum(-1) == 0).sum() == 0


def test_a_dense_spec_writes_no_expert_knobs() -> None:
    """Records and suites of dense transformers read as before the knobs existed."""
    assert not set(moe.KNOBS) & set(AttentionSpec().to_dict())
    sparse = AttentionSpec(experts=4).to_dict()
    assert {k: sparse[k] for k in moe.KNOBS} == {
        "experts": 4,
        "top_k": 2,
        "capacity_factor": 1.25,
        "expert_parallel": True,
    }
    assert spec_from_dict(sparse) == AttentionSpec(experts=4)


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["generate", "attention", "experts=2", "top_k=3"],
            "attention.top_k=3 is invalid: must be <= experts=2",
        ),
        (
            ["run", "--workload", "attention", "experts=4", "--np", "3"],
            "attention.experts=4 is invalid: must be a positive multiple of the 3 ranks",
        ),
        (["generate", "attention", "experts=-1"], "attention.experts=-1 is invalid: must be in [0, 65536]"),
        (["generate", "attention", "capacity_factor=0"], "attention.capacity_factor=0.0 is invalid"),
    ],
)
def test_bad_expert_knobs_are_one_line_and_exit_2(args: list[str], expected: str, tmp_path: Path) -> None:
    p = hpcdl(*args, "-o", str(tmp_path)) if args[0] == "run" else hpcdl(*args)
    assert p.returncode == 2 and expected in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert not list(tmp_path.iterdir())  # refused before any rank started


MOE = ["--workload", "attention", "layers=2", "width=32", "heads=2", "seq_len=8", "vocab=64", "batch_size=4"]


@pytest.mark.mpi
@pytest.mark.parametrize(
    "backend",
    ["torch", "horovod", pytest.param("fsdp", marks=pytest.mark.slow(reason="the same experts under FSDP"))],
)
def test_experts_sharded_across_ranks_train_correctly(backend: str, tmp_path: Path) -> None:
    """4 experts on 2 ranks: 2 each, tokens dispatched by the backend's all-to-all; one step of
    2 ranks equals one process's, the gathered parameters agree, and the all-to-all the record
    holds is what the scaling model predicts."""
    p = hpcdl(
        "run", *MOE, "experts=4", "--np", "2", "--backend", backend, "--steps", "6", "--min-duration", "0",
        "-o", str(tmp_path),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    (rec,) = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
    assert rec["validity"]["passed"], rec["validity"]
    checks = {c["name"] for c in rec["validity"]["checks"]}
    assert {"one_step_equivalence", "parameters_identical"} <= checks
    spec = spec_from_dict(rec["spec"])
    got = rec["metrics"]["communication"]["collectives"]
    predicted = {t.collective: t for t in step_traffic(spec, backend, 2, spec.batch_size)}
    assert set(got) == set(predicted)
    for name, t in predicted.items():
        assert (got[name]["bytes_per_step"], got[name]["calls_per_step"]) == (t.bytes, t.calls), name
    a2a = got["all_to_all"]
    assert a2a["calls_per_step"] == 2 * moe.ALL_TO_ALLS_PER_LAYER and a2a["seconds_per_step"] > 0
    assert a2a["busbw_bytes_per_s"] == pytest.approx(a2a["algbw_bytes_per_s"] / 2)
    # the experts are rank-local: no backend reduces their gradients
    experts = 2 * 4 * 2 * 32 * spec.ffn_hidden * 4
    assert rec["metrics"]["communication"]["grad_bytes_per_step"] == 4 * rec["counts"]["params"] - experts
