"""Pipeline parallelism on ``torch.distributed.pipelining``: a model's layers split into
contiguous stages across the ranks of a pipeline, each step's batch split into micro-batches
that a named schedule runs through the stages (GPipe, 1F1B, interleaved 1F1B).

PyTorch does the work: :class:`PipelineStage` sends activations forward and their gradients
backward (point-to-point, over the pipeline's process group: gloo on CPUs, NCCL on GPUs) and
its schedules order each rank's forward and backward actions. hpcdl adds the split of its
generated models, the checks of a layout against the model (one line each), and the timing of
every stage's actions: the bubble measured (``metrics.pipeline_bubble``) beside the theoretical
one (``metrics.theoretical_bubble``), and the bytes each rank sends per step.

**The split.** The layers are a family's repeated blocks: an attention model's transformer
blocks, an MLP's hidden layers. They are dealt out in contiguous, balanced runs
(:func:`stage_layers`: the first ``layers mod stages`` stages take one more); the first stage
also runs what comes before the blocks (token and position embeddings), the last what comes
after (final norm, pooling, head) and the loss. The stages hold the model's own modules: the
same seed gives the same weights as one process. A tied language-model head would need the
first stage's token table on the last stage: refused (``tie_embeddings=false``).

**The step.** The loss is the mean cross-entropy of each micro-batch, in fp32, on the last
stage; the schedule divides the summed gradients by the micro-batches, so that a step's
gradients are those of the mean loss of the whole batch, as one process computes them. With
data parallelism beside the pipeline (``dp`` > 1) each stage is wrapped in
DistributedDataParallel over the ranks that hold the same stage, which PyTorch's stage lets
reduce during the last micro-batch's backward only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from hpcdl import metrics
from hpcdl.errors import SpecError
from hpcdl.measure.device import synchronize
from hpcdl.workloads.precision import precision as precision_of
from hpcdl.workloads.spec import Spec


@dataclass(frozen=True)
class Schedule:
    """A named pipeline schedule: PyTorch's class, and the stages each rank holds (``virtual``:
    more than one for the interleaved schedule, whose rank r holds stages r, r + pp, ...)."""

    cls: type
    virtual: int
    doc: str


SCHEDULES: dict[str, Schedule] = {
    "gpipe": Schedule(ScheduleGPipe, 1, "all forwards, then all backwards (fill and drain)"),
    "1f1b": Schedule(Schedule1F1B, 1, "one forward, one backward in the steady state (microbatches >= pp)"),
    "interleaved": Schedule(
        ScheduleInterleaved1F1B, 2, "1F1B over 2 stages per rank (Megatron's interleaved; 2 x pp <= layers)"
    ),
}
"""``layout.schedule`` -> its schedule"""


@dataclass(frozen=True)
class End:
    """What a stage runs before or after its blocks (embeddings, head): a function of the model
    and the modules it uses, which the stage holds."""

    run: Callable[[torch.Tensor], torch.Tensor]
    modules: tuple[nn.Module, ...]


@dataclass(frozen=True)
class Parts:
    """A model seen as a pipeline: ``before`` the blocks, the blocks split across the stages,
    and ``after`` them."""

    before: End | None
    blocks: list[nn.Module]
    after: End


def _attention_parts(model: nn.Module) -> Parts:
    m: Any = model  # hpcdl.workloads.families.attention.Transformer
    after = (m.final_norm,) + ((m.head,) if m.head is not None else ())
    return Parts(
        End(m.embed, (m.tokens, m.positions, m.embed_norm, m.embed_drop)),
        list(m.blocks),
        End(m.finish, after),
    )


def _mlp_parts(model: nn.Module) -> Parts:
    # nn.Sequential(Linear, ReLU, ..., Linear, ReLU, Linear): a block is a hidden layer and its ReLU
    layers = list(model)
    blocks: list[nn.Module] = [nn.Sequential(layers[i], layers[i + 1]) for i in range(0, len(layers) - 1, 2)]
    return Parts(None, blocks, End(layers[-1], (layers[-1],)))


SPLITS: dict[str, Callable[[nn.Module], Parts]] = {"attention": _attention_parts, "mlp": _mlp_parts}
"""family -> how its generated model splits into a pipeline"""


def stage_layers(layers: int, stages: int) -> list[range]:
    """The blocks of each stage: contiguous, balanced runs; the first ``layers % stages`` stages
    take one more (the last stage also runs the head and the loss)."""
    share, extra = divmod(layers, stages)
    bounds, start = [], 0
    for s in range(stages):
        end = start + share + (s < extra)
        bounds.append(range(start, end))
        start = end
    return bounds


def check(spec: Spec, pp: int, schedule: str, microbatches: int) -> None:
    """Refuse, in one line, a pipeline this model and batch cannot run (before anything starts)."""
    if schedule not in SCHEDULES:
        raise SpecError("layout.schedule", schedule, f"one of {', '.join(SCHEDULES)}")
    if pp == 1:
        return
    family = spec.family
    if family not in SPLITS:
        raise SpecError("layout.pp", pp, f"1 for the {family} family: pipelines split {' and '.join(SPLITS)}")
    chunks = pp * SCHEDULES[schedule].virtual
    layers = int(getattr(spec, "layers"))
    if chunks > layers:
        per = f" x {SCHEDULES[schedule].virtual} stages per rank ({schedule})" if chunks > pp else ""
        raise SpecError("layout.pp", pp, f"at most {family}.layers={layers} stages: pp{per} = {chunks}")
    if microbatches < 1 or spec.batch_size % microbatches:
        raise SpecError(
            "layout.microbatches", microbatches, f"a divisor of {family}.batch_size={spec.batch_size}"
        )
    if schedule == "1f1b" and microbatches < pp:
        raise SpecError("layout.microbatches", microbatches, f">= pp={pp} with schedule=1f1b")
    if schedule == "interleaved" and microbatches % max(1, microbatches // pp):
        raise SpecError(
            "layout.microbatches", microbatches, f"a multiple of its rounds microbatches // pp with pp={pp}"
        )
    if getattr(spec, "tie_embeddings", False) and getattr(spec, "head", "") == "lm":
        raise SpecError(
            f"{family}.tie_embeddings", True, "false under pipeline parallelism (the head is not on the first stage)"
        )
    if getattr(spec, "experts", 0) and getattr(spec, "expert_parallel", False):
        raise SpecError(
            f"{family}.expert_parallel", True, "false under pipeline parallelism (each stage holds its experts)"
        )
    if spec.accumulation_steps > 1:
        raise SpecError(
            f"{family}.accumulation_steps",
            spec.accumulation_steps,
            "1 under pipeline parallelism: its micro-batches accumulate the gradients",
        )
    if precision_of(spec.precision).loss_scaling:
        raise SpecError(
            f"{family}.precision", spec.precision, "not fp16 under pipeline parallelism (stages would skip steps apart)"
        )


class StageModule(nn.Module):
    """One stage's share of a model: ``before`` (first stage), a run of blocks, ``after`` (last
    stage), run in the precision's autocast. It holds the model's own modules, so its
    parameters are the model's."""

    def __init__(self, before: End | None, blocks: list[nn.Module], after: End | None, spec: Spec) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.ends = nn.ModuleList([m for end in (before, after) if end for m in end.modules])
        self._before, self._after = before, after
        self.precision = precision_of(spec.precision)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.precision
        with torch.autocast(x.device.type, dtype=p.dtype, enabled=p.autocast):
            if self._before is not None:
                x = self._before.run(x)
            x = self.blocks(x)
            return self._after.run(x) if self._after is not None else x


