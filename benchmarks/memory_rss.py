"""On-demand: the resident set beside PyTorch's allocator on a CPU, for the figures behind
``recurrent.SAVED_PER_STEP``, ``recurrent.HEAP_RESIDENT`` and auto-fit's trial noise
(docs/validation/2026-11-26-memory-estimate.md, "Unfused recurrent layers at the fill batches").

    .venv/bin/python benchmarks/memory_rss.py saved                       # per-step saved state
    .venv/bin/python benchmarks/memory_rss.py trace rnn:0:fp32:batch_size=362
    .venv/bin/python benchmarks/memory_rss.py trials speech:0:fp32:batch_size=203 4
    .venv/bin/python benchmarks/memory_rss.py threshold "cnn:0:fp32;speech:0:fp32" 10 [ROUNDS]
    .venv/bin/python benchmarks/memory_rss.py growth "speech:0:fp32;rnn:4:fp32" 10
    .venv/bin/python benchmarks/memory_rss.py mapped "speech:0:fp32;rnn:7:fp32" 8 1048576,65536,jemalloc
    .venv/bin/python benchmarks/memory_rss.py base speech:0:fp32:batch_size=187 [ROUNDS]

``saved``: what one unfused layer saves for backward (``saved_tensors_hooks``, distinct storages)
per step, unit and direction, less its input's copies, fp32, batch 64, 32 steps. ``trace``: one
training step of a spec (named as ``memory_allocator.py`` names it) with glibc's mmap threshold
fixed as auto-fit's trials fix it, its ``VmRSS`` sampled every 0.5 ms beside the profiler's live
bytes (the profiler's own buffers are in the resident set too). ``trials``: the same spec's trial
(``measure.trial.cpu_trial``) N times in a row, each peak in MiB. ``threshold``: each spec
(``;``-separated; without a batch, the batch whose estimate fills 300 MB) trained STEPS steps in
a child process as a trial trains it, with glibc's mmap threshold left dynamic (as a run
without ``--fit``) and fixed at 1 MiB (as a trial and a fitted run), ROUNDS (1) interleaved
pairs: each pair's ratio of median step times after the third step, and each child's peak
rise over its base after 2, 5 and STEPS steps. ``growth``: each spec's child with the threshold
fixed, its peak after every one of STEPS steps (what ``trial.UNFUSED_STEPS`` is chosen from).
``mapped``: each spec's estimate with and without glibc's heap pages, and its child with the
threshold fixed at each of the sizes given (bytes; or ``jemalloc``: jemalloc's allocator preloaded
instead of glibc's), one after another: its peak after 2 and STEPS steps and its median step time
from the third step (what ``device.MMAP_THRESHOLD_BYTES`` is chosen from).
``base``: the spec's trial steps in a child whose base is taken before any step (cold) and in one
whose base is taken after a one-sample step (warm, ``trial.warm_base``, as a trial and a fitted
run take it), ROUNDS (1) interleaved pairs: each base's ``VmRSS``, ``RssAnon`` and ``RssFile``,
the peak's rise over it, and how much of each the steps added (what ``trial.warm_base`` is for).
"""

from __future__ import annotations

import bisect
import ctypes.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch
from memory_allocator import allocations, fill_batch, running, sampled
from torch.profiler import ProfilerActivity, profile

import hpcdl.device
from hpcdl.device import malloc_trim, reset_peak_memory, status_bytes
from hpcdl.measure.data import make_batch
from hpcdl.measure.trial import cpu_trial, train_steps, training_loss, trial_steps, warm_base
from hpcdl.workloads.precision import precision
from hpcdl.workloads.recurrent import recurrent_stack

STEPS, BATCH = 32, 64


def saved() -> None:
    for cell in ("vanilla", "gru"):
        for fan_in, hidden in ((64, 64), (256, 64), (64, 256)):
            for directions in (1, 2):
                layer = recurrent_stack(cell, fan_in, hidden, 1, directions == 2)
                seen: dict[int, int] = {}

                def pack(t: torch.Tensor, seen: dict[int, int] = seen) -> torch.Tensor:
                    seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                    return t

                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    layer(torch.randn(BATCH, STEPS, fan_in, requires_grad=True))
                copies = directions * STEPS * BATCH * fan_in * 4  # each direction's time-major input
                per_unit = (sum(seen.values()) - copies) / (4 * STEPS * BATCH * hidden * directions)
                print(f"{cell} {fan_in} inputs, {hidden} units, {directions} direction(s): "
                      f"{per_unit:.2f} per step and unit (with the weights)")  # fmt: skip


