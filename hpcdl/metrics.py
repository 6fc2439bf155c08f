"""Every reported figure's formula, written once (docs/metrics.md documents each)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median and spread of a sample: median, p10, p90, mean, min, max and n."""
    if len(values) == 0:
        return {
            "median": float("nan"),
            "p10": float("nan"),
            "p90": float("nan"),
            "mean": float("nan"),
            "min": float("nan"),
            "max": float("nan"),
            "n": 0,
        }
    a = np.asarray(values, dtype=float)
    p10, median, p90 = np.percentile(a, [10, 50, 90])
    return {
        "median": float(median),
        "p10": float(p10),
        "p90": float(p90),
        "mean": float(a.mean()),
        "min": float(a.min()),
        "max": float(a.max()),
        "n": int(a.size),
    }


def throughput(samples: int, seconds: float) -> float:
    """Samples per second over a timed window."""
    return samples / seconds if seconds > 0 else 0.0


def overlap_fraction(comm_s: float, exposed_s: float) -> float | None:
    """Of a step's communication, the share hidden behind computation: ``1 − exposed / comm``
    (the scaling model's prediction, or a record's ``exposed_s`` against its collectives'
    seconds); None where there is no communication."""
    if not comm_s > 0 or not math.isfinite(exposed_s):
        return None
    return min(1.0, max(0.0, 1 - exposed_s / comm_s))


def samples_per_step(batch_size: int, accumulation_steps: int) -> int:
    """Samples one rank trains on per optimizer step: ``accumulation_steps`` micro-batches of
    ``batch_size`` each, their gradients summed before one reduction and one optimizer step."""
    return batch_size * accumulation_steps


def ai_ops_per_s(train_flops_per_sample: float, samples_per_s: float) -> float:
    """Sustained training FLOP/s: analytic forward+backward FLOPs of a sample x samples/s."""
    return train_flops_per_sample * samples_per_s


