"""The compute device: choosing it, synchronising it, and asking it about memory."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import platform
import re
import resource
from collections.abc import Iterator
from pathlib import Path

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


def rank_threads(local_size: int) -> int:
    """The threads each of a node's ``local_size`` ranks trains with on a CPU: the count the user
    (``OMP_NUM_THREADS``) or the placement (``harness.capacity``) chose, which torch already
    has; else the node's cores shared among its ranks; else, alone, torch's own default."""
    if local_size > 1 and "OMP_NUM_THREADS" not in os.environ:
        return max(1, (os.cpu_count() or 1) // local_size)
    return torch.get_num_threads()


def ieee_fp32() -> None:
    """fp32 means IEEE fp32 on GPUs too: cuDNN would otherwise run fp32 convolutions and RNNs in
    TF32 on tensor cores (its default), so that some families' fp32 MFU against the CUDA-core
    peak would be inflated and others' not. TF32 is a precision of its own, not fp32."""
    if _per_backend_precision():
        # torch >= 2.9's per-backend precision settings; its type stubs do not declare them yet
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"  # type: ignore[attr-defined]
        torch.backends.cudnn.rnn.fp32_precision = "ieee"  # type: ignore[attr-defined]
    else:  # the flags they replaced (cuDNN's covers convolutions and RNNs alike)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def _per_backend_precision() -> bool:
    """Whether this torch has the per-backend ``fp32_precision`` settings (2.9 on): before them
    ``allow_tf32`` flags said the same, and reading ``fp32_precision`` raises."""
    return hasattr(torch.backends.cudnn, "conv")


def fp32_math() -> dict[str, str]:
    """How fp32 matrix products and convolutions compute on CUDA: ``ieee`` or ``tf32``."""
    if _per_backend_precision():
        return {
            "fp32_matmul": torch.backends.cuda.matmul.fp32_precision,
            "fp32_conv": torch.backends.cudnn.conv.fp32_precision,  # type: ignore[attr-defined]
        }
    return {
        "fp32_matmul": "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee",
        "fp32_conv": "tf32" if torch.backends.cudnn.allow_tf32 else "ieee",
    }


@contextlib.contextmanager
def tf32_matmuls() -> Iterator[None]:
    """cuBLAS allowed TF32 for fp32 products while inside, its setting restored after."""
    matmul = torch.backends.cuda.matmul
    name, tf32 = ("fp32_precision", "tf32") if _per_backend_precision() else ("allow_tf32", True)
    before = getattr(matmul, name)
    setattr(matmul, name, tf32)
    try:
        yield
    finally:
        setattr(matmul, name, before)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so that a host clock reading covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_uuid(index: int) -> str | None:
    """CUDA device ``index``'s UUID without its ``GPU-``/``MIG-`` prefix: the identity of a GPU
    or MIG device across processes (CUDA_VISIBLE_DEVICES renumbers devices per process, so two
    ranks' ``cuda:0`` may be different GPUs). None without CUDA or without the field."""
    try:
        text = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # a CPU-only torch, no driver, or a torch without the field
        return None
    return text.removeprefix("GPU-").removeprefix("MIG-") or None


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
    """Bytes a run may use: the GPU's free memory (the CUDA context and other processes
    already took their part) plus what this process's caching allocator holds for no tensor (a
    previous workload's cache: without it, the suite's second workload on an H200 was fitted to
    30.6 of 139 GiB), or on the CPU the smaller of the host's available memory and what
    this process's memory cgroup still allows (:func:`cgroup_memory_left`: a container or a
    Slurm job is killed at its limit, however much the host has free)."""
    if device.type == "cuda":
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(torch.cuda.mem_get_info(device)[0]) + cached
    host = _host_available()
    cgroup = cgroup_memory_left()
    known = [b for b in (host, cgroup) if b is not None]
    return min(known) if known else 1 << 62  # unknown: do not refuse


def _host_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


UNLIMITED = 1 << 62
"""cgroup v1 writes "no limit" as the largest page-aligned long (9223372036854771712)"""
_CGROUP_FILES = {
    # version: (limit, usage, the memory.stat key of page cache the kernel reclaims first)
    "v2": ("memory.max", "memory.current", "inactive_file"),
    "v1": ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
}


