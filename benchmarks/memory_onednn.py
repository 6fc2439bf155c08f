"""On-demand: what oneDNN holds outside PyTorch's allocator on a CPU, for the figures behind
``recurrent.fused_lstm_wide_input``, ``metrics.CPU_LIBRARY_BYTES`` and
``metrics.CPU_CONV_PRIMITIVE_BYTES`` (docs/validation/2026-11-26-memory-estimate.md). Each
measurement runs in a fresh process with glibc's mmap threshold fixed as auto-fit's trials fix it.

    .venv/bin/python benchmarks/memory_onednn.py lstm        # the 15 LSTM shapes, ~1 min
    .venv/bin/python benchmarks/memory_onednn.py primitives  # resident bytes per bf16 matmul shape
    .venv/bin/python benchmarks/memory_onednn.py convolutions fp32  # per conv shape trained (or bf16)

``lstm``: one fused LSTM layer's backward (after a warm-up backward at the same shape): the rise of
``VmHWM`` less the peak of the profiler's allocations, per step and sample in fp32 elements,
beside ``4 H + fused_lstm_wide_input``; the second of two profiled backward passes (the first
also holds the profiler's buffers). ``primitives``: the rise of the resident set after bf16
linears of 50 and then 200 new shapes (each a new oneDNN matmul primitive), per shape.
``convolutions``: the same after 20 and then 80 new convolution shapes trained (forward and
backward, batch 2 of 16 x 16 maps, under autocast in bf16), per shape.
"""

from __future__ import annotations

import subprocess
import sys

import torch
from memory_allocator import peak_of
from torch import nn
from torch.profiler import ProfilerActivity, profile

from hpcdl.device import malloc_trim, pin_mmap_threshold, reset_peak_memory, status_bytes
from hpcdl.workloads.recurrent import fused_lstm_wide_input

SHAPES = [(64, 64), (128, 64), (256, 64), (512, 64), (1024, 64), (1312, 64), (1536, 64), (2048, 64),
          (2592, 64), (2592, 128), (256, 256), (512, 256), (1024, 256), (1312, 256), (2592, 256)]  # fmt: skip
"""(inputs, units) of the LSTM layers measured"""
STEPS, BATCH = 100, 32


def _resident(key: str) -> int:
    found = status_bytes(key)
    if found is None:
        sys.exit(f"no {key} in /proc/self/status: this benchmark needs Linux")
    return found


def lstm_outside(fan_in: int, hidden: int, dtype: str) -> float:
    """fp32 elements per step and sample one LSTM layer's backward holds outside the allocator"""
    layer = nn.LSTM(fan_in, hidden, batch_first=True)
    x = torch.randn(BATCH, STEPS, fan_in, requires_grad=True)

    def loss() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            y, _ = layer(x)
        return y.float().sum()

    loss().backward()  # the primitives and their kernels exist before the measured backward
    for _ in range(2):  # the first profiled backward also holds the profiler's own buffers
        forward = loss()
        x.grad = None  # as a training step's backward finds them: no gradient yet
        layer.zero_grad(set_to_none=True)
        reset_peak_memory(torch.device("cpu"))  # freed memory back to the system, VmHWM := VmRSS
        base = _resident("VmRSS")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            forward.backward()
        rise = _resident("VmHWM") - base
    return (rise - peak_of(prof)[0]) / (4 * (STEPS + 1) * BATCH)


def primitives() -> None:
    w = torch.randn(256, 256).bfloat16()
    torch.nn.functional.linear(torch.randn(3, 256).bfloat16(), w)
    for n in (50, 200):
        malloc_trim()
        base = _resident("VmRSS")
        for m in range(1000 * n, 1000 * n + n):  # shapes no earlier call made
            torch.nn.functional.linear(torch.randn(m % 997 + 5 + n, 256).bfloat16(), w)
        malloc_trim()
        rise = _resident("VmRSS") - base
        print(
            f"{n} new bf16 matmul shapes: resident set +{rise / 1e6:.1f} MB, {rise / n / 1e6:.2f} MB a shape",
            flush=True,
        )


def convolutions(dtype: str) -> None:
    """The resident set's rise per new convolution shape trained (forward, backward of the data
    and of the weights: three oneDNN primitives), in ``dtype`` under autocast as a step runs it."""
    autocast = dtype == "bf16"

    def step(c: int, n: int) -> None:
        conv = nn.Conv2d(c, c + n % 7 + 8, 3, padding=1)
        x = torch.randn(2, c, 16, 16, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = conv(x)
        y.float().sum().backward()

    step(16, 0)
    for n in (20, 80):
        malloc_trim()
        base = _resident("VmRSS")
        for c in range(24, 24 + n):  # shapes no earlier call trained: the output channels differ by n
            step(c, n)
        malloc_trim()
        rise = _resident("VmRSS") - base
        print(
            f"{n} new {dtype} conv shapes: resident set +{rise / 1e6:.1f} MB,"
            f" {rise / n / 1e6:.2f} MB a shape",
            flush=True,
        )


def main(argv: list[str]) -> None:
    pin_mmap_threshold()
    if argv[:1] == ["--child"]:
        print(lstm_outside(int(argv[1]), int(argv[2]), argv[3]))
        return
    if argv == ["primitives"]:
        primitives()
        return
    if argv[:1] == ["convolutions"] and len(argv) == 2 and argv[1] in ("fp32", "bf16"):
        convolutions(argv[1])
        return
    if argv != ["lstm"]:
        sys.exit("usage: memory_onednn.py lstm | primitives | convolutions fp32|bf16")
    print("fused LSTM backward outside the allocator, fp32 elements per step and sample")
    print(f"({STEPS} steps, batch {BATCH}; fresh gradients, as in a training step)")
    print("inputs  units    fp32    bf16  4H + fused_lstm_wide_input")
    for fan_in, hidden in SHAPES:
        got = [
            float(subprocess.run([sys.executable, __file__, "--child", str(fan_in), str(hidden), dtype],
                                 capture_output=True, text=True, check=True).stdout.split()[-1])
            for dtype in ("fp32", "bf16")
        ]  # fmt: skip
        model = 4 * hidden + fused_lstm_wide_input(fan_in, hidden)
        print(f"{fan_in:6d} {hidden:6d} {got[0]:7.0f} {got[1]:7.0f} {model:7.0f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