def mfu(achieved_flops_per_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: achieved over peak FLOP/s (NaN when the peak is unknown)."""
    return achieved_flops_per_s / peak_flops_per_s if peak_flops_per_s > 0 else float("nan")


LOSS_COPIES = 3
"""fp32 tensors of the logits' size alive when backward starts: the log-softmax output the loss
keeps, its gradient and the logits' gradient"""
HEAD_BACKWARD_COPIES = 1
"""fp32 tensors of the logits' size alive while the head's backward runs: the logits' gradient
(the loss's backward has freed its output and its own gradient; the profiler's allocations,
``benchmarks/memory_allocator.py --timeline 4e6 mlp:37:fp32:batch_size=9868``)"""
ADAMW_TEMPORARIES = 2
"""fp32 temporaries of one parameter's size that AdamW's per-tensor step allocates (the square
root of the second moment and its bias-corrected quotient): PyTorch's CPU default, one tensor at
a time; SGD's momentum updates in place"""
# the three terms of CPU_LIBRARY_BYTES: every CPU step's, autocast's, an unfused recurrent layer's
CPU_LIBRARY_BASE, CPU_LIBRARY_AUTOCAST, CPU_LIBRARY_UNFUSED = 9 << 19, 11 << 19, 5 << 20  # 4.5, 5.5, 5 MiB
CPU_LIBRARY_BYTES = {
    (autocast, unfused): CPU_LIBRARY_BASE + autocast * CPU_LIBRARY_AUTOCAST + unfused * CPU_LIBRARY_UNFUSED
    for autocast in (False, True)
    for unfused in (False, True)
}
"""bytes a CPU training step adds outside PyTorch's allocator, by (autocast, an unfused recurrent
layer): MKL's GEMM buffers, oneDNN's primitives built for the step's shapes, glibc's heap among
the tensors under its mmap threshold (a GRU's per-step tensors; an Elman RNN's are its own part,
``heap``). A base, more with autocast, more with an unfused recurrent layer. Fitted to measured
CPU steps (``benchmarks/bench_memory.py``: the values that keep sampled specs nearest their
estimate, checked on held-out specs) in docs/validation/2026-11-26-memory-estimate.md; a
GPU's libraries live outside the allocator's peak that auto-fit measures there. Each distinct
convolution adds its own term
(``CPU_CONV_PRIMITIVE_BYTES``)."""
CPU_CONV_PRIMITIVE_BYTES = 1 << 18  # 0.25 MiB
"""bytes a CPU step holds outside PyTorch's allocator for each distinct convolution it trains
(``Count.conv_shapes``): oneDNN's forward, backward-data and backward-weights primitives for its
shape, kept in oneDNN's cache. Measured per new shape by ``benchmarks/memory_onednn.py
convolutions``, in docs/validation/2026-11-26-memory-estimate.md."""
AUTOCAST_COPY_BYTES = 2
"""bytes per parameter of the 16-bit weight copies autocast makes and its products keep for
backward (bf16/fp16)"""


def sample_memory(
    activation_bytes: int, logits_elements: int, workspace_bytes: int = 0, copies: int = LOSS_COPIES
) -> int:
    """Bytes one sample adds to a training step: the activations kept for backward, the
    workspace alive during it (activation gradients, backend workspaces) and ``copies`` fp32
    tensors of the logits' size (the loss's as backward begins: dominant for language models'
    vocabularies)."""
    return activation_bytes + workspace_bytes + copies * 4 * logits_elements


def memory_parts(
    params: int,
    sample_bytes: int,
    batch: int,
    optimizer: str,
    *,
    largest_param: int = 0,
    autocast: bool = False,
    sample_workspace_bytes: int = 0,
    moments: Sequence[tuple[int, int, int, int, int]] = (),
    device_type: str = "cpu",
    input_bytes: int = 0,
    unfused_recurrent: bool = False,
    conv_shapes: int = 0,
) -> dict[str, int]:
    """Where a training step's memory goes at its peak (Deep500's split): ``inputs`` (the
    batches of inputs and labels the run keeps on the device, ``input_bytes``), ``weights`` (fp32, plus
    autocast's 16-bit copies), ``gradients`` (fp32), ``optimizer_state`` (AdamW's two moments,
    SGD's momentum), ``activations`` (kept for backward, and the loss's copies of the logits),
    ``workspace`` (activation gradients and backend workspaces, or the optimizer step's
    temporaries) and, on a CPU, ``libraries`` (``CPU_LIBRARY_BYTES``, more with
    ``unfused_recurrent``: a recurrent layer the CPU runs step by step; and
    ``CPU_CONV_PRIMITIVE_BYTES`` for each of ``conv_shapes`` distinct convolutions) and ``heap`` (pages of
    glibc's heap that per-step layers leave resident beyond their live tensors).

    The peak is the largest of the step's moments: each of ``moments``, as (activation bytes per
    sample, workspace bytes per sample, parameters with a gradient, parameters whose autocast
    copy is saved, heap bytes per sample; ``workloads.counting.Moment``): backward runs from the
    last layer to the first, so while a layer's runs only the layers from it on have gradients
    and only those before it keep activations (those up to it, copies); in forward no gradient
    exists. Empty: one moment with everything (``sample_bytes``, of which
    ``sample_workspace_bytes`` workspace). At the optimizer step every gradient exists and
    AdamW's per-tensor temporaries, but no activation and no copy; the heap's pages are still
    resident (the most of any moment).
    Nothing is added for the allocator: on a CPU auto-fit's trials fix glibc's mmap threshold
    (``hpcdl.device.pin_mmap_threshold``), so their resident set holds the live tensors."""
    state = params * (8 if optimizer == "adamw" else 4)
    libraries = (
        CPU_LIBRARY_BYTES[(autocast, unfused_recurrent)] + conv_shapes * CPU_CONV_PRIMITIVE_BYTES
        if device_type == "cpu"
        else 0
    )
    during = [
        {
            "inputs": input_bytes,
            "weights": params * 4 + (AUTOCAST_COPY_BYTES * copies if autocast else 0),
            "gradients": grads * 4,
            "optimizer_state": state,
            "activations": kept * batch,
            "workspace": workspace * batch,
            "libraries": libraries,
            "heap": heap * batch,
        }
        for kept, workspace, grads, copies, heap in (
            moments or [(sample_bytes - sample_workspace_bytes, sample_workspace_bytes, params, params, 0)]
        )
    ]
    step = {
        "inputs": input_bytes,
        "weights": params * 4,
        "gradients": params * 4,
        "optimizer_state": state,
        "activations": 0,
        "workspace": ADAMW_TEMPORARIES * 4 * largest_param if optimizer == "adamw" else 0,
        "libraries": libraries,
        "heap": max((m[4] for m in moments), default=0) * batch,
    }
    return max([*during, step], key=lambda parts: sum(parts.values()))


def memory_estimate(
    params: int,
    sample_bytes: int,
    batch: int,
    optimizer: str,
    *,
    largest_param: int = 0,
    autocast: bool = False,
    device_type: str = "cpu",
) -> int:
    """Bytes a training step needs: the sum of ``memory_parts`` at its peak. ``batch`` is the
    micro-batch: gradient accumulation runs its micro-batches one after the other, each freeing
    its activations in its backward; what it adds, every gradient beside a later micro-batch's
    activations, is in this one moment, which counts them all."""
    parts = memory_parts(
        params,
        sample_bytes,
        batch,
        optimizer,
        largest_param=largest_param,
        autocast=autocast,
        device_type=device_type,
    )
    return sum(parts.values())


def aggregate_throughput(samples_per_rank: Sequence[int], windows_s: Sequence[float]) -> float:
    """Samples/s of a data-parallel run: every rank's samples over the slowest rank's window
    (never one rank's rate times the number of ranks)."""
    return throughput(sum(samples_per_rank), max(windows_s))


def shares(parts: Mapping[str, float]) -> dict[str, float]:
    """Each part over the sum of the parts, so that the shares add up to 1 (all 0 where nothing
    was measured): a step's phases, a phase's operator classes."""
    whole = sum(parts.values())
    return {name: (value / whole if whole > 0 else 0.0) for name, value in parts.items()}


def olympic_mean(values: Sequence[float]) -> float:
    """Mean without the fastest and the slowest value (with three or more; MLPerf's olympic
    mean of repeated runs): one disturbed run moves it less than the mean."""
    kept = sorted(values)[1:-1] if len(values) >= 3 else list(values)
    return float(np.mean(kept)) if kept else float("nan")


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: 0 when all ranks are alike; the straggler figure."""
    med = float(np.median(values)) if len(values) else 0.0
    return (max(values) - min(values)) / med if med > 0 else 0.0


def theoretical_bubble(stages: int, microbatches: int, virtual: int = 1) -> float:
    """The idle share of a pipeline step whose stages take equal times and communicate for free:
    ``(p - 1) / (v m + p - 1)`` for ``p`` ranks, ``m`` micro-batches and ``v`` stages per rank
    (GPipe and 1F1B: v = 1; interleaved 1F1B: v > 1). GPipe (Huang et al. 2019), Megatron-LM's
    interleaved schedule (Narayanan et al. 2021, eq. 1 and 2 over the ideal time)."""
    return (stages - 1) / (virtual * microbatches + stages - 1)


def pipeline_bubble(busy_s: float, span_s: float) -> float:
    """The measured idle share of a pipeline step on one rank: ``1 - busy / span``, where busy is
    the seconds its stages' forward and backward actions took and span the step's wall time
    (waiting for a neighbour's activations or gradients, stage imbalance and point-to-point
    time all count as idle)."""
    return 1 - busy_s / span_s if span_s > 0 else float("nan")


def pipeline_p2p_bytes(activation_bytes: int, microbatches: int) -> int:
    """Bytes one pipeline boundary carries per step: each micro-batch's activations forward and
    their gradient (the same size) backward. ``activation_bytes`` is one micro-batch's tensor
    crossing the boundary (attention: b/m x seq_len x width x the element size)."""
    return 2 * microbatches * activation_bytes


def algbw(nbytes: int, seconds: float) -> float:
    """A collective's algorithm bandwidth: its size in bytes over the time (nccl-tests' algbw).
    The size is nccl-tests': the buffer of an allreduce, the gathered output of an all-gather,
    the input of a reduce-scatter, one rank's send buffer of an all-to-all."""
    return nbytes / seconds if seconds > 0 else 0.0


