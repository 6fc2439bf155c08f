"""On-demand benchmark: the memory estimate behind --fit (``Spec.memory_estimate``) against the
memory a real training step takes, over sampled specs of every family in fp32 and bf16, each
measured in a fresh process (the rise of the peak resident set; ``measure.trial``, as auto-fit
measures); then auto-fit's error per family and precision: how far below the target the measured
peak of the batch ``measure.fit.search`` chose lands (real trials, child processes).

Prints, per family and precision, the ratio measured / estimate (min, median, max) over the specs
whose tensors are estimated above 30 MB (below that what the libraries hold dominates), then
the peak's excess over the estimate's tensors and its convolutions' primitives per precision, with
and without an unfused recurrent layer (what ``metrics.CPU_LIBRARY_BYTES`` stands for), and the
allowance of that form these specs would choose, for docs/validation/. ``--skip N`` measures each row's
specs after its first N instead: specs the allowance was not chosen on. ``--fill-mb M`` measures
the same specs each at the batch whose estimate fills M MB, where auto-fit uses the estimate (the
batch it starts from).

    .venv/bin/python benchmarks/bench_memory.py [--seeds 4] [--skip 0] [--batch 32] [--fit-mb 300]
        [--fill-mb 0] [--families rnn,speech] [--precisions fp32,bf16]
        [--save specs.json]   # --save: every spec's tensors and peak, for memory_residual.py
    .venv/bin/python benchmarks/bench_memory.py --rescore specs.json [...]  # their peaks, today's estimates
    .venv/bin/python benchmarks/bench_memory.py --records reference_results/h200-2026-11-27/suite-M-bf16
    .venv/bin/python benchmarks/bench_memory.py --device cuda

On a GPU a step is measured as auto-fit measures there: the rise of the caching allocator's
reserved peak (``measure.trial.cuda_trial``), in this process; a second table gives the peak of
live tensors (``max_memory_allocated``), what the estimate models.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
import torch
from memory_allocator import BAND, MAX_BYTES, MIN_BYTES, fill_batch, tensor_bytes

from hpcdl.device import malloc_library, resolve_device
from hpcdl.measure.fit import estimate_line, estimated_batch, search
from hpcdl.measure.trial import Trial, cpu_trial, cuda_trial
from hpcdl.metrics import CPU_CONV_PRIMITIVE_BYTES
from hpcdl.records.store import load_record
from hpcdl.results.text import si, table
from hpcdl.workloads.precision import precision as precision_of
from hpcdl.workloads.registry import FAMILIES, spec_from_dict
from hpcdl.workloads.sampling import sample_spec
from hpcdl.workloads.spec import Spec

ALLOCATED: dict[tuple[str, str], list[float]] = {}
"""on a GPU, the allocator's peak of live tensors (``max_memory_allocated``) over the estimate,
by (family, precision): the tensors alone, without the caching allocator's rounding"""
EXCESS: dict[tuple[str, bool], list[float]] = {}
"""bytes measured over the estimate's tensors and its convolutions' primitives
(``metrics.CPU_CONV_PRIMITIVE_BYTES``), by (precision, has an unfused recurrent layer)"""
MEASURED: list[tuple[int, int, bool, bool]] = []
"""every spec's (estimated tensors and convolutions' primitives, measured peak, autocast, unfused
recurrent layer), bytes"""
SPECS: list[dict[str, object]] = []
"""every spec measured, for ``--save``: family, precision, seed, batch, tensors and measured bytes,
and the allocator the trial called"""
MALLOC = malloc_library()
"""whose ``malloc`` this process and its trials (children, which inherit ``LD_PRELOAD``) call, for
the estimate (``Spec.memory_parts``)"""


def trial(spec: Spec, limit: int, device: torch.device) -> Trial:
    """One measured training step: on a GPU the rise of the caching allocator's reserved peak (as
    auto-fit measures there), on a CPU the rise of a child process's peak resident set."""
    if device.type == "cuda":
        return cuda_trial(spec, "adamw", 1, device)
    return cpu_trial(spec, "adamw", 1, limit)


