"""Typed views of hpcdl's records: what readers (audit, score, ranking, reports, sweeps,
schedulers, the command line) see instead of string keys, and what the record builder fills in.

A view is a frozen dataclass whose fields are the keys of one block of the JSON record
(docs/reference/record.md is generated from them), read and written by ``records.typed``
(``parse``, ``to_json``). The views are those of the current ``schema_version``
(``records.schema.RESULT_VERSION``); a record of an older version is upgraded to it before it
is parsed (``records.migrate``), so a field's note says what an older version lacked and how it
reads. A field with a default belongs to some runs only (a layout's, a fitted run's) and is
absent from the others.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcdl import metrics
from hpcdl.measure.measurement import Check
from hpcdl.records import schema
from hpcdl.records.migrate import upgrade
from hpcdl.records.typed import MalformedRecord, parse

# --- the blocks of a result record -----------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """``metrics.summarize`` of a sample (NaN throughout when it is empty)."""

    median: float
    p10: float
    p90: float
    mean: float
    min: float
    max: float
    n: int


@dataclass(frozen=True)
class ExecutionSettings:
    """How the steps executed (``measure.execution.Execution``)."""

    mode: str = "eager"
    """eager, or compile (torch.compile, inductor)"""
    graphs: bool = False
    """the compiled steps ran as CUDA graphs"""
    fused_optimizer: bool = False
    """the optimizer's fused implementation"""
    memory_format: str = "contiguous"
    """contiguous, or channels_last (the convolutions' weights and inputs)"""
    cudnn_benchmark: bool = False
    """cuDNN's autotuner chose the convolutions' algorithms"""


EAGER = ExecutionSettings()
"""what a version-2 record without ``settings.execution`` ran (``records.migrate``)"""


@dataclass(frozen=True)
class Settings:
    precision: str
    batch_per_rank: int
    """samples per rank in one forward and backward (the micro-batch)"""
    world_size: int
    global_batch: int
    """samples per optimizer step over all ranks: batch_per_rank x accumulation_steps x world_size"""
    backend: str
    device: str
    nodes: int
    hosts: list[str]
    accumulation_steps: int
    """micro-batches per optimizer step (version 2 records may lack it: 1)"""
    execution: ExecutionSettings
    """how the steps executed: eager or compiled, graphs, fused optimizer, memory format
    (version 2 records may lack it: eager, ``EAGER``)"""
    layout: str | None = None
    """the parallel layout of a run that splits the model (``dp=2,tp=2,pp=1``;
    ``hpcdl.parallel.layout``); absent: data parallelism over every rank"""
    tp_crosses_nodes: bool | None = None
    """true when a tensor-parallel group spans nodes (its per-layer collectives crossed the
    inter-node network; the run said so in a warning line); absent without tensor parallelism"""

    @property
    def samples_per_step(self) -> int:
        """Samples one rank trains on per step (``metrics.samples_per_step``)."""
        return metrics.samples_per_step(self.batch_per_rank, self.accumulation_steps)

    @property
    def ranks_per_sample(self) -> int:
        """Ranks that train on the same samples: tp x pp of the layout (1 without one)."""
        from hpcdl.parallel.layout import parse_layout  # records read parallel's layout text

        layout = parse_layout(self.layout or "")
        return layout.tp * layout.pp


@dataclass(frozen=True)
class Counts:
    params: int
    forward_flops_per_sample: int
    train_flops_per_sample: int
    activation_bytes_per_sample: int
    memory_bytes_per_sample: int | None
    """``Spec.memory_per_sample``: activations, workspace and the loss's copies of the logits
    where a sample needs the most (null in version 2 records that lacked it: readers take the
    activations instead)"""
    rank_params: int | None = None
    """parameters one rank holds under tensor parallelism (its shards and the whole layers);
    absent where every rank holds the model"""
    rank_forward_flops_per_sample: int | None = None
    """one rank's share of ``forward_flops_per_sample`` under tensor parallelism"""
    rank_train_flops_per_sample: int | None = None
    """one rank's share of ``train_flops_per_sample`` under tensor parallelism (the whole is
    what throughput and MFU count: each sample once)"""