BUS_FACTOR_STEPS = {"allreduce": 2, "all_gather": 1, "reduce_scatter": 1, "all_to_all": 1}
"""ring steps per rank of each collective, in units of (n-1): nccl-tests' PERFORMANCE.md"""


def bus_factor(collective: str, ranks: int) -> float:
    """busbw / algbw of a collective at ``ranks`` ranks (nccl-tests' PERFORMANCE.md): 2(n-1)/n
    for an allreduce (a reduce-scatter then an all-gather of the buffer), (n-1)/n for an
    all-gather, a reduce-scatter and an all-to-all (each rank sends or receives all but its own
    1/n of the size once); 1 for a point-to-point send (every byte crosses the one link)."""
    if collective == "send":
        return 1.0
    return BUS_FACTOR_STEPS[collective] * (ranks - 1) / ranks if ranks > 0 else 0.0


def busbw(algbw_bytes_per_s: float, ranks: int, collective: str = "allreduce") -> float:
    """Bus bandwidth, algbw x ``bus_factor``: the per-link traffic of the collective, comparable
    across rank counts and with the link's own bandwidth."""
    return algbw_bytes_per_s * bus_factor(collective, ranks)


def energy_from_power(times_s: Sequence[float], power_w: Sequence[float]) -> float | None:
    """Joules in a power trace: the trapezoidal integral of watts over seconds. Failed readings
    (NaN) are skipped, the trapezoid bridging them; None with fewer than two readings."""
    t = np.asarray(times_s, dtype=float)
    p = np.asarray(power_w, dtype=float)
    ok = np.isfinite(t) & np.isfinite(p)
    t, p = t[ok], p[ok]
    if t.size < 2:
        return None
    return float(np.sum((p[1:] + p[:-1]) * np.diff(t)) / 2)


