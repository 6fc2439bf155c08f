"""A run ends with its result (issue 45): a class run prints its score as ``hpcdl rank`` computes
it, whether it is rankable, and one line per record that does not count with the reason that was
only inside the record's JSON; any run says why each invalid record is invalid; ``--help``
states the rules a user can trip."""

from __future__ import annotations

from pathlib import Path

from hpcdl_cli import hpcdl

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
    tail = p.stdout.splitlines()[-(2 + len(S)) :]
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
    (line,) = [x for x in p.stdout.splitlines() if x.startswith("invalid: ")]
    assert line.startswith("invalid: mlp: min_duration (timed ") and line.endswith("s, minimum 1000 s)")


def test_help_states_the_validity_rules_a_user_can_trip() -> None:
    text = " ".join(hpcdl("run", "--help").stdout.split())
    assert "at least 4 timed steps (loss_falls)" in text and "a valid record needs 4 or more" in text
    assert f"window lasts {RANK_MIN_WINDOW_S:g} s or more on every rank" in text
    assert not loss_falls([3.0, 2.0, 1.0]).passed and loss_falls([4.0, 3.0, 2.0, 1.0]).passed  # as said
