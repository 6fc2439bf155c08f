"""A benchmark run on the local machine: build, warm up, time, check, and write the record."""

from __future__ import annotations

import functools
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from hpcdl import h5data, metrics, validity
from hpcdl.config import RunConfig
from hpcdl.data import device_pool
from hpcdl.device import memory_capacity, peak_memory, reset_peak_memory, resolve_device
from hpcdl.environment import environment
from hpcdl.errors import SpecError
from hpcdl.loop import BatchSource, StepLog, Trainer
from hpcdl.peaks import Peak, datasheet_peak, matmul_probe
from hpcdl.records import SCHEMA, SCHEMA_VERSION, seal, write_record, write_steps
from hpcdl.spec import Spec

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RunResult:
    """A finished run: its record (a plain dict, as written) and where it was written."""

    record: dict[str, Any]
    path: Path | None
    steps_path: Path | None

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.record["metrics"])

    @property
    def passed(self) -> bool:
        return bool(self.record["validity"]["passed"])


@functools.cache
def measured_peak(device: torch.device, precision: str) -> float:
    """The matmul probe, once per device and precision in a process."""
    return matmul_probe(device, precision)


def reference_peak(device: torch.device, device_name: str, precision: str, override: float) -> Peak:
    """The peak MFU is computed against: the user's, else the datasheet's, else the probe's."""
    if override > 0:
        return Peak(override, "user")
    sheet = datasheet_peak(device_name, precision)
    if sheet is not None:
        return sheet
    if device.type == "cuda":
        warnings.warn(
            f"no datasheet peak for {device_name!r}; MFU uses the measured matmul probe", stacklevel=2
        )
    return Peak(measured_peak(device, precision), "measured matmul probe")


def check_memory(spec: Spec, cfg: RunConfig, device: torch.device) -> int:
    """Refuse a spec whose memory estimate exceeds what the device has; return the estimate."""
    count = spec.count()
    need = metrics.memory_estimate(
        count.params, count.activation_bytes(spec.precision), spec.batch_size, cfg.optimizer
    )
    have = memory_capacity(device)
    if need > have:
        raise SpecError(
            f"{spec.family}.batch_size",
            spec.batch_size,
            f"estimated memory {need / 2**30:.1f} GiB exceeds the {have / 2**30:.1f} GiB "
            f"available on {device}; lower batch_size or the model's size",
        )
    return need


def preflight(spec: Spec, cfg: RunConfig) -> torch.device:
    """Everything that can refuse a run before it starts: the device, and the memory estimate."""
    device = resolve_device(cfg.device)
    check_memory(spec, cfg, device)
    return device


def make_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr)


def make_source(
    spec: Spec, cfg: RunConfig, device: torch.device, stream: int = 0
) -> tuple[BatchSource, dict]:
    """The batch source of the run and, for HDF5, the I/O figures measured while preparing it."""
    if cfg.data != "hdf5":
        return device_pool(
            spec, device, cfg.pool_batches, learnable=cfg.data == "learnable", stream=stream
        ), {}
    io: dict[str, Any] = {}
    if not h5data.has_shards(spec, cfg.data_dir):
        io["write"] = h5data.write_shards(spec, cfg.data_dir, batches=max(cfg.pool_batches, 2)).to_dict()
    io["read"] = h5data.read_throughput(cfg.data_dir, cfg.data_workers).to_dict()
    return h5data.HDF5Source(cfg.data_dir, device, cfg.data_workers), io


def measure(
    spec: Spec, cfg: RunConfig, device: torch.device, progress: Progress | None = None, stream: int = 0
) -> tuple[StepLog, dict[str, Any]]:
    """Build the model and data, and run warm-up and timed steps."""
    say = progress or (lambda _msg: None)
    say(f"building {spec.family} model and {cfg.data} data")
    model = spec.build().to(device)
    source, io = make_source(spec, cfg, device, stream)
    trainer = Trainer(model, make_optimizer(model, cfg), source, device, spec.precision, cfg.phase_sync)
    reset_peak_memory(device)
    say(f"warm-up {cfg.warmup_steps} steps, then timing")
    log = trainer.run(
        cfg.warmup_steps,
        cfg.steps,
        cfg.duration_s,
        progress=lambda n, s: say(f"timed {n} steps in {s:.1f} s"),
    )
    return log, io


