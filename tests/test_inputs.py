"""Every numeric option of the command line, fed non-finite, extreme and malformed values
(hypothesis): each is accepted as a finite setting in range or refused in one line with exit
code 2, never a traceback, and nothing runs or is written on the way."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl, one_line
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcdl.cli import build_parser
from hpcdl.cli.workloads import check_io
from hpcdl.errors import HpcdlError
from hpcdl.workloads.registry import spec_from_args

NUMBERS = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "1e999", "-1", "0", "-0", "1e308", "-1e308", "1e-320"]),
    st.sampled_from(["9" * 40, "", " ", "0x10", "1_000", "1,5", "2**8", "true"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)
RUN_OPTIONS = [
    "warmup",
    "steps",
    "duration",
    "min-duration",
    "workers",
    "lr",
    "peak-flops",
    "fit",
    "stall",
    "timeout",
    "np",
    "profile",
]
# a workload preflight refuses for memory after every option is checked: nothing ever runs
TOO_BIG = ["--workload", "mlp", "layers=100", "width=100000", "batch_size=1000000"]
FAST = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@FAST
@given(option=st.sampled_from(RUN_OPTIONS), value=NUMBERS, command=st.sampled_from(["run", "sweep"]))
def test_run_and_sweep_options(option: str, value: str, command: str, tmp_path: Path) -> None:
    out = tmp_path / "never"
    ranks = [] if option == "np" or command == "run" else ["--np=1,2"]
    line = one_line(hpcdl(command, *TOO_BIG, *ranks, f"--{option}={value}", "-o", str(out)))
    if "batch_size=1000000" in line:  # the option was accepted: it must hold a finite number
        parsed = build_parser().parse_args([command, *TOO_BIG, *ranks, f"--{option}={value}"])
        raw = getattr(parsed, option.replace("-", "_"))
        assert not isinstance(raw, float) or math.isfinite(raw)
        numbers = value.replace("_", "").split(",")  # sweep's --np takes a list of rank counts
        assert all(math.isfinite(float(n)) for n in numbers if n.strip()), (option, value)
    assert not out.exists()


@FAST
@given(knob=st.sampled_from(["batch_size", "width", "accumulation_steps"]), value=NUMBERS)
def test_knob_sweep_values(knob: str, value: str, tmp_path: Path) -> None:
    """Each value of ``--knob`` is a number in the knob's range or one line naming it; a sweep
    whose first value does not fit (TOO_BIG) runs nothing either."""
    out = tmp_path / "never"
    line = one_line(hpcdl("sweep", *TOO_BIG, "--knob", f"{knob}={value},1", "-o", str(out)))
    assert "knob=" in line or f"mlp.{knob}=" in line, line
    assert not out.exists()


@FAST
@given(
    field=st.sampled_from(
        [
            "gamma",
            "alpha",
            "beta",
            "nodes",
            "ranks-per-node",
            "samples",
            "epochs",
            "step-cv",
            "sync",
            "data-rate",
        ]
    ),
    value=NUMBERS,
)
def test_predict_options(field: str, value: str) -> None:
    base = {"gamma": "1e12", "alpha": "1e-6", "beta": "1e9", "nodes": "1,2", "ranks-per-node": "1"}
    base |= {"samples": "1e6", "epochs": "2", "step-cv": "0.01", "sync": "1", "data-rate": "1e4"}
    argv = ["predict", "--workload", "mlp", *(f"--{k}={value if k == field else v}" for k, v in base.items())]
    p = hpcdl(*argv)
    code, err = p.returncode, p.stderr
    assert code in (0, 2) and "Traceback" not in err, (argv, err)
    if code == 2:
        assert len([line for line in err.splitlines() if line.strip()]) == 1, err
    else:
        assert math.isfinite(float(value.replace("_", "").split(",")[0])), (field, value)


@FAST
@given(field=st.sampled_from(["reps", "sizes"]), value=NUMBERS)
def test_comm_options(field: str, value: str) -> None:
    """One rank can never run the benchmark, so every value ends in a refusal; bad ones are
    refused before any rank would start."""
    line = one_line(hpcdl("comm", "--np", "1", f"--{field}={value}"))
    assert f"{field}=" in line or "at least 2 ranks" in line or "invalid int value" in line, line


@FAST
@given(field=st.sampled_from(["batches", "shards", "workers", "epochs"]), value=st.integers(-(2**40), 2**40))
def test_io_options_are_checked_before_anything_is_written(field: str, value: int, tmp_path: Path) -> None:
    args = argparse.Namespace(dir=str(tmp_path / "shards"), batches=32, shards=4, workers=2, epochs=1)
    setattr(args, field, value)
    try:
        check_io(args, spec_from_args("mlp", []))
    except HpcdlError as e:
        assert "\n" not in str(e) and "is invalid" in str(e)
        return
    assert 0 <= args.workers <= 256 and 1 <= args.shards <= args.batches and args.epochs >= 1


@pytest.mark.parametrize("command", ["run", "sweep", "capacity"])
def test_steps_zero_on_the_command_line_is_refused(command: str, tmp_path: Path) -> None:
    """``--steps 0`` is the knob's timed window, which leaving ``--steps`` out already asks for:
    given, it is a mistake (a sweep once ran on it), refused before anything runs."""
    size = {"sweep": ["--np", "1"], "capacity": ["--instances", "2"]}.get(command, [])
    out = tmp_path / "out"
    p = hpcdl(command, "--workload", "mlp", *size, "--steps", "0", "-o", str(out))
    assert "steps='0' is invalid: give --steps N >= 1" in one_line(p)
    assert not out.exists()


# --- every numeric option of every command is fuzzed, in one of the tables here ---------------

OTHERS = {
    # command: the arguments that end in a one-line refusal once every option is checked (so
    # that nothing runs), and its numeric options that the tests above do not fuzz
    "run": (TOO_BIG, ["repeat", "target-loss-fraction"]),
    "sweep": ([*TOO_BIG, "--np=1,2"], ["target-loss-fraction"]),
    "capacity": (TOO_BIG, ["instances", "ranks-per-instance", "per-device", "target-loss-fraction"]),
    "generate": (["mlp", "layers=0"], ["sample"]),
    "comm": (["--reps", "0"], ["np", "timeout"]),  # its --np that fits runs: --np < 1 alone, here
    "predict": (
        ["--workload", "mlp", "--gamma", "1e12", "--alpha", "1e-6", "--beta", "x"],
        ["throughput", "data-rate", "step-cv", "sync"],
    ),
    "profile": (["no_such_package.models:make"], ["steps"]),
    "fit": (["/nonexistent/profile.json"], ["budget", "seed", "finalists", "tolerance", "rounds"]),
    "diagnose": (["--record", "/nonexistent/record.json"], ["np", "seconds", "threshold", "timeout"]),
}
"""a new numeric option is one word here (``test_every_numeric_option_is_fuzzed`` finds it)"""
FUZZED = {
    *{(c, o) for c in ("run", "sweep") for o in RUN_OPTIONS},
    *{("capacity", o) for o in RUN_OPTIONS if o != "np"},  # capacity has the run options but --np
    *{("predict", o) for o in ("gamma", "alpha", "beta", "nodes", "ranks-per-node")},
    *{("comm", o) for o in ("reps", "sizes")},
    *{("io", o) for o in ("batches", "shards", "workers", "epochs")},
    *{(c, o) for c, (_, options) in OTHERS.items() for o in options},
}


def numeric_options() -> set[tuple[str, str]]:
    """(command, option) of every option that takes a number: an int or float type, or a run
    setting whose knob is one."""
    import typing

    from hpcdl.cli.run_options import RUN_FLAGS
    from hpcdl.measure.config import RunConfig

    hints = typing.get_type_hints(RunConfig)
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = set()
    for command, p in sub.choices.items():
        for a in p._actions:
            knob = RUN_FLAGS.get(a.dest)
            if a.option_strings and (a.type in (int, float) or (knob and hints.get(knob) in (int, float))):
                found.add((command, a.option_strings[-1].removeprefix("--")))
    return found


def test_every_numeric_option_is_fuzzed() -> None:
    assert sorted(numeric_options() - FUZZED) == []


@FAST
@given(
    pair=st.sampled_from(sorted((c, o) for c, (_, options) in OTHERS.items() for o in options)), value=NUMBERS
)
def test_other_numeric_options(pair: tuple[str, str], value: str, tmp_path: Path) -> None:
    """Every value is a finite setting or one line; nothing runs (each command's arguments end
    in a refusal) and nothing is written."""
    command, option = pair
    base, _ = OTHERS[command]
    out = ["-o", str(tmp_path / "never")] if command in ("run", "sweep", "capacity") else []
    one_line(hpcdl(command, *base, f"--{option}={value}", *out, timeout=60))
    assert list(tmp_path.iterdir()) == []
