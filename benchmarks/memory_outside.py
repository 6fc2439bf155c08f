"""On-demand: where a CPU training step's memory outside PyTorch's allocator goes, for the specs
named (METRICS.md, "Memory estimate"). Each spec's trial (``measure.trial``, as auto-fit
measures) runs four times in a fresh process: as is; with MKL's memory manager off
(``MKL_DISABLE_FAST_MM=1``); also with oneDNN's primitive cache off
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0``); also with glibc's mmap threshold at 4 KiB instead of
auto-fit's 1 MiB (the heap among small tensors). Prints each peak beside the estimate's tensors.

    .venv/bin/python benchmarks/memory_outside.py speech:0:bf16 rnn:0:fp32 [...]
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


def main() -> None:
    from hpcdl.workloads.sampling import sample_spec

    for name in sys.argv[1:]:
        family, seed, precision = name.split(":")
        spec = sample_spec(family, int(seed), batch_size=32, precision=precision)
        parts = spec.memory_parts(32, "adamw")
        tensors = sum(parts.values()) - parts["libraries"]
        peaks = [
            f"{label} {peak(json.dumps(spec.to_dict()), env) / 1e6:.1f}" for label, env in CONDITIONS.items()
        ]
        print(f"{name}: tensors estimated {tensors / 1e6:.1f} MB; peak MB: " + ", ".join(peaks), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
    else:
        main()