def stage_modules(spec: Spec, model: nn.Module, chunks: int) -> list[StageModule]:
    """``model`` (built from ``spec``) as ``chunks`` stage modules, in pipeline order."""
    parts = SPLITS[spec.family](model)
    bounds = stage_layers(len(parts.blocks), chunks)
    return [
        StageModule(
            parts.before if i == 0 else None,
            [parts.blocks[j] for j in r],
            parts.after if i == chunks - 1 else None,
            spec,
        )
        for i, r in enumerate(bounds)
    ]


class TimedStage(PipelineStage):
    """PyTorch's stage, its forward and backward actions timed (the device synchronised around
    them) and the bytes it sends counted: what the bubble and the point-to-point traffic are
    measured from."""

    busy_s: float = 0.0
    sent_bytes: int = 0
    sends: int = 0

    def _timed(self, action: Callable[[], Any]) -> Any:
        synchronize(self.device)
        t0 = time.perf_counter()
        out = action()
        synchronize(self.device)
        self.busy_s += time.perf_counter() - t0
        return out

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(lambda: super(TimedStage, self).forward_one_chunk(*args, **kwargs))

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(lambda: super(TimedStage, self).backward_one_chunk(*args, **kwargs))

    def _counted(self, ops: list[dist.P2POp]) -> list[dist.P2POp]:
        self.sent_bytes += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
        self.sends += len(ops)
        return ops

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._counted(super().get_fwd_send_ops(fwd_chunk_id))

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._counted(super().get_bwd_send_ops(bwd_chunk_id))


