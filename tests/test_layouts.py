"""Parallel layouts and tensor parallelism: the layout's parsing and checks, the Megatron plan's
shards, collectives and per-rank counts (on torch's fake process group and against the FLOP
counter), class L's default layouts, real tp=2 and dp=2 x tp=2 runs on the emulated hosts whose
loss trajectories match one process (a tp group across hosts said so, one inside a host not),
and bad layouts refused in one line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hpcdl_cli import hpcdl, one_line, unwrapped
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from hpcdl.errors import InputError, SpecError
from hpcdl.measure.data import device_pool
from hpcdl.parallel.layout import (
    Layout,
    check_layout,
    fit_layout,
    parse_layout,
    tp_crosses_nodes,
)
from hpcdl.parallel.tensor import local_tensor, plan, rank_count, tp_traffic
from hpcdl.records.audit import audit
from hpcdl.records.loader import read_record
from hpcdl.records.store import read_steps
from hpcdl.workloads import recipes
from hpcdl.workloads.crosscheck import decomposed
from hpcdl.workloads.registry import spec_from_dict
from hpcdl.workloads.spec import Spec

ATTENTION = dict(family="attention", layers=2, width=32, heads=4, seq_len=8, vocab=32, batch_size=4)
MLPS = [
    dict(family="mlp", layers=3, width=32, input_size=16, output_size=10, batch_size=4),  # 2 pairs
    dict(family="mlp", layers=2, width=32, input_size=16, output_size=10, batch_size=4),  # 1 + 1 whole
]
TP_SPECS = [ATTENTION, *MLPS]
WORKLOAD = ["--workload", "attention", *(f"{k}={v}" for k, v in ATTENTION.items() if k != "family")]


# --- the layout ----------------------------------------------------------------------------


def test_layout_parses_fits_and_places_tp_innermost() -> None:
    layout = fit_layout(parse_layout("tp=2, pp=2,schedule=gpipe"), 8)
    assert (layout.dp, layout.tp, layout.pp, layout.schedule, layout.chunks) == (2, 2, 2, "gpipe", 4)
    assert layout.coords(5) == {"pp": 1, "dp": 0, "tp": 1}
    assert layout.tp_group(5) == [4, 5] and layout.dp_group(5) == [5, 7]
    assert layout.stage_ranks(1) == [4, 5, 6, 7]
    assert fit_layout(parse_layout(""), 4) == Layout(dp=4)
    assert str(fit_layout(parse_layout("dp=2,tp=2"), 4)) == "dp=2,tp=2,pp=1"


@pytest.mark.parametrize(
    ("text", "ranks", "field", "allowed"),
    [
        ("dp=3,tp=2", 4, "run.layout", "dp x tp x pp = 6 must equal the 4 ranks"),
        ("tp=3", 4, "run.layout", "must divide the 4 ranks"),
        ("tp=2,schedule=zigzag", 4, "run.layout.schedule", "allowed: 1f1b, gpipe"),
        ("tp=2,size=4", 4, "run.layout", "unknown key 'size'"),
        ("tp=two", 4, "run.layout.tp", "an integer"),
        ("tp=0", 4, "run.layout.tp", ">= 1"),
        ("tp=2,tp=2", 4, "run.layout", "given twice"),
        ("ep=2", 4, "run.layout.ep", "1 or the 4 ranks"),
    ],
)
def test_bad_layouts_are_one_line_errors(text: str, ranks: int, field: str, allowed: str) -> None:
    with pytest.raises(InputError) as e:
        fit_layout(parse_layout(text), ranks)
    assert e.value.field == field and allowed in e.value.allowed, str(e.value)


@pytest.mark.parametrize(
    ("knobs", "text", "allowed"),
    [
        ({"heads": 6, "width": 48}, "tp=4", "must divide attention.heads=6"),
        ({"heads": 4, "width": 32, "ffn_mult": 1.0625}, "tp=4", "must divide attention.ffn_hidden=34"),
        ({}, "pp=4", "at most 2, the attention model's blocks"),
        ({}, "pp=2,microbatches=3", "must divide attention.batch_size=4"),
        ({"family": "cnn"}, "tp=2", "1: the cnn family has no tensor-parallel plan"),
        ({"family": "mlp", "width": 30}, "tp=4", "must divide mlp.width=30"),
        ({"experts": 4, "expert_parallel": False}, "ep=4", "set attention.expert_parallel=true"),
    ],
)
def test_layouts_the_workload_cannot_take_are_refused(knobs: dict, text: str, allowed: str) -> None:
    base = {"family": "attention"} if knobs.get("family") else ATTENTION
    spec = spec_from_dict({**base, **knobs})
    with pytest.raises(SpecError) as e:
        check_layout(fit_layout(parse_layout(text), 4), spec)
    assert allowed in e.value.allowed, str(e.value)


def test_a_tensor_backend_that_cannot_start_leaves_no_process_group() -> None:
    from hpcdl.parallel.backends.tensor import TensorParallel
    from hpcdl.parallel.world import World

    with pytest.raises(InputError, match="must divide the 1 ranks"):
        TensorParallel(World(), torch.device("cpu"), Layout(tp=2))
    assert not dist.is_initialized()  # its group made, then destroyed: the next run can start


def test_tp_across_nodes_is_told() -> None:
    two_per_node = [0, 0, 1, 1, 2, 2, 3, 3]
    assert not tp_crosses_nodes(fit_layout(parse_layout("tp=2"), 8), two_per_node)
    assert tp_crosses_nodes(fit_layout(parse_layout("tp=4"), 8), two_per_node)
    assert not tp_crosses_nodes(fit_layout(parse_layout("tp=4,pp=2"), 8), [0] * 4 + [1] * 4)


def test_class_l_transformers_name_layouts_that_fit_their_jobs() -> None:
    suite = recipes.suite("L")
    specs = suite.specs()
    transformers = [n for n, s in specs.items() if s.family == "attention"]
    assert transformers and set(suite.layouts) == set(transformers)
    for name in transformers:
        for nodes in (1, 2, 4):
            text = suite.default_layout(name, nodes)
            check_layout(fit_layout(parse_layout(text), nodes * recipes.NODE_DEVICES), specs[name])
    assert suite.default_layout("resnet152", 2) == ""


# --- the shards, their collectives and their counts ------------------------------------------


@pytest.fixture
def fake_group() -> Iterator[None]:
    """torch's fake process group of 2 ranks, this process rank 0: DTensor shards and their
    collectives (which move nothing) without other processes."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


