"""Faults a run must survive without writing a wrong record, leaving half a pair or printing a
traceback: outputs that cannot be written (under a file, read-only, a disk that fills up while
measuring), names that are paths, two runs racing for one name. Real file systems: root mounts
small tmpfs here."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hpcdl_cli import Ran, hpcdl, hpcdl_process, one_line

from hpcdl.records.audit import audit
from hpcdl.records.loader import read_record

TINY = [
    "--workload",
    "mlp",
    "layers=1",
    "width=16",
    "input_size=8",
    "output_size=2",
    "batch_size=4",
    "--data",
    "random",
]


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[callable]:  # type: ignore[valid-type]
    mounted: list[Path] = []

    def make(name: str, options: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def verifies(path: Path) -> bool:
    return not audit(read_record(path)).problems


def test_outputs_that_cannot_be_written_are_refused_before_measuring(tmp_path: Path, mount) -> None:  # type: ignore[no-untyped-def]
    afile = tmp_path / "afile"
    afile.write_text("x")
    readonly = mount("ro", "size=4m,ro")
    full = mount("full", "size=1m")
    cases = {
        afile / "sub": "Not a directory",
        readonly / "out": "Read-only file system",
        full: "MiB free; a record needs up to",
    }
    for out, why in cases.items():
        t0 = time.monotonic()
        line = one_line(hpcdl("run", *TINY, "--duration", "30", "-o", str(out)), alone=False)
        assert why in line and "output=" in line, line
        assert time.monotonic() - t0 < 30  # refused up front, not after a 30 s measurement


@pytest.mark.parametrize("name", ["../evil", "/tmp/evil", "a/b", ".hidden", "x" * 200])
def test_names_are_file_names(tmp_path: Path, name: str) -> None:
    line = one_line(
        hpcdl("run", *TINY, "--steps", "2", "--name", name, "-o", str(tmp_path / "out")), alone=False
    )
    assert f"name={name!r}"[:60] in line and " is invalid: a file name" in line  # a long one is cut
    assert not (tmp_path / "evil").exists() and not Path("/tmp/evil.json").exists()


def test_a_disk_that_fills_up_leaves_no_half_pair_and_the_older_record_intact(mount) -> None:  # type: ignore[no-untyped-def]
    disk = mount("disk", "size=20m")
    first = hpcdl("run", *TINY, "--steps", "5", "--min-duration", "0", "--name", "r", "-o", str(disk))
    assert first.returncode == 0, first.stderr[-2000:]
    old = json.loads((disk / "r.json").read_text())
    # fill the disk while the second run of the same name measures, after its up-front check
    run = subprocess.Popen(
        [sys.executable, "-m", "hpcdl", "run", *TINY, "--duration", "6", "--name", "r", "-o", str(disk)],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stderr is not None
    for line in run.stderr:  # timing: past the up-front check (a fixed sleep was not, under load)
        if "timed" in line and "steps in" in line:
            break
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
        except OSError:
            pass
    err = run.communicate(timeout=120)[1]
    assert run.returncode == 2, err[-2000:]
    assert "could not be written" in err and "No space left on device" in err and "Traceback" not in err, err
    assert json.loads((disk / "r.json").read_text())["id"] == old["id"] and verifies(disk / "r.json")
    assert sorted(p.name for p in disk.iterdir() if p.name.endswith(".tmp")) == []
    assert [p.name for p in disk.glob("*.steps.h5")] == [old["steps_file"]]


def test_two_runs_of_one_name_leave_one_whole_pair(tmp_path: Path) -> None:
    out = tmp_path / "out"
    results: list[Ran] = []
    args = ("run", *TINY, "--steps", "30", "--min-duration", "0", "--name", "same", "-o", str(out))
    # two processes racing (in this one, the second call would wait for the first), a thread
    # each: two cores, one for each, and neither waits for a CPU the other holds (quiet_machine)
    one = {**os.environ, "OMP_NUM_THREADS": "1"}
    race = [threading.Thread(target=lambda: results.append(hpcdl_process(*args, env=one))) for _ in range(2)]
    for t in race:
        t.start()
    for t in race:
        t.join()
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-500:] for r in results]
    record = out / "same.json"
    assert verifies(record)
    steps = list(out.glob("*.steps.h5"))
    assert [p.name for p in steps] == [json.loads(record.read_text())["steps_file"]]


# --- signals, stalls and impossible launches: real ranks, real signals ----------------------

from test_distributed import MLP, _processes_mentioning, start_timing  # noqa: E402


def rank_pid(rank: int, marker: Path) -> int:
    """The process of rank ``rank`` of the run writing to ``marker`` (other runs may be going)."""
    (pid,) = [
        p
        for p in _processes_mentioning(str(marker))
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
    ]
    return pid


def gone(marker: str, within_s: float = 20) -> bool:
    deadline = time.monotonic() + within_s
    while _processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _processes_mentioning(marker) == []


@pytest.mark.mpi
@pytest.mark.slow(
    reason="waits out a 15 s timeout; the fast tier's endings table holds this ending with torch ranks"
)
def test_a_stopped_rank_past_the_timeout_writes_no_record(tmp_path: Path) -> None:
    """SIGSTOP on a rank, then --timeout: mpirun gives the stopped rank a SIGCONT and a second
    before it kills it, in which rank 0 could finish and write. The launcher marked the run
    stopped first: no record, exit 124."""
    args = ["run", *MLP, "--np", "2", "--backend", "horovod", "--duration", "60", "--timeout", "15"]
    proc = start_timing(*args, "--stall", "0", "-o", str(tmp_path))
    os.kill(rank_pid(1, tmp_path), signal.SIGSTOP)
    rest = proc.communicate(timeout=90)[0]
    assert proc.returncode == 124, rest[-2000:]
    assert gone(str(tmp_path)) and not list(tmp_path.glob("*.json"))


@pytest.mark.mpi
@pytest.mark.slow(
    reason="waits for the stall bound to name a stopped rank, then for mpirun to end: about 15 s"
)
def test_a_stalled_rank_is_named_and_the_run_ends(tmp_path: Path) -> None:
    """No --timeout: the stall bound (--stall 3: no step for 3 s, tiny steps) ends the run
    and names the stopped rank and its host."""
    proc = start_timing("run", *MLP, "--np", "2", "--duration", "120", "--stall", "3", "-o", str(tmp_path))
    victim = rank_pid(1, tmp_path)
    t0 = time.monotonic()
    os.kill(victim, signal.SIGSTOP)
    rest = proc.communicate(timeout=90)[0]
    assert time.monotonic() - t0 < 45
    assert proc.returncode not in (0, 124), rest[-2000:]
    assert re.search(r"rank 1 on \S+ \(pid \d+\) is stopped or frozen", rest), rest[-2000:]
    assert gone(str(tmp_path)) and not list(tmp_path.glob("*.json"))


@pytest.mark.mpi
def test_the_launcher_s_hangup_ends_every_rank(tmp_path: Path) -> None:
    """A closed terminal (SIGHUP, not ignored: no nohup) is handled like SIGTERM: mpirun and
    every rank end, no record. kill -9 and nohup: tests/test_kills.py, for every command."""
    proc = start_timing("run", *MLP, "--np", "2", "--duration", "120", "-o", str(tmp_path))
    assert len(_processes_mentioning(str(tmp_path))) >= 3  # launcher, mpirun, ranks
    proc.send_signal(signal.SIGHUP)
    proc.communicate(timeout=60)
    assert proc.returncode == 129
    assert gone(str(tmp_path)) and not list(tmp_path.glob("*.json"))


@pytest.mark.mpi
@pytest.mark.slow(reason="a 1-rank and a 2-rank point of a sweep, the second signalled: about 13 s")
def test_sigterm_during_a_sweep_keeps_finished_points_and_exits_143(tmp_path: Path) -> None:
    args = ["sweep", *MLP, "--np", "1,2", "--steps", "5", "--min-duration", "0", "--data", "random"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdl", *args, "--prefix", "s", "-o", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # the 1-rank point is written; the 2-rank point starts
        if "np=2: running" in line:
            break
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 143, rest[-2000:]
    assert (tmp_path / "s-weak-np1.json").exists() and not (tmp_path / "s-weak-np2.json").exists()
    assert gone(str(tmp_path))


def test_more_ranks_than_the_machine_can_hold_are_refused(tmp_path: Path) -> None:
    t0 = time.monotonic()
    line = one_line(hpcdl("run", *TINY, "--np", "10000", "-o", str(tmp_path)), alone=False)
    assert "np=10000 is invalid: at most about" in line and time.monotonic() - t0 < 30
    assert not any(tmp_path.iterdir()) if tmp_path.exists() else True


# --- the HDF5 data path, job files and outputs of other commands --------------------------------

H5_KNOBS = ["--workload", "mlp", "layers=1", "width=8", "input_size=4", "output_size=2", "batch_size=4"]


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    p = hpcdl("io", "--dir", str(tmp_path / "shards"), "--batches", "4", "--shards", "2", "mlp",
              "layers=1", "width=8", "input_size=4", "output_size=2", "batch_size=4")  # fmt: skip
    assert p.returncode == 0, p.stderr
    return tmp_path / "shards"


def test_damaged_foreign_or_misplaced_shards_are_one_line(shards: Path, tmp_path: Path) -> None:
    run = ["run", *H5_KNOBS, "--data", "hdf5", "--steps", "3", "-o", str(tmp_path / "out")]
    other = [
        "run",
        "--workload",
        "mlp",
        "layers=2",
        "--data",
        "hdf5",
        "--steps",
        "3",
        "-o",
        str(tmp_path / "o"),
    ]
    foreign = one_line(hpcdl(*other, "--data-dir", str(shards)), alone=False)
    assert "holds shards of another workload" in foreign
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert "not a file" in one_line(hpcdl(*run, "--data-dir", str(afile)), alone=False)
    subprocess.run(["truncate", "-s", "500", str(shards / "shard-00001.h5")], check=True)
    damaged = one_line(hpcdl(*run, "--data-dir", str(shards)), alone=False)
    assert "shard shard-00001.h5 is damaged" in damaged and "truncated" in damaged
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.json"))


def test_shards_damaged_after_the_check_fail_the_run_not_the_process(shards: Path) -> None:
    """Found while reading (through the real DataLoader and its worker): RunFailed, which the
    command line turns into one line, exit code 1, every rank ended and nothing recorded."""
    from hpcdl.errors import RunFailed
    from hpcdl.measure.hdf5 import HDF5Source

    source = HDF5Source(shards, torch_device("cpu"), workers=1)
    for shard in shards.glob("shard-*.h5"):
        subprocess.run(["truncate", "-s", "100", str(shard)], check=True)
    with pytest.raises(RunFailed, match="failed mid-run") as failed:
        source.next()
    assert failed.value.exit_code == 1


def torch_device(name: str):  # type: ignore[no-untyped-def]
    import torch

    return torch.device(name)


def test_job_files_that_are_not_text_or_too_deep_are_one_line(tmp_path: Path) -> None:
    binary, deep, fifo = tmp_path / "b.toml", tmp_path / "d.toml", tmp_path / "f.toml"
    binary.write_bytes(b"\xff\xfe not text")
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    os.mkfifo(fifo)
    assert "not UTF-8 text" in one_line(hpcdl("submit", str(binary), "--dry-run"))
    assert "nested deeper than 64" in one_line(hpcdl("submit", str(deep), "--dry-run"))
    assert "a FIFO, not a regular file" in one_line(hpcdl("submit", str(fifo), "--dry-run", timeout=30))


def test_outputs_of_predict_and_comm_that_cannot_be_written_are_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    p = hpcdl("predict", "--workload", "mlp", "--gamma", "1e12", "--beta", "1e9", "-o", str(afile / "p.json"))
    assert "output=" in one_line(p) and "a file hpcdl can write" in p.stderr
