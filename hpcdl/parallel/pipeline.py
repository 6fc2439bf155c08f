"""Pipeline parallelism on ``torch.distributed.pipelining``: a model's layers split into
contiguous stages across the ranks of a pipeline, each step's batch split into micro-batches
that a named schedule runs through the stages (GPipe, 1F1B, interleaved 1F1B).

PyTorch does the work: :class:`PipelineStage` sends activations forward and their gradients
backward (point-to-point, over the pipeline's process group: gloo on CPUs, NCCL on GPUs) and
its schedules order each rank's forward and backward actions. hpcdl adds the split of its
generated models, the checks of a layout against the model (one line each), and the timing of
every stage's actions: the bubble measured (``metrics.pipeline_bubble``) beside the theoretical
one (``metrics.theoretical_bubble``), and the bytes each rank sends per step.

**The split.** The layers are a family's repeated blocks, as the family's own file says
(``Spec.pp_parts``: an attention model's transformer blocks, an MLP's hidden layers). They are
dealt out in contiguous, balanced runs (:func:`stage_layers`: the first ``layers mod stages``
stages take one more); the first stage also runs what comes before the blocks (token and
position embeddings), the last what comes after (final norm, pooling, head) and the loss. The
stages hold the model's own modules: the same seed gives the same weights as one process. A
tied language-model head (GPT-2's, BERT's) multiplies by the token table of the first stage:
the last stage holds its own copy (its rank built the same weights), and after each schedule
the two ends sum their gradients of it (Megatron's way), so both copies take one process's
update.

**The step.** The loss is the mean cross-entropy of each micro-batch, in fp32, on the last
stage; the schedule divides the summed gradients by the micro-batches, so that a step's
gradients are those of the mean loss of the whole batch, as one process computes them. With
data parallelism beside the pipeline (``dp`` > 1) the ranks that hold the same stage then
average its gradients in one flat allreduce (DistributedDataParallel, which PyTorch's stage
supports, loses count of its parameters when the schedule's first step also runs a backward to
infer shapes: torch 2.13).

This module is the plan (split, schedules, checks, what a rank reports); the stages and the
schedule that run it are ``hpcdl.parallel.schedule``'s (torch's pipelining takes seconds to
import: only a pipeline run pays for it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hpcdl import metrics
from hpcdl.errors import SpecError
from hpcdl.parallel.layout import FIELD
from hpcdl.workloads.parallelism import End
from hpcdl.workloads.precision import precision as precision_of
from hpcdl.workloads.spec import Spec


@dataclass(frozen=True)
class Schedule:
    """A named pipeline schedule: PyTorch's class (in ``torch.distributed.pipelining``), and the
    stages each rank holds (``virtual``: 2 for the interleaved schedule, whose rank r holds
    stages r and r + pp)."""

    torch_class: str
    virtual: int


SCHEDULES: dict[str, Schedule] = {
    "gpipe": Schedule("ScheduleGPipe", 1),  # all forwards, then all backwards (fill and drain)
    "1f1b": Schedule("Schedule1F1B", 1),  # one forward, one backward in the steady state
    "interleaved": Schedule("ScheduleInterleaved1F1B", 2),  # Megatron's interleaved 1F1B
}
"""``run.layout``'s ``schedule`` -> its schedule"""


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
        raise SpecError(f"{FIELD}.schedule", schedule, f"one of {', '.join(SCHEDULES)}")
    if pp == 1:
        return
    family, virtual = spec.family, SCHEDULES[schedule].virtual
    blocks = spec.pp_blocks()
    if not blocks:
        raise SpecError(f"{FIELD}.pp", pp, f"1: the {family} family does not split into stages")
    if pp * virtual > blocks:
        per = f" x {virtual} stages per rank ({schedule})" if virtual > 1 else ""
        raise SpecError(
            f"{FIELD}.pp", pp, f"at most the {family} model's {blocks} blocks: pp{per} = {pp * virtual}"
        )
    if spec.batch_size % microbatches:
        raise SpecError(
            f"{FIELD}.microbatches", microbatches, f"must divide {family}.batch_size={spec.batch_size}"
        )
    if schedule == "1f1b" and microbatches < pp:
        raise SpecError(f"{FIELD}.microbatches", microbatches, f">= pp={pp} with schedule=1f1b")
    rounds = max(1, microbatches // pp)
    if schedule == "interleaved" and microbatches % rounds:
        raise SpecError(
            f"{FIELD}.microbatches",
            microbatches,
            f"a multiple of microbatches // pp = {rounds} with schedule=interleaved",
        )
    for knob, bad, why in _REFUSED:
        value = getattr(spec, knob, None)
        if value is not None and bad(spec):
            raise SpecError(f"{family}.{knob}", value, f"{why} under pipeline parallelism")


_REFUSED: list[tuple[str, Callable[[Any], bool], str]] = [
    (
        "expert_parallel",
        lambda s: s.experts and s.expert_parallel,
        "false (each stage holds its own experts)",
    ),
    (
        "accumulation_steps",
        lambda s: s.accumulation_steps > 1,
        "1 (the micro-batches accumulate the gradients)",
    ),
    (
        "precision",
        lambda s: precision_of(s.precision).loss_scaling,
        "not fp16 (stages would skip steps apart)",
    ),
]
"""knobs a pipeline cannot take: (knob, when its value is refused, what is allowed)"""


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


def shared_parameters(spec: Spec, model: nn.Module) -> tuple[nn.Parameter, ...]:
    """The parameters of ``model`` that its first and its last stage both hold (``Parts.shared``)."""
    return spec.pp_parts(model).shared


def stage_modules(spec: Spec, model: nn.Module, chunks: int) -> list[StageModule]:
    """``model`` (built from ``spec``) as ``chunks`` stage modules, in pipeline order."""
    parts = spec.pp_parts(model)
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


@dataclass(frozen=True)
class StageLog:
    """What one rank's stages did in the timed steps (plain data: rank 0 gathers it)."""

    pp_rank: int
    """this rank's place in its pipeline"""
    stages: list[int]
    """the stages it held (one; two with the interleaved schedule)"""
    busy_s: list[float]
    """per timed step, the seconds its stages' forward and backward actions took"""
    span_s: list[float]
    """per timed step, the schedule's wall time on this rank"""
    sent_bytes: int
    """bytes it sent per step: activations forward, their gradients backward"""
    sends: int
    """point-to-point sends per step"""
    dp_grad_bytes: int
    """bytes of its stages' gradients, averaged across the data-parallel replicas (dp > 1) after
    the schedule; 0 without data parallelism"""
    params: int
    """parameters its stages hold"""

    @property
    def bubble(self) -> float:
        """This rank's measured bubble: the median over the timed steps."""
        return metrics.summarize(
            [metrics.pipeline_bubble(b, s) for b, s in zip(self.busy_s, self.span_s, strict=True)]
        )["median"]
