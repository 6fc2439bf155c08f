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
        [--device cuda] [--precision bf16] [--batch-mult 16]

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
    label: str
    preset: str
    knobs: dict[str, Any]
    """the preset's knobs set to the real model's input size"""
    batch: int
    real: Callable[[int], tuple[torch.nn.Module, Any]]
    """the real model and its batch of ``batch`` samples"""

    def name(self, mult: int = 1) -> str:
        return f"{self.label} b{self.batch * mult}"


CASES = [
    Case("resnet50 112px", "resnet50", {"image_size": 112}, 4, lambda b: real_models.resnet50(112, b)),
    Case("vgg16 112px", "vgg16", {"image_size": 112}, 2, lambda b: real_models.vgg16(112, b)),
    Case("lstm_lm 35", "lstm_lm", {}, 8, lambda b: real_models.lstm_lm(35, b)),
    Case("bert_base 128", "bert_base", {"seq_len": 128}, 4, lambda b: real_models.bert(128, b)),
    Case("gpt2_small 128", "gpt2_small", {"seq_len": 128}, 2, lambda b: real_models.gpt2(128, b)),
    Case("gpt2_small 1024", "gpt2_small", {}, 1, lambda b: real_models.gpt2(1024, b)),
]


def bare(spec: Spec) -> Spec:
    knobs: dict[str, Any] = dict(BARE)
    if spec.family == "attention":
        knobs["activation"] = "gelu"
    return spec.replace(**{k: v for k, v in knobs.items() if k in spec.knobs()})


def ratio(c: Comparison) -> str:
    r = c.ratio
    return f"{r['median']:.3f} ({r['p10']:.2f}-{r['p90']:.2f}; fastest {c.fastest_ratio:.3f})"


def run_case(
    case: Case, rounds: int, baseline: bool, device: torch.device, precision: str, mult: int = 1
) -> list[str]:
    module, batch = case.real(case.batch)
    spec = preset(case.preset, **case.knobs, batch_size=case.batch, precision=precision)
    count = spec.count()
    _, counted, _ = flops(Trainee(module, batch))  # on the CPU at the case's batch: FLOPs a sample
    params = sum(p.numel() for p in module.parameters())
    if mult > 1:  # timed at a larger batch (a GPU's compute-bound regime); counted per sample above
        module, batch = case.real(case.batch * mult)
        spec = spec.replace(batch_size=case.batch * mult)
    real = Trainee(module, batch, precision=spec.precision, device=device)
    samples = case.batch
    row = [
        case.name(mult),
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
    ap.add_argument("--precision", default="fp32", help="fp32 (default) | bf16 | fp16")
    ap.add_argument("--batch-mult", type=int, default=1, help="time every case at this multiple of its batch")
    args = ap.parse_args()
    device = resolve_device(args.device)
    warnings.filterwarnings("ignore")
    chosen = [c for c in CASES if not args.only or any(c.label.startswith(o) for o in args.only.split(","))]
    rows = []
    for case in chosen:
        if case.preset == "vgg16" and real_models.torchvision_models() is None:
            print(f"{case.name()}: skipped, torchvision is not installed")
            continue
        rows.append(
            run_case(case, args.rounds, not args.no_baseline, device, args.precision, args.batch_mult)
        )
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
