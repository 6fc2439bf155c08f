"""What a result was measured on: host, devices and software versions, for every record."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch

from hpcdl import reader
from hpcdl.device import cpu_model, device_name, fp32_math, malloc_library
from hpcdl.errors import InputError
from hpcdl.measure.caps import CAP_ENV


def hpcdl_version() -> str:
    try:
        return importlib.metadata.version("hpcdl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def git_revision() -> str | None:
    """The commit of the hpcdl checkout this code runs from (``+dirty`` when modified), if any."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return None
    return rev + ("+dirty" if dirty else "")


def environment(device: torch.device) -> dict[str, Any]:
    """The record's ``environment`` block."""
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # a CPU step's time and peak depend on it (docs/validation/2026-11-26-auto-fit.md, step 6)
        "malloc": malloc_library(),
        "gpus": gpus,
        "gpu_stack": gpu_stack() if device.type == "cuda" else None,
        "device": str(device),
        "device_name": device_name(device),
        "hpcdl": hpcdl_version(),
        "git": git_revision(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm": slurm_allocation(),
        "cap": cap_in_force(),
    }


def cap_in_force() -> dict[str, Any] | None:
    """The power or clock cap the launcher set on this host's devices for the run (``hpcdl sweep
    --power-limit/--clock-limit``: kind, value, unit and each limit's original and read-back
    value), or None."""
    text = os.environ.get(CAP_ENV)
    if not text:
        return None
    try:
        cap = reader.parse_json(text.encode())
    except reader.Unreadable as e:
        raise InputError(CAP_ENV, text[:80], f"the JSON object hpcdl sweep sets ({e})") from None
    if not isinstance(cap, dict):
        raise InputError(CAP_ENV, text[:80], "the JSON object hpcdl sweep sets")
    return cap


def gpu_stack() -> dict[str, Any]:
    """The GPU software a figure depends on: cuDNN, NCCL, HIP, the fp32 math mode and cuDNN's
    autotuning (hpcdl leaves it off, so that runs choose the same kernels)."""
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    return {
        "cudnn": torch.backends.cudnn.version(),
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "hip": torch.version.hip,
        **fp32_math(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


# record key -> the variable Slurm sets in every job (sbatch and srun)
SLURM_VARS = {
    "job_id": "SLURM_JOB_ID",
    "job_name": "SLURM_JOB_NAME",
    "cluster": "SLURM_CLUSTER_NAME",
    "partition": "SLURM_JOB_PARTITION",
    "account": "SLURM_JOB_ACCOUNT",
    "qos": "SLURM_JOB_QOS",
    "nodelist": "SLURM_JOB_NODELIST",
    "num_nodes": "SLURM_JOB_NUM_NODES",
    "ntasks": "SLURM_NTASKS",
    "tasks_per_node": "SLURM_TASKS_PER_NODE",
    "cpus_per_task": "SLURM_CPUS_PER_TASK",
    "gpus_per_node": "SLURM_GPUS_PER_NODE",
    "restart_count": "SLURM_RESTART_COUNT",
}


def slurm_allocation() -> dict[str, str] | None:
    """The Slurm allocation this process runs in (node list, layout, requeues), as Slurm
    wrote it (``tasks_per_node`` like ``2(x4)``), or None outside Slurm."""
    if "SLURM_JOB_ID" not in os.environ:
        return None
    return {key: os.environ[var] for key, var in SLURM_VARS.items() if var in os.environ}


def _version(module: str, distribution: str | None = None) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(distribution or module)
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def availability() -> dict[str, str | None]:
    """Optional parts and where they are: None when absent (for ``hpcdl info``)."""
    return {
        "mpi4py": _version("mpi4py"),
        "horovod": _version("horovod"),
        "submitit": _version("submitit"),
        "pynvml": _version("pynvml", "nvidia-ml-py"),
        "mpirun": shutil.which("mpirun"),
        "srun": shutil.which("srun"),
        "sbatch": shutil.which("sbatch"),
    }
