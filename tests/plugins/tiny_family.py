"""A workload family in one file outside the package: registered through HPCDL_PLUGINS by
tests/test_extensions.py. Two linear layers with a ReLU, and their analytic count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from hpcdl.workloads.counting import Count, Tally
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
        t = Tally()
        t.linear(1, self.features, self.width, data_input=True)
        t.keep(self.width)
        t.linear(1, self.width, self.classes)
        return t.result()

    def sample_inputs(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        return torch.randn(n, self.features, generator=generator, device=device)
