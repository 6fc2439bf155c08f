"""On-demand: where a CPU training step's memory outside PyTorch's allocator goes, for the specs
named (docs/validation/2026-11-26-memory-estimate.md). Each spec's trial (``measure.trial``, as auto-fit
measures) runs four times in a fresh process: as is; with MKL's memory manager off
(``MKL_DISABLE_FAST_MM=1``); also with oneDNN's primitive cache off
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0``); also with glibc's mmap threshold at 4 KiB instead of
auto-fit's 1 MiB (the heap among small tensors). With ``--thresholds``, instead: as is, then
with glibc's mmap threshold at each of those bytes and nothing else changed. Prints each peak and
its excess over the estimate's tensors (specs named as in ``memory_allocator.py``, knobs changed
after a fourth colon).

    .venv/bin/python benchmarks/memory_outside.py speech:0:bf16 rnn:0:fp32 [...]
    .venv/bin/python benchmarks/memory_outside.py --thresholds 262144,65536 speech:0:bf16 [...]
    .venv/bin/python benchmarks/memory_outside.py speech:0:bf16:conv_layers=1,cell=lstm [...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CONDITIONS = {
    "as is": {},
    "no MKL buffers": {"MKL_DISABLE_FAST_MM": "1"},
    "+ no oneDNN cache": {"MKL_DISABLE_FAST_MM": "1", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"},
    "+ mmap at 4 KiB": {
        "MKL_DISABLE_FAST_MM": "1",
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0",
        "THRESHOLD": "4096",
    },
}


def child(argv: list[str]) -> None:
    import hpcdl.device
    from hpcdl.measure.trial import main

    if os.environ.get("THRESHOLD"):
        hpcdl.device.MMAP_THRESHOLD_BYTES = int(os.environ["THRESHOLD"])
    main(argv)


def peak(spec_json: str, env: dict[str, str]) -> int:
    args = [sys.executable, __file__, "--child", spec_json, "adamw", "1"]
    p = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **env}, check=True)
    return int(json.loads(p.stdout.strip().splitlines()[-1])["peak_bytes"])


def main(argv: list[str]) -> None:
    from memory_allocator import sampled

    conditions = CONDITIONS
    if argv[:1] == ["--thresholds"]:
        sizes = [int(x) for x in argv[1].split(",")]
        conditions = {"as is": {}, **{f"mmap at {n >> 10} KiB": {"THRESHOLD": str(n)} for n in sizes}}
        argv = argv[2:]
    for name in argv:
        spec, tensors = sampled(name)
        peaks = {label: peak(json.dumps(spec.to_dict()), env) for label, env in conditions.items()}
        shown = [f"{label} {b / 1e6:.1f} (+{(b - tensors) / 1e6:.1f})" for label, b in peaks.items()]
        print(f"{name}: tensors estimated {tensors / 1e6:.1f} MB; peak MB (over them): " + ", ".join(shown),
              flush=True)  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
    else:
        main(sys.argv[1:])
