"""How long a run takes on this machine, at least, said before it starts: each workload's
warm-up and timed steps, their counted FLOPs at this machine's theoretical peak (the one MFU
divides by), or at the GEMM ceiling the peak store holds where that is lower (what the software
reaches: ``hpcdl info --probe`` stores it). A step cannot run faster, so this is a lower
bound: real steps run at a fraction of it (the MFU column), and building, checks and data add
to it. It is what a person needs before a class M run on a CPU, where one step of gpt2-small
takes a minute."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcdl.device import device_name
from hpcdl.measure.config import RunConfig
from hpcdl.measure.peaks import theoretical_peak
from hpcdl.workloads.spec import Spec

CHECK_STEPS = 2
"""steps the correctness checks take with several ranks (one step of N ranks, one of one)"""


@dataclass(frozen=True)
class Floor:
    """The least time a workload's run takes here, and what it was computed from."""

    seconds: float
    step_s: float
    rate_flops: float
    """the machine's FLOP/s the steps were counted at"""
    basis: str
    """what that rate is: the peak, or the GEMM ceiling stored with it"""


def floor(spec: Spec, cfg: RunConfig, device: torch.device, ranks_here: int) -> Floor | None:
    """The least time of one run of ``spec`` with ``ranks_here`` ranks on this machine (sharing
    its cores on a CPU, a GPU each elsewhere); None where no peak is known (or ``--fit`` will
    choose the batch)."""
    peak = theoretical_peak(device, device_name(device), spec.precision)
    if peak is None or cfg.fit_fraction > 0:
        return None
    ceiling = float(peak.inputs.get("gemm_ceiling_flops") or peak.flops)
    rate, basis = (ceiling, "measured GEMM ceiling") if ceiling < peak.flops else (peak.flops, "peak")
    machine = rate * (ranks_here if device.type == "cuda" else 1)
    step_s = spec.count().train_flops * spec.samples_per_step * ranks_here / machine
    timed = cfg.steps * step_s if cfg.steps else max(cfg.duration_s, step_s)
    steps = cfg.warmup_steps + (CHECK_STEPS if ranks_here > 1 else 0)
    return Floor(steps * step_s + timed, step_s, machine, f"{spec.precision} {basis}")


def duration_text(seconds: float) -> str:
    """Seconds in words: ``35 ms``, ``45 s``, ``3.2 min``, ``1.5 h``."""
    if seconds < 1:
        return f"{seconds * 1e3:.2g} ms"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
