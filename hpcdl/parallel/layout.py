"""A run's parallel layout: how its ranks divide among data (dp), tensor (tp), pipeline (pp) and
expert (ep) parallelism, parsed from text such as ``dp=2,tp=2,pp=2,schedule=1f1b,microbatches=4``
and checked against the world size and the workload before anything runs.

Ranks are placed on the mesh ``(pp, dp, tp)`` in row-major order, tensor parallelism innermost:
rank ``r`` has ``tp`` coordinate ``r % tp``, ``dp`` coordinate ``(r // tp) % dp`` and ``pp``
coordinate ``r // (tp * dp)``. MPI launchers fill a node's slots before the next node's
(``--map-by slot``, Slurm's block distribution), so a tensor-parallel group -- ``tp``
consecutive ranks -- stays inside a node whenever ``tp`` divides the ranks per node: its
latency-bound collectives in every layer then run on the intra-node link, and the pipeline's
point-to-point sends, the least frequent traffic, cross nodes. This is torchtitan's order too
(``["pp", "dp", "tp"]`` of ``init_device_mesh``).

Not to be confused with ``hpcdl.proxy.layout`` (a real network's structure read for a proxy fit)
or ``hpcdl.submission.layout`` (the folders of a submission).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hpcdl.errors import InputError, SpecError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from hpcdl.workloads.spec import Spec

FIELD = "run.layout"
"""the name bad layouts are reported under (the ``--layout`` flag, ``RunConfig.layout``)"""
SCHEDULES = ("1f1b", "gpipe", "interleaved")
"""pipeline schedules a layout may name (``torch.distributed.pipelining``: Schedule1F1B,
ScheduleGPipe, ScheduleInterleaved1F1B; ``hpcdl.parallel.pipeline.SCHEDULES``)"""
DIMS = ("pp", "dp", "tp")
"""the device mesh's dimensions, outermost first (tensor parallelism innermost: inside a node)"""
_SIZES = ("dp", "tp", "pp", "ep", "microbatches")
_KEYS = (*_SIZES, "schedule")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How the ranks of a run divide among the kinds of parallelism. The default is pure data
    parallelism over however many ranks there are (``dp=0``: the rest)."""

    dp: int = 0
    """data-parallel replicas (gradients averaged across them); 0: world size / (tp x pp)"""
    tp: int = 1
    """tensor-parallel ranks sharing each layer (Megatron-style: heads and hidden units split)"""
    pp: int = 1
    """pipeline stages, each a consecutive run of the model's layers"""
    ep: int = 1
    """expert-parallel ranks sharing a mixture-of-experts layer's experts (1: not named; a
    spec with experts and ``expert_parallel`` shards them across all ranks of a pure data-parallel
    run, as before layouts existed)"""
    schedule: str = "1f1b"
    """the pipeline schedule (pp > 1): one of ``SCHEDULES``"""
    microbatches: int = 0
    """micro-batches per step through the pipeline (pp > 1); 0: 2 x pp"""

    def __post_init__(self) -> None:
        for name in _SIZES:
            value = getattr(self, name)
            least = 0 if name in ("dp", "microbatches") else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InputError(f"{FIELD}.{name}", value, f"an integer >= {least}")
        if self.schedule not in SCHEDULES:
            raise InputError(f"{FIELD}.schedule", self.schedule, "allowed: " + ", ".join(SCHEDULES))

    @property
    def chunks(self) -> int:
        """Micro-batches per step (pp > 1; 1 without a pipeline)."""
        if self.pp == 1:
            return 1
        return self.microbatches or 2 * self.pp

    @property
    def model_parallel(self) -> bool:
        """True when a rank holds less than the whole model (tp or pp above 1)."""
        return self.tp > 1 or self.pp > 1

    def __str__(self) -> str:
        text = f"dp={self.dp},tp={self.tp},pp={self.pp}"
        if self.ep > 1:
            text += f",ep={self.ep}"
        if self.pp > 1:
            text += f",schedule={self.schedule},microbatches={self.chunks}"
        return text

    def coords(self, rank: int) -> dict[str, int]:
        """``rank``'s coordinate on each mesh dimension (``DIMS``)."""
        return {"pp": rank // (self.tp * self.dp), "dp": (rank // self.tp) % self.dp, "tp": rank % self.tp}

    def tp_group(self, rank: int) -> list[int]:
        """The ranks of ``rank``'s tensor-parallel group (consecutive ranks)."""
        first = rank - rank % self.tp
        return list(range(first, first + self.tp))

    def dp_group(self, rank: int) -> list[int]:
        """The ranks that hold the same part of the model as ``rank`` (its gradients' group)."""
        base = rank // (self.tp * self.dp) * self.tp * self.dp + rank % self.tp
        return [base + i * self.tp for i in range(self.dp)]

    def stage_ranks(self, stage: int) -> list[int]:
        """The ranks of pipeline stage ``stage``."""
        size = self.tp * self.dp
        return list(range(stage * size, (stage + 1) * size))


def parse_layout(text: str) -> Layout:
    """A layout from text such as ``dp=2,tp=2,pp=2`` or ``tp=2,pp=2,schedule=gpipe,microbatches=8``
    (keys in any order, each at most once; '' = pure data parallelism). Sizes are not yet checked
    against the world: see :func:`fit_layout`."""
    values: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise InputError(FIELD, text, f"'{part}' is not KEY=VALUE; e.g. dp=2,tp=2,pp=2")
        if key not in _KEYS:
            raise InputError(FIELD, text, f"unknown key '{key}'; allowed: " + ", ".join(_KEYS))
        if key in values:
            raise InputError(FIELD, text, f"'{key}' given twice")
        if key == "schedule":
            values[key] = value
            continue
        try:
            values[key] = int(value)
        except ValueError:
            raise InputError(f"{FIELD}.{key}", value, "an integer") from None
    return Layout(**values)


def fit_layout(layout: Layout, world_size: int) -> Layout:
    """``layout`` with ``dp`` resolved for ``world_size`` ranks; refuses (one line) a product of
    dp x tp x pp that is not the world size, and an ``ep`` other than 1 or every rank (what
    ``hpcdl.workloads.moe`` builds)."""
    if layout.ep not in (1, world_size):
        raise InputError(
            f"{FIELD}.ep",
            layout.ep,
            f"1 or the {world_size} ranks of this run: experts are sharded across every rank",
        )
    model = layout.tp * layout.pp
    if layout.dp == 0:
        if world_size % model:
            raise InputError(
                FIELD, _named(layout), f"tp x pp = {model} must divide the {world_size} ranks of this run"
            )
        return replace(layout, dp=world_size // model)
    if layout.dp * model != world_size:
        raise InputError(
            FIELD,
            str(layout),
            f"dp x tp x pp = {layout.dp * model} must equal the {world_size} ranks of this run",
        )
    return layout


def _named(layout: Layout) -> str:
    return ",".join(f"{k}={getattr(layout, k)}" for k in ("tp", "pp") if getattr(layout, k) > 1) or "dp"


def check_layout(layout: Layout, spec: Spec) -> None:
    """Refuse (one line, :class:`SpecError`) a layout the workload cannot take: tensor
    parallelism for a family without a plan for it, or a tp that does not divide a size it
    splits (``Spec.tp_sizes``: the heads, the width, the feed-forward hidden size); pipeline
    stages for a family that does not split, or more of them than its blocks
    (``Spec.pp_blocks``); micro-batches that do not divide the batch; expert parallelism
    without experts."""
    if layout.tp > 1:
        _check_tp(layout.tp, spec)
    if layout.pp > 1:
        blocks = spec.pp_blocks()
        if not blocks:
            why = f"1: the {spec.family} family does not split into stages"
            raise SpecError(f"{FIELD}.pp", layout.pp, why)
        if layout.pp > blocks:
            raise SpecError(f"{FIELD}.pp", layout.pp, f"at most {blocks}, the {spec.family} model's blocks")
        if spec.batch_size % layout.chunks:
            raise SpecError(
                f"{FIELD}.microbatches",
                layout.chunks,
                f"must divide {spec.family}.batch_size={spec.batch_size}",
            )
    if layout.ep > 1 and not getattr(spec, "experts", 0):
        raise SpecError(f"{FIELD}.ep", layout.ep, f"1: this {spec.family} workload has no experts")
    if layout.ep > 1 and not getattr(spec, "expert_parallel", False):
        # ep only names what the spec's knob does: a layout's ep would otherwise be recorded
        # while every rank held every expert
        raise SpecError(f"{FIELD}.ep", layout.ep, f"1, or set {spec.family}.expert_parallel=true")


def _check_tp(tp: int, spec: Spec) -> None:
    sizes = spec.tp_sizes()
    if sizes is None:
        raise SpecError(f"{FIELD}.tp", tp, f"1: the {spec.family} family has no tensor-parallel plan")
    if getattr(spec, "experts", 0):
        raise SpecError(f"{FIELD}.tp", tp, "1: tensor parallelism of mixture-of-experts layers is not built")
    for name, size in sizes.items():
        if size % tp:
            raise SpecError(f"{FIELD}.tp", tp, f"must divide {spec.family}.{name}={size}")


def tp_crosses_nodes(layout: Layout, nodes: list[int]) -> bool:
    """True when some tensor-parallel group holds ranks of different nodes (``nodes[r]``: the
    node of rank ``r``): its per-layer collectives then cross the inter-node network."""
    groups = (layout.tp_group(first) for first in range(0, len(nodes), layout.tp))
    return any(len({nodes[r] for r in group}) > 1 for group in groups)


def crossing_warning(layout: Layout) -> str:
    """The one warning line of a run whose tensor parallelism crosses nodes."""
    return (
        f"warning: layout {layout} puts tensor-parallel groups across nodes: their per-layer "
        "collectives run on the inter-node network (make tp divide the ranks per node)"
    )


def device_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The run's device mesh, dimensions named ``DIMS`` with sizes (pp, dp, tp), over the
    default torch.distributed process group (already initialised by the backend)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (layout.pp, layout.dp, layout.tp), mesh_dim_names=DIMS)
