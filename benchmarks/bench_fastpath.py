"""On-demand benchmark of hpcdl's execution modes (not part of the test suite).

Prints, measured side by side in one run, interleaved rounds, medians:
  1. per class S workload (and with --presets, per preset at a small batch): hpcdl's step eager
     and compiled (``--compile``), their ratio, the time to the first compiled step, and how far
     the two runs' losses drift apart over 20 steps from the same weights and batches;
  2. hpcdl's step against a bare hand-written loop of the same model, eager and compiled
     (target: hpcdl's rate >= 0.99 of the bare loop's in every mode);
  3. with --variants, what ``auto`` chooses on this device: the fused optimizer against the
     per-parameter one, and channels-last against contiguous convolutions (cnn, speech).

    .venv/bin/python benchmarks/bench_fastpath.py [--rounds 5] [--steps 3] [--device auto]
    .venv/bin/python benchmarks/bench_fastpath.py --only cnn-resnet-small --parts 3
    .venv/bin/python benchmarks/bench_fastpath.py --presets --batch 8 --parts 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hpcdl.device import resolve_device, synchronize
from hpcdl.harness.parts import make_optimizer
from hpcdl.measure.config import RunConfig
from hpcdl.measure.data import DevicePool, device_pool
from hpcdl.measure.execution import Execution, compiled, inputs, prepare, resolve
from hpcdl.measure.loop import Trainer
from hpcdl.results.text import table
from hpcdl.workloads import recipes
from hpcdl.workloads.spec import Spec

AGREEMENT_STEPS = 20
SPEED = ["workload", "eager ms", "compiled ms", "ratio", "first step s", "loss drift"]
OVERHEAD = ["workload", "mode", "hpcdl ms", "bare ms", "hpcdl rate / bare", "target"]


def trainer_of(spec: Spec, execution: Execution, device: torch.device, weights: dict) -> Trainer:
    """hpcdl's timed loop of ``spec`` as a run builds it (``harness.runner.measure_rank``), from
    ``weights``, on four batches of the spec's learnable data."""
    model = prepare(spec.build().to(device), execution)
    model.load_state_dict(weights)
    pool = device_pool(spec, device, 4, learnable=True)
    pool.batches[:] = [(inputs(x, execution), y) for x, y in pool.batches]
    optimizer = make_optimizer(model.parameters(), RunConfig(), execution.fused_optimizer)
    return Trainer(
        model=compiled(model, execution),
        optimizer=optimizer,
        source=pool,
        device=device,
        precision=spec.precision,
    )


def bare(trainer: Trainer) -> Callable[[], float]:
    """The loop a user would write by hand over the same model, optimizer and batches: no
    phases, one synchronisation per step; its step, like hpcdl's, takes its batch."""
    p = trainer.precision
    pool = trainer.source
    assert isinstance(pool, DevicePool)

    def step() -> float:
        t0 = time.perf_counter()
        x, y = pool.next()
        with torch.autocast(trainer.device.type, dtype=p.dtype, enabled=p.autocast):
            logits = trainer.model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        synchronize(trainer.device)
        return time.perf_counter() - t0

    return step


def modes(spec: Spec, device: torch.device, **choices: str) -> dict[str, Execution]:
    fused, fmt = choices.get("fused", "auto"), choices.get("memory_format", "auto")
    return {m: resolve(m, False, fused, fmt, spec, device) for m in ("eager", "compile")}


def interleaved(steppers: dict[str, Callable[[], float]], rounds: int, steps: int) -> dict[str, float]:
    """Median step seconds of each, over ``rounds`` rounds of ``steps`` steps each in turn."""
    times: dict[str, list[float]] = {k: [] for k in steppers}
    for _ in range(rounds):
        for name, step in steppers.items():
            times[name] += [step() for _ in range(steps)]
    return {k: statistics.median(v) for k, v in times.items()}


