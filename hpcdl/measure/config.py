"""Run settings: how a workload is measured (not what it is; that is the spec)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hpcdl.errors import SpecError
from hpcdl.parallel.backends import backend_choices
from hpcdl.parallel.layout import parse_layout
from hpcdl.workloads.knobs import Knobs, knob
from hpcdl.workloads.recipes import size_classes

DATA_KINDS = ("random", "learnable", "hdf5")


@dataclass(frozen=True, kw_only=True)
class RunConfig(Knobs):
    """How to measure one workload."""

    prefix: ClassVar[str] = "run"

    warmup_steps: int = knob(3, lo=1, hi=10_000, doc="untimed steps before timing (allocation, autotuning)")
    steps: int = knob(0, lo=0, hi=10_000_000, doc="timed steps; 0 = as many as fit in duration_s")
    duration_s: float = knob(10.0, lo=0.0, hi=1e6, doc="length of the timed window when steps=0")
    min_duration_s: float = knob(
        1.0, lo=0.0, hi=1e6, doc="validity: a timed window shorter than this is not a valid measurement"
    )
    data: str = knob(
        "learnable", choices=DATA_KINDS, doc="random tensors, teacher-labelled data, or HDF5 shards"
    )
    data_dir: str = knob("", doc="directory of HDF5 shards (data=hdf5); written first if empty")
    data_workers: int = knob(2, lo=0, hi=256, doc="DataLoader worker processes (data=hdf5)")
    pool_batches: int = knob(4, lo=1, hi=10_000, doc="distinct batches kept on the device and cycled")
    optimizer: str = knob(
        "adamw", choices=("adamw", "sgd"), doc="optimizer (its element-wise work is not counted)"
    )
    lr: float = knob(1e-3, lo=0.0, hi=10.0, doc="learning rate")
    device: str = knob("auto", doc="torch device: auto (cuda if present, else cpu), cpu, cuda, cuda:1, ...")
    peak_flops: float = knob(0.0, lo=0.0, doc="peak FLOP/s to compute MFU against; 0 = datasheet or probe")
    backend: str = knob(
        "auto", doc="gradient reduction across ranks: horovod, torch (DDP), auto (horovod if installed)"
    )
    mode: str = knob(
        "eager",
        choices=("eager", "compile"),
        doc="eager PyTorch, or torch.compile (inductor) of the model: the warm-up steps compile,"
        " and the time to the first step is recorded apart from the timed window",
    )
    graphs: bool = knob(
        False, doc="CUDA: capture the compiled steps as CUDA graphs (torch.compile's reduce-overhead)"
    )
    fused_optimizer: str = knob(
        "auto",
        choices=("auto", "on", "off"),
        doc="the optimizer's fused implementation; auto: where it is faster on the device (CUDA)",
    )
    memory_format: str = knob(
        "auto",
        choices=("auto", "contiguous", "channels_last"),
        doc="the convolutions' memory format (cnn, speech); auto: channels_last where it is faster (CUDA)",
    )
    stall_s: float = knob(
        120.0,
        lo=0.0,
        hi=1e6,
        doc="several ranks: end the run when a rank completes no step for max(this, 20 x the median step)"
        " seconds (0 = never)",
    )
    suite_class: str = knob(
        "", doc="the size class whose standard suite this workload belongs to ('' = none)"
    )
    suite_version: int = knob(0, lo=0, hi=1_000_000, doc="the version of that class's suite")
    fit_fraction: float = knob(
        0.0,
        lo=0.0,
        hi=1.0,
        doc="size the batch per rank to fill this fraction of the device's memory (0 = off)",
    )

    target_loss_fraction: float = knob(
        0.0,
        lo=0.0,
        hi=1.0,
        doc="time to target: also end the timed window once the loss has fallen to this fraction"
        " of the first timed step's (mean of the last pool_batches steps; 0 = off; steps or"
        " duration_s stay the limit)",
    )

    profile_steps: int = knob(
        0,
        lo=0,
        hi=100,
        doc="steps profiled after the timed window, for the record's time and FLOPs by operator class"
        " and phase (metrics.operators; 0 = none); the timed figures are those of an unprofiled run",
    )

    layout: str = knob(
        "",
        doc="parallel layout, e.g. dp=2,tp=2,pp=2 or tp=2,pp=2,schedule=gpipe,microbatches=8: ranks"
        " per kind of parallelism, dp the rest when left out ('' = data parallelism over every rank;"
        " hpcdl.parallel.layout)",
    )

    def check(self) -> None:
        layout = parse_layout(self.layout)  # its syntax; sizes against the world and workload at the run
        if self.profile_steps and layout.pp > 1:
            raise SpecError("run.profile_steps", self.profile_steps, "not with pipeline parallelism (pp > 1)")
        if self.target_loss_fraction and not self.target_loss_fraction < 1:
            raise SpecError("run.target_loss_fraction", self.target_loss_fraction, "a fraction in (0, 1)")
        if self.target_loss_fraction and self.data == "random":
            raise SpecError(
                "run.target_loss_fraction", self.target_loss_fraction, "needs learnable or hdf5 data"
            )
        if self.suite_class and self.suite_class not in size_classes():
            raise SpecError("run.suite_class", self.suite_class, "allowed: " + ", ".join(size_classes()))
        if self.backend not in backend_choices():
            raise SpecError("run.backend", self.backend, "allowed: " + ", ".join(backend_choices()))
        if self.data == "hdf5" and not self.data_dir:
            raise SpecError("run.data_dir", self.data_dir, "required when data=hdf5 (a directory path)")
