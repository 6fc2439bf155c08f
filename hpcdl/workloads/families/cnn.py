"""CNN: image classifiers built from stages of convolutional blocks -- VGG, ResNet, MobileNet and
SqueezeNet-like networks, the classic convolution-bound workloads.

The layout (channels, strides and feature-map sizes of every block) is planned once by
:meth:`CNNSpec.plan`; :meth:`CNNSpec.build_module` and :meth:`CNNSpec.count` both walk that
plan, so the network and its analytic count cannot drift apart. Each block kind is built and
counted side by side in ``workloads/conv_blocks.py``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from hpcdl.errors import SpecError
from hpcdl.workloads.conv_blocks import BLOCKS, NORMS, BlockPlan, Blocks
from hpcdl.workloads.counting import Count, Tally, conv_out
from hpcdl.workloads.precision import precision
from hpcdl.workloads.registry import FAMILIES
from hpcdl.workloads.spec import Ranges, Spec, knob

STEMS = ("none", "simple", "imagenet")
DOWNSAMPLES = ("stride", "maxpool", "none")
HEAD_POOLS = ("global", "flatten")
POOLS = ("standard", "ceil3")
CLASSIFIERS = ("linear", "conv")

FLATTEN_SIZE = 7
"""side of the map that the "flatten" head pools to, as torchvision's VGG does"""
INDEX_BYTES = 8
"""bytes of each int64 index a max pool keeps for backward per output element (its input is the
previous ReLU's output, kept already)"""


@dataclass(frozen=True)
class Plan:
    """The whole layout: stem output, blocks per stage, map side after each stage's pool."""

    stem_channels: int
    stem_conv_size: int
    """map side after the stem's conv (before its max pool)"""
    stem_size: int
    stages: tuple[tuple[BlockPlan, ...], ...]
    stage_sizes: tuple[int, ...]
    """map side at the end of each stage (after the "maxpool" downsampling)"""
    stage_pools: tuple[bool, ...] = ()
    """whether a 2x2 max pool ends each stage"""

    @property
    def channels(self) -> int:
        return self.stages[-1][-1].c_out

    @property
    def sizes(self) -> tuple[int, ...]:
        """Every map side along the way; all must be at least 1."""
        blocks = [b.size_out for stage in self.stages for b in stage]
        return (self.stem_conv_size, self.stem_size, *blocks, *self.stage_sizes)