def speed(specs: dict[str, Spec], device: torch.device, rounds: int, steps: int) -> list[list[str]]:
    rows = []
    for name, spec in specs.items():
        weights = spec.build().to(device).state_dict()
        run = {m: trainer_of(spec, e, device, weights) for m, e in modes(spec, device).items()}
        first = {}
        for m, t in run.items():
            t0 = time.perf_counter()
            t.step()
            first[m] = time.perf_counter() - t0
        for _ in range(AGREEMENT_STEPS - 1):  # both from the same weights on the same batches
            for t in run.values():
                t.step()
        eager, comp = ([float(v) for v in t._losses] for t in run.values())
        drift = max(abs(a - b) / abs(a) for a, b in zip(eager, comp, strict=True))
        med = interleaved({m: (lambda t=t: t.step()[0]) for m, t in run.items()}, rounds, steps)
        rows.append(
            [
                name,
                f"{med['eager'] * 1e3:.1f}",
                f"{med['compile'] * 1e3:.1f}",
                f"{med['compile'] / med['eager']:.3f}",
                f"{first['compile']:.1f}",
                f"{drift:.1e}",
            ]
        )
        print(
            table(["workload", "eager ms", "compiled ms", "ratio", "first step s", "loss drift"], rows[-1:])
        )
    return rows


def overhead(specs: dict[str, Spec], device: torch.device, rounds: int, steps: int) -> list[list[str]]:
    rows = []
    for name, spec in specs.items():
        weights = spec.build().to(device).state_dict()
        for mode, execution in modes(spec, device).items():
            ours, theirs = (trainer_of(spec, execution, device, weights) for _ in range(2))
            by_hand = bare(theirs)
            for _ in range(3):  # compiled: both compile (and warm) before timing
                ours.step()
                by_hand()
            med = interleaved({"hpcdl": lambda t=ours: t.step()[0], "bare": by_hand}, rounds, steps)
            ms = f"{med['hpcdl'] * 1e3:.2f}", f"{med['bare'] * 1e3:.2f}"
            rows.append([name, mode, *ms, f"{med['bare'] / med['hpcdl']:.3f}", ">= 0.99"])
            print(table(OVERHEAD, rows[-1:]), flush=True)
    return rows


def variants(specs: dict[str, Spec], device: torch.device, rounds: int, steps: int) -> list[list[str]]:
    rows = []
    for name, spec in specs.items():
        weights = spec.build().to(device).state_dict()
        tried = {"per-parameter optimizer": {"fused": "off"}, "fused optimizer": {"fused": "on"}}
        if spec.channels_last:  # the families with convolutions
            tried["channels_last"] = {"memory_format": "channels_last", "fused": "off"}
        run = {}
        for label, choice in tried.items():
            fused, fmt = choice.get("fused", "auto"), choice.get("memory_format", "contiguous")
            e = resolve("eager", False, fused, fmt, spec, device)
            run[label] = trainer_of(spec, e, device, weights)
            for _ in range(2):
                run[label].step()
        med = interleaved({k: (lambda t=t: t.step()[0]) for k, t in run.items()}, rounds, steps)
        base = med["per-parameter optimizer"]
        rows += [[name, k, f"{v * 1e3:.1f}", f"{v / base:.3f}"] for k, v in med.items()]
        print(table(["workload", "eager variant", "ms", "ratio"], rows[-len(med) :]))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3, help="steps per round")
    p.add_argument("--parts", default="1,2", help="which tables: 1 speed, 2 overhead, 3 variants")
    p.add_argument("--only", default="", help="comma-separated workload names")
    p.add_argument("--presets", action="store_true", help="the presets at --batch instead of class S")
    p.add_argument("--batch", type=int, default=8, help="batch of each preset (with --presets)")
    p.add_argument("--precision", default="", help="bf16, fp16 (default: each workload's own)")
    a = p.parse_args()
    device = resolve_device(a.device)
    torch.manual_seed(0)
    if a.presets:
        specs = {n: recipes.preset(n, batch_size=a.batch) for n in recipes.presets()}
    else:
        specs = recipes.suite("S").specs()
    if a.only:
        specs = {n: s for n, s in specs.items() if n in a.only.split(",")}
    if a.precision:
        specs = {n: s.replace(precision=a.precision) for n, s in specs.items()}
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    parts = a.parts.split(",")
    if "1" in parts:
        speed(specs, device, a.rounds, a.steps)
    if "2" in parts:
        overhead(specs, device, a.rounds, a.steps)
    if "3" in parts:
        variants(specs, device, a.rounds, a.steps)


if __name__ == "__main__":
    main()
