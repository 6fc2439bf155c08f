"""Where a run's step goes by operator class (``hpcdl run --profile``): a few more steps after
the timed window, never inside it, profiled with torch.profiler, and one step counted with
``FlopCounterMode``; the record's ``metrics.operators``.

The phases are the timed loop's own: the step clock marks each phase's start
(``measure.loop.Trainer.step``), and while profiling, each mark also opens a profiler range
named for the phase that starts there (:class:`PhaseMarks`), so that every operator is given to
the phase it started in (an operator on another thread, a collective's worker, by its start
time). Each operator's self time goes to its class (``measure.kernels``, the classifier
``hpcdl profile`` uses); the whole ``data`` phase is ``data``, and time in the ``allreduce``
phase outside any operator (a backend that waits outside torch's operators, as Horovod does) is
``communication``. Other time outside operators (the interpreter between them) is recorded per
phase as ``outside_ops_s``, in no class. docs/metrics.md ("Operator classes") gives the figures.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from hpcdl import metrics
from hpcdl.clock import Mark
from hpcdl.device import synchronize
from hpcdl.measure import kernels
from hpcdl.workloads.crosscheck import decomposed

if TYPE_CHECKING:
    from hpcdl.measure.loop import Trainer

PROFILE_STEPS = 3
"""the steps ``--profile`` profiles when it is given no number"""
TOP = 10
"""the operators a record keeps by time"""
LABEL = "hpcdl::"
"""the prefix of the profiler ranges that name a step's phases"""
OUTSIDE = {"data": "data", "allreduce": "communication"}
"""the class of a phase's time outside operators, where the phase says what it is"""


class PhaseMarks:
    """The trainer's step clock, calling ``enter(phase)`` at each of a step's marks with the
    phase that starts there (None after its last): a step marks the start, then after each
    micro-batch's data, forward and backward, then after the reduction and the optimizer."""

    def __init__(self, clock: Any, accumulation_steps: int, enter: Callable[[str | None], None]) -> None:
        self.clock, self.enter = clock, enter
        self.order: list[str | None] = ["data", "forward", "backward"] * accumulation_steps
        self.order += ["allreduce", "optimizer", None]
        self.i = 0

    def mark(self) -> Mark:
        self.enter(self.order[self.i % len(self.order)])
        self.i += 1
        return self.clock.mark()

    def seconds(self, a: Mark, b: Mark) -> float:
        return float(self.clock.seconds(a, b))

    def recycle(self, *marks: Mark) -> None:
        self.clock.recycle(*marks)


@contextlib.contextmanager
def marked(trainer: Trainer, enter: Callable[[str | None], None]) -> Iterator[None]:
    """The trainer's steps with their phases told to ``enter`` while inside."""
    clock = trainer.clock
    trainer.clock = PhaseMarks(clock, trainer.accumulation_steps, enter)  # type: ignore[assignment]
    try:
        yield
    finally:
        trainer.clock = clock


class Ranges:
    """``enter`` for profiling: each phase a profiler range of its own, the last one closed."""

    def __init__(self) -> None:
        self.open: Any = None

    def __call__(self, phase: str | None) -> None:
        if self.open is not None:
            self.open.__exit__(None, None, None)
        self.open = record_function(LABEL + phase) if phase else None
        if self.open is not None:
            self.open.__enter__()


class Counts:
    """``enter`` for counting: ``FlopCounterMode``'s counts taken at each mark, the difference
    since the last one given to the phase that ended there."""

    def __init__(self, count: Any) -> None:
        self.count = count
        self.phase: str | None = None
        self.last: dict[str, dict[Any, int]] = {}
        self.by_phase: dict[str, dict[str, dict[Any, int]]] = {}

    def __call__(self, phase: str | None) -> None:
        now = self.count.get_flop_counts()
        if self.phase is not None:
            mine = self.by_phase.setdefault(self.phase, {})
            for module, ops in now.items():
                for op, flops in ops.items():
                    gained = flops - self.last.get(module, {}).get(op, 0)
                    if gained:
                        mine.setdefault(module, {})[op] = mine.get(module, {}).get(op, 0) + gained
        self.last, self.phase = now, phase


def profile_steps(
    trainer: Trainer, steps: int, device: torch.device, phase_s: dict[str, float] | None = None
) -> dict[str, Any]:
    """The record's ``operators`` block from ``steps`` profiled steps and one counted step;
    ``phase_s``: each phase's median seconds in the timed window, which weigh the phases' class
    shares into the step's (many steps: a few profiled ones on a disturbed machine are not)."""
    flops = counted(trainer)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":  # the kernels' device time, through CUPTI
        activities.append(ProfilerActivity.CUDA)
    ranges = Ranges()
    with kernels.quiet_profiler(), torch_profile(activities=activities) as prof:
        with marked(trainer, ranges):
            for _ in range(steps):
                trainer.step()
            ranges(None)
        synchronize(device)
    basis = "device time (CUPTI)" if device.type == "cuda" else "CPU self time"
    return block(kernels.classify(prof.events(), device), flops, steps, basis, trainer.model, phase_s)