def average_power(energy_j: float | None, seconds: float) -> float | None:
    """Watts over a window: its energy over its length (None when the energy is unknown)."""
    return energy_j / seconds if energy_j is not None and seconds > 0 else None


def energy_per_sample(energy_j: float | None, samples: int) -> float | None:
    """Joules per training sample of the timed work."""
    return energy_j / samples if energy_j is not None and samples > 0 else None


def samples_per_joule(samples: int, energy_j: float | None) -> float | None:
    """Training samples per joule of the timed work (the inverse of energy per sample)."""
    return samples / energy_j if energy_j is not None and energy_j > 0 else None


def energy_delay_product(energy_j: float | None, seconds: float) -> float | None:
    """J·s: energy to solution x time to solution. Lower is better; unlike energy alone it does
    not reward a machine that saves joules by running slowly."""
    return energy_j * seconds if energy_j is not None else None


def ai_ops_per_watt(train_flops_per_sample: float, samples: int, energy_j: float | None) -> float | None:
    """FLOPs per joule (the same number as FLOP/s per watt): analytic training FLOPs of the
    timed work over the energy it took."""
    return train_flops_per_sample * samples / energy_j if energy_j is not None and energy_j > 0 else None


def reached_target(first_loss: float, recent: Sequence[float], fraction: float) -> bool:
    """Time to target's stop rule: the mean loss of the recent steps (one pass over the distinct
    batches, so that no batch counts twice) has fallen to ``fraction`` of the first step's."""
    return len(recent) > 0 and float(np.mean(recent)) <= fraction * first_loss


def capacity(
    samples: Sequence[int], flops: Sequence[float], starts: Sequence[float], ends: Sequence[float]
) -> dict[str, float]:
    """Concurrent instances as one system (MLPerf HPC's throughput metric): every instance's
    samples and training FLOPs over the wall time from the earliest start to the latest end of
    their timed windows."""
    wall = max(ends) - min(starts)
    return {
        "total_samples": sum(samples),
        "total_flops": float(sum(flops)),
        "wall_s": wall,
        "samples_per_s": throughput(sum(samples), wall),
        "ai_ops_per_s": sum(flops) / wall if wall > 0 else 0.0,
    }


def slowdown(alone_samples_per_s: float, samples_per_s: float) -> float:
    """How much slower an instance ran beside the others than alone on the same devices (1: no
    interference; 2: half the rate)."""
    return alone_samples_per_s / samples_per_s if samples_per_s > 0 else float("inf")


