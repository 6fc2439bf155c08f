"""On-demand: the estimate's tensors against the peak of PyTorch's allocator in a real training
step (the profiler's allocations, ``profile_memory=True``, after one warm-up step), and the
operators running at that peak, for the specs named (docs/validation/2026-11-26-memory-estimate.md): the
tensor model checked without what the libraries hold outside the allocator.

    .venv/bin/python benchmarks/memory_allocator.py speech:0:fp32 rnn:4:fp32 [...]
    .venv/bin/python benchmarks/memory_allocator.py --first 24 attention:fp32  # a row's first specs
    .venv/bin/python benchmarks/memory_allocator.py --first 24 rnn:bf16 --fill-mb 300
    .venv/bin/python benchmarks/memory_allocator.py --timeline 1e6 speech:14:fp32

A spec is FAMILY:SEED:PRECISION, sampled at batch 32 as ``bench_memory.py`` samples it, with
knobs changed after a fourth colon: ``speech:0:bf16:conv_layers=1,cell=lstm``. ``--first N``
measures the first N specs of a family and precision that ``bench_memory.py`` would measure and
prints the range of their ratios (with ``--fill-mb M`` each at the batch whose estimate fills M
MB, as ``bench_memory.py --fill-mb``, where a step's activations outweigh its weights);
``--timeline BYTES`` prints every allocation and free of at least BYTES in the step, with the
bytes live after it and the operators running.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from hpcdl.errors import SpecError
from hpcdl.measure.data import make_batch
from hpcdl.measure.fit import estimated_batch
from hpcdl.measure.trial import _loss
from hpcdl.workloads.precision import precision
from hpcdl.workloads.sampling import sample_spec
from hpcdl.workloads.spec import Spec

BATCH = 32
MIN_BYTES, MAX_BYTES = 30 << 20, 2 << 30
"""the specs ``bench_memory.py`` measures: tensors estimated between these"""
BAND = (0.85, 1.15)
"""measured / estimated within which a spec's estimate holds (issue 18's target)"""


def sampled(name: str) -> tuple[Spec, int]:
    """The spec ``name`` names (FAMILY:SEED:PRECISION[:KNOB=VALUE,...]; batch ``BATCH`` unless a
    knob sets ``batch_size``) and the bytes of its estimate's tensors at its batch: the estimate
    without the libraries' allowance."""
    family, seed, prec, *changed = name.split(":")
    spec = sample_spec(family, int(seed), batch_size=BATCH, precision=prec)
    if changed:
        knobs = dict(kv.split("=", 1) for kv in changed[0].split(","))
        spec = spec.replace(**{k: _value(v) for k, v in knobs.items()})
    return spec, tensor_bytes(spec, spec.batch_size)


def tensor_bytes(spec: Spec, batch: int) -> int:
    """The estimate's live tensors at its peak moment: without what stands outside PyTorch's
    allocator on a CPU (the libraries' allowance, glibc's heap pages), as on a GPU, which has
    neither."""
    return spec.memory_estimate(batch, "adamw", "cuda")


def fill_batch(spec: Spec, fill: int, device_type: str = "cpu", malloc: str = "glibc") -> int | None:
    """The batch whose estimate fills ``fill`` bytes, the batch auto-fit starts from
    (``measure.fit.estimated_batch``); None where one sample's estimate is over it."""
    try:
        return estimated_batch(spec, "adamw", 1.0, fill, device_type, malloc=malloc)
    except SpecError:
        return None


def _value(text: str) -> int | str | bool:
    if text in ("true", "false"):
        return text == "true"
    return int(text) if text.lstrip("-").isdigit() else text


def allocations(prof: profile) -> list[tuple[int, int]]:
    """(time in ns, bytes: + allocated, − freed) of every allocation the profiler saw, in order"""
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    return sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")


def peak_of(prof: profile) -> tuple[int, int]:
    """The most bytes the profiled code had allocated at once beyond what it started with, and
    when (ns)."""
    live = top = at = 0
    for t, n in allocations(prof):
        live += n
        if live > top:
            top, at = live, t
    return top, at


