"""A size class is a job (issue 45): a job file's ``[workload] class = "S"`` runs the class's whole
suite at each node count, a record each, as ``hpcdl run --class`` trains it; ``status``,
``collect`` and ``rank`` know its points, and a requeued point runs only what is missing.
Through submitit's local executor here (the Slurm cluster's run is in test_slurm.py); bad
class input is one line, exit 2, nothing submitted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl, one_line

from hpcdl.schedulers.load import load_job
from hpcdl.schedulers.point import points
from hpcdl.workloads import recipes

ROOT = Path(__file__).resolve().parent.parent
S = list(recipes.suite("S").workloads)


def class_job(
    path: Path, workload: str, run: str = "steps = 4\nwarmup_steps = 1\nmin_duration_s = 0.0", **top: str
) -> Path:
    """A class job file: ``workload`` and ``run`` are the tables' lines, ``top`` the fields."""
    fields = {"name": '"cls"', "nodes": "[1]", "output": json.dumps(str(path.parent / "out")), **top}
    lines = [f"{k} = {v}" for k, v in fields.items()]
    path.write_text(
        "\n".join([*lines, "[workload]", workload, "[run]", run, "[env]", 'OMP_NUM_THREADS = "2"']) + "\n"
    )
    return path


def test_a_class_job_has_a_record_per_workload_and_node_count(tmp_path: Path) -> None:
    job = load_job(class_job(tmp_path / "s.toml", 'class = "S"\nversion = 1\nbatch_size = 4', nodes="[1, 2]"))
    assert job.size_class == "S" and list(job.specs()) == S
    assert all(s.batch_size == 4 for s in job.specs().values())  # a tunable knob, on every workload
    one, two = points(job, "local", tmp_path)
    assert [p.stem for p, _, _ in two.records()] == [f"cls-n2-{w}" for w in S]
    assert two.config().suite_class == "S" and two.config().suite_version == 1  # rank's list
    dry = hpcdl("submit", tmp_path / "s.toml", "--dry-run", "--executor", "local")
    assert dry.returncode == 0, dry.stderr
    assert f"# class S: {', '.join(S)}, one after another, a record each" in dry.stdout


@pytest.mark.parametrize(
    ("workload", "top", "expected"),
    [
        ('class = "XL"', {}, "job.workload.class='XL' is invalid: allowed: S, M, L"),
        ('class = "S"\nversion = 2', {}, "job.workload.version=2 is invalid: class S is at version 1"),
        (
            'class = "S"\nlayers = 3',
            {},
            "job.workload.layers=3 is invalid: class S fixes it; a class takes only",
        ),
        ('class = "S"\nbatch_size = 0', {}, "job.workload.batch_size=0 is invalid"),
        ('class = "S"\nprecision = "bf16"', {"precision": '"fp32"'}, "set precision once: job.precision"),
        ('class = "S"', {"instances": "2"}, "job.instances=2 is invalid: 1 for a class job"),
        ('class = "S"\npreset = "resnet50"', {}, "exactly one of preset=, family=, sample=, spec=, class="),
    ],
)
def test_bad_class_input_is_one_line_exit_2_and_nothing_submitted(
    tmp_path: Path, workload: str, top: dict[str, str], expected: str
) -> None:
    f = class_job(tmp_path / "bad.toml", workload, **top)
    assert expected in one_line(hpcdl("submit", f, "--executor", "local"))
    assert not (tmp_path / "out").exists()


def test_a_class_workload_is_a_preset_too(tmp_path: Path) -> None:
    job = load_job(class_job(tmp_path / "p.toml", 'preset = "cnn-resnet-small"\nbatch_size = 4'))
    assert job.spec().to_dict() == recipes.suite("S").specs(batch_size=4)["cnn-resnet-small"].to_dict()
    err = one_line(hpcdl("run", "--preset", "alexnet"))
    assert (
        "preset='alexnet' is invalid: a preset (resnet50" in err and "or a workload of class S, M, L" in err
    )


@pytest.mark.slow(reason="five workloads with rankable 5 s windows, then a requeue: about 100 s")
def test_a_class_job_through_the_local_executor_is_collected_and_ranked(tmp_path: Path) -> None:
    f = class_job(tmp_path / "s.toml", 'class = "S"', run="duration_s = 5.5\nwarmup_steps = 2")
    out = tmp_path / "out"
    p = hpcdl("submit", f, "--executor", "local", timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cls-n1: done: 5 valid records" in p.stdout
    assert "cls: class S v1 score: " in p.stdout and "cls: rankable: complete, every record valid" in p.stdout
    status = hpcdl("status", out)
    assert "cls-n1  " in status.stdout and "5 valid records" in status.stdout and "rankable" in status.stdout
    (row,) = json.loads(hpcdl("status", out, "--json").stdout)
    assert row["state"] == "done" and row["size_class"] == "S" and row["problems"] == []
    against = hpcdl("status", out, "--baseline", out)  # an acceptance run against itself: 100 %
    assert against.returncode == 0 and against.stdout.count("100.0%    pass") == len(S), against.stdout
    assert "cls: class S against the baseline" in against.stdout and "baseline check: pass;" in against.stdout
    collect = hpcdl("collect", out)
    assert collect.returncode == 0 and all(f"cls-n1/{w}" in collect.stdout for w in S)
    rows = json.loads((out / "collected.json").read_text())["points"]
    assert [r["workload"] for r in rows] == S and all(r["state"] == "done" for r in rows)
    ranked = hpcdl("rank", f"here={out}", "-o", tmp_path / "ranking")
    assert ranked.returncode == 0, ranked.stderr
    (score,) = json.loads((tmp_path / "ranking/ranking.json").read_text())["classes"]["S"]
    assert score["system"] == "here" and score["score"] > 0 and score["world_size"] == 1
    assert "0 rejected" in ranked.stdout  # the state file, collected.json: not records to reject

    # a requeue after one workload's record was lost: only that workload runs again
    ids = {w: json.loads((out / f"cls-n1-{w}.json").read_text())["id"] for w in S}
    os.remove(out / "cls-n1-mlp-wide.json")
    again = hpcdl("submit", f, "--executor", "local", timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    now = {w: json.loads((out / f"cls-n1-{w}.json").read_text())["id"] for w in S}
    assert [w for w in S if now[w] != ids[w]] == ["mlp-wide"]


@pytest.mark.parametrize("size_class", recipes.size_classes())
def test_jobs_holds_a_class_job_per_class(size_class: str) -> None:
    job = load_job(ROOT / "jobs" / f"class-{size_class.lower()}.toml")
    assert job.size_class == size_class and list(job.specs()) == list(recipes.suite(size_class).workloads)
    for point in points(job, "slurm", Path("/scratch")):
        assert point.config().suite_version == recipes.suite(size_class).version
        assert len(point.records()) == len(recipes.suite(size_class).workloads) * job.repeat
