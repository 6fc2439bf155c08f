"""A pipeline-parallel rank's part of a run (``hpcdl.parallel.pipeline``): the pipeline's plan
for the one driver (``harness.plan``, ``runner.measure_rank``): its check against one process,
its stages and their timed loop, its traffic and what it hands rank 0.

A pipeline's step does not split into a forward and a backward: the schedule interleaves
every micro-batch's forward and backward across the stages. Its phases are therefore ``data``
(the batch), ``schedule`` (the whole schedule: forwards, backwards, point-to-point sends and
waits, the bubble), ``allreduce`` (the dp replicas averaging each stage's gradients; 0 with
dp = 1) and ``optimizer``; where the schedule's time goes is told by the stages' own timing
instead (``StageLog``: busy against idle, the bubble).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hpcdl.device import synchronize
from hpcdl.harness.parts import Hooks, make_optimizer
from hpcdl.measure.checks import CHECK_STREAM, EQUIVALENCE_TOLERANCE, parameter_digest
from hpcdl.measure.config import RunConfig
from hpcdl.measure.data import device_pool, make_batch
from hpcdl.measure.execution import Execution, prepare
from hpcdl.measure.loop import IN_STEP_PHASES, BatchSource, StepLog, Trainer
from hpcdl.measure.measurement import Check
from hpcdl.parallel.backends import Traffic
from hpcdl.parallel.layout import Layout, device_mesh
from hpcdl.parallel.pipeline import StageLog, StepTimes, pipeline_loss
from hpcdl.parallel.schedule import Pipeline
from hpcdl.parallel.tensor import local_tensor, stage_tp_traffic, time_collective, whole
from hpcdl.parallel.world import World
from hpcdl.workloads.spec import Spec

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

PIPELINE_PHASES = ("data", "schedule", "allreduce", "optimizer")
"""the phases of a pipeline step (see the module's docstring)"""


class PipelineTrainer(Trainer):
    """The timed loop of one rank's stages: each step a batch through the pipeline's schedule,
    then the optimizer. Every rank records the losses, which the last stage computes."""

    phases = PIPELINE_PHASES

    def __init__(
        self,
        *,
        pipeline: Pipeline,
        optimizer: torch.optim.Optimizer,
        source: BatchSource,
        device: torch.device,
        precision: str,
        group: dist.ProcessGroup | None,
        delay_s: float = 0.0,
        on_step: Callable[[], None] | None = None,
        before_window: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(
            model=nn.ModuleList(pipeline.modules),
            optimizer=optimizer,
            source=source,
            device=device,
            precision=precision,
            delay_s=delay_s,
            on_step=on_step,
            before_window=before_window,
        )
        self.pipeline, self.group = pipeline, group
        self.times: list[StepTimes] = []

    def step(self) -> tuple[float, dict[str, float], dict[str, float]]:
        clock = self.clock
        t0 = time.perf_counter()
        marks = [clock.mark()]
        x, y = self.source.next()
        marks.append(clock.mark())
        if self.delay_s:  # a slow rank made on purpose (HPCDL_TEST_SLOW_RANK), in its schedule
            time.sleep(self.delay_s)
        loss, times = self.pipeline.step(x, y)
        marks.append(clock.mark())
        self.pipeline.reduce_gradients()
        marks.append(clock.mark())
        self.optimizer.step()
        self.optimizer.zero_grad()
        marks.append(clock.mark())
        synchronize(self.device)  # the step's one wait for the device
        wall = time.perf_counter() - t0
        # the stages before the last have no loss: theirs is filled in after the run
        self._losses.append(loss if loss is not None else torch.tensor(float("nan")))
        self.times.append(times())
        if self.on_step is not None:
            self.on_step()
        phases = {
            p: clock.seconds(a, b) for p, a, b in zip(PIPELINE_PHASES, marks[:-1], marks[1:], strict=True)
        }
        clock.recycle(*marks)
        return wall, phases, dict.fromkeys(IN_STEP_PHASES, 0.0)

    def local_backward_s(self, steps: int) -> list[float]:
        return []  # a stage's backward waits for its neighbour's gradients: not computation alone

    def run(self, *args: Any, **kwargs: Any) -> StepLog:
        """The base loop; then every rank of the pipeline takes the last stage's losses."""
        log = super().run(*args, **kwargs)
        shared: list[Any] = [log.losses]
        dist.broadcast_object_list(shared, group=self.group, group_src=self.pipeline.pp - 1)
        log.losses = shared[0]
        return log

    def stage_log(self, timed_steps: int, dp_grad_bytes: int) -> StageLog:
        """What this rank's stages did in the last ``timed_steps`` steps."""
        timed = self.times[-timed_steps:]
        return StageLog(
            pp_rank=self.pipeline.indices[0],
            stages=list(self.pipeline.indices),
            busy_s=[t.busy_s for t in timed],
            span_s=[t.span_s for t in timed],
            sent_bytes=timed[-1].sent_bytes,
            sends=timed[-1].sends,
            dp_grad_bytes=dp_grad_bytes,
            params=sum(local_tensor(p).numel() for p in self.pipeline.parameters()),
        )


@dataclass(frozen=True)
class Groups:
    """A rank's groups in the layout's mesh: its pipeline's, its stage's data-parallel replicas'
    (dp > 1) and its tensor-parallel group's (tp > 1, as the mesh DTensor shards over)."""

    pp: dist.ProcessGroup
    dp: dist.ProcessGroup | None
    tp: DeviceMesh | None


def _groups(layout: Layout, device: torch.device) -> Groups:
    mesh = device_mesh(layout, device.type)
    return Groups(
        mesh.get_group("pp"),
        mesh.get_group("dp") if layout.dp > 1 else None,
        mesh["tp"] if layout.tp > 1 else None,
    )


def pipeline_equivalence(
    spec: Spec, layout: Layout, world: World, device: torch.device, groups: Groups
) -> Check:
    """One SGD step of the whole layout (every pipeline on its own shard) against one process
    stepping on the global batch from the same weights: each rank's stage parameters must
    agree with the one process's. The one process runs the same micro-batches one after the
    other, each loss divided by their number (shapes as the stages see them: see
    ``checks.one_step_equivalence``). In eval mode: no dropout."""
    m = layout.chunks
    small = spec.replace(batch_size=m * min(spec.batch_size // m, 2), precision="fp32")
    shards = [make_batch(small, device=device, stream=CHECK_STREAM + d) for d in range(layout.dp)]
    model = small.build().to(device).eval()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    pipe = Pipeline(
        small,
        model,
        pp=layout.pp,
        pp_rank=layout.coords(world.rank)["pp"],
        schedule=layout.schedule,
        microbatches=m,
        device=device,
        group=groups.pp,
        dp_group=groups.dp,
        tp_mesh=groups.tp,
    )
    pipe.step(*shards[layout.coords(world.rank)["dp"]])
    pipe.reduce_gradients()
    torch.optim.SGD(pipe.parameters(), lr=0.1).step()
    mine = {id(p) for p in pipe.parameters()}
    # a tensor-parallel shard is gathered whole (its group's ranks hold the same stage: the
    # same parameters in the same order)
    stepped = {n: whole(p.detach()) for n, p in model.named_parameters() if id(p) in mine}

    ref = small.build().to(device).eval()
    micro = [(x, y) for xs, ys in shards for x, y in zip(xs.chunk(m), ys.chunk(m), strict=True)]
    for x, y in micro:
        (pipeline_loss(ref(x), y) / len(micro)).backward()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    synchronize(device)

    expected = dict(ref.named_parameters())
    update = max(float((expected[n].detach() - p0).abs().max()) for n, p0 in start.items())
    diff = max(float((p - expected[n].detach()).abs().max()) for n, p in stepped.items())
    worst = max(world.allgather(diff / update if update > 0 else float("inf")))
    return Check(
        "one_step_equivalence",
        worst <= EQUIVALENCE_TOLERANCE,
        f"{world.size} ranks as {layout} vs 1 process on the global batch: max parameter "
        f"difference {worst:.2e} of the update (tolerance {EQUIVALENCE_TOLERANCE:g})",
    )


def pipeline_digest(model: nn.Module, pipe: Pipeline, layout: Layout, world: World) -> str:
    """The digest of the whole model as this rank's data-parallel replica holds it: every
    stage's (every tensor-parallel shard's) parameter digest, in stage (and shard) order
    (``records.build`` then finds every replica identical, or not)."""
    mine = {id(p) for p in pipe.parameters()}
    own = parameter_digest([(n, local_tensor(p)) for n, p in model.named_parameters() if id(p) in mine])
    everyone = world.allgather((layout.coords(world.rank), own))
    replica = layout.coords(world.rank)["dp"]
    ordered = sorted((c["pp"], c["tp"], d) for c, d in everyone if c["dp"] == replica)
    return hashlib.sha256("".join(d for *_, d in ordered).encode()).hexdigest()


class PipelinePlan:
    """The strategy of a layout with pipeline stages (``harness.plan.Plan``): this rank's stages
    of the model, trained by the pipeline's schedule; their sends, and tensor parallelism's
    allreduces in every block (tp x pp), timed after training on their groups. The default
    process group is up (the pipeline's backend started it)."""

    def __init__(self, layout: Layout, world: World, device: torch.device) -> None:
        self.layout = layout
        self.groups = _groups(layout, device)
        self.streams = layout.dp  # the first and the last stage of a pipeline draw the same batches
        self.shape = f" in {layout.pp} stages"
        self._reduced = 0

    def check(self, spec: Spec, world: World, device: torch.device) -> Check:
        return pipeline_equivalence(spec, self.layout, world, device, self.groups)

    def build(
        self,
        spec: Spec,
        cfg: RunConfig,
        device: torch.device,
        world: World,
        execution: Execution,
        hooks: Hooks,
    ) -> tuple[Trainer, dict[str, Any]]:
        layout, coords = self.layout, self.layout.coords(world.rank)
        self.spec, self.model = spec, prepare(spec.build(), execution)
        self.pipe = Pipeline(
            spec,
            self.model,
            pp=layout.pp,
            pp_rank=coords["pp"],
            schedule=layout.schedule,
            microbatches=layout.chunks,
            device=device,
            group=self.groups.pp,
            dp_group=self.groups.dp,
            tp_mesh=self.groups.tp,
        )
        self.pipe.release_others(self.model)
        own = self.pipe.parameters()
        if layout.dp > 1:
            self._reduced = sum(local_tensor(p).numel() * p.element_size() for p in own)
        # one stream per replica: every stage of a pipeline reads the same batches
        learnable = cfg.data == "learnable"
        source = device_pool(spec, device, cfg.pool_batches, learnable=learnable, stream=coords["dp"])
        self.trainer = PipelineTrainer(
            pipeline=self.pipe,
            optimizer=make_optimizer(own, cfg, execution.fused_optimizer),
            source=source,
            device=device,
            precision=spec.precision,
            group=self.groups.pp,
            delay_s=hooks.delay_s,
            on_step=hooks.on_step,
            before_window=hooks.before_window,
        )
        return self.trainer, {}

    def traffic(self) -> list[Traffic]:
        """The stages' sends of the last step, and the tensor-parallel allreduces of this rank's
        blocks (tp > 1), each micro-batch making its own calls."""
        last = self.trainer.times[-1]
        blocks = sum(len(m.blocks) for m in self.pipe.modules)
        layout = self.layout
        tp = stage_tp_traffic(self.spec, blocks, layout.tp, layout.chunks)
        return [Traffic("pp.send", last.sent_bytes, last.sends)] + [
            Traffic(f"tp.{t.collective}", t.bytes, t.calls) for t in tp
        ]

    def reduced_bytes(self) -> int:
        return self._reduced

    def time_traffic(self, traffic: list[Traffic], world: World, device: torch.device) -> dict[str, float]:
        out = {}
        for t in traffic:
            if t.collective == "pp.send":
                out[t.collective] = self.pipe.time_sends(t.bytes // max(t.calls, 1))
            else:
                assert self.groups.tp is not None  # tp traffic only with tp > 1
                out[t.collective] = time_collective(t, self.groups.tp.get_group(), device)
        return out

    def digest(self, world: World) -> str:
        return pipeline_digest(self.model, self.pipe, self.layout, world)

    def stage_log(self, steps: int) -> StageLog:
        return self.trainer.stage_log(steps, self._reduced)