@dataclass(frozen=True)
class RankRow:
    """One rank's own figures (``metrics.per_rank[]``)."""

    rank: int
    host: str
    node: int
    local_rank: int
    samples_per_s: float
    step_time_median_s: float
    compute_median_s: float
    timed_steps: int
    timed_window_s: float
    peak_memory_bytes: int
    torch_threads: int
    compute_only_s: float | None
    """median forward + backward without waiting for other ranks, by the backend's rule
    (null where it cannot be told apart, and in version 2 records that lacked it)"""
    on_cpu_s: float | None
    """seconds of the timed window the rank's main thread ran (Linux schedstat; null where
    unknown, and in version 2 records that lacked it)"""
    descheduled_s: float | None
    """seconds of the timed window it was ready but waited for a CPU (as ``on_cpu_s``)"""


def compute_times(rows: Sequence[RankRow]) -> list[float]:
    """Each rank's median computation, the straggler figure: alone (``compute_only_s``) where
    the backend timed it for every rank, else forward + backward, which may hold waiting."""
    alone = [r.compute_only_s for r in rows if r.compute_only_s is not None]
    return alone if len(alone) == len(rows) else [r.compute_median_s for r in rows]


@dataclass(frozen=True)
class Collective:
    """One collective of a training step (``metrics.communication.collectives[NAME]``)."""

    bytes_per_step: int
    """nccl-tests' size summed over the step's calls (docs/metrics.md)"""
    calls_per_step: int
    seconds_per_step: float
    """the slowest rank's median time of the step's bytes (``timing`` says how it was taken)"""
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    timing: str
    ranks: int | None = None
    """the ranks it ran among, under a layout that splits the model (a tp group, the dp
    replicas); absent: every rank of the run"""


@dataclass(frozen=True)
class Communication:
    """Gradient reduction figures; the timed ones only when there are several ranks."""

    grad_bytes_per_step: int
    allreduce_s: float | None = None
    algbw_bytes_per_s: float | None = None
    busbw_bytes_per_s: float | None = None
    exposed_s: float | None = None
    exposed_method: str | None = None
    collectives: dict[str, Collective] = field(default_factory=dict)
    """every collective a step runs, by name (allreduce, all_gather, reduce_scatter,
    all_to_all; a layout's dimension first: ``tp.allreduce``, ``pp.send``); empty for one rank,
    and in version 2 records that lacked it"""


@dataclass(frozen=True)
class Straggler:
    """The rank that computes slowest, by each rank's computation alone (``metrics.straggler``);
    ``rank`` and the figures are None where the backend cannot time computation alone."""

    rank: int | None
    host: str | None
    compute_only_s: float | None
    median_compute_only_s: float | None
    excess: float | None
    """compute_only_s / median_compute_only_s - 1"""
    method: str


@dataclass(frozen=True)
class Energy:
    """Energy of the timed work; a figure nobody could measure is None, never 0."""

    gpu_energy_j: float | None
    cpu_energy_j: float | None
    measured: str
    avg_power_w: float | None
    energy_to_solution_j: float | None
    energy_per_sample_j: float | None
    energy_delay_product_js: float | None
    ai_ops_per_watt: float | None
    per_rank: list[dict[str, Any]]
    """each rank's telemetry summary (``gpu``, ``cpu_rapl``: see docs/metrics.md, "Energy")"""


@dataclass(frozen=True)
class Target:
    """Time to target (``run.target_loss_fraction``): did the loss fall to the fraction of the
    first timed step's, and how long and how many samples the timed window took."""

    fraction: float
    window_steps: int
    """the loss compared is the mean of this many last steps (``run.pool_batches``)"""
    loss_first: float
    """rank 0's loss of the first timed step"""
    loss_final: float
    """rank 0's mean loss of the last ``window_steps`` steps"""
    reached: bool
    """every rank's loss reached the target (the limit did not end the run first)"""
    time_to_target_s: float | None
    """the timed window when reached, else None"""
    samples_to_target: int | None
    """every rank's timed samples when reached, else None"""


