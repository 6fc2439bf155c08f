"""How long a rank was kept from running: the time its main thread was ready but waited for a
CPU (Linux ``/proc/thread-self/schedstat``, the scheduler's ``run_delay``), beside the time it
ran.

Why a record needs it: a rank slowed in bursts (a cgroup CPU limit throttles it for most of
every 100 ms period, or a core it shares) stalls wherever it happens to be, mostly inside the
step's collectives, where its peers wait for it too. Every rank's phases then last alike, and
the median forward and backward of the slowed rank stay those of a fast one (measured: 0.63
against 0.64 ms, while throughput fell 7x under a 10 % quota). Waiting for a peer is sleeping or
spinning, never ``run_delay``; being throttled or crowded out is: the scheduler tells the two
apart where the step timings cannot. Of the time a rank was ready, the share it ran
(``ran / (ran + waited)``) does not depend on how long it sleeps waiting for its peers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType

SCHEDSTAT = Path("/proc/thread-self/schedstat")


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def kernel_id(path: Path = BOOT_ID) -> str:
    """The running kernel's boot id: ranks that share it share the machine's CPUs, whatever host
    names their containers or network namespaces give them ('' where unknown)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def schedstat(path: Path = SCHEDSTAT) -> tuple[float, float] | None:
    """This thread's total seconds on a CPU and runnable but waiting for one; None where the
    kernel does not keep scheduler statistics."""
    try:
        fields = path.read_text().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class Descheduled(AbstractContextManager["Descheduled"]):
    """Seconds the entering thread ran (``ran_s``) and waited for a CPU (``waited_s``) while
    inside the block; None where unknown."""

    def __init__(self, path: Path = SCHEDSTAT) -> None:
        self.path = path
        self._start: tuple[float, float] | None = None
        self.ran_s: float | None = None
        self.waited_s: float | None = None

    def __enter__(self) -> Descheduled:
        self._start = schedstat(self.path)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        end = schedstat(self.path)
        if self._start is not None and end is not None:
            self.ran_s = max(0.0, end[0] - self._start[0])
            self.waited_s = max(0.0, end[1] - self._start[1])


@contextlib.contextmanager
def together(*blocks: AbstractContextManager[object]) -> Iterator[None]:
    """Enter every block, in order (the timed window's sampler and clocks)."""
    with contextlib.ExitStack() as stack:
        for b in blocks:
            stack.enter_context(b)
        yield
