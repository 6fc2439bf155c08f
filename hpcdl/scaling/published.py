"""Published scaling results and the inputs the scaling model predicts each from.

Each case is a published run: the cluster (devices per node, links, NICs), the model's gradient
bytes, the batch per device, the framework's reduction (buckets, algorithms) and one device's
rate. Where a source lacks a figure, the case says what was assumed and from where.
``benchmarks/bench_published.py`` prints published against predicted efficiency;
``tests/test_published.py`` keeps every case within the error its validation entry documents
(docs/validation/2026-11-25-published-results.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpcdl.parallel.backends import Traffic
from hpcdl.scaling.collectives import Comm, Hierarchy
from hpcdl.scaling.model import Model


@dataclass(frozen=True)
class Case:
    """One published result and the inputs it is predicted from."""

    name: str
    source: str
    published: float
    """the published scaling efficiency at ``nodes``"""
    params: float
    """parameters (fp32 gradients: 4 bytes each)"""
    images_per_s: float
    """one device's rate (the base)"""
    rate_source: str
    batch: int
    devices_per_node: int
    nodes: int
    base_nodes: int
    """efficiency is against ``base_nodes`` nodes (Horovod: one GPU, as 1/4 node; Goyal: one server)"""
    intra: Comm
    inter: Comm
    bucket_bytes: float
    algorithms: tuple[str, ...]
    cycle_s: float = 0.0
    explained: str = ""
    """why the error is what it is"""
    per_device_base: bool = False
    """efficiency against one device (Horovod's chart, TensorFlow's tables), not ``base_nodes``"""


# Horovod's 512-GPU benchmark (Sergeev & Del Balso, arXiv:1802.05799; horovod docs/benchmarks):
# 128 servers x 4 Pascal GPUs, RoCE 25 Gbit/s, tf_cnn_benchmarks, batch 64 per GPU, fp32,
# Horovod with NCCL 2 (rings only then: trees came in NCCL 2.4), 64 MB fusion buffer.
HOROVOD_2017_CYCLE_S = 5e-3
"""HOROVOD_CYCLE_TIME of the 2017 releases the benchmark ran (5 ms; 0.28.1 has 1 ms)"""
PCIE = Comm(alpha_s=2e-6, beta_bytes_per_s=10e9)
"""assumed: GPUs of a 2017 server talk over PCIe gen3 x16 (15.75 GB/s line rate), ~10 GB/s
achieved between two GPUs through a PCIe switch; 2 us per step"""
ROCE_25 = Comm(alpha_s=5e-6, beta_bytes_per_s=25e9 / 8 * 0.9)
"""25 Gbit/s (stated) at an assumed 90 % of the line rate; 5 us per step assumed (RDMA over
Ethernet through one switch)"""
HOROVOD = "Horovod README / docs/benchmarks (128 servers x 4 Pascal GPUs, RoCE 25 Gbit/s, batch 64)"
TF_P100 = "tensorflow.org/performance/benchmarks, DGX-1 P100, synthetic data"

# Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour" (arXiv:1706.02677):
# Big Basin servers, 8 P100 on NVLink, 50 Gbit Ethernet; ResNet-50, 32 images per GPU;
# Caffe2 + Gloo: recursive halving/doubling across servers, NCCL inside, the reduction
# overlapping backprop; "~90% scaling efficiency" from 8 to 256 GPUs.
NVLINK_P100 = Comm(alpha_s=1e-6, beta_bytes_per_s=4 * 20e9 * 0.8)
"""P100 SXM2: 4 NVLink 1 links x 20 GB/s per direction (NVIDIA P100 datasheet), at an
assumed 80 %; 1 us per step assumed"""
ETH_50 = Comm(alpha_s=10e-6, beta_bytes_per_s=50e9 / 8 * 0.9)
"""50 Gbit/s (stated) at an assumed 90 %; 10 us per step assumed (Gloo over TCP)"""


