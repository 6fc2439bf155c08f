"""The options of caps, time to target, repeats and capacity, fed non-finite, extreme and
malformed values (hypothesis, as test_inputs.py does for the others): each is accepted as a
setting in range or refused in one line with exit code 2, and nothing runs or is written."""

from __future__ import annotations

import math
from pathlib import Path

from hpcdl_cli import hpcdl, one_line
from hypothesis import given
from hypothesis import strategies as st
from test_inputs import FAST, NUMBERS, TOO_BIG

# after every option is checked, preflight refuses TOO_BIG for memory: nothing ever runs
ACCEPTED = "batch_size=1000000"


def _number(value: str) -> float:
    try:
        return float(value.replace("_", ""))
    except ValueError:
        return math.nan


@FAST
@given(option=st.sampled_from(["power-limit", "clock-limit"]), value=NUMBERS)
def test_cap_options(option: str, value: str, tmp_path: Path) -> None:
    out = tmp_path / "never"
    line = one_line(
        hpcdl("sweep", *TOO_BIG, "--np", "1", "--steps", "5", f"--{option}={value}", "-o", str(out))
    )
    if ACCEPTED in line:
        caps = [_number(v) for v in value.split(",") if v.strip()]
        assert caps and all(math.isfinite(c) and c > 0 for c in caps), (option, value)
    else:
        assert f"{option}=" in line, line
    assert not out.exists()


@FAST
@given(value=NUMBERS, command=st.sampled_from(["run", "sweep"]))
def test_target_loss_fraction(value: str, command: str, tmp_path: Path) -> None:
    out = tmp_path / "never"
    ranks = ["--np", "1"] if command == "sweep" else []
    line = one_line(hpcdl(command, *TOO_BIG, *ranks, f"--target-loss-fraction={value}", "-o", str(out)))
    if ACCEPTED in line:
        assert 0 < _number(value) < 1, value
    assert not out.exists()


@FAST
@given(
    option=st.sampled_from(["repeat", "instances", "ranks-per-instance", "per-device"]),
    value=NUMBERS,
)
def test_repeat_and_capacity_options(option: str, value: str, tmp_path: Path) -> None:
    out = tmp_path / "never"
    if option == "repeat":
        argv = ["run", *TOO_BIG, f"--repeat={value}"]
    else:
        layout = {"instances": "2", "ranks-per-instance": "1", "per-device": "1", option: value}
        argv = ["capacity", *TOO_BIG, *(f"--{k}={v}" for k, v in layout.items())]
    line = one_line(hpcdl(*argv, "-o", str(out)))
    if ACCEPTED in line:
        n = int(value)
        assert n >= 1 and (option != "per-device" or 2 % n == 0), (option, value)
    assert not out.exists()
