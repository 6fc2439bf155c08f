"""Pipeline parallelism (hpcdl.parallel.pipeline, .schedule; harness.pipelined): the split of the
attention and MLP models into stages, the bubble and point-to-point formulas, the refusals of
what a pipeline cannot run, and real ranks (mpirun, gloo) whose every schedule trains as one
process does, through the Python API and through ``hpcdl run --layout``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hpcdl_cli import hpcdl, one_line, unwrapped

from hpcdl import metrics
from hpcdl.errors import SpecError
from hpcdl.parallel import layout as layouts
from hpcdl.parallel.launch import mpi_env, mpirun_path
from hpcdl.parallel.pipeline import SCHEDULES, check, shared_parameters, stage_layers, stage_modules
from hpcdl.parallel.tensor import stage_tp_traffic
from hpcdl.records.audit import audit
from hpcdl.records.loader import read_record
from hpcdl.records.store import read_steps
from hpcdl.results.report.plots import by_dimension
from hpcdl.results.report.write import write_report
from hpcdl.workloads import recipes
from hpcdl.workloads.registry import spec_from_dict

ATTENTION = {
    "family": "attention", "layers": 4, "width": 32, "heads": 2, "seq_len": 8, "vocab": 50, "batch_size": 8
}  # fmt: skip
TIED = {**ATTENTION, "tie_embeddings": True}  # GPT-2's lm head: the token table on both ends
MLP = {"family": "mlp", "layers": 4, "width": 32, "input_size": 16, "output_size": 10, "batch_size": 8}
CLI_MLP = ["--workload", "mlp", "layers=4", "width=32", "input_size=16", "output_size=10", "batch_size=8"]
RUN = ["--warmup", "2", "--steps", "3", "--min-duration", "0"]


def test_layers_are_dealt_in_contiguous_balanced_runs() -> None:
    assert stage_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layers(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]  # the first take the extra
    assert stage_layers(3, 3) == [range(0, 1), range(1, 2), range(2, 3)]


@pytest.mark.parametrize(
    "knobs",
    [
        ATTENTION,
        MLP,
        {**ATTENTION, "norm": "post", "head": "cls"},
        {**ATTENTION, "experts": 2, "expert_parallel": False},
        TIED,
    ],
)
@pytest.mark.parametrize("chunks", [2, 3, 4])
def test_stages_hold_the_model_once_and_compute_it(knobs: dict, chunks: int) -> None:
    """Every parameter of the model in exactly one stage (a tied head's token table in the
    first and the last), and the stages run one after the other give the model's own logits:
    the split loses and repeats nothing else."""
    spec = spec_from_dict(knobs)
    model = spec.build().eval()
    stages = stage_modules(spec, model, chunks)
    held = [id(p) for s in stages for p in s.parameters()]
    twice = [id(p) for p in shared_parameters(spec, model)]
    assert len(twice) == (knobs is TIED)
    assert sorted(held) == sorted([id(p) for p in model.parameters()] + twice)
    x = spec.sample_inputs(3, torch.Generator().manual_seed(0), torch.device("cpu"))
    out = x
    for s in stages:
        out = s.eval()(out)
    assert torch.equal(out, model(x))


def test_bubble_formulas() -> None:
    assert metrics.theoretical_bubble(2, 4) == pytest.approx(1 / 5)
    assert metrics.theoretical_bubble(4, 8, virtual=2) == pytest.approx(3 / 19)  # interleaving shrinks it
    assert metrics.theoretical_bubble(1, 4) == 0
    assert metrics.pipeline_bubble(0.75, 1.0) == pytest.approx(0.25)
    assert metrics.pipeline_p2p_bytes(1024, 4) == 8192  # 4 activations forward, 4 gradients back


def test_layout_names_the_schedules_the_pipeline_runs() -> None:
    assert set(layouts.SCHEDULES) == set(SCHEDULES)


@pytest.mark.parametrize(
    ("knobs", "pp", "schedule", "m", "field"),
    [
        (MLP, 5, "gpipe", 4, "run.layout.pp"),  # more stages than layers
        (MLP, 3, "interleaved", 4, "run.layout.pp"),  # 2 stages per rank: 6 > 4 layers
        (MLP, 2, "zerobubble", 4, "run.layout.schedule"),
        (MLP, 2, "gpipe", 3, "run.layout.microbatches"),  # 3 does not divide the batch of 8
        (MLP, 4, "1f1b", 2, "run.layout.microbatches"),  # 1F1B needs microbatches >= pp
        ({**MLP, "accumulation_steps": 2}, 2, "gpipe", 4, "mlp.accumulation_steps"),
        ({**MLP, "precision": "fp16"}, 2, "gpipe", 4, "mlp.precision"),
        ({"family": "cnn"}, 2, "gpipe", 4, "run.layout.pp"),
    ],
)
def test_what_a_pipeline_cannot_run_is_one_line(
    knobs: dict, pp: int, schedule: str, m: int, field: str
) -> None:
    with pytest.raises(SpecError) as e:
        check(spec_from_dict(knobs), pp, schedule, m)
    assert e.value.field == field and "\n" not in str(e.value)


def test_class_l_pipelines_are_runnable() -> None:
    """Every default layout of class L that splits a model into stages passes the pipeline's
    checks (gpt2-xl: a tied head, 48 blocks, batch 4 in 4 micro-batches)."""
    suite = recipes.suite("L")
    named = [
        (name, layouts.parse_layout(text)) for name, kinds in suite.layouts.items() for text in kinds.values()
    ]
    piped = [(name, lay) for name, lay in named if lay.pp > 1]
    assert piped
    for name, lay in piped:
        check(spec_from_dict(suite.workloads[name]), lay.pp, lay.schedule, lay.chunks)


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        ("pp=8", "run.layout.pp=8 is invalid: at most 4, the mlp model's blocks"),
        ("pp=2,schedule=zigzag", "run.layout.schedule='zigzag' is invalid"),
        ("pp=2,microbatches=3", "run.layout.microbatches=3 is invalid: must divide mlp.batch_size=8"),
        ("pp=2,schedule=1f1b,microbatches=1", "run.layout.microbatches=1 is invalid: >= pp=2"),
        ("pp=2,tp=2", "run.layout.tp=2 is invalid: 1 with pp > 1 for mlp: its tensor-parallel pairs span"),
        ("dp=4", "run.backend='pipeline' is invalid: only with a layout of pp > 1"),
    ],
)
def test_a_bad_layout_is_one_line_before_launching(layout: str, says: str, tmp_path: Path) -> None:
    np = "8" if "pp=8" in layout else "4"  # layouts that fit the ranks: the model refuses them
    backend = ["--backend", "pipeline"] if layout == "dp=4" else []
    argv = ["run", *CLI_MLP, "--np", np, "--layout", layout, *backend, *RUN, "-o", str(tmp_path)]
    assert says in one_line(hpcdl(*argv))
    assert not any(tmp_path.iterdir())  # nothing ran


SCRIPT = """
import json, sys, torch
from hpcdl.measure.data import make_batch
from hpcdl.parallel.backends.torch_ddp import DistGroup
from hpcdl.parallel.layout import Layout, device_mesh, fit_layout
from hpcdl.parallel.pipeline import pipeline_loss
from hpcdl.parallel.schedule import Pipeline
from hpcdl.parallel.tensor import local_tensor
from hpcdl.parallel.world import init_world
from hpcdl.workloads.registry import spec_from_dict

