"""A pipeline's runtime (``hpcdl.parallel.pipeline`` is its plan): this rank's stages on
``torch.distributed.pipelining.PipelineStage``, stepped by PyTorch's schedule, every forward and
backward action timed and every send counted."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining
from torch.distributed.pipelining import PipelineStage

from hpcdl.clock import Mark, StepClock
from hpcdl.device import synchronize
from hpcdl.parallel.pipeline import (
    SCHEDULES,
    StageModule,
    StepTimes,
    check,
    pipeline_loss,
    shared_parameters,
    stage_modules,
)
from hpcdl.parallel.placement import average_across
from hpcdl.parallel.tensor import TIMING_REPEATS, local_tensor, split
from hpcdl.workloads.spec import Spec

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class TimedStage(PipelineStage):
    """PyTorch's stage, its forward and backward actions timed between marks of a step clock
    (read once the step has ended: nothing waits for the device here) and the bytes it sends
    counted: what the bubble and the point-to-point traffic are measured from."""

    sent_bytes: int = 0
    sends: int = 0
    clock: StepClock
    """set by ``Pipeline`` (PyTorch's stage takes its own constructor's arguments)"""
    spans: list[tuple[Mark, Mark]]

    def _timed(self, action: Callable[[], Any]) -> Any:
        start = self.clock.mark()
        out = action()
        self.spans.append((start, self.clock.mark()))
        return out

    def take_busy_s(self) -> float:
        """Seconds of the actions timed since the last take, once the device has done them."""
        busy = sum(self.clock.seconds(a, b) for a, b in self.spans)
        for a, b in self.spans:
            self.clock.recycle(a, b)
        self.spans.clear()
        return busy

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


class Pipeline:
    """This rank's stages of a pipeline over ``pp`` ranks (its place ``pp_rank`` among them,
    communicating over ``group``) and the schedule that steps them. With ``dp_group`` each
    stage is also data-parallel over that group (:meth:`reduce_gradients`); with ``tp_mesh``
    each stage's blocks are also split across that mesh's ranks (the family's plan,
    ``hpcdl.parallel.tensor``): a stage boundary then carries whole activations, which each
    rank of a tensor-parallel group sends to the rank of the same tp coordinate in the next
    stage (torchtitan's way)."""

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
        tp_mesh: DeviceMesh | None = None,
    ) -> None:
        check(spec, pp, schedule, microbatches)
        kind = SCHEDULES[schedule]
        chunks = pp * kind.virtual
        self.microbatches, self.pp, self.virtual = microbatches, pp, kind.virtual
        self.group = group
        all_modules = stage_modules(spec, model, chunks)
        self.indices = [pp_rank + k * pp for k in range(kind.virtual)]
        self.modules: list[StageModule] = [all_modules[i].to(device) for i in self.indices]
        if tp_mesh is not None and tp_mesh.size() > 1:
            # the family's plan of the whole model, each stage splitting the layers it holds
            for m in self.modules:
                split(spec, m, tp_mesh, model)
        self.dp_group = dp_group if dp_group is not None and dist.get_world_size(dp_group) > 1 else None
        held = {id(p) for p in self.parameters()}
        self.shared = [p for p in shared_parameters(spec, model) if id(p) in held]
        self.ends_group = None
        if self.shared:  # this rank holds the first or the last stage: the two of them sum
            ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
            self.ends_group = dist.new_group([ranks[0], ranks[-1]], use_local_synchronization=True)
        self.stages = [
            TimedStage(m, i, chunks, device, group=group)
            for m, i in zip(self.modules, self.indices, strict=True)
        ]
        for stage in self.stages:
            stage.clock, stage.spans = StepClock(device), []
        self.first = 0 in self.indices
        self.last = chunks - 1 in self.indices
        cls = getattr(pipelining, kind.torch_class)
        # single-stage schedules take the stage, multi-stage ones the list
        mine = self.stages[0] if kind.virtual == 1 else self.stages
        self.schedule = cls(mine, microbatches, loss_fn=pipeline_loss)

    def parameters(self) -> list[nn.Parameter]:
        """The parameters this rank's stages hold (its optimizer's)."""
        return [p for m in self.modules for p in m.parameters()]

    def release_others(self, model: nn.Module) -> None:
        """Free the weights of ``model``'s parts that this rank's stages do not hold (every rank
        built the whole model from the seed; a stage keeps only its share in memory)."""
        held = {id(p) for p in self.parameters()}
        for p in model.parameters():
            if id(p) not in held:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor | None, Callable[[], StepTimes]]:
        """One step of the whole batch ``x``, ``y`` through the pipeline: every micro-batch's
        forward and backward, in the schedule's order; the gradients are left on the
        parameters. Returns the batch's mean loss (on the rank of the last stage; None
        elsewhere) and what gives this rank's times once the step's work is done (after the
        step's synchronisation)."""
        for s in self.stages:
            s.take_busy_s()
            s.sent_bytes, s.sends = 0, 0
        args = (x,) if self.first else ()
        losses: list[torch.Tensor] = []
        clock = self.stages[0].clock
        start = clock.mark()
        if self.last:
            self.schedule.step(*args, target=y, losses=losses, return_outputs=False)
        else:
            self.schedule.step(*args, return_outputs=False)
        end = clock.mark()
        sent, sends = sum(s.sent_bytes for s in self.stages), sum(s.sends for s in self.stages)

        def times() -> StepTimes:
            span = clock.seconds(start, end)
            clock.recycle(start, end)
            return StepTimes(span, sum(s.take_busy_s() for s in self.stages), sent, sends)

        loss = torch.stack(losses).detach().mean() if losses else None
        return loss, times

    def reduce_gradients(self) -> None:
        """Sum the gradients of parameters both ends hold (a tied head's table) between the first
        and the last stage; then average this rank's stage gradients across the data-parallel
        replicas (dp > 1): one flat allreduce over ``dp_group`` after the schedule
        (DistributedDataParallel inside the schedule's last backward trips over the schedule's
        extra backward of its first step)."""
        for p in self.shared:  # the first and the last stage's uses of a tied table
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.ends_group)
        if self.dp_group is None:
            return
        average_across([local_tensor(p.grad) for p in self.parameters() if p.grad is not None], self.dp_group)

    def time_sends(self, message_bytes: int, repeats: int = TIMING_REPEATS) -> float:
        """Median seconds per step this rank spends in its stages' point-to-point traffic, timed
        after training (collective over the pipeline's group): every stage boundary in turn,
        after a barrier (a rank's time is its own boundaries', not its wait for the others),
        its ``microbatches`` messages of ``message_bytes`` sent forward one by one, then as
        many back (the activations and their gradients), blocking sends between the boundary's
        two ranks; after one untimed round."""
        group = self.group or dist.group.WORLD
        ranks = dist.get_process_group_ranks(group)
        me, device = self.indices[0], self.stages[0].device
        buf = torch.zeros(max(1, message_bytes // 4), dtype=torch.float32, device=device)
        times = []
        for i in range(repeats + 1):
            spent = 0.0
            for boundary in range(self.pp * self.virtual - 1):
                dist.barrier(group=group)
                src, dst = boundary % self.pp, (boundary + 1) % self.pp
                if me not in (src, dst):
                    continue
                peer = ranks[dst if me == src else src]
                t0 = time.perf_counter()
                for sending in (me == src, me != src):  # activations forward, gradients back
                    for _ in range(self.microbatches):
                        if sending:
                            dist.send(buf, peer, group=group)
                        else:
                            dist.recv(buf, peer, group=group)
                synchronize(device)
                spent += time.perf_counter() - t0
            if i:
                times.append(spent)
        return statistics.median(times)