def cgroup_memory_left(proc: Path = Path("/proc/self")) -> int | None:
    """Bytes this process's memory cgroups still allow, None where no limit applies: for the
    cgroup v2 (``memory.max``) and v1 (``memory.limit_in_bytes``) hierarchies the process is in,
    and each of their ancestors up to the mount (a parent's limit binds its children too), the
    limit minus the usage, without the inactive page cache the kernel reclaims before it kills
    (as the kubelet's working set); the smallest. ``proc`` holds ``cgroup`` and ``mountinfo``
    (the tests point it at files of their own)."""
    try:
        memberships = (proc / "cgroup").read_text().splitlines()
        mounts = _cgroup_mounts((proc / "mountinfo").read_text())
    except OSError:
        return None
    left: list[int] = []
    for line in memberships:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        version = "v2" if hierarchy == "0" and not controllers else "v1"
        if version == "v1" and "memory" not in controllers.split(","):
            continue
        mount = mounts.get(version)
        if mount is None:
            continue
        point, root = mount
        inside = root == "/" or path == root or path.startswith(root.rstrip("/") + "/")
        relative = os.path.relpath(path, root) if inside else "."  # a namespace shows its own root
        folder = (point / relative).resolve()
        while True:
            found = _level_left(folder, *_CGROUP_FILES[version])
            if found is not None:
                left.append(found)
            if folder == point or point not in folder.parents:
                break
            folder = folder.parent
    return max(0, min(left)) if left else None


def _cgroup_mounts(mountinfo: str) -> dict[str, tuple[Path, str]]:
    """Where the cgroup v2 hierarchy and v1's memory hierarchy are mounted, with the part of
    the hierarchy each mount shows (``mountinfo``'s root field: not / inside a container)."""
    mounts: dict[str, tuple[Path, str]] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        fstype, options = after[0], after[2].split(",") if len(after) > 2 else []
        if fstype == "cgroup2":
            mounts.setdefault("v2", (Path(fields[4]), fields[3]))
        elif fstype == "cgroup" and "memory" in options:
            mounts.setdefault("v1", (Path(fields[4]), fields[3]))
    return mounts


