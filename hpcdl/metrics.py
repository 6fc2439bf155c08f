"""Every reported figure's formula, written once (METRICS.md documents each)."""

from __future__ import annotations

from collections.abc import Sequence

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


def ai_ops_per_s(train_flops_per_sample: float, samples_per_s: float) -> float:
    """Sustained training FLOP/s: analytic forward+backward FLOPs of a sample x samples/s."""
    return train_flops_per_sample * samples_per_s


def mfu(achieved_flops_per_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: achieved over peak FLOP/s (NaN when the peak is unknown)."""
    return achieved_flops_per_s / peak_flops_per_s if peak_flops_per_s > 0 else float("nan")


def memory_estimate(params: int, activation_bytes_per_sample: int, batch: int, optimizer: str) -> int:
    """Bytes a training step needs, roughly: fp32 weights and gradients, optimizer state
    (AdamW two moments; SGD one momentum buffer) and the batch's saved activations."""
    state_per_param = 8 if optimizer == "adamw" else 4
    return params * (4 + 4 + state_per_param) + activation_bytes_per_sample * batch
