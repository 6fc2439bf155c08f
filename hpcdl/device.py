"""The compute device: choosing it, synchronising it, and asking it about memory."""

from __future__ import annotations

import platform
import resource

import torch

from hpcdl.errors import SpecError


def resolve_device(name: str) -> torch.device:
    """``auto`` is the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SpecError("run.device", name, "expected auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecError("run.device", name, "no CUDA device is available here; use cpu or auto")
    if device.type not in ("cpu", "cuda"):
        raise SpecError("run.device", name, "expected auto, cpu, cuda or cuda:N")
    return device


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so that a host clock reading covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_capacity(device: torch.device) -> int:
    """Bytes a run may use: the GPU's total memory, or the host's available memory."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # unknown: do not refuse


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what was measured): the CUDA caching allocator's peak, or the process's peak RSS
    on the CPU (which also holds the interpreter and libraries, so it is an upper bound)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "host_max_rss"
