"""A training step's memory as PyTorch's allocator sees it: every allocation the profiler
records (``profile_memory=True``), the peak of bytes live at once, and the operators running
there; and specs named ``FAMILY:SEED:PRECISION[:KNOB=VALUE,...]`` as the memory benchmarks and
tests name them. What ``benchmarks/memory_allocator.py`` reports and ``tests/test_memory.py``
holds the estimate's tensors against (nothing outside the allocator: the libraries' memory is
the trials' business, ``measure/trial.py``)."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from hpcdl.errors import SpecError
from hpcdl.measure.data import make_batch
from hpcdl.measure.fit import estimated_batch
from hpcdl.measure.trial import training_loss
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
    return sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")  # type: ignore[union-attr]


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
            training_loss(model, x, y, cpu, p).backward()
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
