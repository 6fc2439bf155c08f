"""The command line answers at once: ``hpcdl --help`` and a command's ``--help`` import no torch
(it takes seconds and hundreds of MB); only the handlers that run a model do. And the list of
commands that ``hpcdl --help`` shows without importing their modules is theirs."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
# their defaults are constants of hpcdl/proxy/, whose modules import torch
NEEDS_TORCH_FOR_HELP = {"profile", "fit"}

PROBE = """
import sys
from hpcdl.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    assert e.code == 0, e.code
heavy = sorted(m for m in ("torch", "matplotlib", "h5py", "mpi4py") if m in sys.modules)
print("imported:", ",".join(heavy))
"""


def imported_by(*argv: str) -> list[str]:
    """The heavy modules ``hpcdl ARGV`` imported, in a fresh interpreter running this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 0, p.stderr
    line = p.stdout.strip().splitlines()[-1]
    return [m for m in line.removeprefix("imported:").strip().split(",") if m]


def test_help_and_rank_help_import_no_torch() -> None:
    assert imported_by("--help") == []
    assert imported_by("rank", "--help") == []


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - NEEDS_TORCH_FOR_HELP))
def test_every_commands_help_imports_no_torch(command: str) -> None:
    assert "torch" not in imported_by(command, "--help")


def test_python_m_hpcdl_help_answers_without_torch() -> None:
    """As a user types it: ``-X importtime`` lists every module imported, torch not among them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hpcdl", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0 and "rank" in p.stdout, p.stderr[-2000:]
    modules = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if "|" in line}
    assert "hpcdl.cli" in modules and "torch" not in modules


def test_the_command_list_is_the_modules_own() -> None:
    """``COMMANDS`` names every command each module adds, with the help line the module gives it."""
    parser = build_parser()  # every module: the full parser
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    shown = {a.dest: a.help for a in sub._choices_actions}
    assert shown == {name: line for name, (_, line) in COMMANDS.items()}
    for module in {m for m, _ in COMMANDS.values()}:
        alone = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"hpcdl.cli.{module}").add_parsers(alone)
        assert set(alone.choices) == {c for c, (m, _) in COMMANDS.items() if m == module}, module
