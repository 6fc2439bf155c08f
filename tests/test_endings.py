"""What a run leaves in its output folder, for every way it ends (issue 50, item 3): the record
and steps file it promises, or nothing. Heartbeats, locks and temporary files live where every
ending removes them (the launcher's scratch folder, ``launch.SCRATCH_ENV``).

A row of ``ENDINGS`` is one ending of a real 2-rank run (``hpcdl run --np 2``): its arguments,
what is done to it once its ranks time their steps, the exit code, and whether a record is
promised. Each test lists the output folder, hidden files included, after every process of the
run has ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_faults import mount  # noqa: F401  (a fixture)
from test_kills import TINY, Launched
from test_schedulers import processes_with

from hpcdl.parallel.launch import SCRATCH_ENV


def rank_pid(run: Launched, rank: int) -> int:
    """The pid of rank ``rank`` of the run."""
    for line in processes_with(run.mark):
        pid = int(line.split(":")[0])
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"no rank {rank} among {processes_with(run.mark)}")


def scratch_of(run: Launched) -> Path:
    """The launcher's scratch folder, as its ranks were told."""
    environ = Path(f"/proc/{rank_pid(run, 0)}/environ").read_bytes().split(b"\0")
    (value,) = [e for e in environ if e.startswith(f"{SCRATCH_ENV}=".encode())]
    return Path(value.split(b"=", 1)[1].decode())


def fill(folder: Path) -> None:
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
        except OSError:
            pass


def stop_rank_1(run: Launched) -> None:
    os.kill(rank_pid(run, 1), signal.SIGSTOP)


def kill_rank_1(run: Launched) -> None:
    os.kill(rank_pid(run, 1), signal.SIGKILL)


def kill_launcher(run: Launched) -> None:
    """SIGKILL removes nothing: the next launcher on this host removes the scratch folder."""
    scratch = scratch_of(run)
    assert scratch.is_dir() and any(scratch.glob("hpcdl-heartbeats-*/rank-*.json"))
    run.proc.kill()
    run.ended()
    assert scratch.is_dir()
    subprocess.run([sys.executable, "-c", LAUNCH_ONCE], check=True, timeout=60)
    assert not scratch.exists()


def stop_mpirun_then_kill_launcher(run: Launched) -> None:
    """mpirun stopped (it can neither end its ranks nor close their connections), then the
    launcher killed: each rank sees its launcher gone and ends itself within seconds
    (``launch.end_with_launchers``); the stopped mpirun is killed afterwards."""
    (mpirun,) = [
        int(p.split(":")[0]) for p in processes_with(run.mark) if "mpirun" in p.split(":", 1)[1][:80]
    ]
    os.kill(mpirun, signal.SIGSTOP)
    run.proc.kill()
    run.proc.wait()
    end = time.monotonic() + RANKS_END_S
    while [p for p in processes_with(run.mark) if int(p.split(":")[0]) != mpirun] and time.monotonic() < end:
        time.sleep(0.2)
    left = [p for p in processes_with(run.mark) if int(p.split(":")[0]) != mpirun]
    os.kill(mpirun, signal.SIGKILL)
    assert left == [], left


RANKS_END_S = 10.0


LAUNCH_ONCE = "import sys; from hpcdl.parallel.launch import supervise; supervise(['true'], 'x', 30)"


@dataclass(frozen=True)
class Ending:
    args: list[str]
    act: Callable[[Launched], None] | None
    """done once the ranks time their steps (None: the run is left to end)"""
    code: int | None
    """the launcher's exit code (None: any but 0)"""
    promised: bool
    """a record and its steps file are left (else nothing)"""


LONG = ["--duration", "60", "--min-duration", "0"]
ENDINGS = {
    "success": Ending(["--steps", "30", "--min-duration", "0"], None, 0, True),
    "invalid (a check fails)": Ending(["--steps", "3", "--min-duration", "1000"], None, 1, True),
    "timeout, a rank stopped": Ending([*LONG, "--timeout", "20", "--stall", "0"], stop_rank_1, 124, False),
    "SIGTERM to the launcher": Ending(LONG, lambda run: run.proc.terminate(), 143, False),
    "SIGKILL to the launcher": Ending(LONG, kill_launcher, -signal.SIGKILL, False),
    "a rank killed": Ending(LONG, kill_rank_1, None, False),
    "mpirun stopped, the launcher killed": Ending(
        LONG, stop_mpirun_then_kill_launcher, -signal.SIGKILL, False
    ),
    "the disk fills up": Ending(
        ["--duration", "8", "--min-duration", "0"], lambda run: fill(run.out), 2, False
    ),
}


