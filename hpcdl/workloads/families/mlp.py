"""MLP: a stack of fully connected layers -- the simplest dense, matmul-bound workload."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from hpcdl.workloads.counting import Count, Tally
from hpcdl.workloads.precision import precision
from hpcdl.workloads.registry import FAMILIES
from hpcdl.workloads.spec import Ranges, Spec, knob


@FAMILIES.register
@dataclass(frozen=True, kw_only=True)
class MLPSpec(Spec):
    """Fully connected network: ``layers`` hidden layers of ``width`` with ReLU, then a classifier."""

    family: ClassVar[str] = "mlp"
    sampling: ClassVar[Ranges] = {
        "layers": [1, 2, 3, 4, 6, 8],
        "width": [64, 128, 256, 512, 1024, 2048],
        "input_size": [32, 128, 512, 1024],
        "output_size": [10, 100, 1000],
    }

    layers: int = knob(4, lo=1, hi=1000, doc="hidden layers")
    width: int = knob(1024, lo=1, hi=1 << 17, doc="units per hidden layer")
    input_size: int = knob(1024, lo=1, hi=1 << 24, doc="features per input sample")
    output_size: int = knob(1000, lo=2, hi=1 << 24, doc="output classes")

    @property
    def num_classes(self) -> int:
        return self.output_size

    def build_module(self) -> nn.Module:
        mods: list[nn.Module] = []
        fan_in = self.input_size
        for _ in range(self.layers):
            mods += [nn.Linear(fan_in, self.width), nn.ReLU()]
            fan_in = self.width
        mods.append(nn.Linear(fan_in, self.output_size))
        return nn.Sequential(*mods)

    def count(self, tp: int = 1) -> Count:
        """The whole model's work (``tp`` = 1), or one rank's under tensor parallelism over
        ``tp`` ranks (``hpcdl.parallel.tensor``: the layers in column/row-parallel pairs, a last
        unpaired layer whole)."""
        t = Tally()
        if precision(self.precision).autocast:  # the first linear keeps a 16-bit copy of the data
            t.keep(self.input_size)  # (the fp32 batch beside it is the run's inputs)
        sizes = [self.input_size] + [self.width] * self.layers + [self.output_size]
        linears = len(sizes) - 1
        for i in range(linears):
            fan_in, fan_out = sizes[i], sizes[i + 1]
            if tp > 1 and i % 2 == 0 and i + 1 < linears:
                fan_out //= tp  # column-parallel: this rank's outputs
            elif tp > 1 and i % 2 == 1:
                fan_in //= tp  # row-parallel: this rank's inputs; the bias whole
            # a hidden linear's output, as counted, is the ReLU's: the ReLU keeps its own output
            # (the next linear's input) and the linear's is freed once the ReLU has run
            t.linear(1, fan_in, fan_out, data_input=i == 0)
            if i + 1 < linears:  # the ReLU's backward: its output's and its input's gradients
                t.keep(0, gradients=2 * fan_out)  # beside its own output, which it keeps
        return t.result()

    def sample_inputs(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        return torch.randn(n, self.input_size, generator=generator, device=device)