def counted(trainer: Trainer) -> dict[str, dict[str, dict[Any, int]]]:
    """FLOPs of one step by phase, module and operator (``FlopCounterMode``, the fused kernels
    it cannot see switched off while it counts: ``workloads.crosscheck.decomposed``)."""
    with decomposed(), kernels.counter() as count:
        counts = Counts(count)
        with marked(trainer, counts):
            trainer.step()
    return counts.by_phase


def block(
    classed: list[kernels.Classed],
    flops: dict[str, dict[str, dict[Any, int]]],
    steps: int,
    basis: str,
    model: torch.nn.Module,
    phase_s: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Time and FLOP shares per phase and for the step, and the top operators by time. The
    step's time shares are the phases' weighted by ``phase_s`` where given (each phase's
    median in the timed window), else by their profiled time."""
    labels = sorted(
        (c.event.time_range.start, c.event.time_range.end, c.event.name.removeprefix(LABEL))
        for c in classed
        if c.event is c.root and c.event.name.startswith(LABEL)
    )
    starts = [start for start, _, _ in labels]
    times: dict[str, dict[str, float]] = {}
    outside: dict[str, float] = {}
    ops: dict[tuple[str, str, str], list[float]] = {}
    for c in classed:
        phase = phase_of(c.root, labels, starts)
        if phase is None:  # the profiler's own start and stop
            continue
        mine = times.setdefault(phase, dict.fromkeys(kernels.CLASSES, 0.0))
        if c.event is c.root and c.event.name.startswith(LABEL):
            if phase in OUTSIDE:
                mine[OUTSIDE[phase]] += c.seconds
            else:
                outside[phase] = outside.get(phase, 0.0) + c.seconds
            continue
        cls = "data" if phase == "data" else c.cls
        mine[cls] += c.seconds
        found = ops.setdefault((c.event.name, phase, cls), [0.0, 0])
        found[0] += c.seconds
        found[1] += 1
    flop_phases = {p: kernels.flop_classes(counts, model) for p, counts in flops.items()}
    flop_phases = {p: {"data": sum(f.values())} if p == "data" else f for p, f in flop_phases.items()}
    phases = {
        p: phase_figures(times[p], outside.get(p, 0.0), flop_phases.get(p, {}), steps)
        for p in dict.fromkeys(name for _, _, name in labels)
        if p in times
    }
    step_time = {cls: sum(t[cls] for t in times.values()) for cls in kernels.CLASSES}
    total = sum(step_time.values())  # the profiled operators' time, what a top operator's share is of
    if phase_s and all(p in phase_s for p in phases):
        step_time = {
            cls: sum(phase_s[p] * f["time_share"][cls] for p, f in phases.items()) for cls in kernels.CLASSES
        }
    step_flops = {cls: sum(f.get(cls, 0.0) for f in flop_phases.values()) for cls in kernels.CLASSES}
    top = sorted(ops.items(), key=lambda kv: -kv[1][0])[:TOP]
    return {
        "steps": steps,
        "basis": basis,
        "phases": phases,
        "time_share": kernels.normalised(step_time),
        "flop_share": kernels.normalised(step_flops) if sum(step_flops.values()) > 0 else {},
        "top": [
            {
                "name": name,
                "op_class": cls,
                "phase": phase,
                "self_s": seconds / steps,
                "share": seconds / total if total > 0 else 0.0,
                "calls": calls / steps,
            }
            for (name, phase, cls), (seconds, calls) in top
        ],
    }


def phase_of(root: Any, labels: list[tuple[float, float, str]], starts: list[float]) -> str | None:
    """The phase an event tree belongs to: its own label, or the one whose range it started in."""
    if root.name.startswith(LABEL):
        return str(root.name.removeprefix(LABEL))
    i = bisect.bisect_right(starts, root.time_range.start) - 1
    if i < 0 or root.time_range.start > labels[i][1]:
        return None
    return labels[i][2]


def phase_figures(
    times: dict[str, float], outside_s: float, flops: dict[str, float], steps: int
) -> dict[str, Any]:
    """One phase per step: the seconds its classes took, their shares, its time outside any
    operator, its FLOPs and their shares (empty where it computes none)."""
    counted = sum(flops.values())
    return {
        "time_s": sum(times.values()) / steps,
        "outside_ops_s": outside_s / steps,
        "time_share": metrics.shares(times),
        "flops": counted,
        "flop_share": kernels.normalised(flops) if counted > 0 else {},
    }