torch.set_num_threads(1)
world = init_world()
device = torch.device("cpu")
group = DistGroup(world, device)
tp = int(sys.argv[3])
layout = fit_layout(Layout(tp=tp, pp=2), world.size)
mesh = device_mesh(layout, "cpu")
out = []
for knobs in json.loads(sys.argv[1]):
    for schedule in ("gpipe", "1f1b", "interleaved"):
        spec = spec_from_dict(knobs)
        pipe = Pipeline(spec, spec.build(), pp=2, pp_rank=layout.coords(world.rank)["pp"], schedule=schedule,
                        microbatches=4, device=device, group=mesh.get_group("pp"),
                        tp_mesh=mesh["tp"] if tp > 1 else None)
        opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2)
        ref = spec.build()  # one process: the whole batch at once
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        losses, ref_losses = [], []
        for step in range(3):
            x, y = make_batch(spec, device=device, stream=step)
            loss, pending = pipe.step(x, y)
            times = pending()  # (a CPU: the stage clocks' host readings, nothing to wait for)
            pipe.reduce_gradients()
            opt.step()
            opt.zero_grad()
            ref_loss = pipeline_loss(ref(x), y)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            losses.append(None if loss is None else float(loss))
            ref_losses.append(float(ref_loss))
        held = sum(local_tensor(p).numel() for p in pipe.parameters())
        out.append({"family": spec.family, "tied": len(pipe.shared), "schedule": schedule,
                    "losses": losses, "ref": ref_losses, "held": held, "params": spec.count().params,
                    "sent": times.sent_bytes, "busy": times.busy_s, "span": times.span_s})