@dataclass(frozen=True)
class PipelineRank:
    """One rank of a pipeline-parallel run: its stages and what they did (medians over the timed
    steps)."""

    rank: int
    pp_rank: int
    stages: list[int]
    params: int
    """parameters its stages hold"""
    busy_s: float
    """median seconds per step its stages' forward and backward actions took"""
    span_s: float
    """median wall time of the schedule per step"""
    bubble: float
    """median of ``metrics.pipeline_bubble`` over the timed steps"""
    sent_bytes_per_step: int
    """activations (forward) and their gradients (backward) it sent per step"""


@dataclass(frozen=True)
class PipelineFigures:
    """A pipeline-parallel run (``hpcdl.parallel.pipeline``): its schedule and its bubble,
    measured beside the theoretical one, and the point-to-point traffic of a step."""

    schedule: str
    stages: int
    """pp: the ranks of one pipeline"""
    stages_per_rank: int
    """1; 2 with the interleaved schedule"""
    microbatches: int
    microbatch_size: int
    """samples per micro-batch (batch_size / microbatches)"""
    bubble_theoretical: float
    """``metrics.theoretical_bubble``: equal stages, free communication"""
    bubble_measured: float
    """the mean over the ranks of each rank's measured bubble (``PipelineRank.bubble``)"""
    p2p_bytes_per_step: int
    """bytes one pipeline's ranks send each other per step (activations and gradients)"""
    p2p_sends_per_step: int
    """point-to-point messages of one pipeline per step"""
    per_rank: list[PipelineRank]


@dataclass(frozen=True)
class OperatorPhase:
    """One phase of the profiled steps (``metrics.operators.phases[PHASE]``), per step."""

    time_s: float
    """seconds its operators took (self time by class; device time on GPUs)"""
    outside_ops_s: float
    """seconds of the phase outside any operator that no class holds (the interpreter between
    operators); a data or allreduce phase's own are its class's"""
    time_share: dict[str, float]
    """by operator class, summing to 1"""
    flops: float
    """FLOPs counted in the phase (``FlopCounterMode``)"""
    flop_share: dict[str, float]
    """by operator class, summing to 1; empty where the phase counts none"""


@dataclass(frozen=True)
class TopOperator:
    """One of the operators that took the most time (``metrics.operators.top[]``), per step."""

    name: str
    op_class: str
    phase: str
    self_s: float
    share: float
    """of the operators' time over the whole step"""
    calls: float


@dataclass(frozen=True)
class Operators:
    """Where the step goes by operator class, from steps profiled after the timed window
    (``hpcdl run --profile``; rank 0's; ``measure.profiled``)."""

    steps: int
    """steps profiled (after the window: never timed ones)"""
    basis: str
    """what time was measured: CPU self time, or the kernels' device time (CUPTI)"""
    phases: dict[str, OperatorPhase]
    time_share: dict[str, float]
    """the whole step's time by class, summing to 1: each phase's shares weighed by its median
    in the timed window"""
    flop_share: dict[str, float]
    """the whole step's counted FLOPs by class, summing to 1"""
    top: list[TopOperator]


@dataclass(frozen=True)
class IoFigures:
    """Samples and bytes moved through the HDF5 files in a measured time
    (``measure.hdf5.IOStats``)."""

    samples: int
    bytes: int
    seconds: float
    samples_per_s: float
    bytes_per_s: float


@dataclass(frozen=True)
class Io:
    """The HDF5 data path of a run (``--data hdf5``), measured while preparing its data."""

    write: IoFigures | None = None
    """rank 0 writing the shards, fsync included (absent where the shards existed already)"""
    read: IoFigures | None = None
    """rank 0 reading its shard through the DataLoader, after one untimed batch"""


