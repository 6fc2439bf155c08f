"""Capacity: concurrent instances in one MPI job. Placement on cores, GPUs and MIG devices (MIG
found through the telemetry tests' fake NVML), layouts that do not fit refused in one line, and
real runs whose summary follows from the instances' records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl
from test_schedulers import write_job
from test_telemetry import FakeNvml

from hpcdl import metrics
from hpcdl.errors import InputError
from hpcdl.harness import capacity
from hpcdl.harness.capacity import Gpu, Layout, place_node
from hpcdl.records import schema
from hpcdl.records.audit import audit
from hpcdl.records.loader import read_record
from hpcdl.schedulers.status import status


class MigNvml(FakeNvml):
    """The fake NVML with GPU UUIDs and MIG: ``migs[i]`` MIG devices on GPU i (0: MIG off;
    None: a GPU without MIG support, which answers NOT_SUPPORTED)."""

    def __init__(self, migs: list[int | None]) -> None:
        super().__init__()
        self.migs = migs

    def nvmlDeviceGetCount(self) -> int:
        return len(self.migs)

    def nvmlDeviceGetUUID(self, handle: str) -> bytes:
        return f"GPU-{handle}".encode() if "/" not in handle else f"MIG-{handle}".encode()

    def nvmlDeviceGetMigMode(self, handle: str) -> tuple[int, int]:
        n = self.migs[int(handle.removeprefix("gpu"))]
        if n is None:
            raise self.NVMLError("Not Supported")
        return (1, 1) if n else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: str) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: str, index: int) -> str:
        if index >= (self.migs[int(handle.removeprefix("gpu"))] or 0):
            raise self.NVMLError("Not Found")
        return f"{handle}/{index}"


def test_layouts_that_cannot_be_made_are_refused() -> None:
    for args, field in [
        ((0, 1, 1), "instances"),
        ((2, 0, 1), "ranks-per-instance"),
        ((4, 1, 3), "per-device"),
    ]:
        with pytest.raises(InputError, match=f"^{field}="):
            Layout(*args)
    with pytest.raises(InputError, match="per-device=3 .* divisor of --instances 2"):
        Layout(2, 1, 3)


def test_cpu_cores_are_split_among_devices_and_shared_by_co_located_instances() -> None:
    alone = place_node(Layout(2, 2), range(4), "n1", range(8), None)
    assert [(p.instance, p.cpus, p.threads) for p in alone] == [
        (0, [0, 1], 2),
        (0, [2, 3], 2),
        (1, [4, 5], 2),
        (1, [6, 7], 2),
    ]
    shared = place_node(Layout(4, 1, per_device=2), range(4), "n1", range(8), None)
    assert [(p.instance, p.cpus, p.threads) for p in shared] == [
        (0, [0, 1, 2, 3], 2),
        (1, [0, 1, 2, 3], 2),  # instances 0 and 1 share a device: its cores, half the threads each
        (2, [4, 5, 6, 7], 2),
        (3, [4, 5, 6, 7], 2),
    ]
    with pytest.raises(InputError, match="4 devices of cores needed on n1 .* 2 cores there"):
        place_node(Layout(4, 1), range(4), "n1", [0, 1], None)


def test_gpus_are_shared_or_split_into_mig_devices() -> None:
    gpus = capacity.gpu_inventory(MigNvml([None, 0]))
    assert gpus == [Gpu("GPU-gpu0"), Gpu("GPU-gpu1")]
    assert "MIG is absent: 2 instances share each GPU" in capacity.mig_note(gpus, 2)
    shared = place_node(Layout(4, 1, per_device=2), range(4), "n1", [], gpus)
    assert [p.visible for p in shared] == ["GPU-gpu0", "GPU-gpu0", "GPU-gpu1", "GPU-gpu1"]
    migs = capacity.gpu_inventory(MigNvml([3, 2]))
    assert migs == [
        Gpu("GPU-gpu0", ("MIG-gpu0/0", "MIG-gpu0/1", "MIG-gpu0/2")),
        Gpu("GPU-gpu1", ("MIG-gpu1/0", "MIG-gpu1/1")),
    ]
    assert "MIG: each instance on a MIG device of its own" in capacity.mig_note(migs, 2)
    placed = place_node(Layout(4, 1, per_device=2), range(4), "n1", [], migs)
    assert [p.visible for p in placed] == ["MIG-gpu0/0", "MIG-gpu0/1", "MIG-gpu1/0", "MIG-gpu1/1"]
    with pytest.raises(InputError, match="has 2 MIG devices"):
        place_node(Layout(3, 1, per_device=3), range(3), "n1", [], migs[1:])
    with pytest.raises(InputError, match="2 GPUs needed on n1 .* 1 there"):
        place_node(Layout(2, 1), range(2), "n1", [], gpus[:1])


def test_the_inventory_keeps_to_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert capacity.gpu_inventory(MigNvml([0, 0, 0])) == [Gpu("GPU-gpu1")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-gpu2,0")
    assert capacity.gpu_inventory(MigNvml([0, 0, 0])) == [Gpu("GPU-gpu0"), Gpu("GPU-gpu2")]


def test_capacity_figures() -> None:
    fig = metrics.capacity([100, 300], [1e3, 3e3], [10.0, 10.5], [12.0, 14.0])
    assert fig == {
        "total_samples": 400,
        "total_flops": 4e3,
        "wall_s": 4.0,
        "samples_per_s": 100.0,
        "ai_ops_per_s": 1e3,
    }
    assert metrics.slowdown(200.0, 100.0) == 2.0


TINY = ["--workload", "mlp", "layers=2", "width=64", "input_size=32", "output_size=16", "batch_size=16"]


ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--instances", "0"], "instances=0 is invalid"),
        (["--instances", "2", "--per-device", "3"], "per-device=3 is invalid"),
        (["--instances", "3"], "3 devices of cores needed"),  # 2 cores here
        (["--instances", "2", "--ranks-per-instance", "2"], "4 devices of cores needed"),
        (["--instances", "x"], "invalid int value"),
        (["--instances", "2", "width=100000", "batch_size=1000000"], "estimated memory"),
    ],
)
def test_layouts_that_do_not_fit_are_one_line(args: list[str], why: str, tmp_path: Path) -> None:
    p = hpcdl("capacity", *TINY, *args, "-o", str(tmp_path / "never"))
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and why in lines[0], p.stderr
    assert not (tmp_path / "never").exists()


def check_summary(out: Path, name: str, instances: int) -> dict:
    summary = json.loads((out / f"{name}-capacity.json").read_text())
    assert summary["schema"] == schema.CAPACITY
    views = [read_record(out / f"{name}-i{i}.json") for i in range(instances)]
    alone = read_record(out / f"{name}-alone.json")
    assert all(not audit(r).problems for r in [*views, alone])
    results = [r.result for r in views]
    assert [r.spec["seed"] for r in results] == list(range(instances))  # each its own seed
    samples = [r.metrics.timed_steps * r.settings.global_batch for r in results]
    starts = [r.metrics.window_start_unix for r in results]
    ends = [r.metrics.window_end_unix for r in results]
    assert summary["total_samples"] == sum(samples)
    assert summary["wall_s"] == pytest.approx(max(ends) - min(starts), rel=1e-12)  # type: ignore[type-var,operator]
    assert summary["samples_per_s"] == pytest.approx(sum(samples) / summary["wall_s"], rel=1e-12)
    x0 = alone.result.metrics.samples_per_s
    for row, r in zip(summary["instances"], results, strict=True):
        assert row["slowdown"] == pytest.approx(x0 / r.metrics.samples_per_s, rel=1e-12)
    assert max(starts) - min(starts) < 1.0  # type: ignore[type-var,operator]  # one barrier before timing
    return summary


@pytest.mark.mpi
@pytest.mark.slow(reason="two MPI instances, each measured alone and together")
def test_two_instances_on_their_own_cores(tmp_path: Path) -> None:
    p = hpcdl("capacity", *TINY, "--instances", "2", "--duration", "2", "-o", str(tmp_path), env=ONE_THREAD)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = check_summary(tmp_path, "capacity", 2)
    cpus = [tuple(x["cpus"]) for x in summary["placement"]]
    assert len(set(cpus)) == 2 and all(len(c) == 1 for c in cpus)  # 2 cores: one each
    assert "samples/s" in p.stdout and "slowdown" in p.stdout


@pytest.mark.mpi
@pytest.mark.slow(reason="four ranks of Horovod on two cores")
def test_co_located_instances_of_two_horovod_ranks(tmp_path: Path) -> None:
    """Two instances of two ranks each, both on the same two cores (per device 2): each
    instance's Horovod is its own, on its own communicator."""
    p = hpcdl(
        "capacity",
        *TINY,
        "--instances",
        "2",
        "--ranks-per-instance",
        "2",
        "--per-device",
        "2",
        "--backend",
        "horovod",
        "--steps",
        "30",
        "--min-duration",
        "0",
        "--name",
        "hv",
        "-o",
        str(tmp_path),
        env=ONE_THREAD,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    summary = check_summary(tmp_path, "hv", 2)
    by_rank = {x["rank"]: x for x in summary["placement"]}
    assert by_rank[0]["cpus"] == by_rank[2]["cpus"] and by_rank[1]["cpus"] == by_rank[3]["cpus"]
    assert by_rank[0]["cpus"] != by_rank[1]["cpus"]
    for i in range(2):
        r = read_record(tmp_path / f"hv-i{i}.json").result
        assert r.world_size == 2 and r.settings.backend == "horovod" and r.validity.passed


# --- a job file: capacity in one allocation (--executor local here; Slurm runs the same entry) ---


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (
            {"instances": 3, "tasks_per_node": 2},
            "job.instances=3 is invalid: must divide the 2 ranks of 1 node",
        ),
        ({"instances": 2, "tasks_per_node": 2, "per_device": 3}, "job.per_device=3 is invalid"),
        ({"instances": 2, "tasks_per_node": 2, "repeat": 2}, "job.repeat=2 is invalid"),
        ({"instances": 0}, "job.instances=0 is invalid"),
    ],
)
def test_job_files_with_instances_that_cannot_be_are_one_line(tmp_path: Path, fields: dict, why: str) -> None:
    f = write_job(tmp_path / "bad.toml", name="bad", output=str(tmp_path / "never"), **fields)
    p = hpcdl("submit", str(f), "--executor", "local", "--dry-run")
    assert p.returncode == 2 and why in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.mpi
@pytest.mark.slow(reason="a job of two instances through submitit's local executor")
def test_a_job_file_runs_its_instances_in_one_allocation(tmp_path: Path) -> None:
    f = write_job(
        tmp_path / "cap.toml", name="cap", nodes=[1], tasks_per_node=2, instances=2, output=str(tmp_path)
    )
    dry = hpcdl("submit", str(f), "--executor", "local", "--dry-run")
    assert dry.returncode == 0 and "mpirun -np 2" in dry.stdout, dry.stdout + dry.stderr
    p = hpcdl("submit", str(f), "--executor", "local", timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    check_summary(tmp_path, "cap-n1", 2)
    (row,) = status(tmp_path)
    assert row.state == "done"  # the point's records are all there
    again = hpcdl("submit", str(f), "--executor", "local", timeout=600)
    assert "valid record" in again.stdout and "not submitted" in again.stdout, again.stdout
