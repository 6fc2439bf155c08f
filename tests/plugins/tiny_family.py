"""A workload family in one file outside the package: registered through HPCDL_PLUGINS by
tests/test_extensions.py. Two linear layers with a ReLU, and their analytic count; and its
tensor-parallel plan (the first layer split by columns, the second by rows), which a run with
``--layout tp=2`` uses without any other file knowing the family."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from hpcdl.workloads.counting import Count, Tally
from hpcdl.workloads.parallelism import Allreduces, Split
from hpcdl.workloads.precision import precision
from hpcdl.workloads.registry import FAMILIES
from hpcdl.workloads.spec import Spec, knob


@FAMILIES.register
@dataclass(frozen=True, kw_only=True)
class TinySpec(Spec):
    """Two linear layers: features -> width -> classes."""

    family: ClassVar[str] = "tiny"
    sampling: ClassVar[dict[str, list[Any]]] = {"width": [4, 8, 16]}

    features: int = knob(8, lo=1, hi=4096, doc="input features")
    width: int = knob(16, lo=1, hi=4096, doc="hidden units")
    classes: int = knob(4, lo=2, hi=4096, doc="output classes")

    @property
    def num_classes(self) -> int:
        return self.classes

    def build_module(self) -> nn.Module:
        return nn.Sequential(
            nn.Linear(self.features, self.width), nn.ReLU(), nn.Linear(self.width, self.classes)
        )

    def count(self) -> Count:
        return self.tp_count(1)

    def sample_inputs(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        return torch.randn(n, self.features, generator=generator, device=device)

    # --- tensor parallelism: the hidden units split across the group ---------------------
    def tp_sizes(self) -> dict[str, int]:
        return {"width": self.width}

    def tp_splits(self, model: nn.Module) -> dict[nn.Module, Split]:
        return {model[0]: "columns", model[2]: "rows"}

    def tp_allreduces(self, blocks: int | None = None) -> Allreduces:
        # forward: the second layer's partial products summed; backward: none, as the first
        # layer's input is the data
        return Allreduces(self.batch_size * self.classes * precision(self.precision).bytes, 1)

    def tp_count(self, tp: int) -> Count:
        """One rank's share: ``width / tp`` hidden units (the second layer's bias whole)."""
        t = Tally()
        t.linear(1, self.features, self.width // tp, data_input=True)
        t.keep(self.width // tp)
        t.linear(1, self.width // tp, self.classes)
        return t.result()
