"""The timed training loop: one place that owns warm-up, synchronisation and per-phase timing."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from hpcdl import metrics
from hpcdl.clock import StepClock
from hpcdl.device import synchronize
from hpcdl.parallel.backends import Backend
from hpcdl.parallel.backends.single import SingleProcess
from hpcdl.parallel.placement import InStepCollectives
from hpcdl.workloads.precision import needs_loss_scaling
from hpcdl.workloads.precision import precision as precision_of

PHASES = ("data", "forward", "backward", "allreduce", "optimizer")
IN_STEP_PHASES = ("forward", "backward")
"""the phases in which layers call blocking collectives (the experts' all-to-all)"""


class BatchSource(Protocol):
    def next(self) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class StepLog:
    """Per-step measurements of the timed steps, and the loss of every step (warm-up included)."""

    step_s: list[float] = field(default_factory=list)
    phases_s: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    losses: list[float] = field(default_factory=list)
    window_s: float = 0.0
    """wall time from the start of the first timed step to the end of the last"""
    start_unix: float = 0.0
    """when the timed window started, in seconds since the epoch (windows of concurrent runs
    compared; MLPerf-style logs)"""
    in_step_s: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in IN_STEP_PHASES})
    """per timed step, the seconds spent in blocking collectives inside forward and backward"""
    in_step_bytes: int = 0
    """bytes those collectives sent per timed step (one rank's send buffers)"""
    in_step_calls: int = 0
    """their calls per timed step"""
    warmup_s: list[float] = field(default_factory=list)
    """wall time of each warm-up step: the first holds what a user waits for before training
    runs (compilation, first allocations; the time to first step)"""

    def in_step_per_step(self) -> list[float]:
        """Seconds of blocking in-step collectives in each timed step, forward and backward."""
        return [f + b for f, b in zip(self.in_step_s["forward"], self.in_step_s["backward"], strict=True)]


