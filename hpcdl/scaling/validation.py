"""The validation set: published points, the calibration split, the fits, the errors by regime.

Every point is a published figure with its source and the inputs as published
(``hpcdl.scaling.published`` holds the clusters and what is assumed where a source is silent).
The split is a rule fixed before any comparison (docs/validation/2026-12-07-validation-set.md):

- a source that gives one run at several sizes (a sweep) lends every other size, starting with
  its smallest, to calibration; the other sizes are judged;
- a source of one size only (Horovod's 512-GPU figures, Goyal et al.'s 256) is judged whole.

What the calibration points fit, and nothing else:

- per group of runs (one framework's reduction on one cluster), the achieved fraction ``eta`` of
  the bandwidths the case assumes (the devices' achieved bandwidth against the link's nominal);
  TensorFlow 2017's reductions (parameter servers, replicated variables) are taken as not hidden
  behind backward (``overlap="none"``: the variables are pulled before the next forward);
- Megatron-LM's one GPU's rate as a function of the hidden size, ``gamma(h) = g·h/(h + h0)``:
  the GEMMs grow with ``h²`` per token, the memory-bound element-wise work with ``h``.

A group without calibration points keeps the assumptions of its case (``eta = 1``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache

from hpcdl.parallel.backends import Traffic
from hpcdl.scaling.band import regime_of
from hpcdl.scaling.collectives import Hierarchy
from hpcdl.scaling.model import Model, system_comms
from hpcdl.scaling.modelparallel import Activations, Layout, ModelParallel
from hpcdl.scaling.published import (
    CASES,
    DGX1_P100,
    EC2_K80,
    NVLINK_P100,
    Case,
    predicted_efficiency,
    tf_case,
)
from hpcdl.scaling.system import load_system

CALIBRATE, JUDGE = "calibrate", "judge"
DATA_ONE, DATA_FEW, DATA_MANY, MODEL_PARALLEL = (
    "data, one node",
    "data, 2-16 nodes",
    "data, 32+ nodes",
    "tensor + pipeline",
)
REGIMES = (DATA_ONE, DATA_FEW, DATA_MANY, MODEL_PARALLEL)
"""the names ``hpcdl.scaling.band.regime_of`` gives"""


@dataclass(frozen=True)
class Point:
    """One published figure, what it is predicted from, and its place in the split."""

    name: str
    source: str
    published: float
    """the published figure: scaling efficiency, or (Megatron-LM) TFLOP/s per GPU"""
    unit: str
    """"efficiency" or "TFLOP/s per GPU\""""
    group: str
    """the runs that share one fitted term"""
    split: str
    regime: str
    ranks: int
    assumed: str
    """what the model assumes where the source is silent"""


# --- data-parallel CNNs: TensorFlow's tables, Horovod, Goyal et al. ------------------------------

TF_DGX1 = "tensorflow.org/performance/benchmarks (May 2017), DGX-1 P100, synthetic data, batch 64"
TF_EC2 = "tensorflow.org/performance/benchmarks (May 2017), EC2 p2.8xlarge distributed, synthetic data"
READ = (
    "read through the search tool from tensorflow/tensorflow's tensorflow/docs_src/performance/benchmarks.md"
)
PS_ASSUMED = (
    "a parameter server costs what a ring over the same links would; 25 MiB buckets; "
    "the reduction not hidden behind backward (overlap none)"
)

# (model, parameters, one GPU's img/s, img/s at 2, 4, 8 GPUs): the DGX-1 table (batch 64)
DGX1_ROWS = (
    ("Inception V3", 23.8e6, 142.0, (284.0, 569.0, 1131.0), "ps"),
    ("ResNet-50", 25.6e6, 219.0, (422.0, 852.0, 1734.0), "ps"),
    ("ResNet-152", 60.2e6, 91.8, (181.0, 356.0, 716.0), "ps"),
    ("VGG16", 138.4e6, 154.0, (295.0, 584.0, 1081.0), "nccl"),
    ("AlexNet", 61.1e6, 2987.0, (5658.0, 10509.0, 17822.0), "nccl"),
)
"""AlexNet's batch is 512 (the table's options); its 61.1 M parameters are torchvision's count"""
# (model, parameters, one GPU, img/s at 8, 16, 32, 64 GPUs, batch): the distributed EC2 table
EC2_ROWS = (
    ("Inception V3", 23.8e6, 29.7, (229.0, 459.0, 902.0, 1783.0), 64),
    ("ResNet-50", 25.6e6, 52.4, (378.0, 751.0, 1388.0, 2744.0), 64),
    ("ResNet-152", 60.2e6, 19.4, (146.0, 291.0, 565.0, 981.0), 32),
)