SLOW_ENDINGS = {
    "the disk fills up": pytest.mark.slow(
        reason="an 8 s window on a 24 MB mount filled up; test_faults' full disk stays in the fast tier"
    )
}


@pytest.mark.mpi
@pytest.mark.parametrize("ending", [pytest.param(e, marks=SLOW_ENDINGS.get(e, ())) for e in ENDINGS])
def test_a_run_leaves_its_record_or_nothing(tmp_path: Path, ending: str, mount) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    row = ENDINGS[ending]
    out = mount("out", "size=24m") if ending == "the disk fills up" else tmp_path / "out"
    out.mkdir(exist_ok=True)
    argv = ["run", "--workload", *TINY, "--data", "random", *row.args, "--np", "2", "--name", "r"]
    run = Launched([*argv, "--backend", "torch", "-o", str(out)], out)
    try:
        if row.act is not None:
            run.timing()
            row.act(run)
        code = run.ended()
        left = sorted(p.name for p in out.iterdir() if p.name != "filler")
        promised = ["r.json", next((n for n in left if n.endswith(".steps.h5")), "r.*.steps.h5")]
        assert left == (sorted(promised) if row.promised else []), (left, run.output[-3000:])
        assert code == row.code if row.code is not None else code != 0, (code, run.output[-3000:])
        said = [line for line in run.lines if line.startswith("hpcdl: ") and "error" in line]
        assert len(said) <= 1 and "Traceback" not in run.output, run.output[-3000:]
        assert "MPI_ABORT" not in run.output and "help message" not in run.output, run.output[-3000:]
    finally:
        run.stop()


REGISTERS = """
import os, sys
from pathlib import Path
from hpcdl.parallel.launch import keep_until_launcher_ends
folder = Path(sys.argv[1]) / ".hpcdl-heartbeats" / "0123"
folder.mkdir(parents=True)
(folder / "rank-0.json").write_text("{}")
keep_until_launcher_ends(folder)
os._exit(9)  # as a rank killed: nothing of its own is cleaned
"""


def test_heartbeats_under_the_output_folder_are_removed_by_the_launcher(tmp_path: Path) -> None:
    """Ranks on nodes that share no scratch folder meet under the output folder; the launcher
    removes their folder however the run ended."""
    from hpcdl.parallel.launch import supervise

    out = tmp_path / "out"
    out.mkdir()
    code = supervise([sys.executable, "-c", REGISTERS, str(out)], "run", 60)
    assert code == 9 and list(out.iterdir()) == []


# --- a command told to stop removes its temporary folders --------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_check_told_to_stop_removes_what_it_extracted(tmp_path: Path, sig: int) -> None:
    """SIGTERM to ``hpcdl check`` while it extracts an archive: exit 143 and nothing left in the
    temporary folder (SIGTERM unwinds every command). SIGKILL removes nothing: the next check
    removes the folder of the one killed (``launch.private_folder``)."""
    from test_archive import bomb

    archive = tmp_path / "sys.tar.gz"
    bomb(archive, 200, 1)  # 200 MiB of zeros: under every limit, and a while to extract
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    check = [sys.executable, "-m", "hpcdl", "check", str(archive)]
    proc = subprocess.Popen(check, env=env, stderr=subprocess.PIPE)
    end = time.monotonic() + 120
    while not any(scratch.glob("hpcdl-check-*/sys/results/*")) and time.monotonic() < end:
        assert proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == (128 + sig if sig == signal.SIGTERM else -sig)
    if sig == signal.SIGKILL:
        assert list(scratch.iterdir()) != []  # nothing ran on its way out
        (tmp_path / "other.tar.gz").write_bytes(b"not an archive")
        again = subprocess.run([*check[:-1], str(tmp_path / "other.tar.gz")], env=env, capture_output=True)
        assert again.returncode == 1, again.stderr
    assert list(scratch.iterdir()) == []
