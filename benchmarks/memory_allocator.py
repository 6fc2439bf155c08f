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

from hpcdl.measure.allocations import (  # noqa: F401  (BAND, tensor_bytes: the other benchmarks')
    BAND,
    MAX_BYTES,
    MIN_BYTES,
    allocations,
    allocator_peak,
    fill_batch,
    peak_of,
    profiled_step,
    running,
    sampled,
    tensor_bytes,
)


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
