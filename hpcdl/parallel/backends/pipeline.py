"""The backend of a pipeline-parallel run (a layout with pp > 1): the torch.distributed process
group its stages send over, and the rules its record follows. The stages and their data
parallelism are ``hpcdl.parallel.schedule``'s: a pipeline rank never wraps a whole model."""

from __future__ import annotations

from typing import ClassVar

from hpcdl.parallel.backends import BACKENDS
from hpcdl.parallel.backends.torch_ddp import TorchBackend


@BACKENDS.register
class PipelineBackend(TorchBackend):
    """Chosen by a layout with pp > 1 (``--layout``), never by ``backend=auto``; named without
    one it is refused (``harness.compose.run_layout``)."""

    name: ClassVar[str] = "pipeline"
    auto_priority: ClassVar[int | None] = None
    keeps_gradients: ClassVar[bool] = False  # its dp replicas reduce after the schedule, not in DDP
    exposed_method: ClassVar[str] = (
        "median of the allreduce phase (the dp replicas' flat allreduce after the schedule); the "
        "point-to-point sends run inside the schedule (metrics.pipeline: how long the stages sat idle)"
    )
    compute_only_method: ClassVar[str] = (
        "not measured: a stage's forward and backward wait for its neighbours' activations and gradients"
    )

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float | None:
        return None

    @staticmethod
    def compute_only_s(forward_s: float, backward_s: float, local_backward_s: float | None) -> float | None:
        return None