def ratios(
    family: str, precision: str, seeds: int, batch: int, device: torch.device, skip: int = 0, fill: int = 0
) -> list[float]:
    """measured / estimated of the ``seeds`` specs after the first ``skip`` large enough to
    measure (``skip``: held-out specs, unseen by an allowance chosen on the first ones); with
    ``fill``, each of the same specs at the batch whose estimate fills ``fill`` bytes, the batch
    auto-fit starts from (``measure.fit.estimated_batch``)"""
    out: list[float] = []
    passed = 0
    for seed in range((seeds + skip) * 4):  # draw until enough specs are large enough to measure
        spec = sample_spec(family, seed, batch_size=batch, precision=precision)
        tensors = tensor_bytes(spec, batch)  # the allowance and glibc's heap do not decide the sample
        if not MIN_BYTES <= tensors <= MAX_BYTES:
            continue
        passed += 1
        if passed <= skip:
            continue
        if fill:
            filled = fill_batch(spec, fill, device.type, MALLOC)
            if filled is None:
                print(f"  {family} {precision} seed {seed}: batch 1 over {si(fill, 'B')}", flush=True)
                continue
            spec = spec.replace(batch_size=filled)
            tensors = tensor_bytes(spec, filled)
        estimate = spec.memory_estimate(spec.batch_size, "adamw", device.type, malloc=MALLOC)
        measured = trial(spec, 4 * estimate + (1 << 30), device).peak_bytes
        if measured is None:  # past the trial's limit (4x the estimate and 1 GiB): a ratio above 4
            print(f"  {family} {precision} seed {seed}: {si(estimate, 'B')} estimated, over 4x", flush=True)
            out.append(float("inf"))
            continue
        out.append(measured / estimate)
        # its distinct convolutions' primitives are counted apart from the three-term allowance
        convs = spec.count().conv_shapes * CPU_CONV_PRIMITIVE_BYTES if device.type == "cpu" else 0
        EXCESS.setdefault((precision, spec.unfused_recurrent), []).append(measured - tensors - convs)
        MEASURED.append((tensors + convs, measured, precision_of(precision).autocast, spec.unfused_recurrent))
        SPECS.append(
            dict(family=family, precision=precision, seed=seed, batch=spec.batch_size, tensors=tensors,
                 measured=measured, malloc=MALLOC)
        )  # fmt: skip
        line = (
            f"  {family} {precision} seed {seed}, batch {spec.batch_size}: {si(estimate, 'B')} estimated,"
            f" ratio {out[-1]:.2f},"
            f" {(measured - tensors) / 1e6:.1f} MB over its tensors"
        )
        if device.type == "cuda":  # the trial reset the peak statistics; nothing else is on the GPU
            ALLOCATED.setdefault((family, precision), []).append(
                torch.cuda.max_memory_allocated(device) / estimate
            )
            line += f", allocated {ALLOCATED[family, precision][-1]:.2f}"
        print(line, flush=True)
        if len(out) == seeds:
            break
    return out


GRID_MIB = 24.0
"""the largest value of each term ``minimax_allowance`` tries"""


def minimax_allowance(measured: list[tuple[int, int, bool, bool]]) -> tuple[float, float, float, float]:
    """The CPU libraries' allowance, as ``metrics.CPU_LIBRARY_BYTES`` is built (MiB: a base, more
    with autocast, more with an unfused recurrent layer, in steps of 0.5 up to ``GRID_MIB``), that
    keeps these specs' measured / estimated nearest 1 (the greatest deviation, either way,
    least), and that deviation. A term no spec has is left at 0."""
    t, m, a, u = (np.array(x, dtype=float) for x in zip(*measured, strict=True))
    grid = np.arange(0, GRID_MIB + 0.5, 0.5) * (1 << 20)
    base, auto, unf = np.meshgrid(grid, grid, grid, indexing="ij")
    allowance = base[..., None] + auto[..., None] * a + unf[..., None] * u
    r = m / (t + allowance)
    worst = np.maximum(r.max(axis=-1), 1 / r.min(axis=-1))
    i = np.unravel_index(np.argmin(worst), worst.shape)
    return base[i] / (1 << 20), auto[i] / (1 << 20), unf[i] / (1 << 20), float(worst[i])


