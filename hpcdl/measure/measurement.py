"""What one rank measured in a run: gathered on rank 0, which builds the record from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpcdl import metrics


@dataclass(frozen=True)
class Check:
    """One validity check: a fast wrong answer is not a result (``records.validity``; the
    distributed checks, ``measure.checks``)."""

    name: str
    passed: bool
    detail: str


if TYPE_CHECKING:  # annotations only: records read this module's Check without importing torch
    from hpcdl.measure.loop import StepLog
    from hpcdl.measure.peaks import Peak
    from hpcdl.parallel.backends import Traffic
    from hpcdl.parallel.pipeline import StageLog


@dataclass
class RankMeasurement:
    """One rank's part of a run (plain data: it travels to rank 0 pickled)."""

    rank: int
    host: str
    node: int
    local_rank: int
    log: StepLog
    """the timed steps, their phases and every step's loss"""
    device_index: int | None
    """the GPU this rank drives (None on CPUs)"""
    cpus: list[int]
    """the logical CPUs this rank may run on (its affinity)"""
    peak: Peak | None
    """the theoretical peak of this rank's device at the run's precision (its GPU, or the CPU
    cores of its affinity), or None where hpcdl knows none"""
    gemm_ceiling_flops: float
    """this rank's measured GEMM ceiling, taken with the threads it trains with, every rank at
    once"""
    grad_bytes: int
    """bytes of the gradients reduced per step"""
    peak_memory_bytes: int
    peak_memory_kind: str
    threads: int
    energy: dict[str, Any]
    """the telemetry summary of the timed window (``TelemetrySampler.summary``)"""
    power_trace: dict[str, list[float]]
    traffic: list[Traffic] = field(default_factory=list)
    """the collectives the backend runs per step (``Backend.traffic``)"""
    io: dict[str, Any] = field(default_factory=dict)
    """HDF5 write and read figures measured while preparing the data (data=hdf5)"""
    checks: list[Check] = field(default_factory=list)
    """correctness checks taken before timing (several ranks)"""
    local_backward_s: list[float] = field(default_factory=list)
    """backward times without reduction, where the backend can measure them"""
    injected_delay_s: float = 0.0
    """seconds slept before each forward pass on purpose (``HPCDL_TEST_SLOW_RANK``)"""
    digest: str = ""
    """SHA-256 of the parameters after training (several ranks)"""
    device_uuid: str | None = None
    """the UUID of the GPU or MIG device this rank drives (``device.cuda_uuid``): what tells
    GPUs apart across ranks, whose ``cuda:0`` may each be another GPU; None on CPUs"""
    on_cpu_s: float | None = None
    """seconds the rank's main thread ran during the timed window
    (:mod:`hpcdl.measure.schedstat`); None where the kernel does not say"""
    descheduled_s: float | None = None
    """seconds it was ready to run but waited for a CPU then"""
    co_runner_threads: int = 0
    """threads of other runs of the same job sharing this rank's CPUs (concurrent capacity
    instances): part of what the run's own ranks make it wait"""
    kernel: str = ""
    """the boot id of the kernel it ran on (``schedstat.kernel_id``): ranks on one kernel share
    its CPUs, also where they run in containers of their own"""
    collective_s: dict[str, float] = field(default_factory=dict)
    """per collective of ``traffic``: median blocking call of its bytes per step, after
    training (several ranks)"""
    held_before_model_bytes: int | None = None
    """what the rank held before its model was built, after a one-sample step as a trial's base
    (``trial.warm_base``): the base the run's own peak rises from, compared with ``--fit``'s
    target (None: a run without ``--fit``)"""
    pipeline: StageLog | None = None
    """what this rank's pipeline stages did (pipeline-parallel runs only)"""
    execution: dict[str, Any] = field(default_factory=dict)
    """how its steps executed (``measure.execution.Execution.to_dict``; empty: eager)"""
    compiled: dict[str, int] = field(default_factory=dict)
    """what torch.compile made of its model (``measure.execution.compiled_graphs``; compiled runs)"""
    operators: dict[str, Any] | None = None
    """time and FLOPs by operator class of steps profiled after the window (``--profile``;
    ``measure.profiled``)"""

    def forward_backward_s(self) -> list[float]:
        """Forward plus backward time of each timed step: the rank's computation, and whatever
        waiting for other ranks the backend does inside them."""
        if self.pipeline is not None:  # its stages' actions (the waits between them are not in)
            return list(self.pipeline.busy_s)
        phases = self.log.phases_s
        return [f + b for f, b in zip(phases["forward"], phases["backward"], strict=True)]

    def own_phase_s(self, phase: str) -> float:
        """Median time of ``phase`` (forward, backward) without the blocking collectives that
        layers called inside it."""
        wall = self.log.phases_s[phase]
        held = self.log.in_step_s.get(phase) or [0.0] * len(wall)
        return float(metrics.summarize([w - c for w, c in zip(wall, held, strict=True)])["median"])