class Trainer:
    """One model, optimizer and batch source; ``run`` executes steps and times them.

    A timed step waits for the device once, at its end: its phases (and the blocking collectives
    inside forward and backward) are read from the step clock's marks afterwards (CUDA events on
    a GPU, host clock readings on a CPU: ``hpcdl.clock``), so that timing where the time goes
    does not slow the step it times."""

    phases: tuple[str, ...] = PHASES
    """the phases ``step`` times (a pipeline's differ: ``hpcdl.harness.pipelined``)"""

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        source: BatchSource,
        device: torch.device,
        precision: str,
        backend: Backend | None = None,
        in_step: InStepCollectives | None = None,
        delay_s: float = 0.0,
        accumulation_steps: int = 1,
        on_step: Callable[[], None] | None = None,
        target: tuple[float, int] | None = None,
        before_window: Callable[[], None] | None = None,
    ) -> None:
        """``in_step`` times the collectives layers call inside a step; ``delay_s`` is slept
        before every forward pass (a slow rank made on purpose, for tests). A step is
        ``accumulation_steps`` micro-batches (the backend wrapped the model for as many).
        ``on_step`` is called after every step (the stall watchdog's heartbeat); ``target``
        (fraction, window) also ends the timed window once the mean loss of the last ``window``
        timed steps has fallen to ``fraction`` of the first timed step's (time to target);
        ``before_window`` is called after warm-up, right before the timed window."""
        self.model, self.optimizer, self.source, self.device = model, optimizer, source, device
        self.accumulation_steps = accumulation_steps
        self.backend = backend or SingleProcess()
        self.in_step = in_step or InStepCollectives(device)
        self.clock = StepClock(device)
        self.delay_s = delay_s
        self.precision = precision_of(precision)
        self.scaler = torch.amp.GradScaler(
            device.type, enabled=needs_loss_scaling(self.precision, device, model)
        )
        self.on_step, self.target, self.before_window = on_step, target, before_window
        self._losses: list[torch.Tensor] = []
        self._first_timed = 0

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward pass in the run's precision, then the mean cross-entropy in fp32."""
        if self.delay_s:
            time.sleep(self.delay_s)
        with torch.autocast(self.device.type, dtype=self.precision.dtype, enabled=self.precision.autocast):
            logits = self.model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))

    def step(self) -> tuple[float, dict[str, float], dict[str, float]]:
        """One training step: ``accumulation_steps`` micro-batches, each loaded, run forward
        and backward on its loss divided by their number (the gradients sum to those of their
        mean), all but the last inside the backend's ``accumulating`` context; then the
        reduction and the optimizer, once; then one wait for the device. Returns its wall time,
        the time of each phase (data, forward and backward summed over the micro-batches) and
        the time spent in blocking in-step collectives during forward and backward."""
        n, clock = self.accumulation_steps, self.clock
        losses = []
        t0 = time.perf_counter()
        marks = [clock.mark()]  # data, forward, backward per micro-batch; then the reduction, the optimizer
        for i in range(n):
            with nullcontext() if i == n - 1 else self.backend.accumulating(self.model):
                x, y = self.source.next()
                marks.append(clock.mark())
                self.in_step.phase = "forward"
                loss = self._loss(x, y)
                if n > 1:  # the micro-batches' gradients then sum to those of their mean loss
                    loss = loss / n
                marks.append(clock.mark())
                self.in_step.phase = "backward"
                self.scaler.scale(loss).backward()
                marks.append(clock.mark())
            losses.append(loss.detach())
        self.backend.finish_reduction(self.optimizer)
        marks.append(clock.mark())
        self.backend.step(self.optimizer, self.scaler)
        self.scaler.update()
        self.optimizer.zero_grad()  # None grads: the default since torch 2.0
        marks.append(clock.mark())
        synchronize(self.device)  # the step's one wait for the device
        wall = time.perf_counter() - t0
        self._losses.append(torch.stack(losses).sum() if n > 1 else losses[0])  # the mean loss
        phases = dict.fromkeys(PHASES, 0.0)
        for i in range(n):
            for j, phase in enumerate(("data", "forward", "backward")):
                phases[phase] += clock.seconds(marks[3 * i + j], marks[3 * i + j + 1])
        phases["allreduce"] = clock.seconds(marks[-3], marks[-2])
        phases["optimizer"] = clock.seconds(marks[-2], marks[-1])
        clock.recycle(*marks)
        in_step = dict.fromkeys(IN_STEP_PHASES, 0.0) | self.in_step.take()
        if self.on_step is not None:
            self.on_step()
        return wall, phases, in_step

    def local_backward_s(self, steps: int) -> list[float]:
        """Backward times with the backend's reduction switched off (DDP's ``no_sync``) and
        in-step collectives taken out, gradients discarded: what backward costs without
        communication, to tell an exposed allreduce that the backend hides inside backward, and
        a rank's own computation from its wait for the others. Each is a step's, its
        micro-batches summed as in the backward phase. Empty when the backend cannot."""
        if self.backend.no_reduction(self.model) is None:
            return []
        times = []
        for _ in range(steps):
            seconds = 0.0  # summed over a step's micro-batches, as the backward phase is
            with self.backend.no_reduction(self.model) or nullcontext():
                for _ in range(self.accumulation_steps):
                    loss = self._loss(*self.source.next())
                    synchronize(self.device)
                    self.in_step.take()
                    self.in_step.phase = "backward"
                    t0 = time.perf_counter()
                    self.scaler.scale(loss).backward()
                    synchronize(self.device)
                    seconds += time.perf_counter() - t0 - sum(self.in_step.take().values())
            times.append(seconds)
            self.optimizer.zero_grad()  # None grads: the default since torch 2.0
        return times

    def run(
        self,
        warmup: int,
        steps: int,
        duration_s: float,
        progress: Callable[[int, float], None] | None = None,
        window: AbstractContextManager[object] | None = None,
        agree: Callable[[bool], bool] = bool,
    ) -> StepLog:
        """``warmup`` untimed steps, then ``steps`` timed steps (or, if 0, steps until
        ``duration_s`` has passed); ``window`` (e.g. a power sampler) is entered around the
        timed steps only.

        ``agree`` turns this rank's "time is up" into the decision every rank takes: with
        several ranks it must return the same answer on all of them (e.g. true once it is true
        on every rank), since a rank that stops one step early leaves the others waiting in an
        allreduce."""
        log = StepLog(phases_s={p: [] for p in self.phases})
        self.model.train()
        for _ in range(warmup):  # a compiled model compiles in the first
            log.warmup_s.append(self.step()[0])
        synchronize(self.device)
        if self.before_window is not None:
            self.before_window()
        sent, calls = self.in_step.bytes, self.in_step.calls
        with window or nullcontext():
            self._timed(log, steps, duration_s, progress, agree)
        log.in_step_bytes = (self.in_step.bytes - sent) // len(log.step_s)
        log.in_step_calls = (self.in_step.calls - calls) // len(log.step_s)
        log.losses = torch.stack(self._losses).float().tolist()
        return log

    def _timed(
        self,
        log: StepLog,
        steps: int,
        duration_s: float,
        progress: Callable[[int, float], None] | None,
        agree: Callable[[bool], bool],
    ) -> None:
        self._first_timed = len(self._losses)
        start, log.start_unix = time.perf_counter(), time.time()
        last_report = start
        while True:
            dt, phases, in_step = self.step()
            log.step_s.append(dt)
            for name, value in phases.items():
                log.phases_s[name].append(value)
            for name, value in in_step.items():
                log.in_step_s[name].append(value)
            now = time.perf_counter()
            done = len(log.step_s)
            if progress and now - last_report >= 1.0:
                progress(done, now - start)
                last_report = now
            if steps and done >= steps:
                break
            stop = (not steps and now - start >= duration_s) or self._at_target()
            if (not steps or self.target) and agree(stop):  # outside the timed step
                break
        log.window_s = time.perf_counter() - start

    def _at_target(self) -> bool:
        if self.target is None:
            return False
        fraction, window = self.target
        timed = self._losses[self._first_timed :]
        recent = [float(x) for x in timed[-window:]]  # the step ended synchronised
        return metrics.reached_target(float(timed[0]), recent, fraction)
