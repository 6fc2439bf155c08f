"""Marks inside a training step, read after the step's one device synchronisation.

A step is timed with a host clock around it and one synchronisation at its end (what
``torch.cuda.synchronize`` costs is paid once a step, as torchtitan and MLPerf time steps).
Where inside the step the time went (its phases, its in-step collectives) comes from marks that
do not wait: on a GPU, CUDA events recorded in the stream and read once the step has ended; on a
CPU, host clock readings, since a CPU's work is done when the call that does it returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TypeAlias

import torch

Mark: TypeAlias = float | torch.cuda.Event
"""a host clock reading (CPU) or a recorded CUDA event (GPU)"""


@dataclass
class StepClock:
    """Marks on ``device``'s timeline; ``seconds(a, b)`` between two of them, once the work
    before ``b`` has finished (after the step's synchronisation)."""

    device: torch.device
    _events: list[torch.cuda.Event] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def mark(self) -> Mark:
        if not self.on_gpu:
            return time.perf_counter()
        event = self._events.pop() if self._events else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a: Mark, b: Mark) -> float:
        if isinstance(a, float) and isinstance(b, float):
            return b - a
        assert isinstance(a, torch.cuda.Event) and isinstance(b, torch.cuda.Event)
        return a.elapsed_time(b) / 1e3

    def recycle(self, *marks: Mark) -> None:
        """Events read and no longer needed are recorded again by later marks (a step makes a
        dozen: creating them anew each time would cost more than recording them)."""
        self._events.extend(m for m in marks if isinstance(m, torch.cuda.Event))
