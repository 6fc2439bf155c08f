"""The measurement options that ``hpcdl run``, ``sweep`` and ``capacity`` share, and the
RunConfig they make."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hpcdl.errors import InputError

if TYPE_CHECKING:
    from hpcdl.measure.config import RunConfig

RUN_FLAGS = {
    "warmup": "warmup_steps",
    "steps": "steps",
    "duration": "duration_s",
    "min_duration": "min_duration_s",
    "data": "data",
    "data_dir": "data_dir",
    "workers": "data_workers",
    "optimizer": "optimizer",
    "lr": "lr",
    "device": "device",
    "peak_flops": "peak_flops",
    "backend": "backend",
    "fit": "fit_fraction",
    "stall": "stall_s",
    "target_loss_fraction": "target_loss_fraction",
    "layout": "layout",
    "execution_mode": "mode",
    "graphs": "graphs",
    "fused_optimizer": "fused_optimizer",
    "memory_format": "memory_format",
    "profile": "profile_steps",
}


def run_argv(args: argparse.Namespace) -> list[str]:
    """The measurement options given, as command-line words again (a sweep's points)."""
    words = []
    for flag in RUN_FLAGS:
        value = getattr(args, flag)
        if value is None:
            continue
        if flag == "execution_mode":
            words.append(f"--{value}")
        elif flag == "graphs":
            words.append("--graphs")
        else:
            words.append(f"--{flag.replace('_', '-')}={value}")
    return words


def run_config(args: argparse.Namespace) -> RunConfig:
    from hpcdl.measure.config import RunConfig

    values = {
        knob: RunConfig.parse_knob(knob, str(getattr(args, flag)))
        for flag, knob in RUN_FLAGS.items()
        if getattr(args, flag) is not None
    }
    if args.steps is not None and values["steps"] == 0:  # the knob's 0 (a timed window) is left out
        raise InputError("steps", args.steps, "give --steps N >= 1, or leave it out to time --duration")
    if args.fit is not None and not 0 < values["fit_fraction"] <= 1:
        raise InputError("fit", args.fit, "a fraction of the device's memory in (0, 1], e.g. 0.8")
    target = args.target_loss_fraction
    if target is not None and not 0 < values["target_loss_fraction"] < 1:
        raise InputError("target-loss-fraction", target, "a fraction of the first loss in (0, 1), e.g. 0.5")
    if target is not None and args.min_duration is None:
        values["min_duration_s"] = 0.0  # a time to target is as short as the target makes it
    return RunConfig.from_dict(values)


def add_run_options(r: argparse.ArgumentParser) -> None:
    """Options shared by ``run`` and ``sweep``."""
    r.add_argument("-o", "--output", default="results", help="directory for records (default: results)")
    r.add_argument("--warmup", help="untimed warm-up steps (default 3)")
    r.add_argument(
        "--steps", help="timed steps (default: as many as fit in --duration); a valid record needs 4 or more"
    )
    r.add_argument(
        "--duration", help="timed window in seconds when --steps is not given (default 10; suite 12)"
    )
    r.add_argument(
        "--min-duration",
        dest="min_duration",
        help="validity: shortest valid timed window in seconds (default 1; hpcdl rank counts 5 s or more)",
    )
    r.add_argument("--data", help="random | learnable (default) | hdf5")
    r.add_argument("--data-dir", dest="data_dir", help="HDF5 shard directory for --data hdf5")
    r.add_argument("--workers", help="DataLoader workers for --data hdf5 (default 2)")
    r.add_argument("--optimizer", help="adamw (default) | sgd")
    r.add_argument("--lr", help="learning rate (default 1e-3, or what a class sets for a workload)")
    r.add_argument("--device", help="auto (default) | cpu | cuda | cuda:N")
    r.add_argument(
        "--peak-flops", dest="peak_flops", help="peak FLOP/s for MFU (default: datasheet, else probe)"
    )
    r.add_argument("--backend", help="gradient reduction: auto (default) | horovod | torch")
    r.add_argument(
        "--layout",
        help="parallel layout, e.g. dp=2,tp=2 (tensor parallelism inside each pair of ranks) or "
        "dp=2,tp=2,pp=2,schedule=1f1b,microbatches=4; dp is the rest when left out "
        "(default: data parallelism)",
    )
    r.add_argument(
        "--stall",
        metavar="S",
        help="end a multi-rank run when a rank makes no step for max(S, 20 x median step) s (default 120)",
    )
    r.add_argument(
        "--fit",
        nargs="?",
        const="0.8",
        metavar="FRACTION",
        help="size each workload's batch per rank to fill this fraction of the device memory (default 0.8)",
    )
    r.add_argument("--timeout", type=float, help="end a multi-rank run that takes longer than this (seconds)")
    how = r.add_mutually_exclusive_group()
    how.add_argument(
        "--compile",
        dest="execution_mode",
        action="store_const",
        const="compile",
        help="torch.compile the model (inductor); the warm-up compiles, and the time to the first "
        "step is recorded apart (default: the class's mode, else eager)",
    )
    how.add_argument(
        "--eager",
        dest="execution_mode",
        action="store_const",
        const="eager",
        help="eager PyTorch, also for a class that compiles",
    )
    r.add_argument(
        "--graphs",
        action="store_const",
        const="true",
        help="CUDA: capture the compiled steps as CUDA graphs (with --compile; static shapes)",
    )
    r.add_argument(
        "--fused-optimizer",
        dest="fused_optimizer",
        metavar="auto|on|off",
        help="the optimizer's fused implementation (default auto: where faster, on CUDA)",
    )
    r.add_argument(
        "--memory-format",
        dest="memory_format",
        metavar="auto|contiguous|channels_last",
        help="convolutions' memory format for cnn and speech (default auto: channels_last on CUDA)",
    )
    r.add_argument(
        "--profile",
        nargs="?",
        const="3",
        metavar="STEPS",
        help="after the timed window, profile STEPS more steps (default 3) and record the share of time "
        "and FLOPs by operator class in each phase (metrics.operators); the timed figures are untouched",
    )
    r.add_argument(
        "--target-loss-fraction",
        dest="target_loss_fraction",
        metavar="Q",
        help="time to target: end the timed window once the loss has fallen to Q of the first timed step's "
        "(learnable data; --steps or --duration stay the limit)",
    )