def horovod_512(
    name: str, published: float, params: float, images_per_s: float, rate_source: str, explained: str
) -> Case:
    """One of Horovod's 512-GPU runs: only the network, its published efficiency and one GPU's
    rate differ between them; the cluster and Horovod's settings are the same."""
    return Case(
        name=f"Horovod {name}, 512 GPUs",
        source=HOROVOD,
        published=published,
        params=params,
        images_per_s=images_per_s,
        rate_source=rate_source,
        batch=64,
        devices_per_node=4,
        nodes=128,
        base_nodes=1,
        intra=PCIE,
        inter=ROCE_25,
        bucket_bytes=64 * 2**20,
        algorithms=("ring",),
        cycle_s=HOROVOD_2017_CYCLE_S,
        explained=explained,
        per_device_base=True,
    )


CASES = (
    horovod_512(
        "Inception V3",
        0.90,
        23.8e6,
        142.0,
        TF_P100 + ", batch 64",
        "compute-bound: 95 MB of gradients behind 0.45 s of compute; what the model leaves out "
        "(TensorFlow's per-tensor negotiation, stragglers across 512 GPUs) is what is left",
    ),
    horovod_512(
        "ResNet-101",
        0.90,
        44.5e6,
        130.0,
        "assumed: interpolated by FLOPs (7.8 GFLOP) between ResNet-50's 219 and ResNet-152's 95 img/s ("
        + TF_P100
        + "; ResNet-101 is not in the table)",
        "as Inception V3: the communication hides behind backward but for the last bucket",
    ),
    horovod_512(
        "VGG-16",
        0.68,
        138.4e6,
        154.0,
        "154 img/s, " + TF_P100 + ", batch 64 (read from tensorflow/tensorflow's "
        "docs_src/performance/benchmarks.md; batch 32: 144)",
        "communication-bound: 553 MB of gradients, 0.4 s of ring at 25 Gbit/s against 0.28 s of "
        "backward; VGG's gradients come mostly from its fully connected layers, which backward "
        "reaches first, so the buckets start earlier than the model's even spread",
    ),
    Case(
        name="Goyal et al. ResNet-50, 8 -> 256 P100",
        source="Goyal et al. 2017, arXiv:1706.02677 (32 servers x 8 P100, NVLink, 50 Gbit Ethernet)",
        published=0.90,
        params=25.6e6,
        images_per_s=138.0,
        rate_source="the paper's own baseline: 90 epochs of 1.28 M images in 29 h on 8 GPUs",
        batch=32,
        devices_per_node=8,
        nodes=32,
        base_nodes=1,
        intra=NVLINK_P100,
        inter=ETH_50,
        bucket_bytes=25 * 2**20,
        algorithms=("hierarchical",),
        explained="the model sees 102 MB behind 0.23 s of compute at 5.6 GB/s: little exposed; "
        "the paper's 10 % loss includes data loading and stragglers, which the model leaves out",
    ),
)


# TensorFlow's own scaling tables (tensorflow.org/performance/benchmarks, May 2017, read from
# tensorflow/tensorflow's docs_src/performance/benchmarks.md; tf_cnn_benchmarks, synthetic data,
# fp32, 10 warm-up and 100 timed steps, 5 runs averaged): one DGX-1 (8 P100) and eight EC2
# p2.8xlarge (8 K80 GPUs each, 10 Gbit/s). The same rules for every case: each variable's
# reduction starts once its gradient exists (TensorFlow's dataflow), taken as 25 MiB buckets
# behind backward; a parameter server on the CPU, or across servers, costs what a ring
# allreduce over the same links would (an assumption: the model has no parameter server).
TF_TABLE = "tensorflow.org/performance/benchmarks (May 2017), tf_cnn_benchmarks, synthetic data"
ETH_10 = Comm(alpha_s=10e-6, beta_bytes_per_s=10e9 / 8 * 0.9)
"""EC2 p2.8xlarge's 10 Gbit/s (AWS's instance table) at an assumed 90 %; 10 us per step
assumed (TCP through the VPC)"""


def tf_case(
    name: str,
    published: float,
    params: float,
    rate: float,
    batch: int,
    nodes: int,
    devices: int,
    **links: Any,
) -> Case:
    """One row of TensorFlow's tables: ``published`` = rate at ``nodes × devices`` GPUs over
    that many times the one-GPU ``rate``."""
    return Case(
        name=name,
        source=TF_TABLE,
        published=published,
        params=params,
        images_per_s=rate,
        rate_source=f"{TF_TABLE}, 1 GPU, batch {batch}",
        batch=batch,
        devices_per_node=devices,
        nodes=nodes,
        base_nodes=1,
        bucket_bytes=25 * 2**20,
        algorithms=("ring", "hierarchical"),
        per_device_base=True,
        **links,
    )


