"""Peaks: the theoretical peak that MFU is against (datasheets, the CPU formula), the measured
GEMM ceiling kept apart, and figures that cannot be true flagged with their cause."""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

import hpcdl
from hpcdl.device import fp32_math
from hpcdl.harness import runner
from hpcdl.measure.config import RunConfig
from hpcdl.measure.loop import StepLog
from hpcdl.measure.measurement import RankMeasurement
from hpcdl.measure.peaks import (
    DATASHEET_PEAKS,
    CpuInfo,
    Peak,
    cpu_info,
    cpu_peak,
    datasheet_peak,
    flops_per_cycle,
    gemm_ceiling,
    gemm_products,
    raised_to_ceiling,
    theoretical_peak,
)
from hpcdl.records.build import energy_of
from hpcdl.records.loader import read_record
from hpcdl.records.peak import implausible, job_ceiling, job_peak
from hpcdl.results.text import notes_once
from hpcdl.workloads.registry import spec_from_dict

ZEN5 = CpuInfo(
    "AuthenticAMD", 0x1A, 2, frozenset({"avx2", "fma", "avx512f", "avx512_bf16"}), 2, 2.6e9, "test"
)
ZEN4 = replace(ZEN5, family=0x19, model=0x11)
SAPPHIRE = CpuInfo(
    "GenuineIntel", 6, 143, frozenset({"avx2", "fma", "avx512f", "amx_bf16", "avx512_fp16"}), 56, 2e9, "t"
)
HASWELL = CpuInfo("GenuineIntel", 6, 63, frozenset({"avx", "avx2", "fma"}), 8, 3e9, "test")


@pytest.mark.parametrize(
    ("info", "precision", "per_cycle"),
    [
        (ZEN5, "fp32", 64),  # 2 x 512-bit FMA x 16 lanes x 2
        (ZEN5, "bf16", 128),  # AVX512-BF16 dot products: twice the fp32 rate
        (ZEN5, "fp16", 64),  # no fp16 arithmetic: converted to fp32
        (ZEN4, "fp32", 32),  # AVX-512 on 256-bit datapaths
        (ZEN4, "bf16", 64),
        (SAPPHIRE, "bf16", 1024),  # AMX tiles
        (SAPPHIRE, "fp16", 128),  # AVX512-FP16
        (HASWELL, "fp32", 32),
        (HASWELL, "bf16", 32),
    ],
)
def test_flops_per_cycle_from_the_isa(info: CpuInfo, precision: str, per_cycle: int) -> None:
    assert flops_per_cycle(info, precision)[0] == per_cycle


def test_cpu_peak_is_cores_times_clock_times_flops_per_cycle_and_says_so() -> None:
    peak = cpu_peak("fp32", ZEN5)
    assert peak is not None and peak.flops == 2 * 2.6e9 * 64
    assert peak.kind == "estimate" and "2 cores x 2.60 GHz" in peak.source
    assert peak.inputs["cores"] == 2 and peak.inputs["flops_per_cycle"] == 64
    assert cpu_peak("fp32", replace(ZEN5, clock_hz=None)) is None  # no clock: no guess


def test_this_machine_has_a_cpu_peak_wherever_it_says_its_clock() -> None:
    """The peak of this CPU is its cores x clock x FLOPs per cycle; a CPU that states no clock
    (some VMs) gets no peak rather than a guess."""
    info = cpu_info()
    assert info.cores >= 1
    peak = theoretical_peak(torch.device("cpu"), "", "fp32")
    if info.clock_hz is None:
        assert peak is None
    else:
        per_cycle = flops_per_cycle(info, "fp32")[0]
        assert peak is not None and peak.flops == info.cores * info.clock_hz * per_cycle > 0


