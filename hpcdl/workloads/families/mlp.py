"""MLP: a stack of fully connected layers -- the simplest dense, matmul-bound workload."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from hpcdl.workloads.counting import Count, Tally
from hpcdl.workloads.parallelism import Allreduces, End, Parts, Split
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

    def count(self) -> Count:
        return self._count(1)

    def tp_count(self, tp: int) -> Count:
        """One rank's work under tensor parallelism over ``tp`` ranks: the layers in
        column/row-parallel pairs (:meth:`tp_splits`), a last unpaired layer whole."""
        return self._count(tp)

    def _count(self, tp: int) -> Count:
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

    # --- tensor and pipeline parallelism (``hpcdl.parallel``) -----------------------------
    def _sizes(self) -> list[int]:
        """The features into and out of each linear layer: linear i maps sizes[i] to sizes[i + 1]."""
        return [self.input_size] + [self.width] * self.layers + [self.output_size]

    def tp_sizes(self) -> dict[str, int]:
        return {"width": self.width}

    def tp_splits(self, model: nn.Module) -> dict[nn.Module, Split]:
        """The linear layers in pairs, the first of each by columns, the second by rows; a last
        unpaired layer stays whole."""
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        splits: dict[nn.Module, Split] = {}
        for column, row in zip(linears[0::2], linears[1::2], strict=False):
            splits |= {column: "columns", row: "rows"}
        return splits

    def tp_allreduces(self, blocks: int | None = None) -> Allreduces:
        """One allreduce forward per pair, of the row-parallel layer's outputs, and one backward
        per pair whose input is not the data, of its inputs; in the compute precision. (A
        pipeline stage's pairs are not its own: ``tp_in_stages`` is false, ``blocks`` unused.)"""
        sizes = self._sizes()
        pairs = len(sizes[:-1]) // 2
        forward = sum(sizes[2 * p + 2] for p in range(pairs))
        backward = sum(sizes[2 * p] for p in range(1, pairs))  # the first pair's input is the data
        calls = pairs + max(pairs - 1, 0)
        return Allreduces(self.batch_size * (forward + backward) * precision(self.precision).bytes, calls)

    def pp_blocks(self) -> int:
        return self.layers

    def pp_parts(self, model: nn.Module) -> Parts:
        """A block is a hidden layer and its ReLU; the last linear layer runs after them."""
        layers = list(model.children())
        pairs = range(0, len(layers) - 1, 2)
        blocks: list[nn.Module] = [nn.Sequential(layers[i], layers[i + 1]) for i in pairs]
        return Parts(None, blocks, End(layers[-1], (layers[-1],)))

    def pp_boundary_bytes(self) -> int:
        """A hidden layer's output, in the compute precision."""
        return self.width * precision(self.precision).bytes
