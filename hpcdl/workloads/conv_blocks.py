"""The CNN family's convolutional blocks (plain, basic, bottleneck, separable, inverted, fire),
each built and counted side by side: :class:`Blocks` turns a :class:`BlockPlan` into modules and
into the same layers' Tally calls, so that a block kind's network and its count are read (and
changed) together. ``families/cnn.py`` plans the blocks and walks the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from hpcdl.workloads.counting import GRADIENT_BUFFERS, Tally

BLOCKS = ("plain", "basic", "bottleneck", "separable", "inverted", "fire")
NORMS = ("batch", "group", "none")
GROUPS = 32
"""GroupNorm groups (fewer when the channels are not a multiple of it)"""


@dataclass(frozen=True)
class BlockPlan:
    """One block of the body: its channels, stride and input/output map sides."""

    c_in: int
    width: int
    """inner width: the 3x3 (kxk) conv's channels for a bottleneck, else ``c_out``"""
    c_out: int
    stride: int
    size_in: int
    size_out: int
    kernel: int = 3
    """side of the block's spatial (kxk) convolution"""
    hidden: int = 0
    """inverted: channels of the expanded (depthwise) layer, ``c_in`` x the stage's expansion;
    fire: channels of the 1x1 squeeze"""
    spatial: int = 0
    """fire only: output channels of the kxk expand (the 1x1 expand gives the other ``c_out - spatial``)"""

    @property
    def projects(self) -> bool:
        """Whether a residual block needs a 1x1 projection on its shortcut (shape changes)."""
        return self.stride != 1 or self.c_in != self.c_out

    @property
    def expands(self) -> bool:
        """Inverted only: whether a 1x1 conv expands the input (MobileNetV2's first block does not)."""
        return self.hidden != self.c_in