def trace(name: str) -> None:
    spec, _ = sampled(name)
    cpu, p = torch.device("cpu"), precision(spec.precision)
    train_steps(spec.replace(batch_size=1), "adamw", 1, cpu)
    reset_peak_memory(cpu, pin=True)
    model = spec.build()
    opt = torch.optim.AdamW(model.parameters())
    x, y = make_batch(spec, spec.batch_size, cpu)
    training_loss(model, x, y, cpu, p).backward()  # warm-up
    opt.step()
    opt.zero_grad()
    malloc_trim()
    samples: list[tuple[int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.time_ns(), status_bytes("VmRSS") or 0))
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        training_loss(model, x, y, cpu, p).backward()
        opt.step()
        opt.zero_grad()
    done.set()
    sampler.join()
    live, times, total = [], [], 0
    for t, n in allocations(prof):
        total += n
        times.append(t)
        live.append(total)
    base, start = samples[0][1], times[0]
    for t, rss in samples[:: max(1, len(samples) // 40)]:
        i = bisect.bisect_right(times, t) - 1
        allocated = live[i] if i >= 0 else 0
        ops = ", ".join(running(prof, t)[:2])
        print(f"{(t - start) / 1e6:8.1f} ms  resident +{(rss - base) / 1e6:7.1f} MB  "
              f"allocator {allocated / 1e6:7.1f} MB  {ops}")  # fmt: skip


def trials(name: str, n: int) -> None:
    spec, _ = sampled(name)
    # the limit is the child's whole resident set, torch included: as bench_memory.py sets it
    limit = 4 * spec.memory_estimate(spec.batch_size, "adamw") + (1 << 30)
    peaks = [cpu_trial(spec, "adamw", 1, limit).peak_bytes for _ in range(n)]
    print(f"{name}: trial peaks " + ", ".join(f"{(b or 0) / 2**20:.1f}" for b in peaks) + " MiB")


def threshold_child(name: str, steps: int, mode: str) -> None:
    """One child of ``threshold``, ``growth`` or ``mapped``: prints its step times and its peak
    after each step. ``mode``: dynamic, fixed (at ``MMAP_THRESHOLD_BYTES``) or a size in bytes."""
    if mode.isdigit():
        hpcdl.device.MMAP_THRESHOLD_BYTES = int(mode)
    pin = mode != "dynamic"
    spec, _ = sampled(name)
    cpu, p = torch.device("cpu"), precision(spec.precision)
    train_steps(spec.replace(batch_size=1), "adamw", 1, cpu)
    reset_peak_memory(cpu, pin=pin)
    base = status_bytes("VmRSS") or 0
    model = spec.build()
    opt = torch.optim.AdamW(list(model.parameters()))
    x, y = make_batch(spec, spec.batch_size, cpu)
    times, peaks = [], []
    for _ in range(steps):
        start = time.perf_counter()
        training_loss(model, x, y, cpu, p).backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
        peaks.append(((status_bytes("VmHWM") or 0) - base) / 2**20)
    print(json.dumps({"s": times, "peaks": peaks}))


def _child(args: list[str], preload: str | None = None) -> dict:
    """This script run in a child process with ``args`` and this process's threads: its last line's
    JSON. With ``preload``, that library's ``malloc`` instead of glibc's (``LD_PRELOAD``)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    if preload:
        env["LD_PRELOAD"] = preload
    argv = [sys.executable, __file__, *args]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _steps_child(name: str, steps: int, mode: str, preload: str | None = None) -> dict[str, list[float]]:
    """A ``threshold-child`` of ``name`` (``mode``: dynamic, fixed or bytes): step times, peaks."""
    return _child(["threshold-child", name, str(steps), mode], preload)


def _at_fill(name: str) -> str:
    """``name`` with the batch whose estimate fills 300 MB, unless it names a batch."""
    if name.count(":") == 2:
        spec, _ = sampled(name)
        name += f":batch_size={fill_batch(spec, 300 << 20)}"
    return name


def growth(names: str, steps: int) -> None:
    """Per spec, a child with the threshold fixed: its peak after every step."""
    for name in map(_at_fill, names.split(";")):
        got = _steps_child(name, steps, "fixed")
        peaks = " ".join(f"{p:.0f}" for p in got["peaks"])
        print(f"{name}: peak MiB after steps 1-{steps}: {peaks}", flush=True)


def mapped(names: str, steps: int, sizes: list[str]) -> None:
    """Per spec, its estimate with and without glibc's heap pages (``Spec._in_heap``), and a child
    at each fixed threshold (bytes; ``jemalloc``: jemalloc's ``malloc``, preloaded, instead of
    glibc's): its peaks after 2 and ``steps`` steps, and its median step time from the third step."""
    jemalloc = ctypes.util.find_library("jemalloc")
    if "jemalloc" in sizes and not jemalloc:
        sys.exit("jemalloc: no libjemalloc here (Debian: apt-get install libjemalloc2)")
    for name in map(_at_fill, names.split(";")):
        spec, _ = sampled(name)
        glibc, other = (
            spec.memory_estimate(spec.batch_size, "adamw", malloc=m) >> 20 for m in ("glibc", "jemalloc")
        )
        cells = []
        for size in sizes:
            if size == "jemalloc":
                got, label = _steps_child(name, steps, "dynamic", jemalloc), "jemalloc"
            else:
                got, label = _steps_child(name, steps, size), f"{int(size) >> 10} KiB"
            cells.append(f"{label} {got['peaks'][1]:.0f}/{got['peaks'][-1]:.0f} MiB, "
                         f"{statistics.median(got['s'][2:]):.2f} s")  # fmt: skip
        print(f"{name}: estimate {glibc} MiB ({other} without glibc's heap pages); peak after 2/{steps} "
              f"steps, median step: {'; '.join(cells)}", flush=True)  # fmt: skip


def threshold(names: str, steps: int, rounds: int) -> None:
    """Per spec, ``rounds`` interleaved pairs of children (dynamic, then fixed): each pair's step
    time ratio, and every child's peaks."""
    for name in map(_at_fill, names.split(";")):
        ratios, peaks = [], {"dynamic": [], "fixed": []}
        for _ in range(rounds):
            step = {}
            for mode in ("dynamic", "fixed"):
                got = _steps_child(name, steps, mode)
                step[mode] = statistics.median(got["s"][3:])
                peaks[mode].append("/".join(f"{got['peaks'][k]:.0f}" for k in (1, 4, steps - 1)))
            ratios.append(step["fixed"] / step["dynamic"])
        print(f"{name}: step time fixed / dynamic {', '.join(f'{r:.2f}' for r in ratios)}; peak MiB after "
              f"2/5/{steps} steps, dynamic {', '.join(peaks['dynamic'])}; fixed {', '.join(peaks['fixed'])}",
              flush=True)  # fmt: skip


def _resident() -> dict[str, int]:
    return {key: status_bytes(key) or 0 for key in ("VmRSS", "RssAnon", "RssFile")}


def base_child(name: str, warm: bool) -> None:
    """One child of ``base``: its base, taken cold or warm, and what the trial's steps added."""
    spec, _ = sampled(name)
    cpu = torch.device("cpu")
    if warm:
        warm_base(spec, "adamw", cpu)
    reset_peak_memory(cpu, pin=True)
    before = _resident()
    train_steps(spec, "adamw", 1, cpu, trial_steps(spec, cpu))
    print(json.dumps({"before": before, "after": _resident(), "hwm": status_bytes("VmHWM") or 0}))


def base(name: str, rounds: int) -> None:
    """``rounds`` interleaved pairs of children, cold then warm: each base and the rise over it."""
    mib = 2**20
    for _ in range(rounds):
        for mode in ("cold", "warm"):
            got = _child(["base-child", name, mode])
            b, a = got["before"], got["after"]
            rise = (got["hwm"] - b["VmRSS"]) / mib
            print(f"{name} {mode}: base VmRSS {b['VmRSS'] / mib:.0f} (RssAnon {b['RssAnon'] / mib:.0f}, "
                  f"RssFile {b['RssFile'] / mib:.0f}) MiB; peak rise {rise:.0f} MiB; "
                  f"the steps added RssAnon {(a['RssAnon'] - b['RssAnon']) / mib:.0f}, "
                  f"RssFile {(a['RssFile'] - b['RssFile']) / mib:.0f} MiB", flush=True)  # fmt: skip


def main(argv: list[str]) -> None:
    if argv[:1] == ["saved"]:
        saved()
    elif argv[:1] == ["trace"] and len(argv) == 2:
        trace(argv[1])
    elif argv[:1] == ["trials"] and len(argv) == 3:
        trials(argv[1], int(argv[2]))
    elif argv[:1] == ["threshold"] and len(argv) in (3, 4) and int(argv[2]) >= 5:
        threshold(argv[1], int(argv[2]), int(argv[3]) if len(argv) == 4 else 1)
    elif argv[:1] == ["growth"] and len(argv) == 3:
        growth(argv[1], int(argv[2]))
    elif argv[:1] == ["base"] and len(argv) in (2, 3):
        base(argv[1], int(argv[2]) if len(argv) == 3 else 1)
    elif argv[:1] == ["base-child"]:
        base_child(argv[1], argv[2] == "warm")
    elif argv[:1] == ["mapped"] and len(argv) == 4 and int(argv[2]) >= 3:
        mapped(argv[1], int(argv[2]), argv[3].split(","))
    elif argv[:1] == ["threshold-child"]:
        threshold_child(argv[1], int(argv[2]), argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