@dataclass(frozen=True)
class MemoryEstimate:
    """``Spec.memory_parts`` at the batch that ran, where the step peaks, in bytes per rank
    (docs/metrics.md, "Memory"): a part version 2 estimates did not count yet reads 0 (the
    ``total`` never held it)."""

    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    workspace: int
    libraries: int
    inputs: int
    heap: int
    total: int


@dataclass(frozen=True)
class MeasuredMemory:
    """What the device tells of a rank's memory: the largest peak over the ranks, and its kind
    (a GPU's allocator peak, or a CPU process's resident set, interpreter and libraries
    included)."""

    peak_bytes: int
    kind: str


@dataclass(frozen=True)
class Memory:
    """Where a rank's memory goes: the estimate and the measurement side by side (null, both, in
    version 2 records that had neither)."""

    estimated: MemoryEstimate | None
    measured: MeasuredMemory | None


@dataclass(frozen=True)
class FitTrial:
    """One trial of ``--fit``'s search: the batch it trained and the peak it measured."""

    batch: int
    peak_bytes: int | None
    """null: too large (refused before it ran, or stopped)"""


@dataclass(frozen=True)
class FitShard:
    """The share of the model a multi-rank CPU fit's trials trained (``measure.trial.Shard``)."""

    rank: int
    ranks: int
    backend: str | None
    """the backend that shards the model (fsdp, tensor); null where none does"""
    tp: int
    dp: int


@dataclass(frozen=True)
class FitFigures:
    """How ``--fit`` chose the batch per rank (``measure.fit.Fit``, which says more of each
    field). Version 2 records may lack the fields from ``mmap_threshold_bytes`` on: null (false
    for ``kept_grads``)."""

    fraction: float
    capacity_bytes: int
    """memory of one rank for its model (the smallest over ranks)"""
    target_bytes: int
    """``fraction x capacity_bytes``: what the chosen batch's measured peak should reach"""
    estimated_batch: int
    """the batch the analytic estimate chose (the search's start)"""
    batch: int
    """the batch that ran"""
    estimate_bytes: int
    """the analytic estimate at ``batch``"""
    measured_peak_bytes: int | None
    """the peak of this rank's trial at ``batch`` (null: another rank's search chose it)"""
    fixed_bytes: float | None
    """the peak's fixed part, from the search's last line"""
    per_sample_bytes: float | None
    """the peak's slope per sample, from the same line"""
    trials: list[FitTrial]
    """rank 0's trials in order"""
    measured_by: str
    """how a trial's peak was measured"""
    mmap_threshold_bytes: int | None
    """CPU: glibc's mmap threshold the trials and the run fixed; null on a GPU or another malloc"""
    allocator: str | None
    """CPU: whose ``malloc`` the trials and the run called (glibc, jemalloc, tcmalloc)"""
    oversize_threshold_bytes: int | None
    """CPU under jemalloc: its ``opt.oversize_threshold``"""
    kept_grads: bool
    """the estimate and the trials kept every gradient allocated, as the run's backend does"""
    shard: FitShard | None
    """the share each trial trained; null where the trials trained the whole model"""
    run_peak_bytes: int | None
    """the run's own peak above what its rank held before the model, the largest over ranks"""