@pytest.mark.parametrize(
    ("name", "fp32", "bf16"),
    [
        ("NVIDIA H100 80GB HBM3", 66.9e12, 989.4e12),
        ("NVIDIA H100 PCIe", 51.2e12, 756.5e12),
        ("NVIDIA H100 NVL", 60e12, 835.5e12),
        ("NVIDIA H200 NVL", 60e12, 835.5e12),
        ("NVIDIA H200", 66.9e12, 989.4e12),
        ("NVIDIA GH200 480GB", 66.9e12, 989.4e12),
        ("NVIDIA GB200", 90e12, 2500e12),
        ("NVIDIA B200", 80e12, 2250e12),
        ("NVIDIA A100-SXM4-80GB", 19.5e12, 312e12),
        ("NVIDIA A10", 31.2e12, 125e12),
        ("NVIDIA L40S", 91.6e12, 362.05e12),
        ("NVIDIA L40", 90.5e12, 181.05e12),
        ("NVIDIA L4", 30.3e12, 121e12),
        ("AMD Instinct MI300X", 163.4e12, 1307.4e12),
        ("AMD Instinct MI250X", 47.85e12, 191.5e12),
    ],
)
def test_datasheet_entries_match_the_right_device(name: str, fp32: float, bf16: float) -> None:
    got32, got16 = datasheet_peak(name, "fp32"), datasheet_peak(name, "bf16")
    assert got32 is not None and got16 is not None
    assert (got32.flops, got16.flops) == (fp32, bf16) and got32.source.startswith("datasheet: ")


