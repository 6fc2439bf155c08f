"""The hpcdl command: bad input, a run, the counts, and what a terminal and a log show."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl  # beside this file, on pytest's path


@pytest.mark.parametrize(
    "args, field",
    [
        (["run", "--workload", "mlp", "layers=0"], "mlp.layers=0"),
        (["run", "--workload", "mlp", "accumulation_steps=0"], "mlp.accumulation_steps=0"),
        (["run", "--workload", "mlp", "width=abc"], "mlp.width='abc'"),
        (["run", "--workload", "mlp", "colour=red"], "mlp.colour"),
        (["run", "--workload", "attention", "width=100", "heads=3"], "attention.heads=3"),
        (["run", "--workload", "attention", "seq_len=0"], "attention.seq_len=0"),
        (["run", "--workload", "cnn", "kernel_size=4"], "cnn.kernel_size=4"),
        (["run", "--workload", "rnn", "cell=transformer"], "rnn.cell='transformer'"),
        (["run", "--workload", "mlp", "--steps", "-1"], "run.steps=-1"),
        (["run", "--workload", "mlp", "--data", "tape"], "run.data='tape'"),
        (["run", "--workload", "mlp", "--data", "hdf5"], "run.data_dir"),
        (["run", "--workload", "mlp", "--device", "cuda"], "run.device='cuda'"),
        (["run", "--workload", "mlp", "width=131072", "layers=1000", "batch_size=1"], "mlp.batch_size=1"),
        (["run", "--preset", "alexnet"], "preset='alexnet'"),
        (["run", "width=3"], "knob='width=3'"),
        (["run", "--workload", "nope"], "invalid choice: 'nope'"),
        (["generate", "mlp", "layers=-2"], "mlp.layers=-2"),
        (["generate", "deepspeech3"], "family='deepspeech3'"),  # names families, presets, workloads
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], field: str, tmp_path: Path) -> None:
    p = hpcdl(*args, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert field in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "results").exists()  # nothing ran


def test_run_one_workload_prints_table_and_writes_record(tmp_path: Path) -> None:
    p = hpcdl(
        "run",
        "--workload",
        "mlp",
        "layers=2",
        "width=64",
        "input_size=32",
        "output_size=10",
        "--steps",
        "15",
        "--min-duration",
        "0",
        "-o",
        str(tmp_path),
    )
    assert p.returncode == 0, p.stderr
    assert "samples/s" in p.stdout and "mlp" in p.stdout
    assert "[1/1] mlp" in p.stderr  # progress
    (record,) = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
    assert record["spec"]["width"] == 64 and record["metrics"]["timed_steps"] == 15
    assert record["validity"]["passed"]


def test_generate_prints_counts_without_running() -> None:
    p = hpcdl("generate", "mlp", "layers=2", "width=64", "input_size=32", "output_size=10", "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["params"] == 32 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10
    assert info["train_flops_per_sample"] > info["forward_flops_per_sample"] > 0


def test_info_and_list() -> None:
    p = hpcdl("info")
    assert p.returncode == 0 and "torch" in p.stdout and "horovod" in p.stdout
    p = hpcdl("list")
    assert p.returncode == 0 and "attention" in p.stdout and "gpt2_small" in p.stdout
    # each family's description whole (issue 45: its first line only, cut mid-sentence)
    from hpcdl.workloads.registry import FAMILIES

    words = " ".join(p.stdout.split())
    for family, cls in FAMILIES.items():
        first = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        assert f"{family}: {first}" in words, family
    assert all(len(line) <= 100 for line in p.stdout.split("\n\n")[0].splitlines())  # knob docs wrapped


def test_presets_and_sampling_take_knob_overrides_anywhere() -> None:
    p = hpcdl("generate", "attention", "--sample", "3", "layers=2", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["spec"]["layers"] == 2
    p = hpcdl("generate", "resnet50", "--json", "batch_size=2")
    info = json.loads(p.stdout)
    assert info["params"] == 25_557_032 and info["spec"]["batch_size"] == 2
    p = hpcdl("generate", "gpt2_small", "colour=red")
    assert p.returncode == 2 and "attention.colour" in p.stderr
    p = hpcdl("generate", "deepspeech2", "--json", "batch_size=3")  # a workload of class M's table
    info = json.loads(p.stdout)
    assert info["spec"]["family"] == "speech" and info["spec"]["batch_size"] == 3


def test_io_command_measures_real_files(tmp_path: Path) -> None:
    p = hpcdl(
        "io",
        "--dir",
        str(tmp_path),
        "--batches",
        "4",
        "--shards",
        "2",
        "--workers",
        "1",
        "mlp",
        "input_size=16",
        "batch_size=4",
    )
    assert p.returncode == 0, p.stderr
    assert "write" in p.stdout and "read" in p.stdout
    assert len(list(tmp_path.glob("shard-*.h5"))) == 2


def test_a_terminal_gets_a_live_line_and_a_log_gets_plain_lines(tmp_path: Path) -> None:
    """On a terminal (a real pseudo-terminal here) tqdm redraws one line per workload with the
    steps, samples/s and time left; through a pipe (logs, Slurm) the lines are plain."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    args = [sys.executable, "-m", "hpcdl", "run", "--workload", "mlp", "layers=2", "width=64",
            "--duration", "2.5", "-o", str(tmp_path)]  # fmt: skip
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 24 x 120
    proc = subprocess.Popen(args, stdin=terminal, stdout=terminal, stderr=terminal, close_fds=True)
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=120) == 0, seen.decode(errors="replace")[-2000:]
    text = seen.decode(errors="replace")
    assert "\r" in text and "%|" in text and "samples/s" in text and "<" in text, text[-2000:]
    piped = hpcdl(*args[3:])  # a pipe: no terminal
    assert piped.returncode == 0 and "%|" not in piped.stderr
    assert "timed" in piped.stderr and "samples/s" in piped.stderr, piped.stderr
