"""The one way tests call the ``hpcdl`` command.

``hpcdl(...)`` runs it in this process: the test process has imported torch once, so a call
costs what the command does, not a new interpreter and torch (about 2 s and 300 MB each). Its
output is captured at the file descriptors, so what a child it starts (``mpirun``, a trial, a
Slurm client) prints is captured too, and the process-wide state a command may change (the
working directory, the environment, torch's thread count, signal handlers and the stop signals
heard, warning filters) is put back afterwards.

``hpcdl_process(...)`` runs it as a real process, for tests about processes: launchers,
signals, MPI, Slurm, the stop rule, plugins (a plugin registers itself in this process's
registries for good), and anything that changes what cannot be put back (glibc's mmap
threshold, which a fitted run fixes).

Both return a :class:`Ran` (``returncode``, ``stdout``, ``stderr``), as
``subprocess.run(..., capture_output=True, text=True)`` does.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from hpcdl.cli import main
from hpcdl.parallel import launch

ROOT = Path(__file__).resolve().parent.parent
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM)


@dataclass(frozen=True)
class Ran:
    """A finished command: its exit code and what it printed."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


class CommandTimeout(BaseException):
    """An in-process command ran past its timeout (raised into it by SIGALRM; a BaseException,
    so that no ``except Exception`` inside the command mistakes it for the command's own)."""


def hpcdl(
    *args: str,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> Ran:
    """``hpcdl ARGS`` in this process. ``env`` is the whole environment of the call (as for
    ``subprocess.run``); ``timeout`` fails the test instead of hanging the suite."""
    argv = [str(a) for a in args]
    with _captured() as (out, err), _state(cwd, env), _alarm(timeout, argv):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: --help (0) and usage errors (2)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:  # what an interpreter would print before exiting 1
            traceback.print_exc()
            code = 1
    return Ran(argv, code, out.getvalue(), err.getvalue())


def hpcdl_process(
    *args: str,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> Ran:
    """``python -m hpcdl ARGS`` as a child process (see the module's docstring for when)."""
    argv = [str(a) for a in args]
    p = subprocess.run(
        [sys.executable, "-m", "hpcdl", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        timeout=timeout,
    )
    return Ran(argv, p.returncode, p.stdout, p.stderr)


def hears_signals() -> None:
    """For ``preexec_fn``: a child whose test signals it hears the signals hpcdl handles, even
    where the test runner was started with them ignored (``nohup``, a shell without job
    control), which children inherit and hpcdl keeps ignored, as a background job should."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


ERROR_LINE = re.compile(r"^hpcdl( [\w-]+)*: error: ")
"""hpcdl's own error line, or argparse's (``hpcdl run: error: ...``)"""


def one_line(p: Ran, code: int = 2, alone: bool = True) -> str:
    """The one error line a refused command printed, with exit ``code`` and no traceback;
    ``alone``: and nothing else on stderr (a run that fails mid-way may have said more)."""
    assert p.returncode == code, (p.args, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    errors = [line for line in p.stderr.splitlines() if ERROR_LINE.match(line)]
    assert len(errors) == 1 and "Traceback" not in p.stderr, (p.args, p.stderr)
    if alone:
        assert p.stderr.strip() == errors[0], (p.args, p.stderr)
    return errors[0]


def unwrapped(text: str) -> str:
    """Output with its wrapped notes joined again (``results.text.wrapped`` indents each later
    line of a note by two spaces), so that a test finds a phrase wherever a line was broken."""
    return text.replace("\n  ", " ")


class _Captured:
    """A file that file descriptor 1 or 2 is pointed at, read back as text."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile(mode="w+b")
        self.text = ""

    def getvalue(self) -> str:
        return self.text

    def close(self) -> None:
        self.file.seek(0)
        self.text = self.file.read().decode("utf-8", errors="replace")
        self.file.close()


@contextlib.contextmanager
def _captured() -> Iterator[tuple[_Captured, _Captured]]:
    """Point fds 1 and 2 (and ``sys.stdout``/``sys.stderr``, which pytest replaces) at two
    files for the call: a child process writes to the fds, Python code to the objects."""
    out, err = _Captured(), _Captured()
    saved_objects = sys.stdout, sys.stderr
    for stream in saved_objects:
        stream.flush()
    saved_fds = os.dup(1), os.dup(2)
    os.dup2(out.file.fileno(), 1)
    os.dup2(err.file.fileno(), 2)
    sys.stdout = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"), encoding="utf-8", line_buffering=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(2), "wb"), encoding="utf-8", line_buffering=True)
    try:
        yield out, err
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a command may have closed them
                stream.flush()
                stream.close()
        sys.stdout, sys.stderr = saved_objects
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        out.close()
        err.close()


@contextlib.contextmanager
def _state(cwd: str | Path | None, env: Mapping[str, str] | None) -> Iterator[None]:
    """The working directory and environment for the call; on the way out, those and the rest
    of the process-wide state a command may change put back."""
    here, environ = os.getcwd(), dict(os.environ)
    threads = torch.get_num_threads()
    handlers = {s: signal.getsignal(s) for s in SIGNALS}
    received = list(launch._received)  # the stop signals this process heard: a command's own
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    try:
        with warnings.catch_warnings():
            yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        launch._received[:] = received


@contextlib.contextmanager
def _alarm(seconds: float, argv: list[str]) -> Iterator[None]:
    def expired(_signum: int, _frame: object) -> None:
        raise CommandTimeout(f"hpcdl {' '.join(argv)} ran past {seconds:g} s")

    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
