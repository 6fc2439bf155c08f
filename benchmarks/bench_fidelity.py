"""Fidelity of the presets: each preset against the real implementation of the model it
mimics (``benchmarks/real_models.py``), same batch, input size and precision (not part of the
test suite).

For every preset it prints parameters and training FLOPs per sample (preset's analytic count
over the real model's, counted with FlopCounterMode as ``hpcdl profile`` counts) and the step
time of the preset over the real model's, timed interleaved in one process (rounds of one step
each, alternating order; median and p10-p90 over the rounds), both for the preset as shipped
and for it without its fidelity knobs (dropout 0, exact GELU: the presets before they had them).
Target: every shipped preset within 10 % of the real model's step time.

    .venv/bin/python benchmarks/bench_fidelity.py [--only gpt2_small,bert_base] [--rounds 6]
        [--device cuda] [--precision bf16]

Needs ``pip install -e '.[fidelity]'`` (transformers); the VGG-16 row also torchvision.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import real_models
import torch

from hpcdl.device import device_name, resolve_device
from hpcdl.proxy.measure import flops
from hpcdl.proxy.training import Trainee, spec_trainee
from hpcdl.proxy.verify import Comparison, interleaved
from hpcdl.results.text import table
from hpcdl.workloads.recipes import preset
from hpcdl.workloads.spec import Spec

BARE = {"dropout": 0.0}
"""the fidelity knobs switched off (and GELU exact, for attention presets)"""


@dataclass(frozen=True)
class Case:
    name: str
    preset: str
    knobs: dict[str, Any]
    """the preset's knobs set to the real model's batch and input size"""
    real: Callable[[], tuple[torch.nn.Module, Any]]


CASES = [
    Case(
        "resnet50 112px b4",
        "resnet50",
        {"image_size": 112, "batch_size": 4},
        lambda: real_models.resnet50(112, 4),
    ),
    Case("vgg16 112px b2", "vgg16", {"image_size": 112, "batch_size": 2}, lambda: real_models.vgg16(112, 2)),
    Case("lstm_lm 35 b8", "lstm_lm", {"batch_size": 8}, lambda: real_models.lstm_lm(35, 8)),
    Case(
        "bert_base 128 b4", "bert_base", {"seq_len": 128, "batch_size": 4}, lambda: real_models.bert(128, 4)
    ),
    Case(
        "gpt2_small 128 b2", "gpt2_small", {"seq_len": 128, "batch_size": 2}, lambda: real_models.gpt2(128, 2)
    ),
    Case("gpt2_small 1024 b1", "gpt2_small", {"batch_size": 1}, lambda: real_models.gpt2(1024, 1)),
]


def bare(spec: Spec) -> Spec:
    knobs: dict[str, Any] = dict(BARE)
    if spec.family == "attention":
        knobs["activation"] = "gelu"
    return spec.replace(**{k: v for k, v in knobs.items() if k in spec.knobs()})


def ratio(c: Comparison) -> str:
    r = c.ratio
    return f"{r['median']:.3f} ({r['p10']:.2f}-{r['p90']:.2f}; fastest {c.fastest_ratio:.3f})"


def run_case(case: Case, rounds: int, baseline: bool, device: torch.device, precision: str) -> list[str]:
    module, batch = case.real()
    spec = preset(case.preset, **case.knobs, precision=precision)
    count = spec.count()
    _, counted, _ = flops(Trainee(module, batch))  # counted on the CPU: the count is the device's
    real = Trainee(module, batch, precision=spec.precision, device=device)
    samples = spec.batch_size
    params = sum(p.numel() for p in module.parameters())
    row = [
        case.name,
        f"{params:,}",
        f"{count.params / params:.4f}",
        f"{count.train_flops / (counted / samples):.4f}",
    ]
    shipped = interleaved(spec_trainee(spec, device), real, rounds=rounds)
    row.append(ratio(shipped))
    if baseline:
        changed = bare(spec)
        same = changed == spec
        row.append("same" if same else ratio(interleaved(spec_trainee(changed, device), real, rounds=rounds)))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated case prefixes (e.g. gpt2_small,bert)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument(
        "--no-baseline", action="store_true", help="skip the presets without their fidelity knobs"
    )
    ap.add_argument("--device", default="cpu", help="cpu (default) | cuda | cuda:N")
    ap.add_argument("--precision", default="fp32", help="fp32 (default) | bf16 | fp16 | tf32")
    args = ap.parse_args()
    device = resolve_device(args.device)
    warnings.filterwarnings("ignore")
    chosen = [c for c in CASES if not args.only or any(c.name.startswith(o) for o in args.only.split(","))]
    rows = []
    for case in chosen:
        if case.preset == "vgg16" and real_models.torchvision_models() is None:
            print(f"{case.name}: skipped, torchvision is not installed")
            continue
        rows.append(run_case(case, args.rounds, not args.no_baseline, device, args.precision))
        print(" | ".join(rows[-1]), flush=True)
    head = ["case", "real params", "params preset/real", "train FLOPs preset/real", "step preset/real"]
    if not args.no_baseline:
        head.append("without dropout/GELU knobs")
    print()
    print(table(head, rows, numeric=False))
    threads = torch.get_num_threads()
    where = f"{threads} threads" if device.type == "cpu" else device_name(device)
    print(f"step: median (p10-p90) of {args.rounds} interleaved rounds, {where}, {args.precision}, AdamW")


if __name__ == "__main__":
    main()