def _alternate(i: int) -> str:
    return CALIBRATE if i % 2 == 0 else JUDGE


def cnn_cases() -> list[tuple[Case, str, str, str]]:
    """(case, group, split, regime) of every data-parallel CNN point."""
    out: list[tuple[Case, str, str, str]] = []
    for model, params, one, rates, kind in DGX1_ROWS:
        links = DGX1_P100 if kind == "ps" else {"intra": NVLINK_P100, "inter": NVLINK_P100}
        batch = 512 if model == "AlexNet" else 64
        for i, (gpus, rate) in enumerate(zip((2, 4, 8), rates, strict=True)):
            case = tf_case(
                f"TF DGX-1 {model}, {gpus} P100", rate / (gpus * one), params, one, batch, 1, gpus, **links
            )
            case = replace(case, source=TF_DGX1, devices_per_node=gpus)
            out.append((case, f"tf-dgx1-{kind}", _alternate(i), DATA_ONE))
    for model, params, one, ec2_rates, batch_of in EC2_ROWS:
        for i, (gpus, rate) in enumerate(zip((8, 16, 32, 64), ec2_rates, strict=True)):
            nodes = gpus // 8
            case = tf_case(
                f"TF EC2 {model}, {nodes} x 8 K80",
                rate / (gpus * one),
                params,
                one,
                batch_of,
                nodes,
                8,
                **EC2_K80,
            )
            out.append((replace(case, source=TF_EC2), "tf-ec2", _alternate(i), regime_of(nodes, False)))
    for case in CASES:  # one size each: judged whole
        out.append((case, case.source.split(" ")[0].lower(), JUDGE, DATA_MANY))
    return out


def cnn_predicted(case: Case, group: str, eta: float) -> float:
    """A CNN point's efficiency with the group's achieved bandwidth fraction ``eta``."""
    scaled = replace(
        case,
        intra=replace(case.intra, beta_bytes_per_s=case.intra.beta_bytes_per_s * eta),
        inter=replace(case.inter, beta_bytes_per_s=case.inter.beta_bytes_per_s * eta),
    )
    overlap = "none" if group.startswith("tf-") else "bucketed"
    return predicted_efficiency(scaled, overlap, losses=True)


# --- tensor- and pipeline-parallel GPT: Megatron-LM's Table 1 -------------------------------------

MEGATRON = (
    "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using "
    "Megatron-LM (arXiv:2104.04473), Table 1: Selene, DGX A100 80 GB nodes, seq 2048, vocab 51,200"
)
MEGATRON_READ = (
    "read through the search tool: SotaroKaneda/MLCarbon data/megatron_table.csv and public notes "
    "of the paper, which agree row by row"
)
# (billions of parameters, hidden, layers, tp, pp, GPUs, batch, published TFLOP/s per GPU)
MEGATRON_ROWS = (
    (1.7, 2304, 24, 1, 1, 32, 512, 137.0),
    (3.6, 3072, 30, 2, 1, 64, 512, 138.0),
    (7.5, 4096, 36, 4, 1, 128, 512, 142.0),
    (18.4, 6144, 40, 8, 1, 256, 1024, 135.0),
    (39.1, 8192, 48, 8, 2, 512, 1536, 138.0),
    (76.1, 10240, 60, 8, 4, 1024, 1792, 140.0),
    (145.6, 12288, 80, 8, 8, 1536, 2304, 148.0),
    (310.1, 16384, 96, 8, 16, 1920, 2160, 155.0),
    (529.6, 20480, 105, 8, 35, 2520, 2520, 163.0),
    (1008.0, 25600, 128, 8, 64, 3072, 3072, 163.0),
)
SEQ, VOCAB = 2048, 51200
MEGATRON_ASSUMED = (
    "DGX A100 as hpcdl's dgx-a100 system file; micro-batch 1; 1F1B without interleaving (the model "
    "prices no interleaved schedule); activation recomputation: 6 tensor-parallel allreduces of "
    "s·h bf16 values per layer and micro-batch; fp32 gradients reduced once after the flush"
)