group.close()
# a file per rank: two ranks' long lines on one forwarded stdout can interleave
with open(f"{sys.argv[2]}/rank{world.rank}.json", "w") as f:
    json.dump({"rank": world.rank, "runs": out}, f)
"""


@pytest.mark.mpi
@pytest.mark.parametrize(
    "tp",
    [1, pytest.param(2, marks=pytest.mark.slow(reason="the same schedules with tp=2 inside each stage"))],
)
def test_every_schedule_trains_as_one_process_does(tp: int, tmp_path: Path) -> None:
    """pp=2 with GPipe, 1F1B and interleaved 1F1B (two stages per rank), attention (also with a
    tied head, its table's gradients summed between the ends) and MLP; and tp=2 x pp=2 on 4
    ranks, each stage's blocks split Megatron-style: three AdamW steps give one process's
    losses (the whole batch at once against four micro-batches: rounding apart), and each
    boundary carries each micro-batch's activations forward and their gradients back
    (``metrics.pipeline_p2p_bytes``), once per rank of a tensor-parallel group."""
    script = tmp_path / "pipeline_ranks.py"
    script.write_text(SCRIPT)
    specs = [ATTENTION, MLP, TIED] if tp == 1 else [ATTENTION, TIED]  # tp x pp: attention's
    cmd = [mpirun_path(), "-np", str(2 * tp), "--oversubscribe", sys.executable, str(script)]
    args = [*cmd, json.dumps(specs), str(tmp_path), str(tp)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=180, env=mpi_env())
    assert p.returncode == 0, p.stderr[-3000:]
    results = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("rank*.json"))]
    ranks = {r["rank"]: r["runs"] for r in results}
    assert sorted(ranks) == list(range(2 * tp))
    tied = [r["tied"] for r in ranks[tp]]
    assert tied == [0] * 3 * (len(specs) - 1) + [1] * 3  # the tied head's table: both ends
    for shard in range(tp):  # rank shard holds stage 0, rank tp + shard stage 1 (tp innermost)
        for first, last in zip(ranks[shard], ranks[tp + shard], strict=True):
            assert first["losses"] == [None] * 3  # only the last stage computes the loss
            which = (last["family"], last["tied"], last["schedule"], tp)
            assert last["losses"] == pytest.approx(last["ref"], rel=1e-5), which
            assert last["losses"][-1] < last["losses"][0]
            knobs = ATTENTION if last["family"] == "attention" else MLP  # TIED: ATTENTION's sizes
            per_sample = knobs["seq_len"] * knobs["width"] if "seq_len" in knobs else knobs["width"]
            activation = knobs["batch_size"] // 4 * per_sample * 4  # fp32
            boundaries = 3 if last["schedule"] == "interleaved" else 1  # 4 stages on 2 ranks, or 2
            sent = first["sent"] + last["sent"]
            assert sent == boundaries * metrics.pipeline_p2p_bytes(activation, 4), last["schedule"]
            for r in (first, last):
                assert 0 < r["busy"] < r["span"]
    if tp > 1:  # each rank holds its shards: a stage's share of the model, less than the whole
        for a, b in zip(ranks[0], ranks[tp], strict=True):
            assert a["held"] + b["held"] < a["params"]


@pytest.mark.mpi
@pytest.mark.slow(reason="a pipeline run per schedule")
@pytest.mark.parametrize("schedule", ["gpipe"])  # 1f1b: the dp x pp test; every schedule: above
def test_a_pipeline_run_records_its_schedule_and_bubble(schedule: str, tmp_path: Path) -> None:
    """``hpcdl run --np 2 --layout pp=2``: a valid, audited record whose losses are those of
    one process, with the schedule, both bubbles and the point-to-point bytes of a step."""
    one = hpcdl("run", *CLI_MLP, *RUN, "-o", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-2000:]
    layout = f"pp=2,schedule={schedule},microbatches=4"
    p = hpcdl("run", *CLI_MLP, *RUN, "--np", "2", "--layout", layout, "-o", str(tmp_path / "pp"))
    assert p.returncode == 0, p.stderr[-3000:]
    (path,) = (tmp_path / "pp").glob("*.json")
    record = read_record(path)
    assert audit(record).problems == ()
    r = record.result
    assert r.validity.passed, r.validity.failed
    assert r.validity.check("one_step_equivalence") and r.validity.check("parameters_identical")
    assert r.settings.backend == "pipeline" and r.settings.layout == f"dp=1,tp=1,{layout}"
    assert set(r.metrics.phases_s) == {"data", "schedule", "allreduce", "optimizer"}
    pipe = r.metrics.pipeline
    assert pipe is not None and (pipe.schedule, pipe.stages, pipe.microbatches) == (schedule, 2, 4)
    assert pipe.bubble_theoretical == pytest.approx(1 / 5)
    assert all(0 < x.bubble < 1 for x in pipe.per_rank)
    assert pipe.bubble_measured == pytest.approx(sum(x.bubble for x in pipe.per_rank) / 2)
    assert pipe.p2p_bytes_per_step == metrics.pipeline_p2p_bytes(2 * 32 * 4, 4)  # 2 samples x 32 wide
    sends = r.metrics.communication.collectives["pp.send"]  # a rank's sends, timed after training
    assert (sends.ranks, sends.calls_per_step, sends.bytes_per_step) == (2, 4, 4 * 2 * 32 * 4)
    assert sends.seconds_per_step > 0 and sends.busbw_bytes_per_s == sends.algbw_bytes_per_s
    assert sum(x.params for x in pipe.per_rank) == r.counts.params
    (single,) = (tmp_path / "one").glob("*.json")
    ours = read_steps(path.parent / json.loads(path.read_text())["steps_file"])["loss"]
    theirs = read_steps(single.parent / json.loads(single.read_text())["steps_file"])["loss"]
    assert ours == pytest.approx(theirs, rel=1e-5)


@pytest.mark.mpi
@pytest.mark.slow(reason="eight ranks (dp x tp x pp) on two cores")
def test_data_tensor_and_pipeline_parallelism_step_as_one_process(tmp_path: Path) -> None:
    """dp=2 x tp=2 x pp=2 on 8 ranks, a tied head: two pipelines of two stages, each stage's
    blocks split across a tensor-parallel pair, each stage's gradients averaged across the
    pipelines; the run checks itself against one process, its replicas stay identical, and the
    record names every dimension's traffic."""
    layout = "dp=2,tp=2,pp=2,schedule=1f1b,microbatches=2"
    cli = ["--workload", "attention", *(f"{k}={v}" for k, v in TIED.items() if k != "family")]
    p = hpcdl("run", *cli, *RUN, "--np", "8", "--layout", layout, "-o", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    (path,) = tmp_path.glob("*.json")
    record = read_record(path)
    assert audit(record).problems == ()
    r = record.result
    assert r.validity.passed, r.validity.failed
    assert r.validity.check("one_step_equivalence") and r.validity.check("parameters_identical")
    assert r.settings.global_batch == 2 * 8 and r.settings.layout == layout
    pipe = r.metrics.pipeline
    assert pipe is not None and [x.pp_rank for x in pipe.per_rank] == [0] * 4 + [1] * 4  # (pp, dp, tp)
    comm = r.metrics.communication
    assert comm.grad_bytes_per_step == 4 * pipe.per_rank[0].params
    assert r.metrics.phases_s["allreduce"].median > 0
    tp = comm.collectives["tp.allreduce"]  # 2 blocks a stage, 2 + 2 allreduces each, per micro-batch
    (expected,) = stage_tp_traffic(spec_from_dict(TIED), 2, 2, 2)
    assert (tp.ranks, tp.calls_per_step, tp.bytes_per_step) == (2, 2 * 4 * 2, expected.bytes)
    assert tp.seconds_per_step > 0
    sends = comm.collectives["pp.send"]  # 2 micro-batches of 4 sequences of 8 x 32 fp32, one way
    assert (sends.ranks, sends.calls_per_step, sends.bytes_per_step) == (2, 2, 2 * 4 * 8 * 32 * 4)
    said = unwrapped(p.stdout)  # the layout line
    assert all(word in said for word in ("tp.allreduce", "pp bubble", "dp allreduce"))
    # the report's figure of where the step goes per dimension
    parts = by_dimension(r)
    assert parts["tp collectives"] == tp.seconds_per_step and parts["dp allreduce"] == comm.exposed_s
    assert parts["pp bubble"] == pytest.approx(pipe.bubble_measured * r.metrics.phases_s["schedule"].median)
    assert 0 < parts["computation and the rest"] < r.metrics.step_time_s.median
    write_report([tmp_path], tmp_path / "report", say=lambda _: None)
    assert (tmp_path / "report" / "layouts.png").stat().st_size > 0
