"""Peak FLOP/s. MFU's denominator is a theoretical peak only: a GPU's datasheet figure, or for a
CPU an estimate from its cores, clock and the FLOPs per cycle its vector units can do, with the
inputs said. The measured GEMM ceiling (the best of square matrix products of several sizes) is
reported apart, as what the software stack reaches; it never becomes MFU.

MFU is only as honest as its denominator: every datasheet entry names its source and is a dense
figure (no structured sparsity, which doubles it); an unknown device has no peak (MFU is not
computed) rather than a guess, unless the user gives one (``--peak-flops``).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hpcdl.device import synchronize, tf32_matmuls
from hpcdl.measure import peakstore
from hpcdl.measure.datasheets import DATASHEET_PEAKS, datasheet_entry
from hpcdl.workloads.precision import precision as precision_of

ROCM_NAMES = {("gfx942", 304): "AMD Instinct MI300X", ("gfx90a", 110): "AMD Instinct MI250X"}
"""(architecture, compute units) -> the name, for ROCm builds that report no product name"""


@dataclass(frozen=True)
class Peak:
    """The FLOP/s that MFU is computed against, and where it came from."""

    flops: float
    source: str
    """e.g. "datasheet: NVIDIA H100 datasheet, SXM5" or the CPU formula with its inputs"""
    kind: str = "datasheet"
    """datasheet, estimate (a formula whose inputs may be off), or user"""
    inputs: dict[str, Any] = field(default_factory=dict)
    """what an estimate was computed from, for the record"""


def datasheet_peak(device_name: str, precision: str) -> Peak | None:
    """The datasheet peak of a known device at a precision, or None. A MIG slice has none: it
    has a fraction of its GPU's units, not the whole GPU's peak (give --peak-flops)."""
    if " MIG " in f" {device_name} ":
        return None
    found = datasheet_entry(device_name)
    if found is None:
        return None
    peaks, source = found
    return Peak(peaks[precision], f"datasheet: {source}") if precision in peaks else None


# --- CPUs: cores x clock x FLOPs per cycle ---------------------------------------------------


@dataclass(frozen=True)
class CpuInfo:
    """What the peak formula needs to know of this machine's CPU."""

    vendor: str
    family: int
    model: int
    flags: frozenset[str]
    cores: int
    """physical cores this process may run on"""
    clock_hz: float | None
    clock_source: str
    model_name: str = ""
    """as /proc/cpuinfo names it: with the host, the machine the peak store knows"""


