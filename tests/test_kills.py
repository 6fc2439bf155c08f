"""The stop rule, for every way a run can end, against every long command (those that launch
ranks, a fit's trials, a profile): a record is written only when the run ended normally and
whoever launched it still wants it, and every process hpcdl started ends with it.

Real processes throughout: the launcher is hung up under ``nohup`` (SIGHUP ignored by the
parent, as ``nohup`` does), which must end nothing, then killed with SIGKILL, which must end
everything; or told to stop with SIGTERM; or rank 0's write fails (the output directory
replaced by a file while the ranks measure). One run serves both signals of the first fault:
ranks are slow to start. A command is one row of ``COMMANDS``; a fault is one row of
``FAULTS``; every pair that applies is a test. Each asserts that the processes end within a
bound, that no orphan runs on (every process of the run carries a mark in its environment),
that no record, steps file or temporary file is left, and the exit code.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl
from test_schedulers import processes_with, write_job

from hpcdl.parallel.launch import LAUNCHERS_ENV, launcher_env, stop_requested
from hpcdl.records.loader import load_tree
from hpcdl.records.store import write_pair

TINY = ["mlp", "layers=1", "width=16", "input_size=8", "output_size=2", "batch_size=4"]
WINDOW_S = 8  # long enough that every fault lands inside the timed window
BOUND_S = 30  # every process of a run ends within this after the fault
TIMED = re.compile(r"timed \d+ steps in")


@dataclass(frozen=True)
class Command:
    """A long command: its arguments writing into ``out`` (``job``: a job file beside it, for
    ``submit``), the exit code when rank 0's write fails (None: not a case of its own, the same
    ``run`` inside, or nothing written), and when it is busy (``Launched.timing``: its ranks time
    their steps)."""

    argv: Callable[[Path, Path], list[str]]
    write_fails: int | None
    busy: Callable[[Launched], None] = lambda run: run.timing()
    ends_within_s: float = BOUND_S
    """its processes end this soon after it (mpirun takes its time; a helper dies at once)"""


def _submit(out: Path, job: Path) -> list[str]:
    run = {"steps": 0, "duration_s": WINDOW_S, "warmup_steps": 2, "min_duration_s": 0.0}
    workload = dict(kv.split("=") for kv in TINY[1:])
    write_job(job, name="k", nodes=[2], backend="torch", run=run, output=str(out),
              workload={"family": "mlp", **{k: int(v) for k, v in workload.items()}})  # fmt: skip
    return ["submit", str(job), "--executor", "local"]


HELPER_S = 1.5
"""a helper process (a fit's trial) gets its parent-death signal as its parent dies: a trial
left running takes seconds more to finish (or to fail writing to its parent's closed pipe)"""
RUN = ["--data", "random", "--duration", str(WINDOW_S), "--min-duration", "0"]
COMMANDS = {
    "run": Command(lambda out, _: ["run", "--workload", *TINY, *RUN, "--np", "2", "-o", str(out)], 2),
    "sweep": Command(
        lambda out, _: ["sweep", "--workload", *TINY, *RUN, "--np", "2", "--prefix", "k", "-o", str(out)], 2
    ),
    "capacity": Command(
        lambda out, _: ["capacity", "--workload", *TINY, *RUN, "--instances", "2", "-o", str(out)], 2
    ),
    "submit": Command(_submit, None),
    "run --compile": Command(
        lambda out, _: ["run", "--workload", *TINY, *RUN, "--np", "2", "--compile", "-o", str(out)], None
    ),
    "sweep --knob": Command(
        lambda out, _: [
            "sweep",
            "--workload",
            *TINY,
            *RUN,
            "--knob",
            "batch_size=4,8",
            "--prefix",
            "k",
            "-o",
            str(out),
        ],  # fmt: skip
        None,
    ),
    "run --fit": Command(
        lambda out, _: ["run", "--workload", *TINY, *RUN, "--fit", "0.01", "-o", str(out)],
        None,
        lambda run: run.until("a fit's trial", lambda: any(TRIAL in p for p in processes_with(run.mark))),
        ends_within_s=HELPER_S,
    ),
    "run --data hdf5": Command(
        lambda out, _: ["run", "--workload", *TINY, *RUN[2:], *hdf5(out), "-o", str(out)],
        None,
        lambda run: run.until("its data workers", lambda: len(processes_with(run.mark)) >= 3),
        ends_within_s=HELPER_S,
    ),
    "profile": Command(
        lambda out, _: ["profile", PROFILED, "--steps", "1000000", "-o", str(out / "p.json")],
        None,
        lambda run: run.until("timed steps", lambda: "timed steps" in run.output),
        ends_within_s=HELPER_S,
    ),
}
TRIAL = "hpcdl.measure.trial"


def hdf5(out: Path) -> list[str]:
    """Shards written beside ``out``, and the options that read them with 2 DataLoader workers."""
    shards = out.parent / "shards"
    p = hpcdl("io", "--dir", str(shards), "--batches", "8", "--shards", "2", *TINY)
    assert p.returncode == 0, p.stderr
    return ["--data", "hdf5", "--data-dir", str(shards), "--workers", "2"]


PROFILED = str(Path(__file__).resolve().parent / "proxy_models.py") + ":tiny_cnn"


class Launched:
    """A command started as a user would, in its own session (a terminal's), its output
    collected by a thread; every process it starts inherits ``mark``."""

    def __init__(
        self, argv: list[str], out: Path, *, nohup: bool = False, ends_within_s: float = BOUND_S
    ) -> None:
        self.mark = f"hpcdl-kill-{uuid.uuid4().hex}"
        self.ends_within_s = ends_within_s
        """every process it started has ended this long after it did"""
        self.out, self.lines = out, []
        ignore_hup = (lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hpcdl", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "HPCDL_TEST_MARK": self.mark, "OMP_NUM_THREADS": "1"},
            cwd=out.parent,
            start_new_session=True,
            preexec_fn=ignore_hup,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def timing(self, within_s: float = 240) -> None:
        """Return once the ranks time their steps (said on the output, or in a job's log)."""
        end = time.monotonic() + within_s
        while not TIMED.search(self.output) and not any(
            TIMED.search(log.read_text(errors="replace")) for log in self.out.glob("submitit/*/*_log.out")
        ):
            assert self.proc.poll() is None and time.monotonic() < end, self.output[-3000:]
            time.sleep(0.2)

    def until(self, what: str, done: Callable[[], bool], within_s: float = 240) -> None:
        """Return once ``done()``, while the command runs (else fail, naming ``what``)."""
        end = time.monotonic() + within_s
        while not done():
            assert self.proc.poll() is None and time.monotonic() < end, (what, self.output[-3000:])
            time.sleep(0.2)

    def ended(self) -> int:
        """The launcher's exit code, once every process of the run has ended (or fail)."""
        code = self.proc.wait(timeout=BOUND_S)
        end = time.monotonic() + self.ends_within_s
        while processes_with(self.mark) and time.monotonic() < end:
            time.sleep(0.2)
        assert processes_with(self.mark) == [], self.output[-3000:]
        return code

    def stop(self) -> None:
        with_mark = processes_with(self.mark)
        self.proc.kill()
        for line in with_mark:
            try:
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def nothing_recorded(out: Path) -> None:
    """No result record, steps file or temporary file anywhere under ``out``."""
    assert load_tree([out]).records == []
    left = [p.name for p in out.rglob("*") if p.name.endswith((".steps.h5", ".tmp"))]
    assert left == [], left


def kill_launcher(run: Launched) -> None:
    """SIGKILL to the launcher while it is busy (``hang_up_then_kill`` waited): it cannot say it stops."""
    run.proc.kill()
    assert run.ended() == -signal.SIGKILL
    nothing_recorded(run.out)


def hang_up_then_kill(run: Launched, busy: Callable[[Launched], None]) -> None:
    """Under nohup a closed terminal's SIGHUP (to the launcher's whole session) ends nothing:
    every process runs on; then SIGKILL to the launcher ends them all, with no record."""
    busy(run)
    before = sorted(processes_with(run.mark))
    os.killpg(run.proc.pid, signal.SIGHUP)
    time.sleep(2)
    assert run.proc.poll() is None, run.output[-3000:]
    assert sorted(processes_with(run.mark)) == before
    kill_launcher(run)


def terminate(run: Launched, busy: Callable[[Launched], None]) -> None:
    """SIGTERM (``kill``, a harness's timeout) to the launcher alone while it is busy: every
    process it started ends, exit 143 (or the signal itself: a command that launches nothing of
    its own need not catch it), no record."""
    busy(run)
    run.proc.terminate()
    assert run.ended() in (128 + signal.SIGTERM, -signal.SIGTERM), run.output[-3000:]
    assert "Traceback" not in run.output, run.output[-3000:]
    nothing_recorded(run.out)


def write_fails(run: Launched, code: int) -> None:
    """Rank 0's write fails (its output directory is replaced by a file while the ranks time
    their steps): every rank ends at once, one error line, nothing written, the exit code."""
    run.timing()
    moved = run.out.with_name("moved")
    run.out.rename(moved)
    run.out.write_text("not a directory")
    assert run.ended() == code, run.output[-3000:]
    said = [line for line in run.lines if line.startswith("hpcdl:") and "could not be written" in line]
    assert len(said) == 1 and "Traceback" not in run.output, run.output[-3000:]
    nothing_recorded(moved)


FAULTS = ("hangup-then-kill", "term", "write")


@pytest.mark.slow(reason="every command killed every way: about two minutes")
@pytest.mark.mpi
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_run_ends_every_way_without_a_wrong_record(tmp_path: Path, command: str, fault: str) -> None:
    row = COMMANDS[command]
    if fault == "write" and row.write_fails is None:
        pytest.skip(f"{command}: the write is run's own (covered by the run row)")
    out = tmp_path / "out"
    out.mkdir()
    nohup = fault == "hangup-then-kill"
    run = Launched(row.argv(out, tmp_path / "job.toml"), out, nohup=nohup, ends_within_s=row.ends_within_s)
    try:
        if fault == "hangup-then-kill":
            hang_up_then_kill(run, row.busy)
        elif fault == "term":
            terminate(run, row.busy)
        else:
            assert row.write_fails is not None
            write_fails(run, row.write_fails)
    finally:
        run.stop()


# --- the parts, each on its own: fast, no ranks ------------------------------------------------


@pytest.mark.slow(
    reason="a real run whose launcher is killed mid-window, then the bound it waits: about 13 s"
)
def test_a_record_is_not_written_once_a_launcher_is_gone(tmp_path: Path) -> None:
    """A launcher killed with SIGKILL cannot mark its run stopped: rank 0 finds it gone (pid and
    start time) and writes nothing; a launcher whose pid was reused is gone as well."""
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        env = launcher_env()  # this process as a launcher
        ours = dict(os.environ)
        os.environ.update(env)
        assert not stop_requested()
        pid_reused = env[LAUNCHERS_ENV].rsplit("/", 1)[0] + "/1"  # this pid, another start time
        os.environ[LAUNCHERS_ENV] = pid_reused
        assert stop_requested()
    finally:
        os.environ.clear()
        os.environ.update(ours)
    # a real run whose launcher (not its parent: no parent-death signal) is killed mid-window
    script = f"import os; os.environ[{LAUNCHERS_ENV!r}] = {launcher_of(launcher.pid)!r}; " + (
        "from hpcdl.cli import main; raise SystemExit(main())"
    )
    args = ["run", "--workload", *TINY, *RUN, "-o", str(tmp_path)]
    run = subprocess.Popen([sys.executable, "-c", script, *args], stderr=subprocess.PIPE, text=True)
    assert run.stderr is not None
    for line in run.stderr:
        if TIMED.search(line):
            break
    launcher.kill()
    launcher.wait()
    rest = run.communicate(timeout=BOUND_S + WINDOW_S)[1]
    said = f"launcher (pid {launcher.pid}) is gone; its record is not written"
    assert run.returncode == 2 and said in rest, rest
    nothing_recorded(tmp_path)


def launcher_of(pid: int) -> str:
    """``LAUNCHERS_ENV`` naming process ``pid`` (read from /proc as launch.py does)."""
    here = launcher_env()[LAUNCHERS_ENV].split(",")[-1].split("/")[0]
    start = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    return f"{here}/{pid}/{start}"


KILL_BETWEEN_RENAMES = """
import os, signal, sys
from hpcdl.records import store
calls = []
def replace(src, dst):
    calls.append(dst)
    real(src, dst)
    if len(calls) == 1:  # the steps file has its name, the record not yet
        os.kill(os.getpid(), signal.SIGKILL)
real, os.replace = os.replace, replace
store.write_pair({"id": "0123456789abcdef"}, {"step_s": [0.1]}, sys.argv[1], "r")
"""


def test_a_kill_between_the_two_renames_leaves_no_record_and_the_next_write_clears_it(
    tmp_path: Path,
) -> None:
    """SIGKILL after the steps file took its name and before the record took its own: no
    record is read from the folder; the next write of the name leaves one whole pair only."""
    p = subprocess.run([sys.executable, "-c", KILL_BETWEEN_RENAMES, str(tmp_path)], check=False)
    assert p.returncode == -signal.SIGKILL
    assert not (tmp_path / "r.json").exists()
    assert load_tree([tmp_path]).records == [] and not load_tree([tmp_path]).unreadable
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != ".r.lock")
    assert left[0].startswith(".r.json.") and left[1] == "r.0123456789ab.steps.h5", left
    _, path, steps = write_pair({"id": "fedcba9876543210"}, {"step_s": [0.2]}, tmp_path, "r")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, steps.name])  # no lock left