DGX1_P100 = {"intra": PCIE, "inter": PCIE}
"""one DGX-1: inter is never used; its GPUs reduce through the CPU (parameter_server, cpu) or
NCCL on NVLink (replicated: VGG16)"""
EC2_K80 = {"intra": PCIE, "inter": ETH_10}
TABLES = (
    tf_case("TF DGX-1 Inception V3, 8 P100", 1131 / (8 * 142), 23.8e6, 142.0, 64, 1, 8, **DGX1_P100),
    tf_case("TF DGX-1 ResNet-50, 8 P100", 1734 / (8 * 219), 25.6e6, 219.0, 64, 1, 8, **DGX1_P100),
    tf_case("TF DGX-1 ResNet-152, 8 P100", 716 / (8 * 91.8), 60.2e6, 91.8, 64, 1, 8, **DGX1_P100),
    tf_case(
        "TF DGX-1 VGG16, 8 P100",
        1081 / (8 * 154),
        138.4e6,
        154.0,
        64,
        1,
        8,
        intra=NVLINK_P100,
        inter=NVLINK_P100,
    ),  # fmt: skip
    tf_case("TF EC2 Inception V3, 8 x 8 K80", 1783 / (64 * 29.7), 23.8e6, 29.7, 64, 8, 8, **EC2_K80),
    tf_case("TF EC2 ResNet-50, 8 x 8 K80", 2744 / (64 * 52.4), 25.6e6, 52.4, 64, 8, 8, **EC2_K80),
    tf_case("TF EC2 ResNet-152, 8 x 8 K80", 981 / (64 * 19.4), 60.2e6, 19.4, 32, 8, 8, **EC2_K80),
)
"""TensorFlow's single-node and multi-node tables, held against with the losses and without"""

GPU_STEP_CV = 0.0028
"""one GPU's step-time spread σ/μ where no published run gives one: the median of
``metrics.step_cv`` over hpcdl's class M records on one H200 (reference_results/
h200-2026-11-27/suite-M-bf16; tests/test_published.py recomputes it), steps of 0.4-1.1 s as
the published runs' are"""
SYNC_CALLS = 1
"""the ranks' agreement on each step: one latency-bound allreduce (the same for every case)"""


def model_of(case: Case, overlap: str = "bucketed", losses: bool = False) -> tuple[Model, int]:
    """The case's model (γ as samples/s: one FLOP per sample) and its ranks per node; with
    ``losses``, a straggler of ``GPU_STEP_CV`` and ``SYNC_CALLS`` synchronisations a step (data
    loading: none, as the synthetic data of the sources)."""
    grad_bytes = 4 * case.params
    buckets = max(1, math.ceil(grad_bytes / case.bucket_bytes))
    cost = Hierarchy(
        intra=case.intra,
        inter=case.inter,
        ranks_per_node=case.devices_per_node,
        algorithms=case.algorithms,
    )
    model = Model(
        train_flops_per_sample=1.0,
        batch=case.batch,
        gamma_flops_per_s=case.images_per_s,
        comms={"allreduce": cost},
        traffic=(Traffic("allreduce", int(grad_bytes), buckets),),
        cycle_s=case.cycle_s,
        overlap=overlap,
        step_cv=GPU_STEP_CV if losses else 0.0,
        sync_calls=SYNC_CALLS if losses else 0,
        ranks_per_node=case.devices_per_node,
    )
    return model, case.devices_per_node


def predicted_efficiency(case: Case, overlap: str = "bucketed", losses: bool = False) -> float:
    """Samples/s at ``nodes`` against ``nodes / base_nodes`` times those at ``base_nodes``
    (Horovod, TensorFlow: against one GPU); ``losses``: the model's terms besides
    communication, by the rule of ``model_of``."""
    model, rpn = model_of(case, overlap, losses)
    p = case.nodes * rpn
    if case.per_device_base:
        return model.samples_per_s(p) / (p * model.samples_per_s(1))
    base = case.base_nodes * rpn
    return model.samples_per_s(p) / (p / base * model.samples_per_s(base))
