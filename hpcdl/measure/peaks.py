"""Peak FLOP/s: datasheet figures for known GPUs, and a measured dense-matmul probe.

MFU is only as honest as its denominator: every datasheet entry names its source, dense
(no structured sparsity) figures only, and an unknown device falls back to the measured
probe with a warning rather than to a guess.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hpcdl.measure.device import synchronize
from hpcdl.workloads.precision import precision as precision_of

# name fragment (as torch.cuda.get_device_name reports it) -> dense peak FLOP/s by precision.
# fp32 is the non-tensor-core figure: hpcdl does not enable TF32 unless asked.
# Sources: NVIDIA H100 Tensor Core GPU datasheet (SXM5 / PCIe columns); NVIDIA H200 datasheet;
# NVIDIA A100 Tensor Core GPU datasheet; NVIDIA V100 datasheet; NVIDIA L40S datasheet.
# Sparsity figures ("with sparsity") are twice these and are not used.
DATASHEET_PEAKS: list[tuple[str, dict[str, float], str]] = [
    ("H100 PCIe", {"fp32": 51.2e12, "bf16": 756.5e12, "fp16": 756.5e12}, "NVIDIA H100 datasheet, PCIe"),
    ("H100", {"fp32": 66.9e12, "bf16": 989.4e12, "fp16": 989.4e12}, "NVIDIA H100 datasheet, SXM5"),
    ("H200", {"fp32": 66.9e12, "bf16": 989.4e12, "fp16": 989.4e12}, "NVIDIA H200 datasheet, SXM"),
    ("GH200", {"fp32": 66.9e12, "bf16": 989.4e12, "fp16": 989.4e12}, "NVIDIA GH200 datasheet"),
    ("A100", {"fp32": 19.5e12, "bf16": 312e12, "fp16": 312e12}, "NVIDIA A100 datasheet"),
    ("V100", {"fp32": 15.7e12, "fp16": 125e12}, "NVIDIA V100 datasheet, SXM2"),
    ("L40S", {"fp32": 91.6e12, "bf16": 362.05e12, "fp16": 362.05e12}, "NVIDIA L40S datasheet"),
]


@dataclass(frozen=True)
class Peak:
    """The FLOP/s that MFU is computed against, and where it came from."""

    flops: float
    source: str  # "user", "datasheet: ...", or "measured matmul probe"


def datasheet_peak(device_name: str, precision: str) -> Peak | None:
    """The datasheet peak of a known device at a precision, or None."""
    for fragment, peaks, source in DATASHEET_PEAKS:
        if fragment in device_name and precision in peaks:
            return Peak(peaks[precision], f"datasheet: {source}")
    return None


def matmul_probe(device: torch.device, precision: str, seconds: float = 1.0) -> float:
    """Measured peak FLOP/s of square matrix products in ``precision`` on ``device``: after
    warm-up, products are timed one by one (between device synchronisations) for ``seconds``,
    and the fastest one counts -- a peak, not a mean, so that noise on a shared node does not
    lower the MFU denominator."""
    n = 8192 if device.type == "cuda" else 2048
    dtype = precision_of(precision).dtype
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=device).to(dtype)
    b = torch.randn(n, n, generator=gen, device=device).to(dtype)
    for _ in range(2):
        torch.mm(a, b)
    synchronize(device)
    best = float("inf")
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best
