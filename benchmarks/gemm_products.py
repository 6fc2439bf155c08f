"""On-demand: the measured GEMM ceiling's parts, each library's best square product per size and
precision (``measure.peaks.gemm_products``, timed as ``gemm_ceiling`` times them), beside the
theoretical peak: which library sets the ceiling on this machine. On AMD CPUs fp32 ``torch.mm`` is
MKL's AVX2 code and oneDNN's inner product its AVX-512 one (docs/validation/2026-11-28-overhead-and-gemm.md).

    .venv/bin/python benchmarks/gemm_products.py [--seconds 1] [--precisions fp32,bf16] [--device cpu]
"""

from __future__ import annotations

import argparse

from hpcdl.device import device_name, resolve_device
from hpcdl.measure.peaks import CPU_SIZES, GPU_SIZES, gemm_ceiling, gemm_products, theoretical_peak
from hpcdl.results.text import si, table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=1.0, help="per product and size")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    device = resolve_device(a.device)
    sizes = GPU_SIZES if device.type == "cuda" else CPU_SIZES
    rows = []
    for precision in a.precisions.split(","):
        peak = theoretical_peak(device, device_name(device), precision)
        for name, product in gemm_products(device, precision).items():
            rates = [gemm_ceiling(device, precision, a.seconds, (n,), {name: product}) for n in sizes]
            rows.append([precision, name, *(si(r, "FLOP/s") for r in rates),
                         si(peak.flops, "FLOP/s") if peak else "unknown"])  # fmt: skip
    print(f"the best square product per size on {device_name(device)}, {a.seconds:g} s each")
    print(table(["precision", "product", *(f"n = {n}" for n in sizes), "theoretical peak"], rows))


if __name__ == "__main__":
    main()
