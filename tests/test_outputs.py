"""Outputs, sizes and names checked before any work (issue 16, items 4 and 6): ``--mllog`` a
regular file hpcdl can append to, ``hpcdl sweep --prefix`` a plain name, ``--repeat`` within
1..1000, no empty class, preset or workload name; and a log whose writes fail mid-command (a
full disk) loses neither a record nor the runs still to come."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl, one_line

from hpcdl.errors import InputError
from hpcdl.records import mllog

TINY = ["--workload", "mlp", "layers=1", "width=16", "input_size=8", "output_size=2", "batch_size=4"]


@pytest.mark.parametrize("target", ["fifo", "/dev/full", "/dev/null", "directory", "missing/log"])
def test_a_log_that_is_not_a_regular_file_is_refused_without_waiting(tmp_path: Path, target: str) -> None:
    path = Path(target) if target.startswith("/") else tmp_path / target
    if target == "fifo":
        os.mkfifo(path)  # opened for appending without a reader: would block forever
    elif target == "directory":
        path.mkdir()
    with pytest.raises(InputError, match="mllog=.*a regular file hpcdl can append to"):
        mllog.check(path)


@pytest.mark.parametrize("prefix", ["../x", "a/b", "", ".hidden", "x/../../y"])
def test_sweep_prefix_is_a_plain_name(tmp_path: Path, prefix: str) -> None:
    out = tmp_path / "out"
    p = hpcdl("sweep", *TINY, "--np", "1", "--steps", "2", "--prefix", prefix, "-o", str(out))
    assert "prefix=" in one_line(p)
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["run", "--repeat", "1000000000"], "repeat="),
        (["run", *TINY, "--repeat", "0"], "repeat="),
        (["run", "--class", ""], "class="),
        (["run", "--preset", " "], "preset="),
        (["sweep", "--np", "1", "--class", ""], "class="),
        (["capacity", "--instances", "2", "--preset", ""], "preset="),
    ],
)
def test_sizes_and_names_are_checked_before_anything_is_built(
    tmp_path: Path, argv: list[str], field: str
) -> None:
    out = tmp_path / "out"
    assert field in one_line(hpcdl(*argv, "--steps", "1", "-o", str(out)))
    assert not out.exists()


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 kB tmpfs filled to the last byte: a log there opens, but every write fails (ENOSPC)."""
    where = tmp_path / "full"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], check=False)
    if mounted.returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT)
        with pytest.raises(OSError, match="No space left"):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_log_write_that_fails_keeps_every_record_and_run(tmp_path: Path, full_disk: Path) -> None:
    out, log = tmp_path / "o", full_disk / "log.txt"
    args = ["run", *TINY, "--warmup", "1", "--steps", "2", "--min-duration", "0", "--peak-flops", "1e12"]
    args += ["--repeat", "2", "--name", "m"]
    p = hpcdl(*args, "--mllog", str(log), "-o", str(out), env={**os.environ, "OMP_NUM_THREADS": "1"})
    err = p.stderr
    assert p.returncode == 1, err
    assert sorted(p.name for p in out.glob("m-r*.json")) == ["m-r1.json", "m-r2.json"]
    assert err.count("were not written (No space left on device); its record was") == 2, err
    assert "Traceback" not in err
