"""What every rank's part of a run shares, whichever way it trains (``runner.measure_rank`` and
the strategies' plans, ``harness.plan``): where rank 0 reports, the optimizer, the GEMM ceiling
probed once per process, and the GPU a rank is."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from hpcdl.device import cuda_uuid
from hpcdl.measure.config import RunConfig
from hpcdl.measure.peaks import gemm_ceiling

Progress = Callable[[str], None]
Ticks = Callable[[int, float, int], None]
"""timed steps so far, the seconds they took, and the samples of all ranks in them"""


@dataclass(frozen=True)
class Reporter:
    """Where rank 0 says what a run is doing: messages, and the timed steps so far with the
    seconds and samples in them (about once a second; by default a message)."""

    say: Progress = lambda _message: None
    timed: Ticks | None = None

    def tick(self, steps: int, elapsed_s: float, samples: int) -> None:
        if self.timed is not None:
            self.timed(steps, elapsed_s, samples)
        else:
            self.say(f"timed {steps} steps in {elapsed_s:.1f} s")


@functools.cache
def measured_ceiling(device: torch.device, precision: str, threads: int) -> float:
    """This rank's GEMM ceiling, once per device, precision and thread count in a process."""
    return gemm_ceiling(device, precision)


def gpu_identity(device: torch.device) -> str | None:
    """The UUID of the GPU (or MIG device) ``device`` is, or None on CPUs."""
    if device.type != "cuda":
        return None
    return cuda_uuid(device.index if device.index is not None else torch.cuda.current_device())


def make_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: RunConfig, fused: bool = False
) -> torch.optim.Optimizer:
    """The run's optimizer; ``fused``: its one-kernel implementation (``measure.execution``)."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, fused=fused or None)
    return torch.optim.AdamW(params, lr=cfg.lr, fused=fused or None)


@dataclass(frozen=True)
class Hooks:
    """What the driver gives every strategy's trainer (``measure.loop.Trainer``'s hooks)."""

    on_step: Callable[[], None] | None = None
    """after every step: the stall watchdog's heartbeat"""
    before_window: Callable[[], None] | None = None
    """after warm-up, right before the timed window"""
    delay_s: float = 0.0
    """slept before every step's forward work (a slow rank made on purpose, for tests)"""
    target: tuple[float, int] | None = None
    """(fraction, window): time to target's stop rule"""