def running(prof: profile, at: int) -> list[str]:
    """The operators running at ``at`` (ns), innermost first."""
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    ops = sorted(
        (e.end_ns() - e.start_ns(), e.name())
        for e in events
        if e.name() != "[memory]" and e.start_ns() <= at <= e.end_ns()
    )
    return [name for _, name in ops]


def profiled_step(spec: Spec, shapes: bool = False) -> tuple[int, profile]:
    """One training step after a warm-up step, profiled with its allocations (and with
    ``shapes`` the operators' input shapes), and the bytes that lived before it (weights,
    optimizer state, the batch). A step is ``accumulation_steps`` micro-batches, as
    ``measure.loop`` trains it."""
    cpu, p = torch.device("cpu"), precision(spec.precision)
    model = spec.build()
    opt = torch.optim.AdamW(list(model.parameters()))
    x, y = make_batch(spec, spec.batch_size, cpu)

    def step() -> None:
        for _ in range(spec.accumulation_steps):
            _loss(model, x, y, cpu, p).backward()
        opt.step()
        opt.zero_grad()

    step()
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    before = sum(t.numel() * t.element_size() for t in [*model.parameters(), *state, x, y])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=shapes) as prof:
        step()
    return before, prof


def allocator_peak(spec: Spec) -> tuple[int, list[str]]:
    """Bytes live at the step's allocator peak (what lived before it included) and the innermost
    operators running then."""
    before, prof = profiled_step(spec)
    top, at = peak_of(prof)
    return before + top, running(prof, at)[:3]


def _report(name: str) -> float:
    spec, tensors = sampled(name)
    peak, ops = allocator_peak(spec)
    print(f"{name}: allocator peak {peak / 1e6:.1f} MB, tensors estimated {tensors / 1e6:.1f} MB "
          f"({tensors / peak:.3f}); at the peak: {', '.join(ops)}", flush=True)  # fmt: skip
    return tensors / peak


def _first(n: int, row: str, fill: int = 0) -> None:
    family, prec = row.split(":")
    found: list[float] = []
    for seed in range(20 * n):
        if len(found) == n:
            break
        name = f"{family}:{seed}:{prec}"
        spec, tensors = sampled(name)
        if not MIN_BYTES <= tensors <= MAX_BYTES:
            continue
        if fill:  # at the batch whose estimate fills ``fill`` bytes, as bench_memory.py --fill-mb
            batch = fill_batch(spec, fill)
            if batch is None:
                continue
            name += f":batch_size={batch}"
        found.append(_report(name))
    print(f"{row}: {len(found)} specs, estimated tensors / allocator peak {min(found):.3f}.."
          f"{max(found):.3f}, median {statistics.median(found):.3f}")  # fmt: skip


def _timeline(threshold: float, name: str) -> None:
    before, prof = profiled_step(sampled(name)[0])
    live = before
    for t, n in allocations(prof):
        live += n
        if abs(n) >= threshold:
            print(f"{live / 1e6:9.2f} MB {n / 1e6:+8.2f}  {', '.join(running(prof, t)[:2])}")
    print(f"{name}: {before / 1e6:.2f} MB of weights, optimizer state and batch before the step")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "specs", nargs="+", help="FAMILY:SEED:PRECISION[:KNOB=VALUE,...], or with --first FAMILY:PRECISION"
    )
    p.add_argument(
        "--first", type=int, default=0, help="the first N specs of one row, as bench_memory.py draws them"
    )
    p.add_argument(
        "--fill-mb", type=int, default=0, help="with --first: each at the batch whose estimate fills this"
    )
    p.add_argument(
        "--timeline", type=float, default=0, help="every allocation and free of at least this many bytes"
    )
    a = p.parse_args()
    for name in a.specs:
        if a.first:
            _first(a.first, name, a.fill_mb * 10**6)
        elif a.timeline:
            _timeline(a.timeline, name)
        else:
            _report(name)


if __name__ == "__main__":
    main()
