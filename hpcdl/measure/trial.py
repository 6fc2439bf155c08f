"""A trial training step at one batch size, and the peak memory it took: what auto-fit
(``measure.fit``) measures. On a CPU the trial runs in a child process, whose peak resident set
is its own (nothing the parent holds counts), and which the parent watches and ends itself when
its resident set passes a limit: a trial too large is stopped, never killed by the kernel's
out-of-memory killer with the run beside it. On CUDA it runs in this process, measured by the
caching allocator (``torch.cuda.max_memory_reserved``), an out-of-memory error meaning too large.

A rank of a run that divides the model among its ranks (FSDP, tensor parallelism, experts
spread across ranks) holds less than the whole model: its CPU trial trains its own share
(``Shard``).

    python -m hpcdl.measure.trial SPEC_JSON OPTIMIZER POOL_BATCHES [kept_grads] [shard=JSON]
    # prints {"peak_bytes": N, "threads": T}
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from hpcdl.device import held_bytes, pin_mmap_threshold, reset_peak_memory, status_bytes, synchronize
from hpcdl.errors import RunFailed
from hpcdl.parallel.backends import Backend
from hpcdl.parallel.backends.choose import start_backend
from hpcdl.parallel.backends.torch_ddp import DistGroup
from hpcdl.parallel.launch import dies_with_this_process
from hpcdl.parallel.layout import Layout
from hpcdl.parallel.placement import Collectives, spread
from hpcdl.parallel.world import World
from hpcdl.workloads.precision import Precision, precision
from hpcdl.workloads.spec import Spec

STEPS = 2
"""training steps per trial: the optimizer allocates its state in the first, so the second holds
weights, gradients, state and activations at once, as every later step does"""
UNFUSED_STEPS = 6
"""training steps per CPU trial of a spec with a recurrent layer the CPU runs step by step
(``Spec.unfused_recurrent``: GRU, Elman RNN). glibc's heap among their per-step tensors keeps
growing after the second step, and a run holds what its later steps hold; by the sixth step most
of the growth is in (``benchmarks/memory_rss.py growth``, in
docs/validation/2026-11-26-auto-fit.md, step 6). Six steps are not a bound: a lower mmap threshold
or jemalloc would end the growth, at a cost in step time
(``device.MMAP_THRESHOLD_BYTES``)."""
POLL_S = 0.02
"""how often the parent reads a CPU trial's resident set"""


@dataclass(frozen=True)
class Trial:
    """One trial: its batch and the peak memory the step added above the process before its
    model (CPU: resident set; CUDA: allocated), or None when it passed the limit."""

    batch: int
    peak_bytes: int | None
    threads: int | None = None
    """the threads a CPU trial's child trained with (None on CUDA, or when it was stopped)"""

    @property
    def too_large(self) -> bool:
        return self.peak_bytes is None


@dataclass(frozen=True)
class Shard:
    """Rank ``rank`` of ``ranks`` in a run: what its CPU trial trains, under torch's fake process
    group, whose collectives allocate their outputs as the real ones do and move nothing
    (``torch.testing._internal.distributed.fake_pg``, made to run one rank without the others). The
    experts a rank keeps (``placement.spread``) and, where the run's backend shards the model
    (``backend``: FSDP's fully_shard, tensor parallelism's plan over a ``tp`` x ``dp`` mesh), its
    shards and their gathered units: the trial wraps the model as the run does. A data-parallel
    backend's trial stays unwrapped (``kept_grads`` stands in for DDP's buckets; DDP's hooks need a
    real collective's result). A rank that holds a share peaks below the whole model's trial,
    so it trains its share (docs/validation/2026-11-26-auto-fit.md, step 8)."""

    rank: int
    ranks: int
    backend: str | None = None
    """the registered name of the run's backend where it shards the model, else None"""
    tp: int = 1
    dp: int = 0

    def join(self, device: torch.device, spec: Spec) -> tuple[Collectives, Backend | None]:
        """Start the fake group as this rank (a process with a group already keeps it:
        ``benchmarks/memory_shard.py``'s gloo ranks): its collectives, and the run's backend over
        it where that shards the model (None where it does not)."""
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        if not dist.is_initialized():
            dist.init_process_group("fake", store=FakeStore(), rank=self.rank, world_size=self.ranks)
        world = World(rank=self.rank, size=self.ranks)
        if self.backend is None:
            return DistGroup(world, device), None
        backend = start_backend(self.backend, Layout(tp=self.tp, dp=self.dp), world, device, spec)
        return backend, backend


