"""Extensions from one file outside the package, loaded through HPCDL_PLUGINS: a family seen by
list, generate and run, and split by its own tensor-parallel plan across 2 real ranks; a backend
that trains a real 2-rank run whose correctness checks pass. (A scheduler from one file:
tests/test_schedulers.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl_process

PLUGINS = Path(__file__).parent / "plugins"


def plugins(paths: str) -> dict[str, str]:
    """The environment that loads ``paths``. Commands run as processes here: a plugin registers
    itself in its process's registries for good, and every rank loads it from the environment."""
    return {**os.environ, "HPCDL_PLUGINS": paths}


@pytest.mark.slow(reason="five processes, each loading the plugin (it registers for good): about 13 s")
def test_a_family_from_one_file(tmp_path: Path) -> None:
    plugin = str(PLUGINS / "tiny_family.py")
    listed = hpcdl_process("list", env=plugins(plugin))
    assert listed.returncode == 0 and "tiny: Two linear layers" in listed.stdout, listed.stderr
    gen = hpcdl_process("generate", "tiny", "width=8", "--json", env=plugins(plugin))
    assert gen.returncode == 0, gen.stderr
    info = json.loads(gen.stdout)
    assert info["params"] == 8 * 8 + 8 + 8 * 4 + 4 and info["spec"]["family"] == "tiny"
    sampled = hpcdl_process("generate", "tiny", "--sample", "3", "--json", env=plugins(plugin))
    assert json.loads(sampled.stdout)["spec"]["width"] in (4, 8, 16)
    run = hpcdl_process(
        "run",
        "--workload",
        "tiny",
        "--steps",
        "5",
        "--min-duration",
        "0",
        "-o",
        str(tmp_path),
        env=plugins(plugin),
    )
    assert run.returncode == 0, run.stderr[-2000:]
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert record["spec"]["family"] == "tiny" and record["validity"]["passed"]
    # without the plugin the family is unknown: one line naming it and what is allowed
    bare = hpcdl_process("generate", "tiny", env=plugins(""))
    assert bare.returncode == 2 and "family='tiny' is invalid: allowed:" in bare.stderr


@pytest.mark.mpi
def test_a_family_from_one_file_runs_tensor_parallel(tmp_path: Path) -> None:
    """The plugin family's tensor-parallel plan lives in its own file: two ranks split its hidden
    units (``--layout tp=2``), step like one process, and record what its hooks count."""
    plugin = str(PLUGINS / "tiny_family.py")
    run = hpcdl_process(
        "run",
        "--workload",
        "tiny",
        "width=16",
        "batch_size=8",
        "--np",
        "2",
        "--layout",
        "tp=2",
        "--data",
        "random",  # no loss to watch fall in 6 steps: the split is what is checked
        "--steps",
        "6",
        "--min-duration",
        "0",
        "-o",
        str(tmp_path),
        env=plugins(plugin),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert record["settings"]["layout"] == "dp=1,tp=2,pp=1"
    checks = {c["name"]: c["passed"] for c in record["validity"]["checks"]}
    assert checks["one_step_equivalence"] and checks["parameters_identical"], record["validity"]
    # a rank's half of the 16 hidden units (8 features in, 4 classes out; the second bias whole)
    assert record["counts"]["rank_params"] == 8 * 8 + 8 + 8 * 4 + 4 < record["counts"]["params"]
    tp = record["metrics"]["communication"]["collectives"]["tp.allreduce"]
    # one forward allreduce of the 8 samples' 4 fp32 logits (backward: none, the input is data)
    assert (tp["bytes_per_step"], tp["calls_per_step"], tp["ranks"]) == (8 * 4 * 4, 1, 2)


def test_a_kernel_that_fails_mid_run_is_one_line_and_its_traceback_a_file(tmp_path: Path) -> None:
    plugin = str(PLUGINS / "faulty_family.py")
    p = hpcdl_process("run", "--workload", "faulty", "--steps", "2", "-o", str(tmp_path), env=plugins(plugin))
    lines = [line for line in p.stderr.splitlines() if "failed" in line]
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(lines) == 2 and "mat1 and mat2 shapes cannot be multiplied" in lines[0], p.stderr
    assert "1 of 1 run(s) failed (faulty)" in lines[1]
    (saved,) = tmp_path.glob("*-faulty-failed.txt")
    assert str(saved) in lines[0] and "Traceback" in saved.read_text()
    assert not list(tmp_path.glob("*.json"))  # no record of a run that did not finish


def test_a_plugin_that_does_not_import_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_anywhere\n")
    p = hpcdl_process("list", env=plugins(str(broken)))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "HPCDL_PLUGINS=" in p.stderr and "no_such_module_anywhere" in p.stderr


@pytest.mark.mpi
def test_a_backend_from_one_file_trains_correctly(tmp_path: Path) -> None:
    plugin = str(PLUGINS / "naive_backend.py")
    args = ["--workload", "mlp", "layers=2", "width=32", "input_size=16", "output_size=4", "batch_size=8"]
    run = hpcdl_process(
        "run",
        *args,
        "--np",
        "2",
        "--backend",
        "naive-mpi",
        "--steps",
        "6",
        "--min-duration",
        "0",
        "-o",
        str(tmp_path),
        env=plugins(plugin),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert record["settings"]["backend"] == "naive-mpi" and record["settings"]["world_size"] == 2
    checks = {c["name"]: c["passed"] for c in record["validity"]["checks"]}
    assert checks["one_step_equivalence"] and checks["parameters_identical"], record["validity"]
    comm = record["metrics"]["communication"]
    assert comm["exposed_method"].startswith("allreduce phase") and comm["exposed_s"] > 0
    # auto never picks it, and the runs of other users are not affected by its presence
    assert "naive-mpi" not in os.environ.get("HPCDL_PLUGINS", "")