def scaling_efficiency(x_n: float, n: int, x_base: float, n_base: int) -> float:
    """E(N) = X(N) / ((N / N0) X(N0)): throughput against perfect linear scaling from the
    smallest measured point N0 (N0 = 1 gives the usual X(N) / (N X(1)))."""
    return x_n / ((n / n_base) * x_base) if x_base > 0 else float("nan")


def speedup(x_n: float, x_base: float) -> float:
    """S(N) = X(N) / X(N0): strong scaling's gain over the smallest measured point."""
    return x_n / x_base if x_base > 0 else float("nan")


def energy_figures(
    energy_j: float | None, window_s: float, samples: int, train_flops_per_sample: float
) -> dict[str, float | None]:
    """Energy figures of the timed work from its energy (None throughout when that is unknown)."""
    return {
        "energy_to_solution_j": energy_j,
        "energy_per_sample_j": energy_per_sample(energy_j, samples),
        "energy_delay_product_js": energy_delay_product(energy_j, window_s),
        "ai_ops_per_watt": ai_ops_per_watt(train_flops_per_sample, samples, energy_j),
    }


def copy_bandwidth(nbytes: int, copies: int, seconds: float) -> float:
    """Memory bandwidth of a timed copy (``hpcdl diagnose``): each copy of ``nbytes`` reads and
    writes them once, 2 x nbytes moved (STREAM's counting for Copy)."""
    return 2 * nbytes * copies / seconds if seconds > 0 else 0.0


def pingpong(nbytes: int, round_trip_s: float) -> tuple[float, float]:
    """A point-to-point link's one-way latency (half the round trip) and bandwidth (``nbytes``
    over that one-way time), from the median round trip of a ping-pong (OSU's osu_latency and
    osu_bw-style counting; ``hpcdl diagnose``)."""
    one_way = round_trip_s / 2
    return one_way, (nbytes / one_way if one_way > 0 else 0.0)


def time_to_train_s(samples: float, samples_per_s: float) -> float:
    """Seconds to train on ``samples`` (a data set's samples × epochs) at ``samples_per_s``."""
    return samples / samples_per_s


def energy_to_train_j(samples: float, joules_per_sample: float, efficiency: float) -> float:
    """Energy to train on ``samples`` from one rank's measured joules per sample: every rank draws
    what one did, for ``1 / efficiency`` of the time one alone would take per sample,
    ``S · e₁ / E(p)``."""
    return samples * joules_per_sample / efficiency


def node_energy_j(nodes: int, node_power_w: float, seconds: float) -> float:
    """An estimate of the energy of ``nodes`` nodes drawing ``node_power_w`` each for
    ``seconds``: ``n · P_node · t`` (with a datasheet's maximum, an upper bound)."""
    return nodes * node_power_w * seconds


NORMAL_P10_P90 = 2.5631
"""the width of a normal distribution's 10th to 90th percentile, in standard deviations"""


def step_cv(p10: float, p90: float, median: float) -> float:
    """One rank's relative step-time spread, ``σ/μ``, from its percentiles as if normal:
    ``(p90 − p10) / (2.563 · median)`` (robust to the odd outlier a mean and σ are not)."""
    if not (median > 0 and math.isfinite(p10) and math.isfinite(p90)):
        return 0.0
    return max(0.0, p90 - p10) / (NORMAL_P10_P90 * median)


@functools.cache
def expected_max_normal(n: int) -> float:
    """The expected largest of ``n`` independent standard normal draws, ``∫ x · n φ(x) Φ(x)ⁿ⁻¹
    dx`` (numerically; 0 for one draw, 0.564 for 2, 1.42 for 8, 3.04 for 512): how many standard
    deviations the slowest of ``n`` ranks' steps lies above the mean."""
    if n <= 1:
        return 0.0
    x = np.linspace(-12.0, 12.0, 12001)
    phi = np.exp(-(x**2) / 2) / math.sqrt(2 * math.pi)
    big_phi = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    y = x * n * phi * big_phi ** (n - 1)
    # the trapezoid rule by hand: np.trapezoid is NumPy 2's name for np.trapz (1.x has only that)
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2)
