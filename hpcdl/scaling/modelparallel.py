"""Tensor- and pipeline-parallel terms of the scaling model (docs/metrics.md,
"Prediction"): what a layout ``dp × tp × pp`` adds to a data-parallel step.

- **Tensor parallelism** (Megatron-style, column- then row-parallel projections): each
  transformer block runs 2 allreduces of its activations ``b·s·h`` in forward (after the
  attention's and the MLP's row-parallel projections) and 2 in backward (their conjugates, before
  the column-parallel ones), among the ``tp`` ranks of a group, on the intra-node link. With
  sequence parallelism each allreduce becomes a reduce-scatter and an all-gather of the same
  ``b·s·h`` (the same bytes on a ring, in two calls). An MLP's pair of hidden layers is one
  column- and one row-parallel projection: one allreduce of ``b·h`` each way (none backward
  for the first pair, whose input is the data). The calls and their bytes are the family's own
  count (``Spec.tp_allreduces``), which the runtime records too: one place for what a run
  records and the model prices.
- **Pipeline parallelism**: every micro-batch of ``b/m`` samples crosses each stage boundary
  once forward (its activations ``b/m·s·h``) and once backward (their gradients), as one
  point-to-point send: ``α + S/β`` on the link between the stages; the schedule (GPipe or
  1F1B: the same bubble) runs ``m + pp − 1`` micro-batch slots for ``m`` micro-batches of work,
  so a bubble of ``(pp − 1)/(m + pp − 1)`` of the pipeline's time is idle.
- **Data parallelism** on top: each rank reduces the gradients of the ``1/(tp·pp)`` of the
  parameters it holds over the ``dp`` ranks of its data-parallel group.

The layout's text is parsed here with a reader of its own (``predict`` takes layouts that no
run fits, e.g. at rank counts the layout's product does not divide, and no interleaved
schedule, which the model does not price); ``hpcdl.parallel.layout`` is the runtime's, with its
checks against the world and the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from hpcdl import metrics
from hpcdl.errors import InputError
from hpcdl.scaling.collectives import Comm, Cost, Hierarchy
from hpcdl.workloads.parallelism import Allreduces
from hpcdl.workloads.spec import Spec

FIELD = "predict.layout"
SCHEDULES = ("1f1b", "gpipe")
"""both have the same bubble, (pp − 1)/(m + pp − 1) of the pipeline's slots (1F1B holds fewer
micro-batches' activations, which the model does not count)"""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How the ranks divide: ``dp`` data-parallel replicas (0: the rest of the ranks), ``tp``
    ranks sharing each layer, ``pp`` pipeline stages, ``microbatches`` per step (0: 2·pp)."""

    dp: int = 0
    tp: int = 1
    pp: int = 1
    microbatches: int = 0
    schedule: str = "1f1b"
    sequence_parallel: bool = False
    """tensor parallelism's allreduces as reduce-scatter + all-gather (Megatron's ``--sequence-parallel``)"""

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "microbatches"):
            value = getattr(self, name)
            least = 0 if name in ("dp", "microbatches") else 1
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= 1 << 20:
                raise InputError(f"{FIELD}.{name}", value, f"an integer in {least}..1048576")
        if self.schedule not in SCHEDULES:
            raise InputError(f"{FIELD}.schedule", self.schedule, "allowed: " + ", ".join(SCHEDULES))

    def __str__(self) -> str:
        text = f"dp={self.dp or 'rest'},tp={self.tp},pp={self.pp}"
        if self.pp > 1:
            text += f",microbatches={self.chunks},schedule={self.schedule}"
        return text + (",sp=1" if self.sequence_parallel else "")

    @property
    def chunks(self) -> int:
        """Micro-batches per step through the pipeline (1 without one)."""
        return 1 if self.pp == 1 else (self.microbatches or 2 * self.pp)

    @property
    def model_parallel(self) -> int:
        """Ranks one replica spans: ``tp·pp``."""
        return self.tp * self.pp

    def bubble(self) -> float:
        """Idle fraction of the pipeline's time: ``(pp − 1)/(m + pp − 1)``."""
        return metrics.theoretical_bubble(self.pp, self.chunks)


def parse_layout(text: str) -> Layout:
    """``dp=2,tp=2,pp=2[,microbatches=4][,schedule=1f1b][,sp=1]`` -> Layout (keys optional)."""
    shown = text if len(text) <= 60 else text[:57] + "..."
    keys = {"dp": "dp", "tp": "tp", "pp": "pp", "microbatches": "microbatches", "m": "microbatches"}
    values: dict[str, Any] = {}
    for word in filter(None, text.split(",")):
        key, eq, value = word.partition("=")
        key = key.strip()
        if not eq or key not in (*keys, "schedule", "sp"):
            raise InputError(
                FIELD, shown, "comma-separated dp=N,tp=N,pp=N,microbatches=N,schedule=1f1b|gpipe,sp=0|1"
            )
        if key == "schedule":
            values["schedule"] = value.strip()
            continue
        try:
            number = int(value)
        except ValueError:
            raise InputError(f"{FIELD}.{key}", value, "an integer") from None
        if key == "sp":
            values["sequence_parallel"] = bool(number)
        else:
            values[keys[key]] = number
    return Layout(**values)


@dataclass(frozen=True, kw_only=True)
class Activations:
    """What tensor and pipeline parallelism move per sample of a workload."""

    bytes_per_sample: int
    """one block's output for one sample as the pipeline sends it (``s·h`` elements)"""
    layers: int
    """the layers the pipeline splits into stages"""
    tp_calls: int
    """tensor-parallel allreduces of one micro-batch, forward and backward
    (``Spec.tp_allreduces``, what a run records)"""
    tp_bytes_per_sample: int
    """their bytes for one sample, summed over the calls"""