SWALLOWED = """
import os, signal, sys
from hpcdl.parallel.launch import Terminated, stop_signals_raise, supervise
with stop_signals_raise():
    try:  # as logging's after-fork hook does when SIGTERM lands in fork: the exception is lost
        os.kill(os.getpid(), signal.SIGTERM)
    except Terminated:
        pass
    try:
        supervise([sys.executable, "-c", "open(sys.argv[1], 'w')", sys.argv[1]], "run", 30)
    except Terminated as e:
        sys.exit(e.code)
sys.exit(0)
"""


def test_a_stop_signal_whose_exception_was_swallowed_still_stops_the_next_launch(tmp_path: Path) -> None:
    """A SIGTERM that lands in ``fork`` raises inside a callback that ignores exceptions; the
    signal is remembered, and the next launch is not started (it once ran a whole sweep point)."""
    marker = tmp_path / "launched"
    cmd = [sys.executable, "-c", SWALLOWED, str(marker)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    assert not marker.exists()


# --- the daemons of the project's scripts keep no descriptor they inherit ----------------------

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
INHERITS = """
set -euo pipefail
. {lib}
exec 7</etc/hostname 9>>{lock}
listed() {{ ls /proc/self/fd; }}
inherit_nothing ls /proc/self/fd
inherit_nothing listed
"""


def test_a_daemon_started_by_the_cluster_scripts_inherits_no_descriptor(tmp_path: Path) -> None:
    """A script holding a lock (descriptor 9) and a file (7) starts a command and a shell
    function through inherit_nothing: they see stdin, stdout, stderr and ls's own directory only."""
    script = INHERITS.format(lib=SCRIPTS / "slurm" / "inherit-nothing.sh", lock=tmp_path / "lock")
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "1", "2", "3"] * 2, p.stdout


def test_every_daemon_of_the_slurm_cluster_starts_through_inherit_nothing() -> None:
    """Each statement of start-cluster.sh that starts a daemon (its output to /dev/null, the
    daemons' idiom there) begins with inherit_nothing."""
    text = (SCRIPTS / "slurm" / "start-cluster.sh").read_text().replace("\\\n", " ")
    starts = [
        line.strip()
        for line in text.splitlines()
        if "</dev/null >/dev/null 2>&1" in line and not line.strip().startswith("#")
    ]
    daemons = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd -N")
    assert sorted({d for d in daemons for s in starts if d in s}) == sorted(daemons), starts
    assert [s for s in starts if not s.startswith("inherit_nothing ")] == []
