"""MLPerf-style result logs (``hpcdl run --mllog FILE``): a run's record and steps file as
``:::MLLOG`` lines in the format of mlcommons/logging, which MLPerf's parsers and operators'
tools read.

Each line is ``:::MLLOG `` and a JSON object with the keys ``namespace``, ``time_ms`` (milliseconds
since the epoch), ``event_type`` (``INTERVAL_START``, ``INTERVAL_END`` or ``POINT_IN_TIME``),
``key``, ``value`` and ``metadata``, in that order. The lines are written after the run from its
record (so a stopped run, which has no record, logs nothing): init from the command's start to
the timed window, the run over the window, the settings as events, a throughput block for about
every second of rank 0's steps, and power readings where they were measured. The namespace is
the record's name, so that the runs of a suite or of ``--repeat`` share one file.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hpcdl.errors import InputError
from hpcdl.records.views import Result

PREFIX = ":::MLLOG "
START, END, EVENT = "INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"
BLOCK_S = 1.0
"""seconds of steps per throughput block (at least one step each)"""


def line(
    namespace: str, time_s: float, event_type: str, key: str, value: Any, metadata: dict[str, Any]
) -> str:
    """One log line; mlcommons/logging's key order, times in whole milliseconds."""
    entry = {
        "namespace": namespace,
        "time_ms": round(time_s * 1000),
        "event_type": event_type,
        "key": key,
        "value": value,
        "metadata": metadata,
    }
    return PREFIX + json.dumps(entry)


def run_lines(view: Result, steps: Mapping[str, np.ndarray], init_start_s: float) -> list[str]:
    """The log of one run: its record's view, its steps file's columns and when the command
    started working on it (seconds since the epoch)."""
    m, ns = view.metrics, view.name
    start, stop = m.window_start_unix, m.window_end_unix
    if start is None or stop is None:
        raise ValueError(f"record {view.name} has no window times (written before hpcdl logged them)")
    samples = round(m.samples_per_s * m.timed_window_s)
    out = [
        line(ns, init_start_s, START, "init_start", None, {}),
        line(ns, init_start_s, EVENT, "submission_benchmark", view.family, {}),
        line(ns, init_start_s, EVENT, "submission_platform", view.environment.device_name, {}),
        line(ns, init_start_s, EVENT, "global_batch_size", view.settings.global_batch, {}),
        line(ns, init_start_s, EVENT, "seed", view.spec.get("seed"), {}),
        line(ns, init_start_s, EVENT, "train_samples", samples, {}),
        line(ns, start, END, "init_stop", None, {}),
        line(ns, start, START, "run_start", None, {}),
    ]
    out += blocks(ns, start, list(steps.get("step_s", [])), view.settings.global_batch)
    out += power_lines(ns, view, start, stop, steps)
    status = "success" if view.validity.passed and (m.target is None or m.target.reached) else "aborted"
    out.append(line(ns, stop, END, "run_stop", None, {"status": status, "samples_count": samples}))
    return out


def blocks(ns: str, start: float, step_s: Sequence[float], global_batch: int) -> list[str]:
    """Throughput blocks of about BLOCK_S of rank 0's steps: block_start and block_stop with the
    samples before and after, and a ``tracked_stats`` event with the block's samples/s."""
    out, t, i = [], start, 0
    while i < len(step_s):
        first, elapsed = i, 0.0
        while i < len(step_s) and (elapsed < BLOCK_S or i == first):
            elapsed += step_s[i]
            i += 1
        done = i * global_batch
        out.append(line(ns, t, START, "block_start", None, {"samples_count": first * global_batch}))
        t += elapsed
        rate = (done - first * global_batch) / elapsed
        out.append(line(ns, t, EVENT, "tracked_stats", {"throughput": rate}, {"step": i}))
        out.append(line(ns, t, END, "block_stop", None, {"samples_count": done}))
    return out


def power_lines(
    ns: str, view: Result, start: float, stop: float, steps: Mapping[str, np.ndarray]
) -> list[str]:
    """``power_reading`` events: rank 0's GPU samples, and each CPU package's RAPL average over
    the window (RAPL gives energy, not power: one reading at the window's end)."""
    out = []
    times, watts = steps.get("gpu_time_s"), steps.get("gpu_power_w")
    host = view.environment.host
    if times is not None and watts is not None:
        meta = {"host": host, "source": "nvml GPU, rank 0"}
        for t, w in zip(times, watts, strict=True):
            if np.isfinite(w):
                out.append(line(ns, start + float(t), EVENT, "power_reading", float(w), meta))
    cpu = view.metrics.energy.cpu_energy_j
    if cpu is not None and stop > start:
        meta = {"host": host, "source": "rapl packages, average over the window"}
        out.append(line(ns, stop, EVENT, "power_reading", cpu / (stop - start), meta))
    return out


def _open(path: Path) -> int:
    """The log file open for appending (created if missing) when it is a regular file; an
    InputError otherwise. Opened without blocking: a FIFO without a reader fails at once
    instead of waiting, a device (``/dev/full``, ``/dev/null``) is refused by its type."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        why = "a FIFO" if e.errno == errno.ENXIO else e.strerror or str(e)
        raise InputError("mllog", str(path), f"a regular file hpcdl can append to ({why})") from None
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        what = {stat.S_IFCHR: "a character device", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}
        why = f"a regular file hpcdl can append to, not {what.get(kind, 'that')}"
        raise InputError("mllog", str(path), why)
    return fd


def check(path: Path) -> None:
    """Refuse a log that is not a regular file hpcdl can append to, before anything is measured
    (it is created empty when missing)."""
    os.close(_open(path))


def append(path: Path, lines: Sequence[str]) -> None:
    """Add the lines to the log file (created if missing); InputError when it is no longer a
    regular file, OSError when the write fails (a full disk)."""
    with os.fdopen(_open(path), "a", encoding="utf-8") as f:
        f.write("".join(f"{x}\n" for x in lines))