def test_unknown_gpu_and_mig_slices_have_no_peak() -> None:
    assert datasheet_peak("Some Future GPU", "bf16") is None
    assert datasheet_peak("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "bf16") is None  # a slice, not the GPU
    assert datasheet_peak("NVIDIA GH200 480GB", "bf16").source.endswith("GH200 datasheet")  # type: ignore[union-attr]
    assert datasheet_peak("Tesla V100-SXM2-16GB", "bf16") is None  # V100 has no bf16


def rank(
    r: int, host: str, cpus: list[int], peak: Peak | None, device_index: int | None = None
) -> RankMeasurement:
    return RankMeasurement(
        rank=r,
        host=host,
        node=0,
        local_rank=0,
        log=StepLog(),
        device_index=device_index,
        cpus=cpus,
        peak=peak,
        gemm_ceiling_flops=1e9,
        grad_bytes=4,
        peak_memory_bytes=1,
        peak_memory_kind="x",
        threads=1,
        energy={},
        power_trace={},
    )


def test_job_peak_counts_each_host_s_cores_and_each_gpu_once() -> None:
    core = Peak(100.0, "estimate: 1 core", kind="estimate")
    # two ranks bound to one core each on one host, two on another: 2 cores per host
    ranks = [
        rank(0, "a", [0], core),
        rank(1, "a", [1], core),
        rank(2, "b", [0], core),
        rank(3, "b", [1], core),
    ]
    peak = job_peak(torch.device("cpu"), 0.0, ranks)
    assert peak is not None and peak.flops == 400.0 and peak.kind == "estimate"
    # ranks that may all run on every core of their host count the host once
    shared = [rank(0, "a", [0, 1], Peak(200.0, "e")), rank(1, "a", [0, 1], Peak(200.0, "e"))]
    assert job_peak(torch.device("cpu"), 0.0, shared).flops == 200.0  # type: ignore[union-attr]
    gpus = [rank(i, "a", [0], Peak(1e12, "datasheet"), device_index=i) for i in range(4)]
    assert job_peak(torch.device("cuda"), 0.0, gpus).flops == 4e12  # type: ignore[union-attr]
    user = job_peak(torch.device("cuda"), 5e12, gpus)
    assert user is not None and user.flops == 20e12 and user.kind == "user"
    # one part without a known peak: no peak at all (a partial sum would overstate MFU)
    assert job_peak(torch.device("cuda"), 0.0, [*gpus[:3], replace(gpus[3], peak=None)]) is None


def test_job_peak_tells_gpus_apart_by_uuid() -> None:
    # CUDA_VISIBLE_DEVICES set per rank (Slurm's --gpus-per-task, capacity mode): all cuda:0
    own = [
        replace(rank(i, "a", [0], Peak(1e12, "datasheet"), device_index=0), device_uuid=f"u{i}")
        for i in range(4)
    ]
    assert job_peak(torch.device("cuda"), 0.0, own).flops == 4e12  # type: ignore[union-attr]
    on_b = replace(own[3], host="b", device_uuid="u0")  # the same UUID on another host: another GPU
    assert job_peak(torch.device("cuda"), 0.0, [own[0], on_b]).flops == 2e12  # type: ignore[union-attr]


def test_energy_counts_each_gpu_once() -> None:
    def with_energy(r: int, uuid: str | None, joules: float, local_rank: int) -> RankMeasurement:
        gpu = {"device_uuid": uuid, "energy_j": joules}
        cpu = {"energy_j": 10.0}
        return replace(rank(r, "a", [r], None), local_rank=local_rank, energy={"gpu": gpu, "cpu_rapl": cpu})

    # two MIG devices of one GPU read the parent's counter: its energy once, and RAPL once per node
    mig = [with_energy(0, "GPU-p", 100.0, 0), with_energy(1, "GPU-p", 101.0, 1)]
    e = energy_of(mig, train_flops=1, samples=1, window_s=1.0)
    assert e.gpu_energy_j == 100.0 and e.cpu_energy_j == 10.0 and e.energy_to_solution_j == 110.0
    two = [with_energy(0, "GPU-p", 100.0, 0), with_energy(1, "GPU-q", 50.0, 1)]
    assert energy_of(two, 1, 1, 1.0).gpu_energy_j == 150.0
    unknown = [with_energy(0, None, 100.0, 0), with_energy(1, None, 50.0, 1)]  # no UUID: per rank
    assert energy_of(unknown, 1, 1, 1.0).gpu_energy_j == 150.0


def test_figures_that_cannot_be_true_are_flagged_with_a_cause() -> None:
    estimate = Peak(100.0, "e", kind="estimate", inputs={"clock_source": "/proc/cpuinfo"})
    assert implausible(0.5, 0.8, 90.0, estimate) == []
    flags = implausible(1.09, 0.9, 120.0, estimate)
    assert any("MFU 109.0% > 100%" in f and "/proc/cpuinfo" in f for f in flags)
    assert any("GEMM ceiling is 120% of the theoretical peak" in f for f in flags)
    under_load = implausible(0.4, 2.46, 20.0, estimate)
    assert any("measured under load" in f for f in under_load)
    assert implausible(math.nan, 0.5, 10.0, None) == []


def test_gemm_ceiling_is_the_best_of_several_sizes() -> None:
    flops = gemm_ceiling(torch.device("cpu"), "fp32", seconds=0.3, sizes=(64, 128))
    assert flops > 0


def test_every_product_the_ceiling_times_is_the_matrix_product_it_counts() -> None:
    """The ceiling counts 2 n^3 FLOPs a product: each library's must compute a (transposed) n x n
    product, oneDNN's beside the BLAS's on CPUs in fp32 (MKL runs AVX2 code on AMD CPUs)."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(96, 96, generator=gen), torch.randn(96, 96, generator=gen)
    products = gemm_products(torch.device("cpu"), "fp32")
    assert len(products) == (2 if torch.backends.mkldnn.is_available() else 1)
    assert products.pop("torch.mm")(a, b).equal(a @ b)
    for product in products.values():
        out = product(a, b)
        assert torch.allclose(out.to_dense() if out.is_mkldnn else out, a @ b.T, atol=1e-4)
    assert list(gemm_products(torch.device("cpu"), "bf16")) == ["torch.mm"]  # oneDNN's already


def test_a_ceiling_above_the_estimate_raises_the_clock_and_keeps_the_estimate_s_inputs() -> None:
    estimate = cpu_peak("fp32", ZEN4)  # 2 x 2.60 GHz x 32 = 166 GFLOP/s, as on the Zen 4
    assert estimate is not None and estimate.flops == pytest.approx(166.4e9)
    raised = raised_to_ceiling(estimate, 206e9)
    assert raised.flops == 206e9 and raised.kind == "estimate"
    assert raised.inputs["clock_hz"] == pytest.approx(206e9 / (2 * 32))  # 3.22 GHz
    assert raised.inputs["estimated_clock_hz"] == 2.6e9 and raised.inputs["estimated_flops"] == estimate.flops
    assert "3.22 GHz (implied by the measured GEMM ceiling of 206.0 GFLOP/s" in raised.source
    assert "2.60 GHz from test, gives 166.4 GFLOP/s" in raised.source
    assert raised_to_ceiling(estimate, 100e9) is estimate  # a ceiling below the estimate proves nothing
    sheet = Peak(1e12, "datasheet: x")
    assert raised_to_ceiling(sheet, 2e12) is sheet  # a datasheet is not an estimate: flagged instead
    assert any("GEMM ceiling is 200%" in f for f in implausible(0.5, 0.5, 2e12, sheet))


def test_ranks_that_share_their_cpus_raise_the_host_s_peak_by_one_core_s_best() -> None:
    # two unbound ranks of one thread each on a 2-core host: each measured about one core's
    # ceiling; one core's 103 GFLOP/s on each of the 2 cores beats the host's estimate, which is
    # then raised to 206 and no longer flagged (each rank's ceiling over both cores would have
    # raised nothing)
    estimate = cpu_peak("fp32", ZEN4, use_store=False)  # 166.4 GFLOP/s for the host's 2 cores
    assert estimate is not None
    shared = [replace(rank(i, "a", [0, 1], estimate), gemm_ceiling_flops=103e9) for i in range(2)]
    peak = job_peak(torch.device("cpu"), 0.0, shared)
    assert peak is not None and peak.flops == pytest.approx(206e9)
    assert peak.inputs["clock_hz"] == pytest.approx(206e9 / (2 * 32))
    assert not implausible(0.5, 0.5, 206e9, peak)


def test_more_ranks_than_cores_never_sum_their_ceilings_beyond_the_cores() -> None:
    """issue 45: 8 ranks on 2 cores (dp=2,tp=2,pp=2) each measured one core's 95 GFLOP/s at
    its own moment; their sum, 758 GFLOP/s, is 3.6 times what the cores can do. The host's
    peak is raised at most to the 2 cores at the best one core showed."""
    estimate = cpu_peak("fp32", ZEN4, use_store=False)
    assert estimate is not None
    ranks = [replace(rank(i, "a", [0, 1], estimate), gemm_ceiling_flops=94.8e9) for i in range(8)]
    peak = job_peak(torch.device("cpu"), 0.0, ranks)
    assert peak is not None and peak.flops == pytest.approx(189.6e9)  # 2 cores x 94.8, not 8 x 94.8
    assert peak.inputs["clock_hz"] == pytest.approx(189.6e9 / (2 * 32))  # 2.96 GHz, not 11.85
    assert job_ceiling(torch.device("cpu"), ranks) == pytest.approx(189.6e9)  # the flag's ceiling too
    two_threads = [replace(r, threads=2) for r in ranks]  # each measured with both cores: 47.4 a core
    assert job_peak(torch.device("cpu"), 0.0, two_threads).flops == estimate.flops  # type: ignore[union-attr]


def test_every_precision_hpcdl_runs_has_a_peak_or_no_mfu() -> None:
    assert datasheet_peak("NVIDIA H100 80GB HBM3", "tf32") == Peak(
        494.7e12, "datasheet: NVIDIA H100 datasheet, SXM5"
    )
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", "tf32").flops == 156e12  # type: ignore[union-attr]
    assert datasheet_peak("Tesla V100-SXM2-32GB", "bf16") is None  # no bf16 units: no MFU, not a wrong one
    assert datasheet_peak("Tesla V100-SXM2-32GB", "tf32") is None
    for name, peaks, _ in DATASHEET_PEAKS:
        assert {"fp32", "fp16"} <= set(peaks), name
        if "tf32" in peaks and "bf16" in peaks:
            assert peaks["tf32"] == pytest.approx(peaks["bf16"] / 2, rel=0.02), name


def test_info_lists_tf32_where_a_gpus_datasheet_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hpcdl info`` on an H200 lists tf32 beside the precisions hpcdl trains in (the GPU's name
    is faked: no GPU here), on a CPU it does not; the tf32 probe restores cuBLAS's setting."""
    from hpcdl.cli import workloads as info

    monkeypatch.setattr("hpcdl.measure.peaks.gpu_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr("hpcdl.device.device_name", lambda device: "NVIDIA H200")
    rows = [line.split()[:3] for line in info.peaks_table(torch.device("cuda"), probe=False).splitlines()[2:]]
    assert rows == [["fp32", "66.9", "TFLOP/s"], ["bf16", "989", "TFLOP/s"], ["fp16", "989", "TFLOP/s"],
                    ["tf32", "495", "TFLOP/s"]]  # fmt: skip
    assert "tf32" not in info.peaks_table(torch.device("cpu"), probe=False)
    before = fp32_math()
    assert gemm_ceiling(torch.device("cpu"), "tf32", seconds=0.05, sizes=(64,)) > 0
    assert fp32_math() == before


def test_info_raises_a_cpu_estimate_its_ceiling_beats_and_flags_a_datasheet_it_beats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``hpcdl info --probe`` shows the peak a run would use: a CPU estimate below the measured
    ceiling raised to the clock the ceiling implies (no flag), a GPU's datasheet figure kept and
    flagged (the ceilings are given: the logic under test is the table's, not the probe's)."""
    from hpcdl.cli import workloads as info

    estimate = cpu_peak("fp32")
    if estimate is None:
        pytest.skip("no CPU clock to estimate from")
    monkeypatch.setattr("hpcdl.measure.peaks.gemm_ceiling", lambda device, prec: 2 * estimate.flops)
    fp32 = next(line for line in info.peaks_table(torch.device("cpu"), probe=True).splitlines()
                if line.startswith("fp32"))  # fmt: skip
    assert "implied by the measured GEMM ceiling" in fp32 and "100.0%" in fp32 and "(!)" not in fp32
    monkeypatch.setattr("hpcdl.measure.peaks.gpu_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr("hpcdl.device.device_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr("hpcdl.measure.peaks.gemm_ceiling", lambda device, prec: 2e15)
    bf16 = next(line for line in info.peaks_table(torch.device("cuda"), probe=True).splitlines()
                if line.startswith("bf16"))  # fmt: skip
    assert "989 TFLOP/s" in bf16 and "(!) above the theoretical peak" in bf16


def test_a_run_whose_ceiling_beats_the_estimate_records_the_implied_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    estimate = cpu_peak("fp32")
    if estimate is None:
        pytest.skip("this machine's clock cannot be read: no estimate to raise")
    # the one synthetic figure, at the function boundary: a ceiling 1.25x the estimate of the
    # cores the rank's threads occupy (the whole estimate where it has a thread per core)
    cores = estimate.inputs["cores"]
    measured = {}

    def ceiling(device: torch.device, precision: str, threads: int) -> float:
        measured["flops"] = 1.25 * estimate.flops * min(threads, cores) / cores
        return measured["flops"]

    monkeypatch.setattr(runner, "measured_ceiling", ceiling)
    spec = spec_from_dict({"family": "mlp", "layers": 1, "width": 64, "batch_size": 8})
    res = hpcdl.run(spec, RunConfig(steps=3, min_duration_s=0.0), output_dir=tmp_path, name="t")
    assert res.path is not None
    m = read_record(res.path).result.metrics  # through the file and the loader
    assert m.peak_flops == pytest.approx(1.25 * estimate.flops) and m.peak_kind == "estimate"
    assert m.peak_inputs["estimated_clock_hz"] == estimate.inputs["clock_hz"]
    assert m.peak_inputs["clock_hz"] == pytest.approx(1.25 * estimate.inputs["clock_hz"])
    assert "implied by the measured GEMM ceiling" in m.peak_source
    assert not any("GEMM ceiling is" in f for f in m.flags) and m.mfu <= 1
    assert m.measured_matmul_flops == pytest.approx(m.peak_flops)  # one core's best x the host's cores
    # where the memory goes: the estimate's parts at the batch that ran, and the measured peak
    parts, pool = m.memory.estimated, RunConfig().pool_batches  # the run keeps its pool of batches
    assert parts is not None and m.memory.measured is not None
    total = spec.memory_estimate(8, "adamw", pool_batches=pool)
    assert parts.total == total == sum(v for k, v in asdict(parts).items() if k != "total")
    assert parts.inputs == pool * 8 * spec.input_bytes() == pool * 8 * (1024 * 4 + 8)
    measured = m.memory.measured
    assert (measured.peak_bytes, measured.kind) == (m.peak_memory_bytes, m.peak_memory_kind)


def test_a_note_shared_by_every_workload_is_printed_once() -> None:
    notes = notes_once({"a": ["machine", "only a"], "b": ["machine"], "c": ["machine", "only c"]})
    assert notes == ["machine", "a: only a", "c: only c"]
    assert notes_once({"a": ["x"]}) == ["a: x"]