@FAMILIES.register
@dataclass(frozen=True, kw_only=True)
class CNNSpec(Spec):
    """Convolutional image classifier: an optional stem, ``stages`` stages of blocks whose
    width grows by ``width_mult`` per stage, then a pooled (or flattened) fully connected head.

    ResNet-50 is ``stem=imagenet block=bottleneck blocks=3,4,6,3 base_width=64``; VGG-16 is
    ``stem=none block=plain blocks=2,2,3,3,3 downsample=maxpool norm=none head_pool=flatten
    head_layers=2`` (see ``generators/presets.py``).
    """

    family: ClassVar[str] = "cnn"
    channels_last: ClassVar[bool] = True
    sampling: ClassVar[Ranges] = {
        "stages": [1, 2, 3, 4],
        "blocks_per_stage": [1, 2, 3],  # drawn once per stage into "blocks" (from_drawn)
        "base_width": [8, 16, 32, 64],
        "width_mult": [1.5, 2.0],
        "kernel_size": [3, 5],
        "block": ["plain", "basic", "bottleneck", "separable"],
        "downsample": ["stride", "maxpool", "none"],
        "norm": ["batch", "group", "none"],
        "stem": ["none", "simple"],
        "image_size": [32, 64],
        "classes": [10, 100],
    }

    image_size: int = knob(32, lo=1, hi=1 << 15, doc="height and width of the input images")
    in_channels: int = knob(3, lo=1, hi=1 << 12, doc="channels of the input images")
    classes: int = knob(10, lo=2, hi=1 << 20, doc="output classes")
    stem: str = knob(
        "simple",
        choices=STEMS,
        doc="none; simple: 3x3 conv to base_width; imagenet: 7x7/2 conv to base_width + 3x3/2 max pool",
    )
    stages: int = knob(3, lo=1, hi=16, doc="stages of blocks; each later stage may downsample")
    blocks: tuple[int, ...] = knob(
        (2,), lo=1, hi=1000, doc="blocks per stage: one entry for every stage, or one per stage"
    )
    base_width: int = knob(32, lo=1, hi=1 << 14, doc="channels of the stem and of the first stage")
    width_mult: float = knob(2.0, lo=0.25, hi=8.0, doc="width growth per stage")
    max_width: int = knob(1024, lo=1, hi=1 << 16, doc="cap on a stage's width")
    kernel_size: int = knob(3, lo=1, hi=15, doc="side of the blocks' spatial convolutions (odd)")
    block: str = knob(
        "basic",
        choices=BLOCKS,
        doc="plain: conv-norm-relu; basic: ResNet 2-conv residual; bottleneck: ResNet v1.5 "
        "1x1-kxk-1x1 residual; separable: depthwise kxk + pointwise 1x1 (MobileNet); inverted: "
        "1x1 expand (x expansion), depthwise kxk, linear 1x1, residual when the shape stays (MobileNetV2); "
        "fire: 1x1 squeeze, then a 1x1 and a kxk expand side by side, concatenated (SqueezeNet)",
    )
    expansion: int = knob(
        4,
        lo=1,
        hi=16,
        doc="bottleneck: output channels = width * expansion; inverted: hidden = input * expansion",
    )
    squeeze_ratio: float = knob(
        0.125,
        lo=0.01,
        hi=1.0,
        doc="fire: channels of the squeeze = round(width x squeeze_ratio), at least 1 (SqueezeNet: 1/8)",
    )
    expand_split: float = knob(
        0.5,
        lo=0.01,
        hi=0.99,
        doc="fire: share of a block's output channels from the kxk expand, the rest from the 1x1 "
        "(SqueezeNet: 0.5)",
    )
    downsample: str = knob(
        "stride",
        choices=DOWNSAMPLES,
        doc="stride: first block of each later stage strides 2; maxpool: 2x2 max pool after "
        "every stage (VGG); none",
    )
    norm: str = knob(
        "batch", choices=NORMS, doc="normalisation after each conv (convs get a bias only with none)"
    )
    pool: str = knob(
        "standard",
        choices=POOLS,
        doc="the max pools: standard (the imagenet stem's 3x3/2 padded by 1, the stages' 2x2/2); "
        "ceil3 (every one 3x3/2, unpadded, in ceil mode: SqueezeNet)",
    )
    head_pool: str = knob(
        "global",
        choices=HEAD_POOLS,
        doc="global: average pool to 1x1; flatten: average pool to 7x7 and flatten",
    )
    classifier: str = knob(
        "linear",
        choices=CLASSIFIERS,
        doc="linear: a fully connected layer after the pool; conv: a 1x1 conv (bias, ReLU) to the "
        "classes before a global pool, dropout before it (SqueezeNet)",
    )
    head_layers: int = knob(0, lo=0, hi=16, doc="hidden fully connected layers (ReLU) before the classifier")
    head_width: int = knob(4096, lo=1, hi=1 << 17, doc="units per hidden head layer")
    dropout: float = knob(0.0, lo=0.0, hi=0.95, doc="dropout after each hidden head layer (VGG: 0.5)")
    # --- the layout of a given network, stage by stage (empty / 0: from the knobs above) ---
    widths: tuple[int, ...] = knob(
        (),
        lo=1,
        hi=1 << 16,
        doc="width of every stage, one entry per stage (default: base_width x width_mult^i)",
    )
    kernels: tuple[int, ...] = knob(
        (), lo=1, hi=15, doc="side of each stage's spatial convolutions, odd (default: kernel_size)"
    )
    downsamples: tuple[str, ...] = knob(
        (),
        choices=DOWNSAMPLES,
        doc="per stage: stride (its first block strides 2, stage 0 too), maxpool (a 2x2 max pool "
        "ends it) or none (default: downsample for every stage)",
    )
    expansions: tuple[int, ...] = knob(
        (), lo=1, hi=16, doc="per stage: the expansion of its blocks (default: expansion)"
    )
    stem_kernel: int = knob(
        0, lo=0, hi=15, doc="side of the stem's conv, odd (0: 7 for imagenet, 3 for simple)"
    )
    stem_stride: int = knob(0, lo=0, hi=8, doc="stride of the stem's conv (0: 2 for imagenet, 1 for simple)")
    stem_padding: int = knob(-1, lo=-1, hi=7, doc="padding of the stem's conv (-1: kernel // 2)")
    head_conv: int = knob(
        0,
        lo=0,
        hi=1 << 16,
        doc="channels of a 1x1 conv-norm-relu before the head's pool (0: none; MobileNetV2 1280)",
    )

    @classmethod
    def from_drawn(cls, drawn: dict[str, Any], ranges: Ranges, rng: random.Random) -> dict[str, Any]:
        """The drawn ``blocks_per_stage`` is the first stage's; the others are drawn here."""
        knobs = dict(drawn)
        first = knobs.pop("blocks_per_stage")
        if "blocks" not in knobs:
            rest = [rng.choice(ranges["blocks_per_stage"]) for _ in range(knobs["stages"] - 1)]
            knobs["blocks"] = [first, *rest]
        return knobs

    # --- layout --------------------------------------------------------------------------
    def check(self) -> None:
        for name, value in (("kernel_size", self.kernel_size), ("stem_kernel", self.stem_kernel)):
            if value % 2 == 0 and value:
                raise SpecError(
                    f"{self.family}.{name}", value, "must be odd (padding k//2 keeps the map size)"
                )
        if any(k % 2 == 0 for k in self.kernels):
            raise SpecError(f"{self.family}.kernels", list(self.kernels), "must be odd (padding k//2)")
        if len(self.blocks) not in (1, self.stages):
            raise SpecError(
                f"{self.family}.blocks",
                list(self.blocks),
                f"expected 1 entry or one per stage (stages={self.stages})",
            )
        for name in ("widths", "kernels", "downsamples", "expansions"):
            value = getattr(self, name)
            if value and len(value) != self.stages:
                raise SpecError(
                    f"{self.family}.{name}",
                    list(value),
                    f"expected no entry or one per stage (stages={self.stages})",
                )
        if self.classifier == "conv" and (self.head_pool, self.head_layers) != ("global", 0):
            raise SpecError(
                f"{self.family}.classifier", self.classifier, "conv needs head_pool=global and head_layers=0"
            )
        if self.block == "fire":
            for width in self.stage_widths():
                if not 0 < self.fire_split(width)[1] < width:
                    raise SpecError(
                        f"{self.family}.expand_split",
                        self.expand_split,
                        f"leaves an expand of a {width}-channel fire block without channels",
                    )
        stem_knobs = {"stem_kernel": self.stem_kernel, "stem_stride": self.stem_stride}
        stem_knobs["stem_padding"] = self.stem_padding + 1  # its default is -1
        for name, value in stem_knobs.items():
            if self.stem == "none" and value:
                raise SpecError(
                    f"{self.family}.{name}", getattr(self, name), "needs a stem (stem=simple or imagenet)"
                )
        if min(self.plan().sizes) < 1:
            raise SpecError(
                f"{self.family}.image_size",
                self.image_size,
                f"stem={self.stem} with {self.stages} stages of downsample={self.downsample} shrinks the "
                f"image below 1 pixel; need image_size >= {self._min_image_size()}",
            )

    def _min_image_size(self) -> int:
        """Smallest image side the layout can take (map sides grow with the image side)."""
        lo, hi = self.image_size, 1 << 20
        while lo + 1 < hi:  # invariant: lo too small, hi large enough
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if min(self.plan(mid).sizes) >= 1 else (mid, hi)
        return hi

    def stage_widths(self) -> tuple[int, ...]:
        """Width of each stage (a bottleneck's inner width; its output is ``expansion`` times it)."""
        if self.widths:
            return self.widths
        return tuple(
            min(self.max_width, max(1, round(self.base_width * self.width_mult**i)))
            for i in range(self.stages)
        )

    def blocks_per_stage(self) -> tuple[int, ...]:
        return self.blocks * self.stages if len(self.blocks) == 1 else self.blocks

    def stage_kernels(self) -> tuple[int, ...]:
        return self.kernels or (self.kernel_size,) * self.stages

    def stage_expansions(self) -> tuple[int, ...]:
        return self.expansions or (self.expansion,) * self.stages

    def stage_downsamples(self) -> tuple[str, ...]:
        """Each stage's downsampling; the ``downsample`` knob never strides the first stage."""
        if self.downsamples:
            return self.downsamples
        first = "none" if self.downsample == "stride" else self.downsample
        return (first,) + (self.downsample,) * (self.stages - 1)

    def stem_conv(self) -> tuple[int, int, int]:
        """(kernel, stride, padding) of the stem's conv."""
        kernel, stride = (7, 2) if self.stem == "imagenet" else (3, 1)
        kernel = self.stem_kernel or kernel
        return kernel, self.stem_stride or stride, kernel // 2 if self.stem_padding < 0 else self.stem_padding

    def fire_split(self, width: int) -> tuple[int, int]:
        """(squeeze, kxk expand) channels of a fire block of ``width`` output channels."""
        return max(1, round(width * self.squeeze_ratio)), round(width * self.expand_split)

    def _pool_out(self, size: int, *, stem: bool = False) -> int:
        """Side of a max pool's output: a 3x3/2 window in ceil mode keeps a last, partial window."""
        if self.pool == "ceil3":
            return -(-(size - 3) // 2) + 1 if size >= 3 else 0
        return conv_out(size, 3, 2, 1) if stem else conv_out(size, 2, 2, 0)

    def _max_pool(self, *, stem: bool = False) -> nn.Module:
        if self.pool == "ceil3":
            return nn.MaxPool2d(3, stride=2, ceil_mode=True)
        return nn.MaxPool2d(3, stride=2, padding=1) if stem else nn.MaxPool2d(2, stride=2)

    def plan(self, image_size: int | None = None) -> Plan:
        """Channels, strides and map sides of every layer for ``image_size`` (default: the knob)."""
        size = self.image_size if image_size is None else image_size
        channels, conv_size = self.in_channels, size
        if self.stem != "none":
            channels = self.base_width
            kernel, stride, padding = self.stem_conv()
            size = conv_size = conv_out(size, kernel, stride, padding)
            if self.stem == "imagenet":
                size = self._pool_out(conv_size, stem=True)
        stem_channels, stem_size = channels, size
        stages: list[tuple[BlockPlan, ...]] = []
        stage_sizes: list[int] = []
        layout = zip(
            self.stage_widths(),
            self.blocks_per_stage(),
            self.stage_kernels(),
            self.stage_downsamples(),
            self.stage_expansions(),
            strict=True,
        )
        for width, n, k, down, expansion in layout:
            c_out = width * expansion if self.block == "bottleneck" else width
            blocks = []
            for j in range(n):
                stride = 2 if down == "stride" and j == 0 else 1
                # every strided conv pads k//2 (1x1: 0), so all give the same side
                out = conv_out(size, k, stride, k // 2)
                hidden, spatial = channels * expansion if self.block == "inverted" else 0, 0
                if self.block == "fire":
                    hidden, spatial = self.fire_split(width)
                blocks.append(BlockPlan(channels, width, c_out, stride, size, out, k, hidden, spatial))
                channels, size = c_out, out
            if down == "maxpool":
                size = self._pool_out(size)
            stages.append(tuple(blocks))
            stage_sizes.append(size)
        pools = tuple(d == "maxpool" for d in self.stage_downsamples())
        return Plan(stem_channels, conv_size, stem_size, tuple(stages), tuple(stage_sizes), pools)

    # --- network -------------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return self.classes

    def _blocks(self) -> Blocks:
        """How this network's blocks are built and counted (``workloads/conv_blocks.py``)."""
        return Blocks(self.block, self.norm)

    def build_module(self) -> nn.Module:
        plan, kit = self.plan(), self._blocks()
        mods: list[nn.Module] = []
        if self.stem != "none":
            kernel, stride, padding = self.stem_conv()
            stem = kit.conv_norm_relu(self.in_channels, plan.stem_channels, kernel, stride, padding=padding)
            mods += stem
            if self.stem == "imagenet":
                mods.append(self._max_pool(stem=True))
        for stage, pool in zip(plan.stages, plan.stage_pools, strict=True):
            mods += [kit.build(b) for b in stage]
            if pool:
                mods.append(self._max_pool())
        channels = plan.channels
        if self.head_conv:
            mods += kit.conv_norm_relu(channels, self.head_conv, 1)
            channels = self.head_conv
        mods += self._head(channels)
        return nn.Sequential(*mods)

    def _head(self, channels: int) -> list[nn.Module]:
        if self.classifier == "conv":
            drop: list[nn.Module] = [nn.Dropout(self.dropout)] if self.dropout else []
            classify = nn.Conv2d(channels, self.classes, 1)  # the classifier: a bias, no norm
            return [*drop, classify, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        side = 1 if self.head_pool == "global" else FLATTEN_SIZE
        mods: list[nn.Module] = [nn.AdaptiveAvgPool2d(side), nn.Flatten()]
        fan_in = channels * side * side
        for _ in range(self.head_layers):
            mods += [nn.Linear(fan_in, self.head_width), nn.ReLU()]
            if self.dropout:
                mods.append(nn.Dropout(self.dropout))
            fan_in = self.head_width
        mods.append(nn.Linear(fan_in, self.classes))
        return mods

    def sample_inputs(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        shape = (n, self.in_channels, self.image_size, self.image_size)
        return torch.randn(*shape, generator=generator, device=device)

    # --- analytic count ------------------------------------------------------------------
    def count(self) -> Count:
        plan, kit = self.plan(), self._blocks()
        t = Tally()
        # the first conv keeps its input for its weight gradient: the batch itself, which is the
        # run's inputs (``Spec.input_bytes``), or under autocast a 16-bit copy of it
        if precision(self.precision).autocast:
            t.keep(self.in_channels * self.image_size**2)
        first = True  # the next conv reads the data: autograd computes no input gradient
        if self.stem != "none":
            kernel, _, _ = self.stem_conv()
            kit.count_conv(
                t,
                plan.stem_conv_size,
                self.in_channels,
                plan.stem_channels,
                kernel,
                data=True,
                size_in=self.image_size,
            )
            if self.stem == "imagenet":
                self._count_pool(t, plan.stem_channels * plan.stem_size**2, kept=True)
            first = False
        # the last map goes to a head that keeps it, or only to a global average pool (keeps nothing)
        head_keeps = bool(self.head_conv) or self.head_pool == "flatten" or self.classifier == "conv"
        for i, (stage, size, pool) in enumerate(
            zip(plan.stages, plan.stage_sizes, plan.stage_pools, strict=True)
        ):
            for b in stage:
                kit.count(t, b, data=first)
                first = False
            if pool:
                self._count_pool(t, stage[-1].c_out * size**2, kept=head_keeps or i + 1 < len(plan.stages))
        channels = plan.channels
        if self.head_conv:
            kit.count_conv(t, plan.stage_sizes[-1], channels, self.head_conv, 1)
            channels = self.head_conv
        self._count_head(t, channels, plan.stage_sizes[-1])
        return t.result()

    def _count_pool(self, t: Tally, out: int, *, kept: bool) -> None:
        """A max pool of ``out`` output elements: its int64 indices (in elements of the spec's
        precision), and its output when the next layer keeps it (its input is the previous
        ReLU's output, kept already)."""
        t.keep(out * INDEX_BYTES // precision(self.precision).bytes)
        if kept:
            t.keep(out)

    def _count_head(self, t: Tally, channels: int, size: int) -> None:
        if self.classifier == "conv":
            if self.dropout:
                t.keep(channels * size * size)  # the dropped map (the conv's input)
                t.dropout(channels * size * size)
            t.conv2d((size, size), channels, self.classes, (1, 1), bias=True)
            t.keep(self.classes * size * size)  # the ReLU's output
            return
        side = 1 if self.head_pool == "global" else FLATTEN_SIZE
        fan_in = channels * side * side
        t.keep(fan_in)  # pooled features, the first linear's input
        for _ in range(self.head_layers):
            # the linear's output, as counted, is the ReLU's (which keeps it; the linear's own is
            # freed once the ReLU has run); the ReLU's backward holds two gradients beside it
            t.linear(1, fan_in, self.head_width)
            t.keep(0, gradients=2 * self.head_width)
            if self.dropout:  # the dropped output (the next linear's input) and the mask
                t.keep(self.head_width)
                t.dropout(self.head_width)
            fan_in = self.head_width
        t.linear(1, fan_in, self.classes)
