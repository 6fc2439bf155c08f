"""A workload family whose forward fails inside a real ATen kernel (a matrix product of shapes
that do not chain) once training starts: what a kernel this machine cannot run looks like to
``hpcdl run`` (tests/test_extensions.py). Its count is the valid model's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from hpcdl.workloads.counting import Count, Tally
from hpcdl.workloads.registry import FAMILIES
from hpcdl.workloads.spec import Spec, knob


class Faulty(nn.Module):
    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            x = x @ torch.ones(x.shape[-1] + 1, x.shape[-1], device=x.device)  # raises RuntimeError
        return self.head(x)


@FAMILIES.register
@dataclass(frozen=True, kw_only=True)
class FaultySpec(Spec):
    """One linear layer whose training forward fails."""

    family: ClassVar[str] = "faulty"

    features: int = knob(8, lo=1, hi=4096, doc="input features")
    classes: int = knob(4, lo=2, hi=4096, doc="output classes")

    @property
    def num_classes(self) -> int:
        return self.classes

    def build_module(self) -> nn.Module:
        return Faulty(self.features, self.classes)

    def count(self) -> Count:
        t = Tally()
        t.linear(1, self.features, self.classes, data_input=True)
        return t.result()

    def sample_inputs(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        return torch.randn(n, self.features, generator=generator, device=device)
