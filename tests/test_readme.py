"""Every README example runs as written (issue 45: the README's diagnose example failed on every
rank). The README's shell blocks are read here, command by command; each is in ``HOW``: run in the
fast tier (no measurement), run in the slow tier (a measurement, as written), or left out for a
stated reason (a GPU, a cluster, a download, the user's own model). A command added to the README
without a line here fails the first test, so that no example goes untried by accident.

Commands run in-process (``hpcdl_cli.hpcdl``) from a scratch folder that holds what the README
assumes of the repository root: ``reference_results/`` and the job file its TOML block shows.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hpcdl_cli import ERROR_LINE, hpcdl

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

FAST, SLOW, MPI = "fast", "slow", "mpi"
GPU = "needs a GPU (the CUDA build of torch)"
SETUP = "installs packages (scripts/setup.sh; CI runs it)"
CLUSTER = "submits to a real cluster's partition (tests/test_slurm.py submits to the local one)"
USER_MODEL = "names the user's own model (mypkg.models); tests/test_proxy.py runs the same path"
FILL_IN = "needs the submitter's answers in system.toml (tests/test_submission.py)"
HOW = {
    "bash scripts/setup.sh": SETUP,
    "hpcdl run": "the default suite, as the quick start's step 1 (the slow tier runs class S below)",
    "bash scripts/test.sh": "the test suite itself",
    "hpcdl run --workload attention layers=4 width=256 heads=4 --duration 20": SLOW,
    "hpcdl run --preset resnet50 batch_size=16 --steps 30": SLOW,
    "hpcdl generate gpt2_small": FAST,
    "hpcdl list": FAST,
    "hpcdl sweep --workload attention --knob seq_len=64,128,256,512": SLOW,
    "hpcdl sweep --workload cnn --knob batch_size=16,32,64,128 --fit 0.01": SLOW,
    "hpcdl run --workload cnn --profile": SLOW,
    "PYTHONPATH=. python3 -m hpcdl run --class M precision=bf16 --fit --duration 6": GPU,
    "bash scripts/setup.sh --mpi": SETUP,
    "hpcdl run --workload attention --np 4 --backend horovod": MPI,
    "hpcdl sweep --np 1,2,4 --mode weak --workload mlp": MPI,
    "hpcdl run --workload attention layers=4 heads=8 --np 4 --layout dp=2,tp=2": MPI,
    "hpcdl submit jobs/my-cluster.toml --dry-run": FAST,
    "hpcdl submit jobs/my-cluster.toml": CLUSTER,
    "hpcdl status results/resnet50-bf16": CLUSTER,
    "hpcdl collect results/resnet50-bf16": CLUSTER,
    "hpcdl run --class S -o results/mysys": SLOW,
    "hpcdl run --class S --np 2 -o results/mysys": SLOW,
    "hpcdl rank mysys=results/mysys ref=reference_results/cpu-epyc-2core-2026-11-23 -o ranking": SLOW,
    "hpcdl report mysys=results/mysys ref=reference_results/cpu-epyc-2core-2026-11-23 -o report": SLOW,
    "hpcdl rank mysys=results/mysys --baseline reference_results/cpu-epyc-2core-2026-11-23 -o ranking": SLOW,
    "hpcdl predict --preset resnet50 batch_size=64 --throughput 400 --system dgx-a100 --system dgx-h100 "
    "--nodes 1,8,64,512": FAST,
    "hpcdl predict --preset vgg16 --system dgx1-v100 --samples 100000000 --epochs 10 --nodes 1": FAST,
    "hpcdl profile mypkg.models:make_model -o model.json": USER_MODEL,
    "hpcdl fit model.json -o proxy.toml --verify --model mypkg.models:make_model": USER_MODEL,
    "hpcdl run --spec proxy.toml": USER_MODEL,
    "hpcdl system init results -o system.toml": FILL_IN,
    "hpcdl system check system.toml": FILL_IN,
    "hpcdl package results --system system.toml -o mysys-2026-11.tar.gz": FILL_IN,
    "hpcdl check mysys-2026-11.tar.gz": FILL_IN,
}


def commands() -> list[str]:
    """The README's shell commands in order: comments dropped, continued lines joined, ``&&``
    split, the venv's ``.venv/bin/`` dropped (the tests' ``hpcdl`` is this checkout's)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].split("# ")[0] if not line.startswith("#") else ""
            out += [" ".join(c.replace(".venv/bin/", "").split()) for c in line.split("&&") if c.strip()]
    return out


def scratch(tmp_path: Path) -> Path:
    """A folder with what the README assumes of the repository root."""
    (tmp_path / "reference_results").symlink_to(ROOT / "reference_results")
    job = next(b for b in re.findall(r"```toml\n(.*?)```", README, re.S) if "jobs/my-cluster.toml" in b)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "my-cluster.toml").write_text(job)
    return tmp_path


def run(command: str, cwd: Path) -> None:
    """The command as written: it ends with its own answer (0, or 1 where a check it makes
    fails, as ``--baseline`` below the reference), never a refusal or a traceback."""
    p = hpcdl(*shlex.split(command)[1:], cwd=cwd, timeout=900)
    refused = [line for line in p.stderr.splitlines() if ERROR_LINE.match(line)]
    assert p.returncode in (0, 1) and not refused and "Traceback" not in p.stderr, (command, p.stderr[-2000:])


def test_every_readme_command_is_tried_or_left_out_for_a_reason() -> None:
    found = commands()
    assert [c for c in found if c not in HOW] == []  # a new example: say here how it is tried
    assert [c for c in HOW if c not in found] == []  # an example gone from the README
    assert len(found) >= 20


def test_the_readme_commands_that_measure_nothing_run_as_written(tmp_path: Path) -> None:
    cwd = scratch(tmp_path)
    for command in [c for c in commands() if HOW[c] == FAST]:
        run(command, cwd)


@pytest.mark.slow(reason="class S at 1 and 2 ranks, three runs, two knob sweeps, rank and report: ~12 min")
def test_the_readme_commands_that_measure_run_as_written(tmp_path: Path) -> None:
    cwd = scratch(tmp_path)
    for command in [c for c in commands() if HOW[c] == SLOW]:
        run(command, cwd)
    assert (cwd / "report" / "index.html").exists() and (cwd / "ranking" / "ranking.json").exists()


@pytest.mark.slow(reason="three runs of four ranks and a sweep on two cores: about 3 minutes")
@pytest.mark.mpi
def test_the_readme_commands_with_several_ranks_run_as_written(tmp_path: Path) -> None:
    cwd = scratch(tmp_path)
    for command in [c for c in commands() if HOW[c] == MPI]:
        run(command, cwd)