def activations(spec: Spec) -> Activations:
    """What the workload's family says its tensor and pipeline parallelism move (its own hooks,
    ``Spec.tp_allreduces`` and ``Spec.pp_boundary_bytes``, which a run's runtime uses too):
    for one sample, a block's output at a stage boundary and the tensor-parallel allreduces of
    one micro-batch; zeros for what the family does not split (:func:`check` refuses a layout
    that asks for it)."""
    one = spec.replace(batch_size=1, accumulation_steps=1)
    tp = one.tp_allreduces() if spec.tp_sizes() is not None else Allreduces(0, 0)
    blocks = spec.pp_blocks()
    return Activations(
        bytes_per_sample=spec.pp_boundary_bytes() if blocks else 0,
        layers=blocks,
        tp_calls=tp.calls,
        tp_bytes_per_sample=tp.bytes,
    )


@dataclass(frozen=True, kw_only=True)
class ModelParallel:
    """A layout's terms for one workload on a system of ``intra`` and ``inter`` links
    (α per message, β of one rank's link; flat systems: the same Comm twice)."""

    layout: Layout
    activations: Activations
    intra: Comm
    inter: Comm
    ranks_per_node: int = 1

    def crosses_nodes(self, group: int, p: int) -> bool:
        """Whether ``group`` consecutive ranks (a tensor-parallel group), or a pipeline's stages
        (``group = p``), span more than one node."""
        return min(group, p) > self.ranks_per_node

    def tp_s(self, samples: float, p: int) -> float:
        """One micro-batch of ``samples`` on one stage: forward and backward's tensor-parallel
        collectives of its ``blocks/pp`` blocks, ``S = samples · s·h`` bytes each."""
        tp = self.layout.tp
        if tp == 1:
            return 0.0
        level = self.inter if self.crosses_nodes(tp, p) else self.intra
        a = self.activations
        calls = a.tp_calls / self.layout.pp  # a stage runs its layers' share
        nbytes = samples * a.tp_bytes_per_sample / a.tp_calls  # one call's, on average
        if self.layout.sequence_parallel:
            pair = ("reduce_scatter", "all_gather")
            return calls * sum(replace(level, collective=c).time(nbytes, tp) for c in pair)
        return calls * replace(level, collective="allreduce").time(nbytes, tp)

    def p2p_s(self, samples: float, p: int) -> float:
        """One micro-batch's sends across one stage boundary: its activations forward, their
        gradients backward, ``α + S/β`` each. Every rank of a tensor-parallel group sends its
        own copy (``hpcdl.parallel.schedule``): across nodes the ``min(tp, r)`` of them on a
        node share its fabric, ``β / min(tp, r)`` each."""
        if self.layout.pp == 1:
            return 0.0
        crossing = self.crosses_nodes(p, p)
        level = self.inter if crossing else self.intra
        sharing = min(self.layout.tp, self.ranks_per_node) if crossing else 1
        nbytes = samples * self.activations.bytes_per_sample
        return 2 * (level.alpha_s + nbytes * sharing / level.beta_bytes_per_s)

    def dp_cost(self, cost: Cost) -> Cost:
        """A data-parallel collective's cost among the ``dp`` ranks of one group: the group's
        ranks on one node are the node's ranks over ``tp`` (tensor parallelism innermost), and
        the ``min(tp, r)`` groups with ranks on a node run at once, sharing its fabric (a node
        of 8 NICs and tp = 8: one NIC each, as rail-optimised systems place them)."""
        if isinstance(cost, Hierarchy):
            r, tp = cost.ranks_per_node, self.layout.tp
            fabric = cost.inter.beta_bytes_per_s / min(tp, r)
            return replace(
                cost, ranks_per_node=max(1, r // tp), inter=replace(cost.inter, beta_bytes_per_s=fabric)
            )
        return cost


def levels(comms: Mapping[str, Cost]) -> tuple[Comm, Comm, int]:
    """(intra, inter, ranks per node) of a system's collective costs: a Hierarchy's two levels,
    or one flat Comm twice."""
    cost = comms.get("allreduce") or next(iter(comms.values()))
    if isinstance(cost, Hierarchy):
        return cost.intra, cost.inter, cost.ranks_per_node
    return cost, cost, 1


def check(layout: Layout, spec: Spec) -> None:
    """tp divides every size the family's plan splits (``Spec.tp_sizes``: the heads, the
    width); pp no more than the blocks (as a run refuses); neither for a family without them."""
    if layout.tp > 1:
        sizes = spec.tp_sizes()
        if sizes is None:
            why = f"1: the {spec.family} family has no tensor-parallel plan"
            raise InputError(f"{FIELD}.tp", layout.tp, why)
        for name, size in sizes.items():
            if size % layout.tp:
                raise InputError(f"{FIELD}.tp", layout.tp, f"must divide {spec.family}.{name}={size}")
    blocks = spec.pp_blocks()
    if layout.pp > 1 and not blocks:
        raise InputError(f"{FIELD}.pp", layout.pp, f"1: the {spec.family} family does not split into stages")
    if layout.pp > max(blocks, 1):
        raise InputError(f"{FIELD}.pp", layout.pp, f"at most the {blocks} layers")


def replicas(layout: Layout, p: int) -> int | None:
    """Data-parallel replicas at ``p`` ranks, or None where the layout does not fit ``p``."""
    if p % layout.model_parallel:
        return None
    dp = p // layout.model_parallel
    return dp if layout.dp in (0, dp) else None
