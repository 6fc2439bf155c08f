"""On-demand: could a per-spec model predict what a CPU training step holds outside PyTorch's
allocator? Reads the specs ``bench_memory.py --save`` measured (each one's estimated tensors and
measured peak resident set; their difference is what the libraries' allowance,
``metrics.CPU_LIBRARY_BYTES``, stands for) and counts, in one profiled step of each
(``memory_allocator.profiled_step``), what the libraries' memory should follow:

- oneDNN primitives: the distinct input shapes of the operators that run through oneDNN, which
  builds and caches a primitive (its JIT-compiled kernel) per shape: convolutions and fused
  recurrent layers always, matrix products under autocast (fp32 ones go to MKL's sgemm);
- the heap: the peak of live tensors under glibc's mmap threshold (``device.MMAP_THRESHOLD_BYTES``),
  which come from glibc's heap, whose freed pages stay resident.

It then fits the excess on the allowance's own terms (a base, more with autocast, more with an
unfused recurrent layer), and on those with either or both counts, by least squares relative to
each spec's peak (as the ratio is judged); each model is fitted on the very specs it is judged
on, an optimistic bound. Per model: its coefficients, the residual's root mean square in % of
the peak (all specs, and those below 160 MB: the band is ±15 %), and the specs whose measured /
(tensors + the fitted allowance) falls outside 0.85-1.15.

    .venv/bin/python benchmarks/bench_memory.py --seeds 24 --fit-mb 0 --save specs.json  # ~40 min
    .venv/bin/python benchmarks/memory_residual.py specs.json                             # ~5 min
"""

from __future__ import annotations

import json
import sys

import numpy as np
from memory_allocator import BAND, allocations, profiled_step

from hpcdl.device import MMAP_THRESHOLD_BYTES
from hpcdl.results.text import table
from hpcdl.workloads.precision import precision
from hpcdl.workloads.sampling import sample_spec
from hpcdl.workloads.spec import Spec

ONEDNN_ALWAYS = frozenset(
    {"aten::mkldnn_convolution", "aten::convolution_backward", "aten::mkldnn_rnn_layer",
     "aten::mkldnn_rnn_layer_backward"}
)  # fmt: skip
ONEDNN_UNDER_AUTOCAST = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
SMALL_SPEC_BYTES = 160e6
"""below this, specs are counted apart: where the libraries' memory is a large share"""


def counts(spec: Spec) -> tuple[int, int]:
    """(oneDNN primitives, peak bytes of live tensors under the mmap threshold) of one step"""
    _, prof = profiled_step(spec, shapes=True)
    autocast = precision(spec.precision).autocast
    ops = ONEDNN_ALWAYS | (ONEDNN_UNDER_AUTOCAST if autocast else frozenset())
    primitives = len({(e.name, str(e.input_shapes)) for e in prof.events() if e.name in ops})
    live = top = 0
    for _, n in allocations(prof):
        if abs(n) < MMAP_THRESHOLD_BYTES:
            live += n
            top = max(top, live)
    return primitives, top


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x**2)))


def main(path: str) -> None:
    saved = json.loads(open(path).read())
    rows = []
    for s in saved:
        spec = sample_spec(s["family"], s["seed"], batch_size=s["batch"], precision=s["precision"])
        primitives, small = counts(spec)
        autocast = precision(spec.precision).autocast
        rows.append((s["tensors"], s["measured"], autocast, spec.unfused_recurrent, primitives, small))
    columns = (np.array(c, dtype=float) for c in zip(*rows, strict=True))
    tensors, measured, autocast, unfused, primitives, small = columns
    excess, one = (measured - tensors) / 1e6, np.ones(len(rows))
    terms = {"base MB": one, "+autocast MB": autocast, "+unfused MB": unfused,
             "MB per primitive": primitives, "MB per MB small": small / 1e6}  # fmt: skip
    models = {
        "allowance's terms": ["base MB", "+autocast MB", "+unfused MB"],
        "+ primitives": ["base MB", "+autocast MB", "+unfused MB", "MB per primitive"],
        "+ small tensors": ["base MB", "+autocast MB", "+unfused MB", "MB per MB small"],
        "+ both": ["base MB", "+autocast MB", "+unfused MB", "MB per primitive", "MB per MB small"],
    }
    small_spec = tensors < SMALL_SPEC_BYTES
    out = []
    for name, used in models.items():
        x = np.stack([terms[t] for t in used], axis=1)
        weight = 1e6 / measured  # residuals as shares of the peak
        coef, *_ = np.linalg.lstsq(x * weight[:, None], excess * weight, rcond=None)
        fitted = x @ coef
        share = (excess - fitted) * weight
        ratio = measured / (tensors + fitted * 1e6)
        outside = (ratio < BAND[0]) | (ratio > BAND[1])
        out.append([
            name, ", ".join(f"{t} {c:.2f}" for t, c in zip(used, coef, strict=True)),
            f"{_rms(share):.1%}", f"{_rms(share[small_spec]):.1%}" if small_spec.any() else "-",
            f"{outside.sum()} of {len(rows)}", f"{ratio.min():.2f}..{ratio.max():.2f}",
        ])  # fmt: skip
    print(f"{len(rows)} specs: measured over the estimate's tensors {np.median(excess):.1f} MB median, "
          f"{excess.min():.1f}..{excess.max():.1f}; fitted on these specs themselves")  # fmt: skip
    small_header = f"< 160 MB ({small_spec.sum()})"
    header = ["model", "coefficients", "residual rms", small_header, "outside 0.85-1.15", "ratios"]
    print(table(header, out))


if __name__ == "__main__":
    main(sys.argv[1])