def pipeline_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss of one micro-batch on the last stage: mean cross-entropy in fp32, as one process
    computes it (``measure.loop.Trainer``)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


@dataclass(frozen=True)
class StepTimes:
    """One pipeline step on this rank: its wall time, the seconds its stages computed, and what
    they sent."""

    span_s: float
    busy_s: float
    sent_bytes: int
    sends: int

    @property
    def bubble(self) -> float:
        return metrics.pipeline_bubble(self.busy_s, self.span_s)


class Pipeline:
    """This rank's stages of a pipeline over ``pp`` ranks (its place ``pp_rank`` among them,
    communicating over ``group``) and the schedule that steps them. With ``dp_group`` each
    stage is also data-parallel over that group (DistributedDataParallel)."""

    def __init__(
        self,
        spec: Spec,
        model: nn.Module,
        *,
        pp: int,
        pp_rank: int,
        schedule: str,
        microbatches: int,
        device: torch.device,
        group: dist.ProcessGroup | None = None,
        dp_group: dist.ProcessGroup | None = None,
    ) -> None:
        check(spec, pp, schedule, microbatches)
        kind = SCHEDULES[schedule]
        chunks = pp * kind.virtual
        self.schedule_name, self.microbatches, self.pp, self.virtual = schedule, microbatches, pp, kind.virtual
        all_modules = stage_modules(spec, model, chunks)
        self.indices = [pp_rank + k * pp for k in range(kind.virtual)]
        self.modules: list[nn.Module] = []
        for i in self.indices:
            module: nn.Module = all_modules[i].to(device)
            if dp_group is not None and dist.get_world_size(dp_group) > 1:
                from torch.nn.parallel import DistributedDataParallel

                ids = [device.index] if device.type == "cuda" else None
                module = DistributedDataParallel(module, device_ids=ids, process_group=dp_group)
            self.modules.append(module)
        self.stages = [TimedStage(m, i, chunks, device, group=group) for m, i in zip(self.modules, self.indices)]
        self.first = 0 in self.indices
        self.last = chunks - 1 in self.indices
        if kind.virtual == 1:
            self.schedule = kind.cls(self.stages[0], microbatches, loss_fn=pipeline_loss)
        else:
            self.schedule = kind.cls(self.stages, microbatches, loss_fn=pipeline_loss)

    def parameters(self) -> list[nn.Parameter]:
        """The parameters this rank's stages hold (its optimizer's)."""
        return [p for m in self.modules for p in m.parameters()]

    def train(self) -> None:
        for m in self.modules:
            m.train()

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor | None, StepTimes]:
        """One step of the whole batch ``x``, ``y`` through the pipeline: every micro-batch's
        forward and backward, in the schedule's order; the gradients are left on the
        parameters. Returns the batch's mean loss (on the rank of the last stage; None
        elsewhere) and this rank's times."""
        for s in self.stages:
            s.busy_s, s.sent_bytes, s.sends = 0.0, 0, 0
        args = (x,) if self.first else ()
        losses: list[torch.Tensor] = []
        t0 = time.perf_counter()
        if self.last:
            self.schedule.step(*args, target=y, losses=losses, return_outputs=False)
        else:
            self.schedule.step(*args, return_outputs=False)
        synchronize(self.stages[0].device)
        span = time.perf_counter() - t0
        times = StepTimes(
            span,
            sum(s.busy_s for s in self.stages),
            sum(s.sent_bytes for s in self.stages),
            sum(s.sends for s in self.stages),
        )
        loss = torch.stack(losses).detach().mean() if losses else None
        return loss, times

    @property
    def theoretical_bubble(self) -> float:
        return metrics.theoretical_bubble(self.pp, self.microbatches, self.virtual)
