"""On-demand benchmark of hpcdl's own overheads and accuracy (not part of the test suite).

Prints, measured side by side in one run:
  1. hpcdl's step time against a bare hand-written PyTorch loop on the identical model and
     batch (target: ratio <= 1.02), interleaved A/B rounds, medians;
  2. analytic against FlopCounterMode-counted FLOPs per family over sampled specs (target <= 1 %);
  3. achieved FLOP/s of a compute-bound MLP in fp32 and bf16 against the theoretical peak (MFU)
     and the measured GEMM ceiling (target >= 80 % of the ceiling).

    .venv/bin/python benchmarks/bench_local.py [--rounds 5] [--device auto] [--parts 1,3]

On a GPU table 1 also times a compute-bound bf16 MLP (the two small specs are launch-bound there).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import hpcdl
from hpcdl.device import resolve_device, synchronize
from hpcdl.measure.config import RunConfig
from hpcdl.measure.data import make_batch
from hpcdl.measure.loop import Trainer
from hpcdl.results.text import si, table
from hpcdl.workloads.crosscheck import counted_flops
from hpcdl.workloads.precision import precision as precision_of
from hpcdl.workloads.registry import FAMILIES
from hpcdl.workloads.sampling import sample_spec

# FlopCounterMode over-counts grouped-conv weight gradients (tests/test_cnn.py): sample without them.
COUNTER_SAFE = {"cnn": {"block": ["plain", "basic", "bottleneck"]}}

OVERHEAD_SPECS = {
    "mlp 4x1024 b128": {"family": "mlp", "layers": 4, "width": 1024, "input_size": 1024, "batch_size": 128},
    "attention 2x256 L64 b8": {
        "family": "attention",
        "layers": 2,
        "width": 256,
        "heads": 4,
        "seq_len": 64,
        "vocab": 2000,
        "batch_size": 8,
    },
}
GPU_OVERHEAD_SPECS = {
    "mlp 4x8192 b4096 bf16": {
        "family": "mlp",
        "layers": 4,
        "width": 8192,
        "input_size": 8192,
        "batch_size": 4096,
        "precision": "bf16",
    },
}
"""on a GPU the two specs above are launch-bound (microseconds of work a kernel); this one is
compute-bound there (too slow for a CPU's rounds)"""


class Fixed:
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.batch = (x, y)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch


def bare_steps(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    n: int,
    device: torch.device,
    precision: str,
) -> list[float]:
    """The loop a user would write by hand: no phases, one sync per step, the forward pass under
    autocast in the spec's precision (as hpcdl's; without it a bf16 row timed bf16 against fp32)."""
    p = precision_of(precision)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=p.dtype, enabled=p.autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


def overhead(device: torch.device, rounds: int, steps: int) -> list[list[str]]:
    rows = []
    specs = OVERHEAD_SPECS | (GPU_OVERHEAD_SPECS if device.type == "cuda" else {})
    for name, d in specs.items():
        spec = hpcdl.spec_from_dict(d)
        x, y = make_batch(spec, device=device)
        models = [spec.build().to(device) for _ in range(2)]
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in models]
        trainer = Trainer(
            model=models[0], optimizer=opts[0], source=Fixed(x, y), device=device, precision=spec.precision
        )
        trainer.run(3, 3, 0)
        bare_steps(models[1], opts[1], x, y, 3, device, spec.precision)
        ours, bare = [], []
        for _ in range(rounds):  # interleaved, so drift hits both alike
            ours += trainer.run(0, steps, 0).step_s
            bare += bare_steps(models[1], opts[1], x, y, steps, device, spec.precision)
        mo, mb = statistics.median(ours), statistics.median(bare)
        rows.append([name, f"{mo * 1e3:.2f}", f"{mb * 1e3:.2f}", f"{mo / mb:.3f}", "<= 1.02"])
    return rows


def flop_accuracy(seeds: int) -> list[list[str]]:
    rows = []
    for family in FAMILIES:
        worst_f, worst_t = 0.0, 0.0
        for seed in range(seeds):
            spec = sample_spec(family, seed, COUNTER_SAFE.get(family), batch_size=2)
            c = spec.count()
            fwd, total = counted_flops(spec)
            worst_f = max(worst_f, abs(c.forward_flops - fwd) / fwd)
            worst_t = max(worst_t, abs(c.train_flops - total) / total)
        rows.append([family, str(seeds), f"{worst_f * 100:.3f}%", f"{worst_t * 100:.3f}%", "<= 1%"])
    return rows


def compute_bound(device: torch.device) -> list[list[str]]:
    """A compute-bound MLP in fp32 and bf16: its sustained FLOP/s against the theoretical peak
    (MFU, must not exceed 100 % unflagged) and against the measured GEMM ceiling (what the
    software stack reaches; target >= 80 %)."""
    rows = []
    for precision in ("fp32", "bf16"):
        width, batch = (8192, 4096) if device.type == "cuda" else (2048, 512)
        spec = hpcdl.spec_from_dict(
            {
                "family": "mlp",
                "layers": 4,
                "width": width,
                "input_size": width,
                "output_size": 1000,
                "batch_size": batch,
                "precision": precision,
            }
        )
        cfg = RunConfig(device=str(device), duration_s=5, data="random", optimizer="sgd")
        m = hpcdl.run(spec, cfg, output_dir=None).result.metrics
        flagged = " (flagged)" if m.flags else ""
        rows.append(
            [
                f"mlp 4x{width} b{batch} {precision}",
                si(m.ai_ops_per_s, "FLOP/s"),
                si(m.peak_flops, "FLOP/s"),
                f"{m.mfu * 100:.1f}%{flagged}",
                si(m.measured_matmul_flops, "FLOP/s"),
                f"{m.fraction_of_measured_matmul * 100:.1f}%",
                ">= 80% of the ceiling",
            ]
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--device", default="auto")
    p.add_argument("--parts", default="1,2,3", help="which tables to print (default 1,2,3)")
    a = p.parse_args()
    parts = set(a.parts.split(","))
    device = resolve_device(a.device)
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    if "1" in parts:
        rows = overhead(device, a.rounds, a.steps)
        print(table(["1. step time", "hpcdl ms", "bare ms", "ratio", "target"], rows), flush=True)
    if "2" in parts:
        rows = flop_accuracy(a.seeds)
        print(table(["2. FLOPs family", "specs", "max fwd err", "max train err", "target"], rows), flush=True)
    if "3" in parts:
        head = ["3. compute-bound", "achieved", "theoretical peak", "MFU", "GEMM ceiling", "of ceiling"]
        print(table([*head, "target"], compute_bound(device)))


if __name__ == "__main__":
    main()
