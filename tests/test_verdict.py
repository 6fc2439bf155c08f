"""A run ends with its result (issue 45): a class run prints its score as ``hpcdl rank`` computes
it, whether it is rankable, and one line per record that does not count with the reason that was
only inside the record's JSON; any run says why each invalid record is invalid; ``--help``
states the rules a user can trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hpcdl_cli import hpcdl, unwrapped

from hpcdl.device import device_name
from hpcdl.harness.duration import CHECK_STEPS, duration_text, floor
from hpcdl.measure.config import RunConfig
from hpcdl.measure.peaks import theoretical_peak
from hpcdl.records.audit import RANK_MIN_WINDOW_S
from hpcdl.records.validity import loss_falls
from hpcdl.workloads import recipes

S = list(recipes.suite("S").workloads)


def test_a_class_run_ends_with_its_score_and_why_each_record_does_not_count(tmp_path: Path) -> None:
    """Four steps of batch 2 are valid records but windows far below the list's 5 s: the class
    has no score, and each record says so; a window rule the run itself sets fails validity."""
    p = hpcdl("run", "--class", "S", "batch_size=2", "--steps", "4", "--warmup", "1", "--min-duration",
              "0", "-o", tmp_path)  # fmt: skip
    assert p.returncode == 0, p.stderr  # valid records: the run did what it was asked
    # said before it starts: how long the class takes here at least (counted FLOPs at the peak)
    (estimate,) = [x for x in p.stderr.splitlines() if x.startswith("class S here: at least ")]
    assert "(an estimate: the counted FLOPs of each workload's 1 warm-up steps and 4 timed steps" in estimate
    tail = unwrapped(p.stdout).splitlines()[-(2 + len(S)) :]
    assert tail[0].startswith("class S v1: no score: suite incomplete at every scale (missing ")
    assert tail[1] == (
        f"not rankable: incomplete, {len(S)} record(s) not counted, 0 run(s) of each workload "
        "(hpcdl rank's rules)"
    )
    for line, workload in zip(tail[2:], S, strict=True):
        assert line.startswith("not counted: ") and f"-{workload}.json: shortest timed window " in line
        assert line.endswith(f"s < {RANK_MIN_WINDOW_S:g} s")


def test_an_invalid_record_says_why_on_the_console(tmp_path: Path) -> None:
    p = hpcdl("run", "--workload", "mlp", "layers=1", "width=32", "--steps", "4", "--min-duration", "1000",
              "-o", tmp_path)  # fmt: skip
    assert p.returncode == 1
    (line,) = [x for x in unwrapped(p.stdout).splitlines() if x.startswith("invalid: ")]
    assert line.startswith("invalid: mlp: min_duration (timed ") and line.endswith("s, minimum 1000 s)")


def test_help_states_the_validity_rules_a_user_can_trip() -> None:
    text = " ".join(hpcdl("run", "--help").stdout.split())
    assert "at least 4 timed steps (loss_falls)" in text and "a valid record needs 4 or more" in text
    assert f"window lasts {RANK_MIN_WINDOW_S:g} s or more on every rank" in text
    assert not loss_falls([3.0, 2.0, 1.0]).passed and loss_falls([4.0, 3.0, 2.0, 1.0]).passed  # as said


def test_the_estimate_is_the_counted_flops_at_the_peak() -> None:
    spec = recipes.suite("S").specs()["mlp-wide"]
    device = torch.device("cpu")
    peak = theoretical_peak(device, device_name(device), spec.precision)
    if peak is None:
        pytest.skip("no CPU peak here")
    step = spec.count().train_flops * spec.batch_size / peak.flops
    one = floor(spec, RunConfig(steps=10, warmup_steps=2), device, 1)
    assert one is not None and one.step_s == pytest.approx(step) and one.seconds == pytest.approx(12 * step)
    window = floor(spec, RunConfig(duration_s=30.0, warmup_steps=3), device, 2)  # 2 ranks share the cores
    assert window is not None and window.seconds == pytest.approx(30 + (3 + CHECK_STEPS) * 2 * step)
    assert floor(spec, RunConfig(fit_fraction=0.5), device, 1) is None  # the batch is not known yet
    assert [duration_text(s) for s in (0.035, 45, 192, 7200)] == ["35 ms", "45 s", "3.2 min", "2.0 h"]