def fit_error(family: str, precision: str, target: int, device: torch.device) -> tuple[int, int, int, float]:
    """(estimated batch, chosen batch, trials, measured peak / target) of a fit of the first
    sampled spec of ``family`` in ``precision`` to ``target`` bytes of model memory."""
    spec = sample_spec(family, 0, batch_size=1, precision=precision)
    _, per_sample = estimate_line(spec, "adamw", device.type, 1, MALLOC)
    start = estimated_batch(spec, "adamw", 1.0, target, device.type, malloc=MALLOC)
    batch, trials, _, _ = search(
        lambda b: trial(spec.replace(batch_size=b), 4 * target + (512 << 20), device),
        int(start),
        target,
        2 * target,
        float(per_sample),
    )
    peak = next(t.peak_bytes for t in trials if t.batch == batch)
    seen = [f"{t.batch}: {t.peak_bytes / target:.3f}" if t.peak_bytes else f"{t.batch}: over" for t in trials]
    print(f"  {family} {precision}: trials (batch: peak / target) {', '.join(seen)}", flush=True)
    return int(start), batch, len(trials), (peak or 0) / target


LARGE_BYTES = 120e6
"""``--rescore`` counts the specs estimated at this or more apart: below it what a step holds
outside PyTorch's allocator (10-30 MB) is a large share of the estimate"""


def rescore(paths: list[str]) -> None:
    """The peaks ``--save`` files hold over today's estimates of the same specs at the same
    batches (fp32 and bf16 rows; a spec's peak does not depend on the estimate): what a change to
    the estimate does to measured specs, without measuring them again; then how many are within
    among those estimated below ``LARGE_BYTES`` and at it or more."""
    found: dict[tuple[str, str], list[float]] = {}
    by_size: dict[bool, list[float]] = {False: [], True: []}
    for path in paths:
        for s in json.loads(Path(path).read_text()):
            spec = sample_spec(s["family"], s["seed"], batch_size=s["batch"], precision=s["precision"])
            estimate = spec.memory_estimate(s["batch"], "adamw", "cpu", malloc=s.get("malloc", "glibc"))
            ratio = s["measured"] / estimate
            found.setdefault((s["family"], s["precision"]), []).append(ratio)
            by_size[estimate >= LARGE_BYTES].append(ratio)
            if not BAND[0] <= ratio <= BAND[1]:
                print(f"  {s['family']} {s['precision']} seed {s['seed']}, batch {s['batch']}: "
                      f"{si(estimate, 'B')} estimated, ratio {ratio:.3f}")  # fmt: skip
    rows = [[f, p, str(len(r)), *(f"{x:.2f}" for x in (min(r), statistics.median(r), max(r))),
             str(sum(not BAND[0] <= x <= BAND[1] for x in r))] for (f, p), r in found.items()]  # fmt: skip
    print(f"measured peaks in {', '.join(paths)} over today's estimates")
    print(
        table(["family", "precision", "specs", "min", "median", "max", f"outside {BAND[0]}-{BAND[1]}"], rows)
    )
    for large, r in by_size.items():
        if r:
            within = sum(BAND[0] <= x <= BAND[1] for x in r)
            side = "or more" if large else "below"
            print(f"estimated at {si(LARGE_BYTES, 'B')} {side}: {within} of {len(r)} within, "
                  f"{min(r):.3f}-{max(r):.3f}")  # fmt: skip


