"""Faults a run must survive without writing a wrong record, leaving half a pair or printing a
traceback: outputs that cannot be written (under a file, read-only, a disk that fills up while
measuring), names that are paths, two runs racing for one name. Real file systems: root mounts
small tmpfs here."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def hpcdl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hpcdl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def one_line(p: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert p.returncode == code, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("hpcdl: error")]
    assert len(errors) == 1 and "Traceback" not in p.stderr, p.stderr
    return errors[0]


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
        line = one_line(hpcdl("run", *TINY, "--duration", "30", "-o", str(out)))
        assert why in line and "output=" in line, line
        assert time.monotonic() - t0 < 30  # refused up front, not after a 30 s measurement


@pytest.mark.parametrize("name", ["../evil", "/tmp/evil", "a/b", ".hidden", "x" * 200])
def test_names_are_file_names(tmp_path: Path, name: str) -> None:
    line = one_line(hpcdl("run", *TINY, "--steps", "2", "--name", name, "-o", str(tmp_path / "out")))
    assert f"name={name!r} is invalid" in line
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
    time.sleep(4)
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
    results: list[subprocess.CompletedProcess[str]] = []
    args = ("run", *TINY, "--steps", "30", "--min-duration", "0", "--name", "same", "-o", str(out))
    threads = [threading.Thread(target=lambda: results.append(hpcdl(*args))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-500:] for r in results]
    record = out / "same.json"
    assert verifies(record)
    steps = list(out.glob("*.steps.h5"))
    assert [p.name for p in steps] == [json.loads(record.read_text())["steps_file"]]
