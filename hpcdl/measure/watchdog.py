"""The stall bound: a run in which some rank completes no step for too long ends, with the rank
and host named, instead of hanging forever (a rank stopped, hung on a device, or waiting on a
lost peer).

Every rank runs a watchdog thread while it trains (warm-up and timed steps). Each second it
writes this rank's heartbeat into a directory the ranks share (:func:`heartbeat_dir`): the
steps done, when the last one ended, the median step time and
a tick that shows the process itself is alive. It reads the others' and, when some rank has
completed no step for ``max(floor, FACTOR x median step)``, says which rank stalled and ends
every rank (MPI_Abort). A frozen rank (stopped, its tick old) is the culprit; otherwise the
rank whose last step is oldest. Ranks that finished training say so and are left out.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from hpcdl import reader
from hpcdl.parallel.launch import SCRATCH_ENV, keep_until_launcher_ends
from hpcdl.parallel.world import World

FACTOR = 20
"""a step may take this many times the median step before the run counts as stalled"""
TICK_S = 1.0
FROZEN_S = 5.0
"""a heartbeat whose tick is older than this belongs to a process that no longer runs"""
MIN_BOUND_S = FROZEN_S + 2 * TICK_S
"""the stall bound is never shorter: by then a frozen rank's heartbeat has shown it"""


class Watchdog:
    """This rank's part of the stall bound (see the module's docstring)."""

    def __init__(self, directory: Path, world: World, floor_s: float) -> None:
        self.world = world
        self.floor_s = floor_s
        self.path = directory / f"rank-{world.rank}.json"
        self.directory = directory
        self.steps = 0
        self.last_step = time.time()
        self.durations: deque[float] = deque(maxlen=64)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcdl-watchdog", daemon=True)

    def step_done(self) -> None:
        """Called by the training loop after every step."""
        now = time.time()
        self.durations.append(now - self.last_step)
        self.last_step, self.steps = now, self.steps + 1

    def __enter__(self) -> Watchdog:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.last_step = time.time()
        self._beat(done=False)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        # finished: the others no longer expect steps from this rank. A directory that went
        # away or filled up fails no finished measurement: the record's write says so if it must
        with contextlib.suppress(OSError):
            self._beat(done=True)

    def _beat(self, done: bool) -> None:
        beat = {
            "rank": self.world.rank,
            "host": self.world.hostname,
            "pid": os.getpid(),
            "steps": self.steps,
            "last_step": self.last_step,
            "median_s": statistics.median(self.durations) if self.durations else 0.0,
            "tick": time.time(),
            "done": done,
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(beat))
        os.replace(tmp, self.path)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self._beat(done=False)
                verdict = stalled(read_beats(self.directory), self.floor_s, time.time())
            except OSError:
                continue  # a shared directory that hiccups is no reason to end a run
            if verdict:
                print(f"hpcdl: {verdict}; ending the run", file=sys.stderr, flush=True)
                self.world.abort(1)
                os._exit(1)  # without MPI (one process cannot stall itself, but be sure)


HEARTBEATS = ".hpcdl-heartbeats"
"""under the output folder, where ranks that share no other folder meet"""


def heartbeat_dir(output_dir: str | Path | None, world: World) -> Path | None:
    """Where the ranks' watchdogs meet (None alone): a new folder in the launcher's scratch
    folder (``launch.SCRATCH_ENV``), else in this host's temporary folder, when every rank sees
    it; else, ranks on several nodes that share neither, under the output folder, which the
    launcher, if there is one, removes when it ends. Rank 0 removes it too when training ends
    (:func:`remove_heartbeats`)."""
    if world.size == 1:
        return None
    made = None
    if world.rank == 0:
        scratch = os.environ.get(SCRATCH_ENV)  # the launcher's: on another node, not here
        made = tempfile.mkdtemp(
            prefix="hpcdl-heartbeats-", dir=scratch if scratch and os.path.isdir(scratch) else None
        )
    made = world.bcast(made)
    if all(world.allgather(os.path.isdir(made))):
        return Path(made)
    fallback = world.bcast(uuid.uuid4().hex if world.rank == 0 else None)
    base = Path(output_dir) if output_dir is not None else Path(tempfile.gettempdir())
    if world.rank == 0:
        os.rmdir(made)
        keep_until_launcher_ends(base / HEARTBEATS / fallback)
    return base / HEARTBEATS / fallback


def remove_heartbeats(directory: Path) -> None:
    """Rank 0, when training ends: the folder, and the output folder's folder of them once empty."""
    shutil.rmtree(directory, ignore_errors=True)
    if directory.parent.name == HEARTBEATS:
        with contextlib.suppress(OSError):
            directory.parent.rmdir()


def read_beats(directory: Path) -> list[dict[str, Any]]:
    beats = []
    for path in directory.glob("rank-*.json"):
        try:
            beats.append(reader.read_json(path))
        except reader.Unreadable:
            continue  # being replaced right now: next second
    return beats


def stalled(beats: list[dict[str, Any]], floor_s: float, now: float) -> str:
    """Why the run stalls ('' when it does not): some rank still training has completed no step
    for longer than the bound."""
    active = [b for b in beats if not b.get("done")]
    medians = [b["median_s"] for b in active if b["median_s"] > 0]
    bound = max(MIN_BOUND_S, floor_s, FACTOR * statistics.median(medians) if medians else 0.0)
    late = [b for b in active if now - b["last_step"] > bound]
    if not late:
        return ""
    frozen = [b for b in active if now - b["tick"] > FROZEN_S]
    culprit = min(frozen or late, key=lambda b: b["last_step"])
    state = "is stopped or frozen (its heartbeat stopped too)" if frozen else "completed no step"
    return (
        f"rank {culprit['rank']} on {culprit['host']} (pid {culprit['pid']}) {state}: no step for "
        f"{now - culprit['last_step']:.0f} s after {culprit['steps']} steps, beyond the stall bound of "
        f"{bound:.0f} s (max of --stall {floor_s:g} s and {FACTOR} x the median step)"
    )