def build_record(
    spec: Spec, cfg: RunConfig, device: torch.device, log: StepLog, io: dict[str, Any], name: str
) -> dict[str, Any]:
    """The result record (see METRICS.md) of one single-process run."""
    env = environment(device)
    count = spec.count()
    samples = spec.batch_size * len(log.step_s)
    samples_per_s = metrics.throughput(samples, log.window_s)
    ai_ops = metrics.ai_ops_per_s(count.train_flops, samples_per_s)
    peak = reference_peak(device, env["device_name"], spec.precision, cfg.peak_flops)
    probe = measured_peak(device, spec.precision) if peak.source != "measured matmul probe" else peak.flops
    mem_bytes, mem_kind = peak_memory(device)
    checks = [validity.loss_finite(log.losses), validity.min_duration(log.window_s, cfg.min_duration_s)]
    if cfg.data in ("learnable", "hdf5"):
        checks.append(validity.loss_falls(log.losses))
    record = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "id": uuid.uuid4().hex,
        "name": name,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "spec": spec.to_dict(),
        "run": cfg.to_dict(),
        "settings": {
            "precision": spec.precision,
            "batch_per_rank": spec.batch_size,
            "world_size": 1,
            "backend": "none",
            "device": str(device),
        },
        "environment": env,
        "counts": {
            "params": count.params,
            "forward_flops_per_sample": count.forward_flops,
            "train_flops_per_sample": count.train_flops,
            "activation_bytes_per_sample": count.activation_bytes(spec.precision),
        },
        "metrics": {
            "samples_per_s": samples_per_s,
            "ai_ops_per_s": ai_ops,
            "train_flops_per_sample": count.train_flops,
            "step_time_s": metrics.summarize(log.step_s),
            "phases_s": {p: metrics.summarize(v) for p, v in log.phases_s.items()},
            "timed_steps": len(log.step_s),
            "timed_window_s": log.window_s,
            "peak_memory_bytes": mem_bytes,
            "peak_memory_kind": mem_kind,
            "peak_flops": peak.flops,
            "peak_source": peak.source,
            "measured_matmul_flops": probe,
            "mfu": metrics.mfu(ai_ops, peak.flops),
            "fraction_of_measured_matmul": metrics.mfu(ai_ops, probe),
            "loss_first": log.losses[0] if log.losses else None,
            "loss_last": log.losses[-1] if log.losses else None,
            "io": io,
        },
    }
    record["validity"] = validity.block(checks)
    return record


def run(
    spec: Spec,
    config: RunConfig | None = None,
    *,
    output_dir: str | Path | None = "results",
    name: str | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """Measure one workload on this machine and write its record (unless ``output_dir`` is None).

    Returns the record with its paths. Raises :class:`hpcdl.errors.SpecError` before running
    anything when the spec cannot fit the device.
    """
    cfg = config or RunConfig()
    device = preflight(spec, cfg)
    log, io = measure(spec, cfg, device, progress)
    name = name or f"{time.strftime('%Y%m%d-%H%M%S')}-{spec.family}"
    record = build_record(spec, cfg, device, log, io, name)
    if output_dir is None:
        return RunResult(seal(record), None, None)
    out = Path(output_dir)
    steps_path = write_steps(
        {"step_s": log.step_s, **{f"{p}_s": v for p, v in log.phases_s.items()}, "loss": log.losses},
        out / f"{name}.steps.h5",
    )
    record["steps_file"] = steps_path.name
    record = seal(record)
    return RunResult(record, write_record(record, out / f"{name}.json"), steps_path)
