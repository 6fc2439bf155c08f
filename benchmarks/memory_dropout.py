"""On-demand: what a dropout keeps for its backward, and what counting it right does to the
memory estimate (docs/validation/2026-12-02-dropout-masks.md).

1. ``saved_tensors_hooks`` around one dropout of each kind, fp32 and bf16 tensors, and an fp32
   tensor under bf16 autocast: the dtype and bytes autograd keeps, through ``nn.Dropout`` (what
   a CPU runs: torch's ``_dropout_impl`` multiplies by a scaled copy of its noise) and through
   ``torch.native_dropout`` (what CUDA runs: a boolean mask).
2. Two workloads with dropout, fp32 and bf16, at batch 32: the estimate
   (``Spec.memory_estimate``) against the peak of a trial step in a child process, as auto-fit
   measures it (``measure.trial.cpu_trial``).

    .venv/bin/python benchmarks/memory_dropout.py            # ~2 min on 2 cores
"""

from __future__ import annotations

import torch
from torch import nn

from hpcdl.measure.trial import cpu_trial
from hpcdl.results.text import table
from hpcdl.workloads.registry import spec_from_dict

ELEMENTS = 64 * 128
WORKLOADS = {
    "attention": {"layers": 2, "width": 256, "heads": 4, "seq_len": 128, "vocab": 8000, "dropout": 0.1},
    "rnn": {"cell": "lstm", "hidden": 512, "layers": 2, "seq_len": 64, "vocab": 8000, "embedding": 256,
            "dropout": 0.5, "output": "step"},
}  # fmt: skip


def kept(drop: str, dtype: torch.dtype, autocast: bool) -> list[str]:
    """What autograd keeps of one dropout over ``ELEMENTS`` elements of ``dtype``."""
    x = torch.randn(ELEMENTS, dtype=dtype, requires_grad=True)
    seen: list[str] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        per = t.numel() * t.element_size() / ELEMENTS
        seen.append(f"{str(t.dtype).removeprefix('torch.')} {per:g} B/elem")
        return t

    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if drop == "nn.Dropout":
                nn.Dropout(0.1).train()(x)
            else:
                torch.native_dropout(x, 0.1, True)
    return seen


def main() -> int:
    rows = []
    for drop in ("nn.Dropout", "native_dropout"):
        for dtype, autocast in ((torch.float32, False), (torch.bfloat16, False), (torch.float32, True)):
            where = f"{str(dtype).removeprefix('torch.')}{' under bf16 autocast' if autocast else ''}"
            rows.append([drop, where, ", ".join(kept(drop, dtype, autocast))])
    print(table(["dropout", "tensor", "kept for backward"], rows))
    rows = []
    for family, knobs in WORKLOADS.items():
        for precision in ("fp32", "bf16"):
            spec = spec_from_dict({"family": family, **knobs, "batch_size": 32, "precision": precision})
            estimate = spec.memory_estimate(32, "adamw")
            peak = cpu_trial(spec, "adamw", 1, 4 << 30).peak_bytes
            shown = f"{peak / 2**20:.1f}" if peak else "-"
            ratio = f"{peak / estimate:.3f}" if peak else "-"
            rows.append([family, precision, f"{estimate / 2**20:.1f}", shown, ratio])
    print(table(["workload", "precision", "estimate MiB", "trial peak MiB", "measured / estimate"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