class TrialFailed(RunFailed):
    """A trial that failed for a reason other than memory: the run ends with that reason (one
    line, exit code 1), not with a smaller batch."""


def trial_steps(spec: Spec, device: torch.device) -> int:
    """Training steps a trial of ``spec`` on ``device`` takes: ``STEPS``, or ``UNFUSED_STEPS`` on
    a CPU for a recurrent layer run step by step."""
    return UNFUSED_STEPS if device.type == "cpu" and spec.unfused_recurrent else STEPS


def train_steps(
    spec: Spec,
    optimizer: str,
    pool_batches: int,
    device: torch.device,
    steps: int = STEPS,
    kept_grads: bool = False,
    shard: Shard | None = None,
) -> None:
    """``steps`` optimizer steps of ``spec`` as ``measure.loop`` trains it (autocast in
    bf16/fp16, the loss in fp32), each of ``accumulation_steps`` forward and backward passes,
    with the run's pool of batches on the device: from the second micro-batch on every gradient
    is alive beside the activations (``Spec.memory_parts``). ``kept_grads``: the gradients are
    zeroed in place between steps, not freed, as a backend that keeps them in its buckets holds
    them (``Backend.keeps_gradients``: two DDP ranks of a 10.4 M-parameter MLP at batch 4000
    peaked at 319 MiB, one process 286 with its gradients freed, 318 with them kept;
    ``benchmarks/memory_ddp.py``). ``shard``: only that rank's share of the model, wrapped as
    its run's backend wraps it (``Shard``)."""
    from hpcdl.measure.data import make_batch

    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"optimizer {optimizer!r}: adamw or sgd")

    def make_optimizer(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        if optimizer == "sgd":
            return torch.optim.SGD(params, lr=1e-4, momentum=0.9)
        return torch.optim.AdamW(params)

    model = spec.build().to(device)
    backend = None
    if shard:
        group, backend = shard.join(device, spec)
        spread(model, shard.rank, shard.ranks, group, device)
    if backend:
        model, opt = backend.wrap(model, make_optimizer, spec.accumulation_steps)
    else:
        opt = make_optimizer(model.parameters())
    x, y = make_batch(spec, spec.batch_size * max(pool_batches, 1), device)
    x, y = x[: spec.batch_size], y[: spec.batch_size]
    p = precision(spec.precision)
    n = spec.accumulation_steps
    for _ in range(steps):
        for i in range(n):
            with backend.accumulating(model) if backend and i < n - 1 else nullcontext():
                training_loss(model, x, y, device, p).backward()
        if backend:
            backend.finish_reduction(opt)
        opt.step()
        opt.zero_grad(set_to_none=not kept_grads)
    synchronize(device)


def warm_base(spec: Spec, optimizer: str, device: torch.device) -> int | None:
    """What this process holds before ``spec``'s model, taken as a CPU trial takes its base: after
    a one-sample step has loaded the kernels' code and the libraries' buffers, what is garbage
    then freed and given back (``device.held_bytes``). The base a fitted run's own peak rises
    from, so that it compares with its trials': the fit test's CNN at batch 120 rose 55-59 MiB
    from a base before any step, 34-35 from this one, 22 MiB of it the kernels' mapped code
    (``RssFile``; ``benchmarks/memory_rss.py base``). None where the resident set cannot be read;
    0 on CUDA."""
    if device.type == "cpu":
        train_steps(spec.replace(batch_size=1), optimizer, 1, device)
    return held_bytes(device)


def training_loss(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device, p: Precision
) -> torch.Tensor:
    """The loss as ``measure.loop`` computes it; the logits are not held beyond it (in bf16 the
    autocast logits would stay alive through backward beside the loss's fp32 copies)."""
    with torch.autocast(device.type, dtype=p.dtype, enabled=p.autocast):
        logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def cuda_trial(
    spec: Spec, optimizer: str, pool_batches: int, device: torch.device, kept_grads: bool = False
) -> Trial:
    """A trial on a GPU, in this process: the caching allocator's peak reserved memory above
    what it held before (``torch.cuda.max_memory_reserved``: what a run runs out of, allocated
    tensors and the fragmentation between them); too large on an out-of-memory error (cuBLAS
    and cuDNN report theirs as RuntimeErrors)."""
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        train_steps(spec, optimizer, pool_batches, device, trial_steps(spec, device), kept_grads)
        return Trial(spec.batch_size, torch.cuda.max_memory_reserved(device) - before)
    except torch.OutOfMemoryError:
        return Trial(spec.batch_size, None)
    except RuntimeError as e:
        if "ALLOC_FAILED" in str(e) or "out of memory" in str(e):
            return Trial(spec.batch_size, None)
        raise TrialFailed(f"a trial step at batch {spec.batch_size} failed: {e}") from None
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def cpu_trial(
    spec: Spec,
    optimizer: str,
    pool_batches: int,
    limit_bytes: int,
    threads: int | None = None,
    kept_grads: bool = False,
    shard: Shard | None = None,
) -> Trial:
    """A trial in a child process with ``threads`` threads (default: this process's), those the
    run will train with: per-thread buffers (oneDNN's scratchpads, the allocator's arenas) are
    part of its peak. None as its peak when the child's resident set passed ``limit_bytes`` (the
    parent ended it). ``kept_grads`` and ``shard``: as :func:`train_steps`'s."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads or torch.get_num_threads())}
    args = [
        sys.executable,
        "-m",
        "hpcdl.measure.trial",
        json.dumps(spec.to_dict()),
        optimizer,
        str(pool_batches),
        *(["kept_grads"] if kept_grads else []),
        *([f"shard={json.dumps(asdict(shard))}"] if shard else []),
    ]
    child = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=dies_with_this_process(),  # a killed run takes its trial along
    )
    try:
        while child.poll() is None:
            rss = _rss(child.pid)
            if rss is not None and rss > limit_bytes:
                child.send_signal(signal.SIGKILL)
                child.communicate()
                return Trial(spec.batch_size, None)
            time.sleep(POLL_S)
        out, err = child.communicate()
    finally:  # a signal or Ctrl-C here: the child ends now (and it dies with this process anyway)
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0:
        if child.returncode == -signal.SIGKILL:  # the kernel's OOM killer, despite the limit
            return Trial(spec.batch_size, None)
        last = (err.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
        raise TrialFailed(f"a trial step at batch {spec.batch_size} failed: {last}")
    found = json.loads(out.strip().splitlines()[-1])
    return Trial(spec.batch_size, int(found["peak_bytes"]), int(found["threads"]))


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main(argv: list[str]) -> None:
    """The child: take the base as a fitted run takes it (``warm_base``: after a one-sample step),
    then measure the trial's steps as the rise of the peak resident set (``VmHWM``, reset through
    ``clear_refs``) over it."""
    from hpcdl.workloads.registry import spec_from_dict

    spec = spec_from_dict(json.loads(argv[0]))
    optimizer, pool, kept_grads = argv[1], int(argv[2]), "kept_grads" in argv[3:]
    shard = next((Shard(**json.loads(a[6:])) for a in argv[3:] if a.startswith("shard=")), None)
    cpu = torch.device("cpu")
    # glibc's mmap threshold fixed from the start, as a fitted run fixes it before its own warm
    # base: a warm-up under the dynamic threshold left chunks in the heap that the trial's steps
    # reused, resident (an FSDP rank's share at batch 3000 read 291-337 MiB over six children,
    # 290-291 with it fixed first, as two gloo ranks read; benchmarks/memory_shard.py)
    pin_mmap_threshold()
    # the libraries and kernels a step loads are the process's, not the trial's; what the warm-up
    # freed goes back to the system (else the trial would reuse it unseen): the base a fitted run
    # takes too
    base = warm_base(spec, optimizer, cpu)
    reset_peak_memory(cpu)  # VmHWM := VmRSS (the threshold is fixed already)
    train_steps(spec, optimizer, pool, cpu, trial_steps(spec, cpu), kept_grads, shard)
    hwm = status_bytes("VmHWM")
    if base is None or hwm is None:
        raise OSError("no VmRSS or VmHWM in /proc/self/status: a trial cannot measure its peak")
    peak = hwm - base
    print(json.dumps({"peak_bytes": peak, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main(sys.argv[1:])