@dataclass(frozen=True)
class Gpt:
    billions: float
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    published: float

    @property
    def flops(self) -> float:
        """The paper's Eq. 3: FLOPs of one iteration, recomputation's extra forward included."""
        h, lay = self.hidden, self.layers
        return 96 * self.batch * SEQ * lay * h**2 * (1 + SEQ / (6 * h) + VOCAB / (16 * lay * h))


@cache
def _dgx_a100() -> dict[str, Hierarchy]:
    return {k: v for k, v in system_comms(load_system("dgx-a100"), 8).items() if isinstance(v, Hierarchy)}


def gpt_model(row: Gpt, gamma: float) -> Model:
    """The row's model at ``gamma`` FLOP/s per GPU."""
    comms = _dgx_a100()
    dp = row.gpus // (row.tp * row.pp)
    per_replica = row.batch // dp
    layout = Layout(tp=row.tp, pp=row.pp, microbatches=per_replica if row.pp > 1 else 0)
    boundary = 2 * SEQ * row.hidden  # one sample's activations in bf16
    calls = 6 * row.layers
    mp = ModelParallel(
        layout=layout,
        activations=Activations(
            bytes_per_sample=boundary, layers=row.layers, tp_calls=calls, tp_bytes_per_sample=calls * boundary
        ),
        intra=comms["allreduce"].intra,
        inter=comms["allreduce"].inter,
        ranks_per_node=8,
    )
    return Model(
        train_flops_per_sample=row.flops / row.batch,
        batch=per_replica,
        gamma_flops_per_s=gamma,
        comms=dict(comms),
        traffic=(Traffic("allreduce", int(4 * row.billions * 1e9), 1),),
        parallel=mp,
        ranks_per_node=8,
    )


def gpt_predicted(row: Gpt, g: float, h0: float) -> float:
    """Predicted TFLOP/s per GPU with ``gamma(h) = g·h/(h + h0)``."""
    model = gpt_model(row, g * row.hidden / (row.hidden + h0))
    return row.flops / (row.gpus * model.parts(row.gpus)[2]) / 1e12


GPTS = tuple(Gpt(*r) for r in MEGATRON_ROWS)


# --- the set, the fits, the errors ------------------------------------------------------------------


@dataclass(frozen=True)
class Judged:
    """A point with its prediction and error."""

    point: Point
    predicted: float
    error: float
    """(predicted − published) / published: positive when the model is optimistic"""
    uncalibrated: float
    """the prediction before any fitted term (eta 1; gamma(h) at the A100's 312 TFLOP/s, h0 0)"""


def _fit_1d(loss: Callable[[float], float], grid: Sequence[float]) -> float:
    return min(grid, key=loss)


ETA_GRID = tuple(10 ** (-2 + 2 * i / 400) for i in range(401))  # 0.01 .. 1, log-spaced