def _cpuinfo_fields() -> dict[str, str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():  # the first processor stands for all
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def physical_cores(cpus: Sequence[int]) -> int:
    """Physical cores among logical CPUs: SMT siblings share a (package, core) pair."""
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(
                (topo.joinpath("physical_package_id").read_text(), topo.joinpath("core_id").read_text())
            )
        except OSError:
            cores.add((str(cpu), ""))  # no topology: count the logical CPU
    return len(cores)


def _max_clock() -> tuple[float | None, str]:
    """The highest clock the cores can run at, and where it was read."""
    try:
        khz = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()
        return float(khz) * 1e3, "cpufreq max: boost"
    except (OSError, ValueError):
        pass
    mhz = _cpuinfo_fields().get("cpu MHz")
    if mhz:
        return float(mhz) * 1e6, "/proc/cpuinfo: may be the base clock"
    return None, "unknown"


def cpu_info(cpus: Sequence[int] | None = None) -> CpuInfo:
    """This machine's CPU, for the CPUs this process may use (its affinity) or ``cpus``."""
    f = _cpuinfo_fields()
    allowed = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    clock, source = _max_clock()
    flags = f.get("flags") or f.get("Features") or ""
    return CpuInfo(
        vendor=f.get("vendor_id", platform.machine()),
        family=int(f.get("cpu family", "0") or 0),
        model=int(f["model"]) if f.get("model", "").isdigit() else 0,
        flags=frozenset(flags.split()),
        cores=physical_cores(allowed),
        clock_hz=clock,
        clock_source=source,
        model_name=f.get("model name", platform.processor()),
    )


def fp32_lanes_and_units(info: CpuInfo) -> tuple[int, int, str]:
    """(fp32 lanes per FMA unit, FMA units per core, why): the vector datapath, by ISA and,
    where the ISA hides it, by microarchitecture."""
    flags = info.flags
    amd = info.vendor == "AuthenticAMD"
    if amd and info.family == 0x17 and info.model < 0x30:
        return 4, 2, "Zen/Zen+, 2 x 128-bit FMA"
    if amd and info.family == 0x19 and "avx512f" in flags:
        return 8, 2, "Zen 4 AVX-512, 2 x 256-bit FMA"
    if amd and info.family == 0x1A and info.model >= 0x20:
        return 8, 2, "Zen 5 mobile AVX-512, 2 x 256-bit FMA"
    if "avx512f" in flags:
        return 16, 2, "AVX-512, 2 x 512-bit FMA"
    if "avx2" in flags and "fma" in flags:
        return 8, 2, "AVX2, 2 x 256-bit FMA"
    if "asimd" in flags:
        return 4, 2, "NEON, 2 x 128-bit FMA assumed"
    if "avx" in flags:
        return 8, 1, "AVX without FMA, 1 x 256-bit"
    return 4, 1, "SSE, 1 x 128-bit"


def flops_per_cycle(info: CpuInfo, precision: str) -> tuple[int, str]:
    """Peak FLOPs per cycle and core at ``precision``, and how it was derived. A multiply-add
    is 2 FLOPs. bf16/fp16 run at the fp32 rate unless the ISA has instructions for them."""
    lanes, units, why = fp32_lanes_and_units(info)
    fp32 = 2 * lanes * units
    flags = info.flags
    if precision == "bf16":
        if "amx_bf16" in flags:
            return 1024, "AMX tiles"
        if "avx512_bf16" in flags:
            return 2 * fp32, f"AVX512-BF16, 2 x the fp32 rate of {why}"
    if precision == "fp16":
        if "amx_fp16" in flags:
            return 1024, "AMX-FP16 tiles"
        if "avx512_fp16" in flags:
            return 2 * fp32, f"AVX512-FP16, 2 x the fp32 rate of {why}"
    converted = "" if precision == "fp32" else f", no {precision} instructions"
    return fp32, f"{why}{converted}"


def cpu_peak(precision: str, info: CpuInfo | None = None, use_store: bool = True) -> Peak | None:
    """This machine's peak as the peak store holds it (``measure.peakstore``: one per machine),
    else cores x clock x FLOPs per cycle, an estimate with its inputs; None without a clock."""
    info = info or cpu_info()
    entry = peakstore.stored(info.model_name, precision) if use_store else None
    if entry is not None:
        return stored_peak(entry, info.cores)
    if info.clock_hz is None:
        return None
    per_cycle, why = flops_per_cycle(info, precision)
    ghz = info.clock_hz / 1e9
    return Peak(
        info.cores * info.clock_hz * per_cycle,
        f"estimate: {info.cores} cores x {ghz:.2f} GHz ({info.clock_source}) x {per_cycle} "
        f"FLOP/cycle ({why})",
        kind="estimate",
        inputs={
            "cores": info.cores,
            "clock_hz": info.clock_hz,
            "clock_source": info.clock_source,
            "flops_per_cycle": per_cycle,
            "flops_per_cycle_source": why,
        },
    )


STORED_INPUTS = (
    "clock_hz",
    "clock_source",
    "flops_per_cycle",
    "flops_per_cycle_source",
    "gemm_ceiling_flops",
)
"""what a stored entry keeps of the peak it was made from, besides its figure per core"""


def stored_peak(entry: dict[str, Any], cores: int) -> Peak:
    """The peak of ``cores`` of this machine from its stored entry: the stored figure per core,
    its inputs, and where and when it was stored (``stored``, ``probed``, ``probed_by``)."""
    per_core = float(entry["flops_per_core"])
    kept = {k: entry[k] for k in STORED_INPUTS if k in entry}
    where = str(peakstore.store_path())
    inputs = {**kept, "cores": cores, "stored": where, "probed": entry.get("probed"),
              "probed_by": entry.get("probed_by")}  # fmt: skip
    how = (
        f"{kept['clock_hz'] / 1e9:.2f} GHz ({kept.get('clock_source')}) x {kept['flops_per_cycle']} "
        f"FLOP/cycle ({kept.get('flops_per_cycle_source')})"
        if "clock_hz" in kept and "flops_per_cycle" in kept
        else f"{per_core / 1e9:.1f} GFLOP/s per core"
    )
    date = str(entry.get("probed", ""))[:10]
    source = f"stored by {entry.get('probed_by')} on {date} ({where}): {cores} cores x {how}"
    return Peak(per_core * cores, source, kind="estimate", inputs=inputs)


def store_entry(peak: Peak, ceiling_flops: float) -> dict[str, Any] | None:
    """What the peak store keeps of a CPU estimate: its figure per core, its inputs and the GEMM
    ceiling of the probe (None for a peak that is not a CPU estimate, or one read from the store)."""
    cores = peak.inputs.get("cores")
    if peak.kind != "estimate" or "stored" in peak.inputs or not cores:
        return None
    kept = {k: peak.inputs[k] for k in STORED_INPUTS if k in peak.inputs}
    per_core = float(peak.inputs["clock_hz"]) * float(peak.inputs["flops_per_cycle"])
    return {"flops_per_core": per_core, "cores": cores, **kept, "gemm_ceiling_flops": ceiling_flops}


def raised_to_ceiling(peak: Peak, ceiling_flops: float) -> Peak:
    """A CPU estimate that the measured GEMM ceiling proves low, recomputed with the clock the
    measurement implies, ``ceiling / (cores x FLOPs per cycle)``; any other peak unchanged.

    A machine cannot exceed its peak, so a ceiling above the estimate means the estimate's clock
    is low (a VM's ``/proc/cpuinfo`` shows the base clock, not the boost). The implied clock is a
    lower bound of the real one; the estimate's own inputs stay in ``inputs`` (``estimated_*``).
    A peak read from the store is the machine's and stays as it is."""
    needed = ("cores", "clock_hz", "clock_source", "flops_per_cycle", "flops_per_cycle_source")
    if peak.kind != "estimate" or not ceiling_flops > peak.flops or not all(k in peak.inputs for k in needed):
        return peak
    if "stored" in peak.inputs:  # the machine's peak: a run's ceiling above it is flagged, not taken
        return peak
    cores, per_cycle = peak.inputs["cores"], peak.inputs["flops_per_cycle"]
    clock = ceiling_flops / (cores * per_cycle)
    said = peak.inputs["clock_hz"]
    inputs = {
        **peak.inputs,
        "clock_hz": clock,
        "clock_source": "implied by the measured GEMM ceiling",
        "estimated_clock_hz": said,
        "estimated_clock_source": peak.inputs["clock_source"],
        "estimated_flops": peak.flops,
        "gemm_ceiling_flops": ceiling_flops,
    }
    source = (
        f"estimate: {cores} cores x {clock / 1e9:.2f} GHz (implied by the measured GEMM ceiling of "
        f"{ceiling_flops / 1e9:.1f} GFLOP/s; the clock read, {said / 1e9:.2f} GHz from "
        f"{peak.inputs['clock_source']}, gives {peak.flops / 1e9:.1f} GFLOP/s) x {per_cycle} FLOP/cycle "
        f"({peak.inputs['flops_per_cycle_source']})"
    )
    return Peak(ceiling_flops, source, kind="estimate", inputs=inputs)


def has_bf16(device: torch.device) -> bool:
    """Whether the device computes in bf16 natively: a CUDA device that supports it, or a CPU
    with AVX512-BF16, AMX or Arm's BF16 instructions (elsewhere bf16 is emulated, far slower)."""
    if device.type == "cuda":  # not is_bf16_supported(), which also says yes where it is emulated
        return torch.version.hip is not None or torch.cuda.get_device_capability(device) >= (8, 0)
    return bool(cpu_info().flags & {"avx512_bf16", "amx_bf16", "bf16"})


def gpu_name(device: torch.device) -> str:
    """The product name of a GPU; on ROCm builds that report none, the name its architecture
    and compute units identify."""
    name = torch.cuda.get_device_name(device)
    if torch.version.hip is not None and not any(f in name for f, _, _ in DATASHEET_PEAKS):
        props = torch.cuda.get_device_properties(device)
        arch = str(getattr(props, "gcnArchName", "")).split(":")[0]
        name = ROCM_NAMES.get((arch, props.multi_processor_count), name)
    return name


def theoretical_peak(device: torch.device, name: str, precision: str) -> Peak | None:
    """One device's theoretical peak: a GPU's datasheet figure, or this process's CPU cores
    estimated; None where hpcdl knows no peak."""
    if device.type == "cuda":
        return datasheet_peak(gpu_name(device), precision)
    return cpu_peak(precision)


# --- the measured GEMM ceiling -----------------------------------------------------------------

CPU_SIZES = (512, 1024, 2048)
GPU_SIZES = (2048, 4096, 8192)


INFO_PRECISIONS = ("tf32",)
"""precisions ``hpcdl info`` probes beside the training ones where a GPU's datasheet lists them:
tf32, fp32 products on NVIDIA's tensor cores (hpcdl never trains in it; readers compare)"""


Product = Callable[[Tensor, Tensor], Tensor]


def gemm_products(device: torch.device, precision: str) -> dict[str, Product]:
    """The matrix products a training step can run on ``device`` in ``precision``: ``torch.mm``
    (the BLAS's), and on CPUs in fp32 oneDNN's inner product too, which convolutions, fused LSTMs
    and (in bf16) linears run on. fp32 ``torch.mm`` goes to MKL, which on AMD CPUs runs its AVX2
    code: on a Zen 5 EPYC 219 GFLOP/s where oneDNN's product did 479
    (``benchmarks/gemm_products.py``), so a ceiling of ``torch.mm`` alone flagged CNNs and LSTMs
    above it and hid a low estimate."""
    products: dict[str, Product] = {"torch.mm": torch.mm}
    if device.type == "cpu" and precision == "fp32" and torch.backends.mkldnn.is_available():
        # a @ b.T, as a linear computes it
        products["oneDNN inner product"] = lambda a, b: torch._C._nn.mkldnn_linear(a.to_mkldnn(), b, None)
    return products


def gemm_ceiling(
    device: torch.device,
    precision: str,
    seconds: float = 1.0,
    sizes: Sequence[int] | None = None,
    products: Mapping[str, Product] | None = None,
) -> float:
    """The measured GEMM ceiling: the fastest square matrix product in ``precision`` over several
    sizes (the best size differs between machines) and the libraries a step uses
    (:func:`gemm_products`, or ``products``), each timed one by one between device
    synchronisations for its share of ``seconds`` after two warm-up products. The best of all
    counts: noise on a shared node does not lower a ceiling. ``tf32`` (a GPU's): fp32 products
    with cuBLAS allowed TF32, the setting restored after."""
    if precision == "tf32":
        with tf32_matmuls():
            return gemm_ceiling(device, "fp32", seconds, sizes, products)
    sizes = sizes or (GPU_SIZES if device.type == "cuda" else CPU_SIZES)
    dtype = precision_of(precision).dtype
    timed = list((products or gemm_products(device, precision)).values())
    share = seconds / (len(sizes) * len(timed))
    best = 0.0
    for n in sizes:
        gen = torch.Generator(device=device).manual_seed(n)
        a = torch.randn(n, n, generator=gen, device=device).to(dtype)
        b = torch.randn(n, n, generator=gen, device=device).to(dtype)
        for product in timed:
            for _ in range(2):
                product(a, b)
            synchronize(device)
            start = time.perf_counter()
            while time.perf_counter() - start < share:
                t0 = time.perf_counter()
                product(a, b)
                synchronize(device)
                best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best
