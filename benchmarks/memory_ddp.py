"""On-demand: what DDP's gradient buckets add to a rank's peak resident set on a CPU, against one
process that frees its gradients each step and one that keeps them (``measure.trial.train_steps``'s
``kept_grads``): the figures behind ``Backend.keeps_gradients`` (docs/validation/2026-11-26-auto-fit.md,
step 7).

    MLP="mlp:0:fp32:layers=2,width=2048,input_size=2048,output_size=1000,batch_size=4000"
    .venv/bin/python benchmarks/memory_ddp.py "$MLP" [STEPS]

The spec is named as ``memory_allocator.py`` names it. Four cases, each in processes of its own
with glibc's mmap threshold fixed from their start (as a fitted run fixes it): one process
freeing its gradients, one keeping them, and two DDP ranks (gloo) with ``gradient_as_bucket_view``
off and on. Each prints the largest rank's peak rise over its base (``trial.warm_base``) in MiB
after STEPS (6) AdamW steps.
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
from torch.nn.parallel import DistributedDataParallel

from hpcdl.device import pin_mmap_threshold, reset_peak_memory, status_bytes
from hpcdl.measure.data import make_batch
from hpcdl.measure.trial import train_steps, training_loss, warm_base
from hpcdl.workloads.precision import precision

CPU = torch.device("cpu")
CASES = ("one, gradients freed", "one, gradients kept", "DDP, bucket copy", "DDP, bucket view")


def _rank(rank: int, world: int, init: str, name: str, case: str, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    pin_mmap_threshold()
    spec, _ = sampled(name)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    base = warm_base(spec, "adamw", CPU)
    reset_peak_memory(CPU, pin=True)
    if world == 1:
        train_steps(spec, "adamw", 1, CPU, steps, kept_grads=case.endswith("kept"))
    else:
        model = DistributedDataParallel(spec.build(), gradient_as_bucket_view=case.endswith("view"))
        opt = torch.optim.AdamW(model.parameters())
        x, y = make_batch(spec, spec.batch_size, CPU)
        for _ in range(steps):
            training_loss(model, x, y, CPU, precision(spec.precision)).backward()
            opt.step()
            opt.zero_grad()
        dist.destroy_process_group()
    rise = (status_bytes("VmHWM") or 0) - (base or 0)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(rise, f)


def main(name: str, steps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(CASES):
            world = 2 if case.startswith("DDP") else 1
            init, out = os.path.join(tmp, f"init{i}"), os.path.join(tmp, f"rise{i}")
            mp.spawn(_rank, args=(world, init, name, case, steps, out), nprocs=world)
            rises = [json.load(open(f"{out}.{r}")) for r in range(world)]
            print(f"{case:22s} {max(rises) / 2**20:7.0f} MiB", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6)