def _level_left(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    """What one cgroup still allows (None: no limit, or no memory controller here)."""
    try:
        text = (folder / limit_file).read_text().strip()
        if text == "max":
            return None
        limit = int(text)
        if limit >= UNLIMITED:
            return None
        usage = int((folder / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    inactive = 0
    with contextlib.suppress(OSError, ValueError):
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
    return limit - max(0, usage - inactive)


_rss_peak_reset = False

MMAP_THRESHOLD_BYTES = 1 << 20
"""allocations from this size up are mapped on their own by glibc and unmapped when freed; set
in auto-fit's trials (``pin_mmap_threshold``) so that their peak resident set is what the
tensors hold, not what glibc's heap keeps of freed ones. Below it, the per-step tensors of a
recurrent layer the CPU runs step by step still fragment the heap over a run's first steps
(``measure.trial.UNFUSED_STEPS``). A lower threshold maps those too and flattens the peak, but
lengthens their steps (``benchmarks/memory_rss.py mapped``, in
docs/validation/2026-11-26-auto-fit.md, step 6): a fitted run would score a slower allocator, not
the machine. jemalloc preloaded instead of glibc's allocator
holds them as flat at a smaller cost: an operator may start a fitted run with it
(``malloc_library``), giving freed blocks back from this size as glibc does
(``JEMALLOC_CONF``)."""
JEMALLOC_CONF = f"oversize_threshold:{MMAP_THRESHOLD_BYTES}"
"""the ``MALLOC_CONF`` a run started under jemalloc takes to give freed blocks back from the size
glibc's do (``jemalloc_oversize_threshold``)"""
_M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter number of the threshold (glibc's malloc.h)"""


def reset_peak_memory(device: torch.device, *, pin: bool = False) -> None:
    """Start a new peak: the CUDA allocator's, or on the CPU the process's peak RSS (Linux
    resets VmHWM when "5" is written to /proc/self/clear_refs), so that each run of a suite
    in one process gets its own peak instead of the process's high-water mark so far.

    What is garbage by then is freed first, and on the CPU given back to the system: models
    made before (the correctness check's, the weights FSDP replaced) sit in reference cycles
    (module hooks), and memory glibc keeps after a free still counts in the RSS. Without
    this, FSDP's peak per rank on a 25 M-parameter MLP read 1.25 GB instead of 1.09. With
    ``pin`` (auto-fit's trials, and the runs whose batch they fitted) glibc's mmap threshold is
    fixed from here on (``pin_mmap_threshold``), so that the peak follows the tensors and the
    memory estimate. Other runs do not pin it: every mapped tensor is faulted in again each step,
    which lengthens steps (docs/validation/2026-11-26-auto-fit.md, step 5)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    if pin:
        pin_mmap_threshold()
    malloc_trim()
    global _rss_peak_reset
    try:
        Path("/proc/self/clear_refs").write_text("5")
        _rss_peak_reset = True
    except OSError:
        _rss_peak_reset = False  # peak_memory then reports the process-wide peak, and says so


def held_bytes(device: torch.device) -> int | None:
    """What this process holds on ``device`` before a model is built, the base a run's peak rises
    from: on the CPU its resident set once garbage is freed and given back (``malloc_trim``), as an
    auto-fit trial takes its base; 0 on CUDA, whose allocator counts only the tensors made after;
    None where the CPU's resident set cannot be read."""
    if device.type == "cuda":
        return 0
    gc.collect()
    malloc_trim()
    return status_bytes("VmRSS")


def pin_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD_BYTES`` (``mallopt``); False where the C
    library is not glibc. By default the threshold is dynamic: freeing a mapped block raises it
    to that block's size, up to 32 MiB, and from then on tensors below it come from the heap,
    which keeps their pages resident after they are freed. A training step's peak resident set
    then depends on the order in which tensors of each size were freed: measured on a CNN at
    batches 8, 16 and 32, 105, 232 and 377 MB, against 77, 150 and 294 MB (linear in the batch,
    and within 2 % of the bytes PyTorch's allocator had live) with the threshold fixed. A fixed
    threshold also turns off the dynamic one; at the batches ``--fit`` chooses, most activation
    tensors are above 32 MiB and were mapped anyway."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def malloc_trim() -> None:
    """Give the allocator's free pages back to the system, so that the resident set is what is
    live: glibc's ``malloc_trim``, and where jemalloc was preloaded its purge of every arena
    (``mallctl("arena.4096.purge")``, 4096 being ``MALLCTL_ARENAS_ALL``)."""
    try:
        if malloc_library() == "jemalloc":
            ctypes.CDLL(None).mallctl(b"arena.4096.purge", None, None, None, ctypes.c_size_t(0))
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # another C library: its freed memory stays counted
        pass


def jemalloc_oversize_threshold() -> int | None:
    """jemalloc's ``opt.oversize_threshold`` (set by ``MALLOC_CONF``; 8 MiB by default): blocks
    from this size up come from an arena that gives their pages back as they are freed, as glibc
    unmaps its mapped blocks. Below it, jemalloc keeps freed pages resident for reuse, which put a
    CNN above glibc's peak at the same batch; at 1 MiB, glibc's threshold in a fitted run,
    jemalloc's peak follows glibc's (docs/validation/2026-11-26-auto-fit.md, step 6). None
    where jemalloc is not this process's ``malloc``."""
    if malloc_library() != "jemalloc":
        return None
    value, size = ctypes.c_size_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
    try:
        read = ctypes.CDLL(None).mallctl(
            b"opt.oversize_threshold", ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)
        )
    except (OSError, AttributeError):
        return None
    return value.value if read == 0 else None


@functools.cache
def malloc_library() -> str:
    """Whose ``malloc`` this process calls: ``jemalloc`` or ``tcmalloc`` where one was preloaded
    (``LD_PRELOAD``, its library then mapped into the process), else ``glibc``. A CPU peak depends
    on it: glibc's heap among small per-step tensors grows over a recurrent run's first steps,
    jemalloc's does not (docs/validation/2026-11-26-auto-fit.md, step 6)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "glibc"
    return next((name for name in ("jemalloc", "tcmalloc") if f"/lib{name}" in maps), "glibc")


def status_bytes(key: str) -> int | None:
    """A ``/proc/self/status`` figure in bytes (``VmRSS``, ``VmHWM``); None where there is none."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = re.search(rf"^{key}:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what was measured): the CUDA caching allocator's peak; on the CPU the process's
    peak RSS since ``reset_peak_memory`` (``host_peak_rss``, which also holds the interpreter
    and libraries, so it is an upper bound), or since the process started (``host_max_rss``)
    where the peak cannot be reset."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    hwm = status_bytes("VmHWM")
    if hwm is not None and _rss_peak_reset:
        return hwm, "host_peak_rss"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "host_max_rss"