@cache
def fits() -> dict[str, tuple[float, ...]]:
    """The fitted terms, from the calibration points only: ``eta`` per CNN group; ``(g, h0)`` for
    Megatron-LM (``g`` in FLOP/s). Least squares on the relative errors, over fixed grids."""
    out: dict[str, tuple[float, ...]] = {}
    cases = cnn_cases()
    for group in sorted({g for _, g, _, _ in cases}):
        cal = [c for c, g, s, _ in cases if g == group and s == CALIBRATE]
        if not cal:
            out[group] = (1.0,)
            continue

        def loss(eta: float, cal: list[Case] = cal, group: str = group) -> float:
            return sum((cnn_predicted(c, group, eta) / c.published - 1) ** 2 for c in cal)

        out[group] = (_fit_1d(loss, ETA_GRID),)
    cal_rows = [r for i, r in enumerate(GPTS) if _alternate(i) == CALIBRATE]
    best = (math.inf, 0.0, 0.0)
    for h0 in range(0, 4001, 100):
        for g in range(150, 313, 2):
            sq = sum((gpt_predicted(r, g * 1e12, h0) / r.published - 1) ** 2 for r in cal_rows)
            best = min(best, (sq, g * 1e12, float(h0)))
    out["megatron"] = best[1:]
    return out


@cache
def judged() -> tuple[Judged, ...]:
    """Every point of the set, predicted with the calibration's fits."""
    f = fits()
    out = []
    for case, group, split, regime in cnn_cases():
        point = Point(
            case.name,
            f"{case.source} ({READ if case.source in (TF_DGX1, TF_EC2) else case.rate_source})",
            case.published,
            "efficiency",
            group,
            split,
            regime,
            case.nodes * case.devices_per_node,
            PS_ASSUMED if group.startswith("tf-") else case.explained,
        )
        predicted = cnn_predicted(case, group, f[group][0])
        out.append(Judged(point, predicted, predicted / case.published - 1, cnn_predicted(case, group, 1.0)))
    g, h0 = f["megatron"]
    for i, row in enumerate(GPTS):
        name = f"Megatron-LM GPT {row.billions:g}B, tp {row.tp} pp {row.pp}, {row.gpus} A100"
        point = Point(
            name,
            f"{MEGATRON} ({MEGATRON_READ})",
            row.published,
            "TFLOP/s per GPU",
            "megatron",
            _alternate(i),
            regime_of(row.gpus // 8, row.tp * row.pp > 1),
            row.gpus,
            MEGATRON_ASSUMED,
        )
        predicted = gpt_predicted(row, g, h0)
        out.append(Judged(point, predicted, predicted / row.published - 1, gpt_predicted(row, 312e12, 0.0)))
    return tuple(out)


@dataclass(frozen=True)
class Summary:
    regime: str
    split: str
    count: int
    median: float
    """median |error|"""
    worst: float
    """the largest |error|, signed"""


def summaries(points: Sequence[Judged]) -> list[Summary]:
    """Median and worst error of each regime and split that has points."""
    out = []
    for split in (CALIBRATE, JUDGE):
        for regime in REGIMES:
            errors = [j.error for j in points if j.point.regime == regime and j.point.split == split]
            if errors:
                worst = max(errors, key=abs)
                out.append(Summary(regime, split, len(errors), statistics.median(map(abs, errors)), worst))
    return out


def bands(points: Sequence[Judged]) -> dict[str, float]:
    """The band of each regime, by the rule fixed before comparing: the largest |error| of its
    calibration points (a new exchangeable point exceeds the largest of n with chance 1/(n+1));
    a regime without calibration points takes twice the largest of the data-parallel regimes'."""
    out: dict[str, float] = {}
    for regime in REGIMES:
        cal = [abs(j.error) for j in points if j.point.regime == regime and j.point.split == CALIBRATE]
        if cal:
            out[regime] = max(cal)
    data = [out[r] for r in (DATA_ONE, DATA_FEW, DATA_MANY) if r in out]
    for regime in REGIMES:
        out.setdefault(regime, 2 * max(data))
    return out


def largest_ranks(points: Sequence[Judged]) -> dict[str, int]:
    """The largest rank count the set validates, data-parallel and model-parallel."""
    data = max(j.point.ranks for j in points if j.point.regime != MODEL_PARALLEL)
    model = max(j.point.ranks for j in points if j.point.regime == MODEL_PARALLEL)
    return {"data": data, "model": model}


__all__ = ["Judged", "Point", "bands", "fits", "judged", "largest_ranks", "regime_of", "summaries"]
