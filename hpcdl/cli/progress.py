"""What a person sees while a workload runs: on a terminal one live line per workload (steps,
elapsed, current samples/s, time left; drawn by tqdm), and elsewhere (logs, Slurm, pipes) the
plain lines of a log, one a second at most."""

from __future__ import annotations

import shutil
import sys
from types import TracebackType
from typing import TextIO

from tqdm import tqdm

from hpcdl.cli.terminal import unfiltered
from hpcdl.escape import printable


class LiveLine:
    """The progress of one workload. ``say`` prints a message; ``timed`` reports the timed steps
    so far. A run of ``steps`` steps counts steps; a run of ``duration_s`` counts seconds."""

    def __init__(self, prefix: str, steps: int, duration_s: float, stream: TextIO | None = None) -> None:
        self.prefix = prefix
        self.by_steps = steps > 0
        self.stream = stream or sys.stderr
        self.bar: tqdm[None] | None = None
        if self.stream.isatty():
            sized = shutil.get_terminal_size((0, 0)).columns > 0  # a terminal may report 0 columns
            self.bar = tqdm(
                total=steps if self.by_steps else duration_s,
                desc=printable(prefix),
                unit="step" if self.by_steps else "s",
                file=unfiltered(self.stream),  # the bar draws with control codes; its text is printable
                dynamic_ncols=sized,
                ncols=None if sized else 100,
                nrows=None if sized else 24,  # tqdm asks the terminal unless given both
                leave=True,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}",
            )

    def say(self, message: str) -> None:
        line = f"{self.prefix}: {message}"
        if self.bar is not None:
            self.bar.write(printable(line), file=self.bar.fp)  # the bar's own stream: it clears it first
        else:
            print(line, file=self.stream, flush=True)

    def timed(self, steps: int, elapsed_s: float, samples: int) -> None:
        rate = samples / elapsed_s if elapsed_s > 0 else 0.0
        if self.bar is None:
            self.say(f"timed {steps} steps in {elapsed_s:.1f} s, {rate:.1f} samples/s")
            return
        done = steps if self.by_steps else min(elapsed_s, float(self.bar.total or 0))
        self.bar.update(done - self.bar.n)
        self.bar.set_postfix_str(f"{steps} steps, {rate:.1f} samples/s")

    def __enter__(self) -> LiveLine:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.bar is not None:
            self.bar.close()
