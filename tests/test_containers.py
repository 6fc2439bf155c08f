"""Containers in job files: the exact srun lines ``hpcdl submit --dry-run`` prints for pyxis and
Apptainer (what sbatch would get), and bad ``[container]`` tables refused with one line, exit 2,
nothing written. In-process: no Slurm, no runtime needed to write a batch script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hpcdl_cli import hpcdl, one_line

LOGS = "--output {f}/%j_%t_log.out --error {f}/%j_%t_log.err"
ENTRY = "python3 -u -m hpcdl.schedulers.entry --submitit {f}"


def job_file(path: Path, container: dict[str, Any], **top: Any) -> Path:
    fields = {"name": "box", "nodes": [2], "tasks_per_node": 2, "gpus_per_node": 2, **top}
    lines = [f"{k} = {v!r}".replace("'", '"') for k, v in fields.items()]
    lines += ["[workload]", 'preset = "resnet50"', "[env]", 'NCCL_DEBUG = "WARN"', "[container]"]
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in container.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def dry_run(tmp_path: Path, container: dict[str, Any], **top: Any) -> str:
    """The batch scripts ``hpcdl submit --dry-run`` prints for a job file of ``container``."""
    f = job_file(tmp_path / "job.toml", container, output=str(tmp_path / "out"), **top)
    p = hpcdl("submit", str(f), "--executor", "slurm", "--dry-run")
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_pyxis_srun_line(tmp_path: Path) -> None:
    out = dry_run(
        tmp_path,
        {
            "runtime": "pyxis",
            "image": "nvcr.io/nvidia/pytorch:25.01-py3",
            "mounts": ["/data:/data:ro"],
            "env": ["UCX_TLS"],
        },
    )
    o, f = tmp_path / "out", tmp_path / "out/submitit/%j"
    srun = [line for line in out.splitlines() if line.startswith("srun")]
    assert srun == [
        f"srun --unbuffered {LOGS.format(f=f)} --mpi=pmix "
        "--container-image=nvcr.io/nvidia/pytorch:25.01-py3 "
        f"--container-mounts={o}:{o},/data:/data:ro --no-container-mount-home "
        "--container-name=hpcdl-box-n2 --container-env=NCCL_DEBUG,UCX_TLS " + ENTRY.format(f=f)
    ], out
    assert "APPTAINERENV" not in out


@pytest.mark.parametrize(
    ("gpus", "vendor", "flag"), [(2, "nvidia", "--nv "), (2, "amd", "--rocm "), (0, "nvidia", "")]
)
def test_apptainer_srun_line(tmp_path: Path, gpus: int, vendor: str, flag: str) -> None:
    image = tmp_path / "hpcdl.sif"
    image.write_bytes(b"")  # only its existence is checked before submitting
    box = {"runtime": "apptainer", "image": str(image), "mounts": ["/scratch:/scratch"], "gpu_vendor": vendor}
    out = dry_run(tmp_path, box, gpus_per_node=gpus, tasks_per_node=2)
    o, f = tmp_path / "out", tmp_path / "out/submitit/%j"
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("srun")] == [
        f"srun --unbuffered {LOGS.format(f=f)} --mpi=pmix apptainer exec {flag}"
        f"--bind {o}:{o},/scratch:/scratch {image} " + ENTRY.format(f=f)
    ], out
    assert 'if [ -n "${NCCL_DEBUG+set}" ]; then export APPTAINERENV_NCCL_DEBUG="$NCCL_DEBUG"; fi' in lines


BAD = [
    (
        {"runtime": "docker", "image": "x"},
        {},
        "job.container.runtime='docker' is invalid: allowed: , pyxis, apptainer",
    ),
    (
        {"runtime": "apptainer", "image": "/nonexistent/hpcdl.sif"},
        {},
        "job.container.image='/nonexistent/hpcdl.sif'",
    ),
    ({"runtime": "pyxis", "image": "img", "mounts": ["/a"]}, {}, "job.container.mounts='/a' is invalid"),
    ({"runtime": "pyxis", "image": "img", "mounts": ["/a:/b:rw"]}, {}, "job.container.mounts='/a:/b:rw'"),
    ({"runtime": "pyxis", "image": "img", "mounts": ["a:/b"]}, {}, "job.container.mounts='a:/b'"),
    ({"runtime": "pyxis", "image": "img"}, {"launcher": "mpirun"}, "job.launcher='mpirun' is invalid"),
]


@pytest.mark.parametrize(("box", "top", "message"), BAD)
def test_bad_container_is_one_line_exit_2(
    tmp_path: Path, box: dict[str, Any], top: dict[str, Any], message: str
) -> None:
    out = tmp_path / "out"
    f = job_file(tmp_path / "job.toml", box, output=str(out), **top)
    for extra in (["--dry-run"], []):
        assert message in one_line(hpcdl("submit", str(f), "--executor", "slurm", *extra))
    assert not out.exists()


def test_registry_image_is_not_a_path_for_pyxis(tmp_path: Path) -> None:
    """A pyxis image reference or an Apptainer docker:// one is not checked as a file."""
    for box in (
        {"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:25.01-py3"},
        {"runtime": "apptainer", "image": "docker://nvcr.io/nvidia/pytorch:25.01-py3"},
    ):
        assert "--mpi=pmix" in dry_run(tmp_path, box)
