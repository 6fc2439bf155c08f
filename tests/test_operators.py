"""``hpcdl run --profile``: steps profiled after the timed window, their time and FLOPs by operator
class per phase (``measure.profiled``, the classifier ``measure.kernels`` that ``hpcdl profile``
shares). Real runs of a tiny spec of every family, read against the profiler's own operators and
against ``FlopCounterMode``; one run across two ranks for the communication class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import Cluster  # beside this file, on pytest's path
from hpcdl_cli import hpcdl, one_line
from tiny import TINY  # beside this file, on pytest's path

import hpcdl as api
from hpcdl.measure import kernels
from hpcdl.measure.config import RunConfig
from hpcdl.records.store import read_steps
from hpcdl.records.views import Operators
from hpcdl.workloads.crosscheck import counted_flops
from hpcdl.workloads.registry import FAMILIES

EXPECTED = {  # the class each family's products are, which its forward FLOPs must hold
    "mlp": ["gemm"],
    "cnn": ["convolution"],
    "rnn": ["recurrent"],
    "attention": ["attention", "gemm"],
    "speech": ["convolution", "recurrent"],
}
PHASES = ["data", "forward", "backward", "allreduce", "optimizer"]
PROFILED = 2


def profiled(family: str, **changes: object) -> tuple[api.Spec, Operators]:
    spec = api.spec_from_dict({"family": family, **TINY[family], **changes})
    cfg = RunConfig(steps=4, warmup_steps=1, min_duration_s=0.0, data="random", profile_steps=PROFILED)
    metrics = api.run(spec, cfg, output_dir=None).result.metrics
    operators = metrics.operators
    assert operators is not None
    # the step's shares: each phase's class shares weighed by its median in the timed window
    medians = {p: metrics.phases_s[p].median for p in operators.phases}
    for cls, share in operators.time_share.items():
        weighed = sum(medians[p] * ph.time_share[cls] for p, ph in operators.phases.items())
        assert share == pytest.approx(weighed / sum(medians.values()), abs=1e-9), cls
    return spec, operators


def test_every_family_has_a_tiny_spec_here() -> None:
    assert set(TINY) == {name for name in FAMILIES if name in EXPECTED}


@pytest.mark.parametrize("family", sorted(TINY))
def test_the_shares_sum_to_one_in_every_phase_of_every_family(family: str) -> None:
    spec, ops = profiled(family)
    assert ops.steps == PROFILED and ops.basis == "CPU self time"
    assert list(ops.phases) == PHASES
    for name, phase in ops.phases.items():
        assert set(phase.time_share) == set(kernels.CLASSES), name
        assert sum(phase.time_share.values()) == pytest.approx(1.0), (name, phase.time_share)
        assert phase.time_s >= 0 and phase.outside_ops_s >= 0
        if phase.flops > 0:
            assert sum(phase.flop_share.values()) == pytest.approx(1.0), (name, phase.flop_share)
        else:
            assert phase.flop_share == {}
    assert ops.phases["data"].time_share["data"] == 1.0  # loading a batch is the phase's whole job
    assert ops.phases["optimizer"].time_share["optimizer"] > 0.9
    assert sum(ops.time_share.values()) == pytest.approx(1.0)
    assert sum(ops.flop_share.values()) == pytest.approx(1.0)
    # the phases' FLOPs are the counter's of one training step, which the analytic count matches
    forward, total = counted_flops(spec)
    assert ops.phases["forward"].flops == pytest.approx(forward * spec.batch_size, rel=1e-6)
    assert ops.phases["forward"].flops + ops.phases["backward"].flops == pytest.approx(
        total * spec.batch_size, rel=1e-6
    )
    for cls in EXPECTED[family]:  # the products the family is made of, by FLOPs and by time
        assert ops.phases["forward"].flop_share[cls] > 0, (cls, ops.phases["forward"].flop_share)
        assert ops.phases["forward"].time_share[cls] > 0, (cls, ops.phases["forward"].time_share)


def test_the_top_operators_are_the_profilers_with_their_class_and_phase() -> None:
    _, ops = profiled("cnn")
    assert 0 < len(ops.top) <= 10
    times = [t.self_s for t in ops.top]
    assert times == sorted(times, reverse=True)
    assert all(t.op_class in kernels.CLASSES and t.phase in PHASES for t in ops.top)
    assert all(t.calls > 0 and 0 < t.share <= 1 for t in ops.top)
    assert sum(t.share for t in ops.top) <= 1 + 1e-9  # shares of the same whole
    top = {(t.name, t.phase): t.op_class for t in ops.top}
    assert top.get(("aten::convolution_backward", "backward")) == "convolution", top


def test_a_profiled_run_times_the_same_window_as_an_unprofiled_one(tmp_path: Path) -> None:
    """Profiling comes after the window: the record has the same figures, plus ``operators``,
    and the steps file holds the timed steps only."""
    common = ["run", "--workload", "mlp", *[f"{k}={v}" for k, v in TINY["mlp"].items()], "--steps", "5"]
    common += ["--data", "random", "--min-duration", "0"]
    for name, extra in (("plain", []), ("profiled", ["--profile", "2"])):
        assert hpcdl(*common, *extra, "--name", name, "-o", str(tmp_path)).returncode == 0
    plain, profiled_ = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("plain", "profiled"))
    assert set(profiled_["metrics"]) - set(plain["metrics"]) == {"operators"}
    assert profiled_["metrics"]["timed_steps"] == plain["metrics"]["timed_steps"] == 5
    assert profiled_["metrics"]["operators"]["steps"] == 2 and "operators" not in plain["metrics"]
    assert profiled_["validity"]["checks"][0]["name"] == plain["validity"]["checks"][0]["name"]
    (steps_file,) = tmp_path.glob("profiled.*.steps.h5")
    assert len(read_steps(steps_file)["step_s"]) == 5


@pytest.mark.parametrize(("value", "allowed"), [("0x", "integer"), ("-1", "[0, 100]"), ("101", "[0, 100]")])
def test_a_bad_profile_count_is_one_line(tmp_path: Path, value: str, allowed: str) -> None:
    out = tmp_path / "out"
    line = one_line(hpcdl("run", "--workload", "mlp", f"--profile={value}", "-o", str(out)))
    assert "profile_steps" in line and allowed in line
    assert not out.exists()


def test_profiling_a_pipeline_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = hpcdl("run", "--workload", "mlp", "--np", "2", "--layout", "pp=2", "--profile", "-o", str(out))
    assert "pp > 1" in one_line(p) and not out.exists()


@pytest.mark.mpi
@pytest.mark.usefixtures("on_cluster")
def test_two_ranks_give_their_collectives_the_communication_class(cluster: Cluster, tmp_path: Path) -> None:
    words = [f"{k}={v}" for k, v in TINY["mlp"].items()]
    p = hpcdl(
        "run", "--workload", "mlp", *words, "--np", "2", "--backend", "torch", "--steps", "4",
        "--min-duration", "0", "--data", "random", "--profile", "2", "--name", "two", "-o", str(tmp_path),
        env=cluster.environ(),
    )  # fmt: skip
    assert p.returncode in (0, 1), p.stderr[-3000:]  # a disturbed machine may fail validity
    ops = json.loads((tmp_path / "two.json").read_text())["metrics"]["operators"]
    # DDP reduces buckets during backward; what is left is waited for in the allreduce phase
    assert ops["phases"]["backward"]["time_share"]["communication"] > 0
    assert ops["phases"]["allreduce"]["time_share"]["communication"] > 0.5
    assert any(t["op_class"] == "communication" for t in ops["top"]) or ops["time_share"]["communication"] > 0


@pytest.mark.gpu
def test_on_a_gpu_the_shares_are_the_kernels_device_time_and_nvml_samples_memory_utilisation() -> None:
    spec = api.spec_from_dict({"family": "cnn", **TINY["cnn"], "batch_size": 32})
    cfg = RunConfig(
        steps=20, warmup_steps=3, min_duration_s=0.0, data="random", profile_steps=PROFILED, device="cuda"
    )
    result = api.run(spec, cfg, output_dir=None).result
    ops = result.metrics.operators
    assert ops is not None and ops.basis == "device time (CUPTI)"
    for name, phase in ops.phases.items():
        assert sum(phase.time_share.values()) == pytest.approx(1.0), name
    assert ops.phases["forward"].time_share["convolution"] > 0  # cuDNN's kernels, timed on the device
    gpu = result.metrics.energy.per_rank[0]["gpu"]
    if gpu["available"]:  # NVML's memory utilisation beside the GPU's, over the timed window
        assert 0 <= gpu["avg_mem_util_pct"] <= 100 and 0 <= gpu["avg_util_pct"] <= 100


def test_a_gpu_kernel_is_counted_once_with_its_launcher() -> None:
    """The profiler lists each CUDA kernel as an event of its own besides adding its time to the
    operator that launched it: the classifier counts it there only."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name: str, device: DeviceType, own: float) -> SimpleNamespace:
        return SimpleNamespace(name=name, device_type=device, cpu_parent=None, cpu_children=[],
                               self_device_time_total=own, self_cpu_time_total=0.0)  # fmt: skip

    launcher = event("aten::mm", DeviceType.CPU, 900.0)  # its kernel's 900 us
    kernel = event("ampere_sgemm_128x64_nn", DeviceType.CUDA, 900.0)
    found = kernels.classify([launcher, kernel], torch.device("cuda"))
    assert [(c.cls, c.seconds) for c in found] == [("gemm", 900e-6)]
    assert kernels.time_shares([launcher, kernel], torch.device("cuda"))["gemm"] == 1.0
