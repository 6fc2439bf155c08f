"""Devices' dense peak FLOP/s by precision, each from its datasheet: what MFU divides by on a
GPU (``measure.peaks``), and the devices of the systems ``hpcdl predict`` compares
(``scaling.system``). Plain data, without torch, so that whoever reads a system file needs none.
"""

from __future__ import annotations

# name fragment (as torch.cuda.get_device_name reports it; the first match wins, so specific
# names come before the names they contain) -> dense peak FLOP/s by precision, and the source.
# fp32 is the CUDA-core (vector) figure on NVIDIA: hpcdl runs fp32 in IEEE precision, never TF32
# (hpcdl.device.ieee_fp32). On AMD CDNA the FP32 matrix cores compute full fp32, so the fp32
# matrix figure is the peak. tf32 (NVIDIA Ampere and later, AMD MI300X; half the bf16 figure) is
# listed for `hpcdl info` and for readers comparing: hpcdl itself never trains in it. MI250X: each
# of its two dies (GCDs) is a device of its own, so a device's peak is half the package's.
# Structured-sparsity figures (twice these) are never used.
LISTED = ("fp32", "bf16", "fp16", "tf32")
"""the precisions a datasheet entry may list"""
DATASHEET_PEAKS: list[tuple[str, dict[str, float], str]] = [
    (
        "GH200",
        {"tf32": 494.7e12, "fp32": 66.9e12, "bf16": 989.4e12, "fp16": 989.4e12},
        "NVIDIA GH200 datasheet",
    ),
    (
        "H200 NVL",
        {"tf32": 417.5e12, "fp32": 60e12, "bf16": 835.5e12, "fp16": 835.5e12},
        "NVIDIA H200 NVL datasheet",
    ),
    (
        "H200",
        {"tf32": 494.7e12, "fp32": 66.9e12, "bf16": 989.4e12, "fp16": 989.4e12},
        "NVIDIA H200 datasheet, SXM",
    ),
    (
        "H100 NVL",
        {"tf32": 417.5e12, "fp32": 60e12, "bf16": 835.5e12, "fp16": 835.5e12},
        "NVIDIA H100 NVL datasheet",
    ),
    (
        "H100 PCIe",
        {"tf32": 378e12, "fp32": 51.2e12, "bf16": 756.5e12, "fp16": 756.5e12},
        "NVIDIA H100 datasheet, PCIe",
    ),
    (
        "H100",
        {"tf32": 494.7e12, "fp32": 66.9e12, "bf16": 989.4e12, "fp16": 989.4e12},
        "NVIDIA H100 datasheet, SXM5",
    ),
    (
        "GB200",
        {"tf32": 1250e12, "fp32": 90e12, "bf16": 2500e12, "fp16": 2500e12},
        "NVIDIA Blackwell datasheet, GB200 per GPU",
    ),
    (
        "B200",
        {"tf32": 1125e12, "fp32": 80e12, "bf16": 2250e12, "fp16": 2250e12},
        "NVIDIA Blackwell datasheet, HGX B200",
    ),
    ("A100", {"tf32": 156e12, "fp32": 19.5e12, "bf16": 312e12, "fp16": 312e12}, "NVIDIA A100 datasheet"),
    ("A10", {"tf32": 62.5e12, "fp32": 31.2e12, "bf16": 125e12, "fp16": 125e12}, "NVIDIA A10 datasheet"),
    (
        "L40S",
        {"tf32": 183e12, "fp32": 91.6e12, "bf16": 362.05e12, "fp16": 362.05e12},
        "NVIDIA L40S datasheet",
    ),
    ("L40", {"tf32": 90.5e12, "fp32": 90.5e12, "bf16": 181.05e12, "fp16": 181.05e12}, "NVIDIA L40 datasheet"),
    ("L4", {"tf32": 60e12, "fp32": 30.3e12, "bf16": 121e12, "fp16": 121e12}, "NVIDIA L4 datasheet"),
    ("V100", {"fp32": 15.7e12, "fp16": 125e12}, "NVIDIA V100 datasheet, SXM2"),
    ("P100-SXM2", {"fp32": 10.6e12, "fp16": 21.2e12}, "NVIDIA Tesla P100 datasheet, SXM2 (NVLink)"),
    ("P100", {"fp32": 9.3e12, "fp16": 18.7e12}, "NVIDIA Tesla P100 datasheet, PCIe"),
    (
        "MI300X",
        {"tf32": 653.7e12, "fp32": 163.4e12, "bf16": 1307.4e12, "fp16": 1307.4e12},
        "AMD Instinct MI300X data sheet",
    ),
    ("MI250X", {"fp32": 47.85e12, "bf16": 191.5e12, "fp16": 191.5e12}, "AMD MI250X data sheet, per GCD"),
]


def datasheet_entry(device_name: str) -> tuple[dict[str, float], str] | None:
    """The peaks of the first entry whose name fragment is in ``device_name``, and their source."""
    for fragment, peaks, source in DATASHEET_PEAKS:
        if fragment in device_name:
            return peaks, source
    return None