@dataclass(frozen=True)
class Metrics:
    samples_per_s: float
    ai_ops_per_s: float
    train_flops_per_sample: int
    step_time_s: Stats
    phases_s: dict[str, Stats]
    timed_steps: int
    timed_window_s: float
    per_rank: list[RankRow]
    slowest_rank_samples_per_s: float
    straggler_spread: float
    communication: Communication
    peak_memory_bytes: int
    peak_memory_kind: str
    peak_flops: float
    peak_source: str
    measured_matmul_flops: float
    mfu: float
    fraction_of_measured_matmul: float
    loss_first: float | None
    loss_last: float | None
    io: Io
    """what the HDF5 data path measured (``--data hdf5``; empty otherwise)"""
    energy: Energy
    peak_kind: str
    """datasheet, estimate, user or unknown (version 2 records may lack it: unknown)"""
    flags: list[str]
    """figures that cannot be true (an MFU above 100 %), each with its likely cause (version 2
    records may lack it: none)"""
    memory: Memory
    """where a rank's memory goes: the estimate's parts and what the device measured"""
    window_start_unix: float | None
    """the earliest rank's window start, seconds since the epoch (null in version 2 records
    that lacked it)"""
    window_end_unix: float | None
    """the latest rank's window end (as ``window_start_unix``)"""
    time_to_first_step_s: float | None
    """wall time of the first warm-up step, the slowest rank's: what a user waits before training
    runs (a compiled run's compilation is in it); not in the timed window (null without warm-up,
    and in version 2 records that lacked it)"""
    peak_inputs: dict[str, Any] = field(default_factory=dict)
    """what an estimated peak was computed from (cores, clock and its source, FLOPs/cycle)"""
    fit: FitFigures | None = None
    """how ``--fit`` chose the batch per rank, when it did"""
    target: Target | None = None
    """time to target, when the run had one"""
    straggler: Straggler | None = None
    """the slowest-computing rank of a multi-rank run (absent for one rank, and from version 2
    records that lacked it)"""
    pipeline: PipelineFigures | None = None
    """the pipeline's schedule, bubble and point-to-point traffic (pipeline-parallel runs only)"""
    compiled: Compiled | None = None
    """what torch.compile made of the model (compiled runs only)"""
    operators: Operators | None = None
    """time and FLOPs by operator class per phase, from steps profiled after the window
    (``hpcdl run --profile`` only)"""


@dataclass(frozen=True)
class Compiled:
    """What dynamo compiled on rank 0 (``measure.execution.compiled_graphs``)."""

    graphs: int
    """compiled graphs"""
    graph_breaks: int
    """places where the model's code ran eagerly between compiled graphs"""


@dataclass(frozen=True)
class Validity:
    checks: list[Check]
    passed: bool

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]

    @property
    def reasons(self) -> list[str]:
        """Each failed check with why, as a person reads it: ``loss_falls (only 3 steps; need
        at least 4)``."""
        return [f"{c.name} ({c.detail})" if c.detail else c.name for c in self.checks if not c.passed]


@dataclass(frozen=True)
class Environment:
    """What the run was measured on; the keys readers use (the record holds more)."""

    host: str
    device_name: str
    torch: str
    hpcdl: str
    git: str | None = None
    os: str = ""
    """``platform.platform()`` of rank 0's host (kernel and C library)"""
    python: str = ""
    cuda: str | None = None
    """``torch.version.cuda``; None on a CPU build"""
    cpu_model: str = ""
    cpu_count: int | None = None
    """logical CPUs of rank 0's host"""
    gpus: list[str] = field(default_factory=list)
    """the accelerators rank 0's host shows, by name"""
    slurm_job_id: str | None = None
    slurm: dict[str, str] | None = None
    cap: dict[str, Any] | None = None
    """the power or clock cap set on the devices for the run (``hpcdl sweep --power-limit``)"""


@dataclass(frozen=True)
class RunSettings:
    """How the workload was measured (``measure.config.RunConfig``): the keys readers use (the
    record holds every setting)."""

    optimizer: str
    data: str
    """random, learnable or hdf5"""
    warmup_steps: int
    suite_class: str
    """the size class whose suite the workload belongs to ('' = none; version 2 records written
    before size classes lack it: they ran the default suite, class S version 1)"""
    suite_version: int
    """the version of that class's suite (0 with none)"""