@dataclass(frozen=True)
class Blocks:
    """One network's blocks: their kind (``BLOCKS``) and the norm after each conv (``NORMS``)."""

    kind: str
    norm: str

    # --- network -------------------------------------------------------------------------
    def conv(
        self, c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1, padding: int = -1
    ) -> nn.Conv2d:
        # a bias right before a norm would be cancelled by its mean subtraction
        padding = kernel // 2 if padding < 0 else padding
        return nn.Conv2d(
            c_in, c_out, kernel, stride=stride, padding=padding, groups=groups, bias=self.norm == "none"
        )

    def norm_layer(self, c: int) -> nn.Module:
        if self.norm == "batch":
            return nn.BatchNorm2d(c)
        if self.norm == "group":
            return nn.GroupNorm(math.gcd(GROUPS, c), c)
        return nn.Identity()

    def conv_norm_relu(
        self, c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1, padding: int = -1
    ) -> list[nn.Module]:
        return [self.conv(c_in, c_out, kernel, stride, groups, padding), self.norm_layer(c_out), nn.ReLU()]

    def build(self, b: BlockPlan) -> nn.Module:
        """The block ``b`` as modules."""
        k = b.kernel
        if self.kind == "inverted":
            expand = self.conv_norm_relu(b.c_in, b.hidden, 1) if b.expands else []
            inverted = nn.Sequential(
                *expand,
                *self.conv_norm_relu(b.hidden, b.hidden, k, b.stride, groups=b.hidden),
                self.conv(b.hidden, b.c_out, 1),
                self.norm_layer(b.c_out),
            )
            return inverted if b.projects else Residual(inverted, nn.Identity(), relu=False)
        if self.kind == "plain":
            return nn.Sequential(*self.conv_norm_relu(b.c_in, b.c_out, k, b.stride))
        if self.kind == "fire":  # a strided block strides its squeeze
            return Fire(
                nn.Sequential(*self.conv_norm_relu(b.c_in, b.hidden, 1, b.stride)),
                nn.Sequential(*self.conv_norm_relu(b.hidden, b.c_out - b.spatial, 1)),
                nn.Sequential(*self.conv_norm_relu(b.hidden, b.spatial, k)),
            )
        if self.kind == "separable":
            return nn.Sequential(
                *self.conv_norm_relu(b.c_in, b.c_in, k, b.stride, groups=b.c_in),
                *self.conv_norm_relu(b.c_in, b.c_out, 1),
            )
        if self.kind == "basic":
            body = [*self.conv_norm_relu(b.c_in, b.c_out, k, b.stride), self.conv(b.c_out, b.c_out, k)]
        else:  # bottleneck, v1.5: the stride sits on the kxk conv, not on the first 1x1
            body = [
                *self.conv_norm_relu(b.c_in, b.width, 1),
                *self.conv_norm_relu(b.width, b.width, k, b.stride),
                self.conv(b.width, b.c_out, 1),
            ]
        body.append(self.norm_layer(b.c_out))
        shortcut = (
            nn.Sequential(self.conv(b.c_in, b.c_out, 1, b.stride), self.norm_layer(b.c_out))
            if b.projects
            else nn.Identity()
        )
        return Residual(nn.Sequential(*body), shortcut)

    # --- analytic count ------------------------------------------------------------------
    def count_conv(
        self,
        t: Tally,
        size: int,
        c_in: int,
        c_out: int,
        kernel: int,
        *,
        groups: int = 1,
        data: bool = False,
        relu: bool = True,
        size_in: int = 0,
        alive: int = 0,
        summed: bool = False,
    ) -> None:
        """A conv, its norm and (optionally) its ReLU. A norm keeps the conv's output; the ReLU
        keeps its own (the next layer's input). ``size_in``: the input's map side (default
        ``size``); ``alive``: elements of other gradients alive during their backward;
        ``summed``: its output (its norm's, with one) is added to an identity shortcut, whose
        gradient (``alive``) is then the very tensor that layer's backward receives, counted
        once (cnn seed 17, fp32: one map too many at its peak, ``memory_allocator.py``)."""
        last_alive = 0 if summed else alive  # alive in the backward of the layer that is summed
        t.conv2d(
            (size, size),
            c_in,
            c_out,
            (kernel, kernel),
            groups=groups,
            bias=self.norm == "none",
            data_input=data,
            in_hw=(size_in or size, size_in or size),
            keep_output=self.norm != "none",
            alive=alive if self.norm != "none" else last_alive,
        )
        out = c_out * size * size
        if self.norm != "none":
            t.add_params(2 * c_out)  # scale and shift; BatchNorm's running stats are buffers
            t.transient(GRADIENT_BUFFERS * out + last_alive)  # its output's and its input's gradients
        if relu:
            t.keep(out)
            t.transient(GRADIENT_BUFFERS * out + alive)

    def count(self, t: Tally, b: BlockPlan, *, data: bool) -> None:
        """The block ``b``'s layers, as ``build`` makes them; ``data``: its input is the batch
        (autograd computes no gradient for it)."""
        k, s, size_in = b.kernel, b.size_out, b.size_in
        # a residual block's input gradient from its shortcut is alive while its body's backward
        # runs (the shortcut, made last in forward, runs its backward first)
        shortcut = b.c_in * size_in * size_in
        if self.kind == "inverted":
            alive = 0 if b.projects else shortcut
            if b.expands:
                self.count_conv(t, size_in, b.c_in, b.hidden, 1, data=data, alive=alive)
            dw_data = data and not b.expands
            self.count_conv(
                t, s, b.hidden, b.hidden, k, groups=b.hidden, data=dw_data, size_in=size_in, alive=alive
            )
            self.count_conv(t, s, b.hidden, b.c_out, 1, relu=False, alive=alive, summed=not b.projects)
            # the block's output, the next layer's input: the residual sum (no ReLU after it) or
            # the last norm's output (the last conv's with no norm)
            t.keep(b.c_out * s * s)
            return
        if self.kind == "plain":
            self.count_conv(t, s, b.c_in, b.c_out, k, data=data, size_in=size_in)
            return
        if self.kind == "fire":
            self.count_conv(t, s, b.c_in, b.hidden, 1, data=data, size_in=size_in)
            self.count_conv(t, s, b.hidden, b.c_out - b.spatial, 1)
            self.count_conv(t, s, b.hidden, b.spatial, k)
            t.keep(b.c_out * s * s)  # the concatenation, a tensor of its own that the next layer keeps
            return
        if self.kind == "separable":
            self.count_conv(t, s, b.c_in, b.c_in, k, groups=b.c_in, data=data, size_in=size_in)
            self.count_conv(t, s, b.c_in, b.c_out, 1)
            return
        if self.kind == "basic":
            self.count_conv(t, s, b.c_in, b.c_out, k, data=data, size_in=size_in, alive=shortcut)
            self.count_conv(t, s, b.c_out, b.c_out, k, relu=False, alive=shortcut, summed=not b.projects)
        else:
            self.count_conv(t, size_in, b.c_in, b.width, 1, data=data, alive=shortcut)
            self.count_conv(t, s, b.width, b.width, k, size_in=size_in, alive=shortcut)
            self.count_conv(t, s, b.width, b.c_out, 1, relu=False, alive=shortcut, summed=not b.projects)
        if b.projects:
            self.count_conv(t, s, b.c_in, b.c_out, 1, data=data, relu=False, size_in=size_in)
        t.keep(b.c_out * s * s)  # the ReLU after the residual sum
        t.transient(GRADIENT_BUFFERS * b.c_out * s * s)


class Fire(nn.Module):
    """SqueezeNet's fire module: ``cat(expand1(s), expand_k(s))`` with ``s = squeeze(x)``."""

    def __init__(self, squeeze: nn.Module, expand1: nn.Module, expand_k: nn.Module) -> None:
        super().__init__()
        self.squeeze = squeeze
        self.expand1 = expand1
        self.expand_k = expand_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.squeeze(x)
        return torch.cat([self.expand1(s), self.expand_k(s)], 1)


class Residual(nn.Module):
    """``relu(body(x) + shortcut(x))``: the ResNet residual connection (MobileNetV2's has no ReLU)."""

    def __init__(self, body: nn.Module, shortcut: nn.Module, *, relu: bool = True) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut
        self.relu = nn.ReLU() if relu else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))