def rescore_records(folder: str) -> None:
    """Each record's measured peak (``metrics.memory.measured``) over today's estimate of its
    spec at its batch, on its device type, with its optimizer, pool of batches and allocator:
    what a change to the estimate does to records measured where this machine cannot measure
    (a GPU's), without running them again."""
    rows = []
    for path in sorted(Path(folder).glob("*.json")):
        r = load_record(path)
        if "spec" not in r or not r["metrics"].get("memory", {}).get("measured"):
            continue  # a suite's index, or a record without a measured peak
        spec, run, memory = spec_from_dict(r["spec"]), r["run"], r["metrics"]["memory"]
        device_type = str(run["device"]).split(":")[0]
        malloc = r["environment"].get("malloc", "glibc")
        batch, pool = spec.batch_size, run["pool_batches"]
        today = spec.memory_estimate(batch, run["optimizer"], device_type, pool, malloc)
        measured, kind = memory["measured"]["peak_bytes"], memory["measured"]["kind"]
        then = memory["estimated"]["total"]
        rows.append([r["name"], str(batch), si(then, "B"), si(today, "B"), f"{si(measured, 'B')} ({kind})",
                     f"{measured / today:.3f}"])  # fmt: skip
    print(f"measured peaks of the records in {folder} over today's estimates")
    print(table(["record", "batch", "estimated then", "today", "measured", "measured / today"], rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument(
        "--fit-mb", type=int, default=300, help="auto-fit's target in MB of model memory (0: skip)"
    )
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--device", default="cpu", help="cpu (default) | cuda | cuda:N")
    p.add_argument("--skip", type=int, default=0, help="leave out each row's first N specs")
    p.add_argument(
        "--fill-mb", type=int, default=0, help="measure each spec at the batch whose estimate fills this"
    )
    p.add_argument("--save", help="write every spec's estimated tensors and measured peak to this JSON file")
    p.add_argument("--rescore", nargs="+", help="measure nothing: --save files' peaks over today's estimates")
    p.add_argument("--records", help="measure nothing: a folder of records' peaks over today's estimates")
    a = p.parse_args()
    if a.rescore:
        rescore(a.rescore)
        return
    if a.records:
        rescore_records(a.records)
        return
    device = resolve_device(a.device)
    families = a.families.split(",")
    rows = []
    for family in families:
        for precision in a.precisions.split(","):
            r = ratios(family, precision, a.seeds, a.batch, device, a.skip, a.fill_mb * 10**6)
            if r:
                rows.append(
                    [family, precision, str(len(r))]
                    + [f"{x:.2f}" for x in (min(r), statistics.median(r), max(r))]
                )
    print(
        f"measured / estimated memory of a training step, specs whose tensors are estimated >= "
        f"{si(MIN_BYTES, 'B')} at batch {a.batch}"
        + (f", each measured at the batch whose estimate fills {a.fill_mb} MB" if a.fill_mb else "")
        + f", on {device}"
        + (f" ({MALLOC}'s malloc)" if device.type == "cpu" else "")
        + (f", each row's first {a.skip} specs left out" if a.skip else "")
    )
    print(table(["family", "precision", "specs", "min", "median", "max"], rows), flush=True)
    if ALLOCATED:
        rows = [[f, p, str(len(r)), *(f"{x:.2f}" for x in (min(r), statistics.median(r), max(r)))]
                for (f, p), r in ALLOCATED.items()]  # fmt: skip
        print("\nthe same, max_memory_allocated (the live tensors, no allocator rounding) / estimated")
        print(table(["family", "precision", "specs", "min", "median", "max"], rows), flush=True)
    excess = [
        [precision, "with" if unfused else "without", str(len(e)), f"{statistics.median(e) / 1e6:.1f}",
         f"{min(e) / 1e6:.1f}..{max(e) / 1e6:.1f}"]
        for (precision, unfused), e in sorted(EXCESS.items())
    ]  # fmt: skip
    print(
        "\nmeasured over the estimate's tensors and convolutions' primitives"
        " (what the libraries' allowance stands for), MB"
    )
    print(table(["precision", "unfused recurrent layer", "specs", "median", "range"], excess), flush=True)
    if a.save:
        Path(a.save).write_text(json.dumps(SPECS, indent=1) + "\n")
    if device.type == "cpu" and MEASURED:
        base, auto, unf, worst = minimax_allowance(MEASURED)
        has_autocast = any(autocast for _, _, autocast, _ in MEASURED)
        has_unfused = any(unfused for _, _, _, unfused in MEASURED)
        terms = [
            f"+{value} {what}" if present else f"nothing {what} (no such spec)"
            for value, present, what in (
                (auto, has_autocast, "with autocast"),
                (unf, has_unfused, "with an unfused recurrent layer"),
            )
        ]
        at_edge = GRID_MIB in (base, auto, unf)
        edge = " (a term at the grid's edge: the least may lie beyond it)" if at_edge else ""
        print(
            "the allowance that keeps these specs nearest (metrics.CPU_LIBRARY_BYTES' form): "
            f"{base} MiB, {', '.join(terms)} (worst ratio {worst:.3f} or its inverse){edge}"
        )
    if a.fit_mb:
        fits = []
        for family in families:
            for precision in a.precisions.split(","):
                start, batch, n, ratio = fit_error(family, precision, a.fit_mb << 20, device)
                fits.append(
                    [family, precision, str(start), str(batch), str(n), f"{ratio:.3f}", f"{ratio - 1:+.1%}"]
                )
        print(f"\nauto-fit to {a.fit_mb} MiB of model memory (seed 0 of each family)")
        head = ["family", "precision", "estimated batch", "fitted batch", "trials", "peak / target", "error"]
        print(table(head, fits))


if __name__ == "__main__":
    main()