@dataclass(frozen=True)
class Result:
    """A result record (``schema: hpcdl.result``) as readers see it."""

    schema: str
    schema_version: int
    """the version of the record's fields: the current one once read (an older record is
    upgraded on reading, ``records.migrate``; ``written_version`` says which it was)"""
    id: str
    name: str
    created: str
    spec: dict[str, Any]
    """the workload's knobs (``workloads.registry.spec_from_dict`` makes the Spec)"""
    run: RunSettings
    settings: Settings
    environment: Environment
    counts: Counts
    metrics: Metrics
    validity: Validity
    steps_file: str = ""
    steps_sha256: str = ""
    digest: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """the JSON as read, before any upgrade: the digest covers it, and fields no view names
    live here"""

    @property
    def written_version(self) -> int:
        """The ``schema_version`` the record was written with."""
        version = self.raw.get("schema_version", self.schema_version)
        return version if isinstance(version, int) else self.schema_version

    @property
    def system(self) -> str:
        """The machine it ran on: its Slurm cluster, else rank 0's host."""
        cluster = (self.environment.slurm or {}).get("cluster")
        return str(cluster or self.environment.host)

    @property
    def world_size(self) -> int:
        return self.settings.world_size

    @property
    def family(self) -> str:
        return str(self.spec.get("family", "?"))


# --- a prediction's points (``hpcdl predict``, schema hpcdl.prediction: never a measurement) ---


@dataclass(frozen=True)
class PredictionPoint:
    """One rank count of the scaling model's prediction (``scaling.model.Model.point``;
    docs/metrics.md, "Prediction"), and, where ``hpcdl predict --compare`` found one, the
    measured figures beside it."""

    np: int
    ranks: int
    step_s: float
    """predicted seconds of one optimizer step"""
    compute_s: float
    comm_s: float
    """every collective of the step, hidden or not"""
    exposed_comm_s: float
    """the communication not hidden behind computation"""
    overlap: float | None
    """1 - exposed_comm_s / comm_s (null without communication)"""
    algorithm: str
    """the algorithm of the step's largest collective at this rank count"""
    samples_per_s: float
    ai_ops_per_s: float
    speedup: float
    efficiency: float
    step_rse: float
    """relative standard error of ``step_s`` from the fits of gamma, alpha and beta"""
    straggler_s: float = 0.0
    """seconds a step waits for the slowest of its ranks (the record's step spread)"""
    sync_s: float = 0.0
    """seconds of a step's per-step synchronisations"""
    data_s: float = 0.0
    """seconds a step waits for its data beyond what loading hides"""
    layout: str | None = None
    """the layout priced (``hpcdl predict --layout``)"""
    bubble_s: float | None = None
    """seconds of the pipeline's idle slots per step"""
    system: str = ""
    """the system column it belongs to (``hpcdl predict --system``, repeatable)"""
    nodes: int = 0
    measured_samples_per_s: float | None = None
    measured_overlap: float | None = None
    error: float | None = None
    """(predicted - measured) / measured samples/s: positive when the model is optimistic"""
    costed: bool = False
    """the time and energy to train a data set were asked for (``--samples``, ``--tokens``)"""
    train_hours: float | None = None
    """hours to train it at this rank count (null where the step never ends)"""
    train_energy_kwh: float | None = None
    """kWh to train it (null without an energy source)"""
    energy_estimated: bool | None = None
    """the energy is the nodes' power x hours, not a record's joules per sample"""


def read_result(data: Any) -> Result:
    """A result record's view, an older version upgraded first (``records.migrate``);
    :class:`MalformedRecord` names what is missing or wrong, or a version no table reads."""
    if not isinstance(data, Mapping) or data.get("schema") != schema.RESULT:
        kind = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
        raise MalformedRecord(f"not a result record: schema {kind!r}")
    view = parse(Result, upgrade(data))
    return dataclasses.replace(view, raw=dict(data))


def finite(value: float | None) -> bool:
    """True for a real number (not None, NaN or infinite): a figure that can be shown plain."""
    return value is not None and math.isfinite(value)
