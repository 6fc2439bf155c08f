"""On-demand: the estimate's tensors against the peak of PyTorch's allocator in a real training
step (the profiler's allocations, ``profile_memory=True``, after one warm-up step), and the
operators running at that peak, for the specs named (METRICS.md, "Memory estimate"): the
tensor model checked without what the libraries hold outside the allocator.

    .venv/bin/python benchmarks/memory_allocator.py speech:0:fp32 rnn:4:fp32 [...]

A spec is FAMILY:SEED:PRECISION, sampled at batch 32 as ``bench_memory.py`` samples it, with
knobs changed after a fourth colon: ``speech:0:bf16:conv_layers=1,cell=lstm``.
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from hpcdl.measure.data import make_batch
from hpcdl.measure.trial import _loss
from hpcdl.workloads.precision import precision
from hpcdl.workloads.sampling import sample_spec
from hpcdl.workloads.spec import Spec

BATCH = 32


def sampled(name: str) -> tuple[Spec, int]:
    """The spec ``name`` names (FAMILY:SEED:PRECISION[:KNOB=VALUE,...]; batch ``BATCH`` unless a
    knob sets ``batch_size``) and the bytes of its estimate's tensors at its batch: the estimate
    without the libraries' allowance."""
    family, seed, prec, *changed = name.split(":")
    spec = sample_spec(family, int(seed), batch_size=BATCH, precision=prec)
    if changed:
        knobs = dict(kv.split("=", 1) for kv in changed[0].split(","))
        spec = spec.replace(**{k: _value(v) for k, v in knobs.items()})
    parts = spec.memory_parts(spec.batch_size, "adamw")
    return spec, sum(parts.values()) - parts["libraries"]


def _value(text: str) -> int | str | bool:
    if text in ("true", "false"):
        return text == "true"
    return int(text) if text.lstrip("-").isdigit() else text


def allocator_peak(spec: Spec) -> tuple[int, list[str]]:
    """Bytes live at the step's allocator peak (what lived before it included) and the innermost
    operators running then."""
    cpu, p = torch.device("cpu"), precision(spec.precision)
    model = spec.build()
    opt = torch.optim.AdamW(list(model.parameters()))
    x, y = make_batch(spec, spec.batch_size, cpu)
    _loss(model, x, y, cpu, p).backward()
    opt.step()
    opt.zero_grad()
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    before = sum(t.numel() * t.element_size() for t in [*model.parameters(), *state, x, y])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _loss(model, x, y, cpu, p).backward()
        opt.step()
        opt.zero_grad()
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    live = top = at = 0
    for t, n in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        live += n
        if live > top:
            top, at = live, t
    ops = sorted(
        (e.end_ns() - e.start_ns(), e.name())
        for e in events
        if e.name() != "[memory]" and e.start_ns() <= at <= e.end_ns()
    )
    return before + top, [name for _, name in ops[:3]]


def main() -> None:
    for name in sys.argv[1:]:
        spec, tensors = sampled(name)
        peak, ops = allocator_peak(spec)
        print(f"{name}: allocator peak {peak / 1e6:.1f} MB, tensors estimated {tensors / 1e6:.1f} MB "
              f"({tensors / peak:.2f}); at the peak: {', '.join(ops)}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
