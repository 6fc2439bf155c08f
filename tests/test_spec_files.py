"""A fit is runnable (issue 45): ``hpcdl run --spec FILE`` and a job file's ``spec = "FILE"`` run a
saved spec, such as the TOML ``hpcdl fit -o`` writes, a fit record or a result record; a file that
is not a spec is one line naming the field, exit 2, nothing run or submitted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl, one_line

from hpcdl.cli.proxy import spec_toml
from hpcdl.schedulers.load import load_job
from hpcdl.workloads.registry import spec_from_dict

FITTED = spec_from_dict({"family": "mlp", "layers": 2, "width": 48, "input_size": 24, "output_size": 5,
                         "batch_size": 8})  # fmt: skip
RUN = ["--steps", "4", "--warmup", "1", "--min-duration", "0"]


def test_run_takes_a_fitted_spec_and_knobs_over_it(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(spec_toml(FITTED, ["fitted by hpcdl fit to model.json (model)"]))
    p = hpcdl("run", "--spec", path, "width=32", *RUN, "-o", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    (record,) = (tmp_path / "out").glob("*-proxy.json")  # named by the file
    assert spec_from_dict(json.loads(record.read_text())["spec"]) == FITTED.replace(width=32)
    again = hpcdl("run", "--spec", record, *RUN, "-o", tmp_path / "again")  # a record's spec runs too
    assert again.returncode == 0, again.stderr
    (second,) = (tmp_path / "again").glob("*.json")
    assert json.loads(second.read_text())["spec"] == json.loads(record.read_text())["spec"]


def test_a_job_file_runs_a_spec_file_named_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/proxy.toml").write_text(spec_toml(FITTED, []))
    job = tmp_path / "job.toml"
    job.write_text('name = "proxy"\n[workload]\nspec = "specs/proxy.toml"\nbatch_size = 4\n')
    assert load_job(job).spec() == FITTED.replace(batch_size=4)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"schema": "hpcdl.ranking"}', "spec='{path}' is invalid: not a spec file: a table with family="),
        ("[1, 2]", "spec='{path}' is invalid: expected a JSON object, not an array"),
        ('{"family": "mlp", "width": 0}', "spec.width=0 is invalid: must be in"),
        ('{"family": "tiny-dragon"}', "spec.family='tiny-dragon' is invalid: allowed: "),
    ],
)
def test_a_file_that_is_not_a_spec_is_one_line(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "x.json"
    path.write_text(content)
    assert expected.format(path=path) in one_line(hpcdl("run", "--spec", path, *RUN, "-o", tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    job = tmp_path / "job.toml"
    job.write_text(f'name = "x"\noutput = "{tmp_path / "jobs"}"\n[workload]\nspec = "x.json"\n')
    field = expected.format(path=path).replace("spec", "job.workload.spec", 1)
    assert field in one_line(hpcdl("submit", job, "--executor", "local"))
    assert not (tmp_path / "jobs").exists()