class Allreduces(TorchDispatchMode):
    """The bytes and dtypes of every allreduce a pass dispatches (DTensor's functional ones)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops._c10d_functional.all_reduce.default:
            self.sent.append((args[0].dtype, args[0].numel() * args[0].element_size()))
        return func(*args, **(kwargs or {}))


@pytest.mark.usefixtures("fake_group")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("knobs", TP_SPECS, ids=["attention", "mlp-pairs", "mlp-odd"])
def test_shards_and_collectives_are_what_the_counts_say(knobs: dict, precision: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    spec = spec_from_dict({**knobs, "precision": precision})
    model = spec.build()
    parallelize_module(model, init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)), plan(spec, model))
    assert sum(local_tensor(p).numel() for p in model.parameters()) == rank_count(spec, 2).params
    x = spec.sample_inputs(spec.batch_size, torch.Generator().manual_seed(0), torch.device("cpu"))
    with Allreduces() as seen, torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
        model(x).float().sum().backward()
    (traffic,) = tp_traffic(spec, 2)
    assert (len(seen.sent), sum(n for _, n in seen.sent)) == (traffic.calls, traffic.bytes)
    if spec.family == "attention":  # 4 allreduces per block of batch x tokens x width
        forward, backward = (2 if precision == "bf16" else 4), 4  # backward's are fp32 under autocast
        assert traffic.bytes == 2 * 2 * 8 * 32 * 4 * (forward + backward)


def rank_shard(spec: Spec, model: nn.Module, tp: int) -> nn.Module:
    """Rank 0's shard of ``model`` under ``plan`` as plain layers (no process group, no
    collectives): what the rank multiplies, for the FLOP counter."""
    for name, style in plan(spec, model).items():
        layer = model.get_submodule(name)
        assert isinstance(layer, nn.Linear)
        w = layer.weight.detach()
        if isinstance(style, ColwiseParallel):
            out = w.shape[0] // tp
            layer.weight = nn.Parameter(w[:out].clone())
            layer.bias = nn.Parameter(layer.bias.detach()[:out].clone()) if layer.bias is not None else None
        else:
            assert isinstance(style, RowwiseParallel)
            layer.weight = nn.Parameter(w[:, : w.shape[1] // tp].clone())
    return model


@pytest.mark.parametrize("knobs", TP_SPECS, ids=["attention", "mlp-pairs", "mlp-odd"])
@pytest.mark.parametrize("tp", [2, 4])
def test_rank_counts_match_the_flop_counter(knobs: dict, tp: int) -> None:
    spec = spec_from_dict(knobs)
    model = rank_shard(spec, spec.build(), tp)
    x = spec.sample_inputs(2, torch.Generator().manual_seed(0), torch.device("cpu"))
    with decomposed(), FlopCounterMode(display=False) as counter:
        out = model(x)
        forward = counter.get_total_flops()
        out.sum().backward()
    mine = rank_count(spec, tp)
    assert (forward // 2, counter.get_total_flops() // 2) == (mine.forward_flops, mine.train_flops)
    assert sum(p.numel() for p in model.parameters()) == mine.params
    assert mine.train_flops < spec.count().train_flops


# --- real runs ------------------------------------------------------------------------------


def reference_losses(spec: Spec, streams: int, steps: int) -> list[float]:
    """One process training on the global batch (every dp replica's stream, as the runner makes
    them: learnable data, 4 batches cycled, AdamW at 1e-3), with stream 0's loss of each step:
    what rank 0 of a layout run records."""
    model = spec.build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    pools = [device_pool(spec, torch.device("cpu"), 4, learnable=True, stream=s) for s in range(streams)]
    losses = []
    for _ in range(steps):
        per_stream = []
        for pool in pools:
            x, y = pool.next()
            logits = model(x)
            per_stream.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))
        losses.append(float(per_stream[0].detach()))
        (sum(per_stream) / streams).backward()
        opt.step()
        opt.zero_grad()
    return losses


@pytest.mark.mpi
@pytest.mark.slow(
    reason="tensor-parallel runs of two and four ranks across hosts; the fast tier checks tp's plan"
)
@pytest.mark.usefixtures("emulated_cluster", "on_cluster")  # two hosts of their own
@pytest.mark.parametrize(
    ("layout", "np", "dp", "per_host"),
    [
        ("tp=2", 2, 1, "1"),  # one rank per emulated host: the tp group spans two hosts
        ("dp=2,tp=2", 4, 2, "2"),  # two hosts of two ranks: each tp group inside one
    ],
)
def test_tensor_parallel_runs_train_as_one_process(
    layout: str, np: int, dp: int, per_host: str, tmp_path: Path
) -> None:
    steps = ["--warmup", "1", "--steps", "3", "--min-duration", "0"]
    p = hpcdl(
        "run", *WORKLOAD, *steps, "--np", str(np), "--layout", layout, cwd=tmp_path,
        env={**os.environ, "HPCDL_CLUSTER_HOSTS": "2", "HPCDL_CLUSTER_PPN": per_host},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    (path,) = (tmp_path / "results").glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["validity"]["passed"], rec["validity"]
    assert audit(read_record(path)).problems == ()  # its figures follow from its measurements
    crosses = per_host == "1"
    assert rec["settings"]["nodes"] == 2 and rec["settings"]["tp_crosses_nodes"] is crosses
    warnings = [line for line in p.stderr.splitlines() if "across nodes" in line]
    assert len(warnings) == int(crosses), p.stderr[-2000:]
    assert rec["settings"]["layout"] == f"dp={dp},tp=2,pp=1"
    assert f"layout dp={dp},tp=2,pp=1: step" in unwrapped(p.stdout)  # where the step's time goes, said
    assert rec["settings"]["global_batch"] == 4 * dp and rec["settings"]["backend"] == "tensor"
    spec = spec_from_dict(ATTENTION)
    assert rec["counts"]["rank_params"] == rank_count(spec, 2).params < rec["counts"]["params"]
    comm = rec["metrics"]["communication"]["collectives"]
    assert comm["tp.allreduce"]["ranks"] == 2 and comm["tp.allreduce"]["calls_per_step"] == 8
    assert comm["tp.allreduce"]["bytes_per_step"] == tp_traffic(spec, 2)[0].bytes
    assert ("allreduce" in comm) == (dp > 1)
    (steps_file,) = (tmp_path / "results").glob("*.h5")
    measured = read_steps(steps_file)["loss"].tolist()
    expected = reference_losses(spec, dp, len(measured))
    assert measured == pytest.approx(expected, rel=1e-4), (measured, expected)


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        ("dp=3,tp=2", "run.layout='dp=3,tp=2,pp=1' is invalid: dp x tp x pp = 6 must equal the 4 ranks"),
        ("tp=4,dp=1", "run.layout.tp=4 is invalid: must divide attention.heads=2"),
        ("pp=2,schedule=zigzag", "run.layout.schedule='zigzag' is invalid: allowed: 1f1b, gpipe"),
    ],
)
def test_cli_refuses_bad_layouts_in_one_line(layout: str, says: str, tmp_path: Path) -> None:
    argv = ["run", *WORKLOAD, "heads=2", "--np", "4", "--layout", layout, "-o", str(tmp_path)]
    assert says in one_line(hpcdl(*argv))
    assert not any(tmp_path.iterdir())  # nothing ran
