"""What a backend inherits when every rank holds a replica of the model: the members of the
``Backend`` protocol whose rule is data parallelism's. Each rank draws its own data; the only
collectives of a step outside forward and backward are the backend's own (``traffic``: the
gradients' allreduce, FSDP's all-gathers and reduce-scatters), timed after training through the
backend over every rank. A backend with other rules overrides them (tensor parallelism:
``backends.tensor``); a backend that is one file (``tests/plugins/naive_backend.py``) inherits
them like the built-in ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

import torch
from torch import nn

from hpcdl.parallel.backends import Backend, Traffic, gradient_bytes
from hpcdl.parallel.world import World

if TYPE_CHECKING:
    from hpcdl.workloads.spec import Spec


class Replicated:
    """The data-parallel rules of the ``Backend`` protocol (see there for each member)."""

    compiles_after_wrap: ClassVar[bool] = False
    cycle_s: ClassVar[float] = 0.0

    @staticmethod
    def traffic(model: nn.Module, accumulation_steps: int = 1) -> list[Traffic]:
        raise NotImplementedError  # every backend states its own

    def streams(self, rank: int, ranks: int) -> tuple[int, int]:
        return rank, ranks

    def step_traffic(self, model: nn.Module, spec: Spec) -> list[Traffic]:
        return self.traffic(model, spec.accumulation_steps)

    def reduced_bytes(self, model: nn.Module) -> int:
        return gradient_bytes(model)

    def time_traffic(self, traffic: list[Traffic], world: World, device: torch.device) -> dict[str, float]:
        from hpcdl.parallel.commbench import backend_time  # its sweeps import this module's package

        backend = cast(Backend, self)
        return {t.collective: backend_time(world, backend, device, t.collective, t.bytes)[0] for t in traffic}
