"""On-demand: a rank's share of a sharded model, as auto-fit's trial measures it under torch's fake
process group (``measure.trial.Shard``), against the same steps on real gloo ranks and against a
trial of the whole model: the figures behind ``Shard`` (docs/validation/2026-11-26-auto-fit.md,
step 8).

    MLP="mlp:0:fp32:layers=2,width=2048,input_size=2048,output_size=1000,batch_size=3000"
    .venv/bin/python benchmarks/memory_shard.py "$MLP" fsdp [RANKS] [REPEATS]

The spec is named as ``memory_allocator.py`` names it; the backend is ``fsdp``, ``tensor`` (tp
over all RANKS, default 2) or ``experts`` (experts spread over data-parallel ranks). Each case
runs REPEATS (3) times, one thread a process, four batches of inputs kept (a run's pool), glibc's
mmap threshold fixed: the whole model's trial, every rank's trial under the fake group (each
its own child, as auto-fit runs it), and RANKS gloo ranks training the same steps. Each prints
the peak rise over the process's base (``trial.warm_base``) in MiB, per rank.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from memory_allocator import sampled

from hpcdl.device import pin_mmap_threshold, reset_peak_memory, status_bytes
from hpcdl.measure.trial import STEPS, Shard, cpu_trial, train_steps, warm_base

CPU = torch.device("cpu")
POOL = 4


def shard(backend: str, rank: int, ranks: int) -> Shard:
    if backend == "tensor":
        return Shard(rank, ranks, "tensor", tp=ranks, dp=1)
    return Shard(rank, ranks, None if backend == "experts" else backend)


def _gloo_rank(rank: int, ranks: int, init: str, name: str, backend: str, out: str) -> None:
    torch.set_num_threads(1)
    pin_mmap_threshold()
    spec, _ = sampled(name)
    base = warm_base(spec, "adamw", CPU)
    reset_peak_memory(CPU)  # the threshold is fixed already
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=ranks)
    train_steps(spec, "adamw", POOL, CPU, STEPS, False, shard(backend, rank, ranks))  # keeps the group
    dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump((status_bytes("VmHWM") or 0) - (base or 0), f)


def main(name: str, backend: str, ranks: int, repeats: int) -> None:
    spec, _ = sampled(name)
    limit = 16 << 30

    def mib(peaks: list[int | None]) -> str:
        return " ".join(f"{(p or 0) / 2**20:6.0f}" for p in peaks)

    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            whole = cpu_trial(spec, "adamw", POOL, limit, threads=1).peak_bytes
            fake = [
                cpu_trial(spec, "adamw", POOL, limit, threads=1, shard=shard(backend, r, ranks)).peak_bytes
                for r in range(ranks)
            ]
            init, out = os.path.join(tmp, f"init{i}"), os.path.join(tmp, f"rise{i}")
            mp.spawn(_gloo_rank, args=(ranks, init, name, backend, out), nprocs=ranks)
            gloo = [json.load(open(f"{out}.{r}")) for r in range(ranks)]
            print(f"whole {mib([whole])} MiB | fake group {mib(fake)} | gloo {mib(gloo)}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], int(args[2]) if len(args) > 2 else 2, int(args[3]) if len(args) > 3 else 3)
