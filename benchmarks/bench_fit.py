"""Proxy fitting against real models (not part of the test suite): for one model of each kind
-- a CNN, a transformer encoder, a transformer decoder, a recurrent model -- profile the real
implementation (``benchmarks/real_models.py``), fit an hpcdl spec to the profile, then time the
fitted spec and the real model interleaved in one process.

Prints each fit's errors in parameters, training FLOPs and activation memory, and the step time
of the proxy over the real model's (median and p10-p90 over the interleaved rounds).
Targets: parameters and training FLOPs within 2 %, step time within 10 %.

    .venv/bin/python benchmarks/bench_fit.py [--only resnet50,gpt2] [--budget 300] [--rounds 10]
        [--device cuda]    # profile, fit and verify on that device
        [--any-family]     # search every family that takes the data, not only the expected one
        [--others]         # instead, ten networks no preset mimics (other_models.py), eleven
                           # with torchvision importable (PYTHONPATH; it must not replace torch)

Needs ``pip install -e '.[fidelity]'`` (transformers).
"""

from __future__ import annotations

import argparse
import multiprocessing
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import other_models
import real_models
import torch

import hpcdl
from hpcdl.proxy.reference import RealModel
from hpcdl.proxy.search import describe_spec
from hpcdl.proxy.verify import verify
from hpcdl.results.text import table


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    family: str
    real: Callable[[], tuple[torch.nn.Module, Any]]


CASES = [
    Case("resnet50 112px b4", "CNN", "cnn", lambda: real_models.resnet50(112, 4)),
    Case("bert_base 128 b4", "encoder", "attention", lambda: real_models.bert(128, 4)),
    Case("gpt2_small 128 b2", "decoder", "attention", lambda: real_models.gpt2(128, 2)),
    Case("lstm_lm 35 b8", "recurrent", "rnn", lambda: real_models.lstm_lm(35, 8)),
]
OTHERS = [
    Case("ResNet-18 64px b2", "CNN", "cnn", lambda: other_models.resnet18(64, 2)),
    Case("ResNet-34 64px b2", "CNN", "cnn", lambda: other_models.resnet34(64, 2)),
    Case("VGG-11 32px b2", "CNN", "cnn", lambda: other_models.vgg11(32, 2)),
    Case("MobileNetV2 64px b4", "CNN", "cnn", lambda: other_models.mobilenet_v2(64, 4)),
    Case("MobileNetV1 64px b4", "CNN", "cnn", lambda: other_models.mobilenet_v1(64, 4)),
    Case("SqueezeNet-1.1-like 64px b4", "CNN", "cnn", lambda: other_models.squeezenet(64, 4)),
    Case("plain CNN 32px b8", "CNN", "cnn", lambda: other_models.plain_cnn(32, 8)),
    Case("DistilBERT 64 b2", "encoder", "attention", lambda: other_models.distilbert(64, 2)),
    Case("pre-norm decoder 128 b2", "decoder", "attention", lambda: other_models.prenorm_decoder(128, 2)),
    Case("GRU LM 32 b4", "recurrent", "rnn", lambda: other_models.gru_lm(32, 4)),
]
"""networks no preset mimics (``--others``)"""
if real_models.torchvision_models() is not None:  # only torchvision has it
    v3 = Case("MobileNetV3-small 64px b4", "CNN", "cnn", lambda: other_models.mobilenet_v3_small(64, 4))
    OTHERS.append(v3)


def run_case(name: str, args: argparse.Namespace) -> list[str]:
    warnings.filterwarnings("ignore")
    case = next(c for c in CASES + OTHERS if c.name == name)
    module, batch = case.real()
    profile = hpcdl.profile(module, batch, name=case.name, steps=4, device=args.device)
    family = None if args.any_family else case.family
    result = hpcdl.fit(profile, family, budget_s=args.budget, finalists=2, device=args.device)
    print(f"{case.name}: {result.miss or 'reached'}", flush=True)
    module, batch = case.real()  # untrained weights again, as profiled
    real = RealModel(case.name, module, batch, None)
    comparison, entry = verify(result.spec, real, rounds=args.rounds, device=args.device)
    e = result.best.errors
    r = comparison.ratio
    print(f"{case.name}: {result.spec.family} {describe_spec(result.spec)}", flush=True)
    row = [
        case.name,
        case.kind,
        result.spec.family + ("" if result.reached else " (miss)"),
        f"{e['params']:+.2%}",
        f"{e['flops']:+.2%}",
        f"{e['memory']:+.1%}" if "memory" in e else "",
        f"{r['median']:.3f} ({r['p10']:.2f}-{r['p90']:.2f}; fastest {comparison.fastest_ratio:.3f})",
    ]
    print("row: " + " | ".join(row), flush=True)  # as each case ends: a long run keeps its rows
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated case prefixes")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds per fit")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds of the verification")
    ap.add_argument("--any-family", action="store_true")
    ap.add_argument("--others", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu (default) | cuda | cuda:N")
    args = ap.parse_args()
    cases = OTHERS if args.others else CASES
    wanted = args.only.split(",") if args.only else []
    names = [c.name for c in cases]
    if wanted:  # in the order asked
        names = [n for o in wanted for n in names if n.startswith(o)]
    # each case in a fresh process: two large models and their optimizer states per case would
    # otherwise pile up (a run of all four once ran out of 23 GiB)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn, max_tasks_per_child=1) as pool:
        rows = [pool.submit(run_case, name, args).result() for name in names]
    print()
    head = ["real model", "kind", "family", "params", "train FLOPs", "memory", "step proxy/real"]
    print(table(head, rows, numeric=False))
    print(
        f"errors: fitted / real - 1; step: median (p10-p90) of {args.rounds} interleaved rounds, fp32, AdamW,"
        f" on {args.device}"
    )


if __name__ == "__main__":
    main()
