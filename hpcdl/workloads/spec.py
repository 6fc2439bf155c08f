"""The workload contract: a spec is a set of knobs (``hpcdl.workloads.knobs``) that a family
turns into a network and its analytic count. A family subclasses :class:`Spec`, declares its
knobs with :func:`knob`, and implements ``build_module``, ``count``, ``sample_inputs`` and
``target_shape`` in the same module, so that the network and its count stay side by side.
A family that tensor or pipeline parallelism can split also implements the optional hooks
``tp_*`` and ``pp_*`` there (``hpcdl.workloads.parallelism`` holds their types).
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any, ClassVar

import torch
from torch import nn

from hpcdl import metrics
from hpcdl.device import MMAP_THRESHOLD_BYTES
from hpcdl.workloads.counting import Count, Moment
from hpcdl.workloads.knobs import Knobs, knob
from hpcdl.workloads.parallelism import Allreduces, Parts, Split
from hpcdl.workloads.precision import PRECISIONS, precision

__all__ = ["Knobs", "Ranges", "Spec", "knob"]

Ranges = dict[str, list[Any]]
"""knob (or derived quantity) -> the values to draw from"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spec(Knobs):
    """A workload: the knobs common to every family, and what each family must provide."""

    family: ClassVar[str] = ""
    sampling: ClassVar[Ranges] = {}
    """knob -> the values ``hpcdl generate FAMILY --sample SEED`` draws from, uniformly; a
    family may also name derived quantities here and turn them into knobs in ``from_drawn``"""
    channels_last: ClassVar[bool] = False
    """its convolutions can run channels-last (``run.memory_format``, ``measure.execution``)"""
    tp_in_stages: ClassVar[bool] = False
    """its tensor-parallel pairs of layers lie inside its pipeline blocks, so that a stage
    boundary never separates a column-parallel layer from its row-parallel partner (tp x pp)"""

    batch_size: int = knob(
        32, lo=1, hi=1 << 20, doc="samples per rank per micro-batch (x accumulation_steps per step)"
    )
    accumulation_steps: int = knob(
        1, lo=1, hi=1 << 16, doc="micro-batches per optimizer step, their gradients reduced across ranks once"
    )
    precision: str = knob("fp32", choices=PRECISIONS, doc="compute precision (bf16/fp16 use autocast)")
    seed: int = knob(0, lo=0, hi=2**63 - 1, doc="seeds weights and data: same seed, same model and data")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.prefix = cls.family

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready dict with the family name first; ``spec_from_dict`` inverts it."""
        return {"family": self.family, **super().to_dict()}

    # --- to be provided by each family -------------------------------------------------
    def build_module(self) -> nn.Module:
        """The network (on the CPU, in fp32); called by :meth:`build` under the spec's seed.
        Its output is logits of shape ``(batch, *target_shape(), num_classes)``."""
        raise TypeError(f"{type(self).__name__} does not define build_module")

    def count(self) -> Count:
        """Parameters, FLOPs and activations of one sample, from the knobs alone."""
        raise TypeError(f"{type(self).__name__} does not define count")

    def sample_inputs(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        """``n`` random input samples (images, token ids, features, spectrograms)."""
        raise TypeError(f"{type(self).__name__} does not define sample_inputs")

    def target_shape(self) -> tuple[int, ...]:
        """Shape of one sample's labels: ``()`` for one label, ``(T,)`` for one per position."""
        return ()

    @property
    def num_classes(self) -> int:
        """Size of the last dimension of the logits."""
        raise TypeError(f"{type(self).__name__} does not define num_classes")

    # --- optional: tensor and pipeline parallelism (``hpcdl.parallel``, ``hpcdl.scaling``) ---
    def tp_sizes(self) -> dict[str, int] | None:
        """The sizes tensor parallelism splits, by knob (or derived size) name: the group's size
        must divide each. None (the default): the family has no tensor-parallel plan."""
        return None

    def tp_splits(self, model: nn.Module) -> dict[nn.Module, Split]:
        """The layers of ``model`` (built from this spec) that tensor parallelism splits, and
        how: column-parallel, then row-parallel, pair by pair; the others stay whole on every
        rank. Keyed by module, so that a pipeline stage holding some of them splits its own."""
        raise TypeError(f"{type(self).__name__} has no tensor-parallel plan")

    def tp_allreduces(self, blocks: int | None = None) -> Allreduces:
        """The allreduces one micro-batch of ``batch_size`` runs on a rank of the tensor-parallel
        group, forward and backward, through ``blocks`` of the model's pipeline blocks (a
        stage's, under tp x pp: ``tp_in_stages``) or the whole model (None); the same at any
        group size above 1."""
        raise TypeError(f"{type(self).__name__} has no tensor-parallel plan")

    def tp_count(self, tp: int) -> Count:
        """One rank's parameters and work per sample under tensor parallelism over ``tp`` ranks
        (its shards and the layers that stay whole)."""
        raise TypeError(f"{type(self).__name__} has no tensor-parallel plan")

    def pp_blocks(self) -> int:
        """The blocks a pipeline deals out to its stages (``pp_parts``); 0 (the default): the
        model does not split into stages."""
        return 0

    def pp_parts(self, model: nn.Module) -> Parts:
        """``model`` (built from this spec) as a pipeline: what runs before its ``pp_blocks``
        blocks, the blocks, what runs after them, and parameters both ends use."""
        raise TypeError(f"{type(self).__name__} does not split into pipeline stages")

    def pp_boundary_bytes(self) -> int:
        """Bytes of one sample's activations where one stage hands them to the next (and of
        their gradient, sent back)."""
        raise TypeError(f"{type(self).__name__} does not split into pipeline stages")

    @classmethod
    def from_drawn(cls, drawn: dict[str, Any], ranges: Ranges, rng: random.Random) -> dict[str, Any]:
        """Knobs from the values drawn from ``sampling`` (or the caller's ranges): by default the
        values themselves; a family whose ranges name derived quantities (a width per head, a
        block count per stage) turns them into knobs here, drawing more from ``rng`` if needed.
        Knobs the caller fixed are already in ``drawn`` and must be kept."""
        return drawn

    @property
    def unfused_recurrent(self) -> bool:
        """Whether a CPU runs a recurrent layer of this spec step by step (oneDNN fuses only the
        LSTM), which costs the libraries more (``metrics.CPU_LIBRARY_BYTES``)."""
        return False

    @property
    def logits_elements(self) -> int:
        """Elements of one sample's logits (one row of ``num_classes`` per label)."""
        return math.prod(self.target_shape()) * self.num_classes

    def memory_per_sample(self, device_type: str = "cpu") -> int:
        """Bytes one sample adds to a training step where it needs the most
        (``metrics.sample_memory``), on a ``device_type`` device."""
        return _largest_sample(self._moment_bytes(self.count(), device_type=device_type))

    def _moment_bytes(
        self, c: Count, heap: bool = False, kept_grads: bool = False, device_type: str = "cpu"
    ) -> list[tuple[int, int, int, int, int]]:
        """``c.moments`` in bytes per sample (``metrics.memory_parts``'s ``moments``). The
        first, as backward begins, is two: the loss's backward, with its copies of the logits
        (``metrics.LOSS_COPIES``), then the head's, with the logits' gradient (the loss has freed
        the others) and the head's input gradient. No gradient exists during the loss's backward
        (the previous step's were freed); the head's makes the first. ``heap``: the heap pages
        per-step layers leave resident count (``Moment.heap``). With gradient accumulation, or
        ``kept_grads`` (gradients a backend keeps allocated, ``Backend.keeps_gradients``), what a
        step holds beside every gradient (:func:`_accumulated`). Dropout masks are what the
        device keeps of them (``Tally.dropout``: an element of the dropped tensor on a CPU, a
        byte on CUDA)."""
        size = precision(self.precision).bytes
        heap_size = size if heap else 0
        loss = metrics.sample_memory(0, self.logits_elements)
        head = metrics.sample_memory(0, self.logits_elements, copies=metrics.HEAD_BACKWARD_COPIES)

        def kept(m: Moment) -> int:
            if device_type == "cuda":  # its masks booleans, not elements of the dropped tensor
                return (m.kept - m.masks) * size + m.mask_bytes
            return m.kept * size

        first, *placed = c.moments
        moments = [
            (kept(first) + loss, 0, 0, first.copies, first.heap * heap_size),
            (
                kept(first) + head,
                first.workspace * size,
                first.grads,
                first.copies,
                first.heap * heap_size,
            ),
            *((kept(p), p.workspace * size, p.grads, p.copies, p.heap * heap_size) for p in placed),
        ]
        return _accumulated(moments, c.params) if self.accumulation_steps > 1 or kept_grads else moments

    def _in_heap(self, c: Count, batch: int, device_type: str, malloc: str) -> bool:
        """Whether glibc's heap holds a batch of the per-step states of ``Count.heap_row``: a CPU
        whose ``malloc`` is glibc's (``device.malloc_library``), below the mmap threshold auto-fit's
        trials fix. Under jemalloc an Elman RNN holds none: rnn seed 0 at batch 290 peaked at 224
        MiB, its estimate 234 without these pages and 299 with them (``benchmarks/memory_rss.py
        mapped``)."""
        row = batch * c.heap_row * precision(self.precision).bytes
        return device_type == "cpu" and 0 < row < MMAP_THRESHOLD_BYTES and malloc == "glibc"

    def input_bytes(self) -> int:
        """Bytes of one sample's inputs and labels (int64), as the run's pool of batches and the
        HDF5 shards hold them (made on the meta device: a shape and a dtype, no data)."""
        inputs = self.sample_inputs(1, torch.Generator(), torch.device("meta"))
        return inputs.nbytes + 8 * math.prod(self.target_shape())

    def memory_parts(
        self,
        batch: int,
        optimizer: str,
        device_type: str = "cpu",
        pool_batches: int = 1,
        malloc: str = "glibc",
        kept_grads: bool = False,
    ) -> dict[str, int]:
        """Where a training step at ``batch`` on a ``device_type`` device, with ``pool_batches``
        batches of inputs kept there (``RunConfig.pool_batches``; a trial keeps one), would put
        its memory at its peak (``metrics.memory_parts``). ``malloc``: whose ``malloc`` a CPU
        step calls (``device.malloc_library``: glibc, jemalloc, tcmalloc). ``kept_grads``: the
        gradients stay allocated between steps (``Backend.keeps_gradients``: DDP's buckets)."""
        c = self.count()
        heap = self._in_heap(c, batch, device_type, malloc)
        moments = self._moment_bytes(c, heap=heap, kept_grads=kept_grads, device_type=device_type)
        return metrics.memory_parts(
            c.params,
            _largest_sample(moments),
            batch,
            optimizer,
            largest_param=c.largest_param,
            autocast=precision(self.precision).autocast,
            moments=moments,
            device_type=device_type,
            input_bytes=pool_batches * batch * self.input_bytes(),
            unfused_recurrent=self.unfused_recurrent,
            conv_shapes=c.conv_shapes,
        )

    def memory_estimate(
        self,
        batch: int,
        optimizer: str,
        device_type: str = "cpu",
        pool_batches: int = 1,
        malloc: str = "glibc",
        kept_grads: bool = False,
    ) -> int:
        """Bytes a training step at ``batch`` needs (:meth:`memory_parts`)."""
        parts = self.memory_parts(batch, optimizer, device_type, pool_batches, malloc, kept_grads)
        return sum(parts.values())

    @property
    def samples_per_step(self) -> int:
        """Samples one rank trains on per optimizer step (``metrics.samples_per_step``)."""
        return metrics.samples_per_step(self.batch_size, self.accumulation_steps)

    def build(self) -> nn.Module:
        """The network with weights drawn from ``seed``: the same spec gives the same weights."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self.build_module()


def _accumulated(
    moments: list[tuple[int, int, int, int, int]], params: int
) -> list[tuple[int, int, int, int, int]]:
    """``moments`` (``Spec._moment_bytes``: the loss's, the head's, then the placed ones from the
    first layer to the last) as a step's second and later micro-batches hold them, or every
    micro-batch where a backend keeps the gradients allocated (DDP's buckets): every parameter's
    gradient exists, from the micro-batches before or in the buckets (each new one is summed into
    it in place), and while a layer's backward runs, the gradient it has just made for its own
    parameters is alive beside them: its moment's gradients less those of the layers after it
    (attention seed 11 in fp32 at batch 32 with two micro-batches: 775.4 MB at the allocator's
    peak, the loss's backward, 697.2 with one)."""
    grads = [g for _, _, g, _, _ in moments]
    accumulated = []
    for i, (kept, workspace, g, copies, heap) in enumerate(moments):
        after = [h for h in (*grads[i + 1 :], grads[1]) if h < g] if i > 1 else []
        accumulated.append((kept, workspace, params + g - max(after, default=0), copies, heap))
    return accumulated


def _largest_sample(moments: list[tuple[int, int, int, int, int]]) -> int:
    """The most bytes one sample holds at any of the step's moments (``Spec._moment_bytes``)."""
    return max(kept + workspace + heap for kept, workspace, _, _, heap in moments)
