"""Which backend carries a run's layout, and starting it for a rank: the one place for both,
called by the run (``harness.runner``) and by an auto-fit trial of a rank's share
(``measure.trial.Shard``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hpcdl.parallel.backends import BACKENDS, Backend
from hpcdl.parallel.backends.pipeline import PipelineBackend
from hpcdl.parallel.backends.tensor import TensorParallel
from hpcdl.parallel.layout import Layout
from hpcdl.parallel.world import World

if TYPE_CHECKING:
    from hpcdl.workloads.spec import Spec


def backend_class(name: str, layout: Layout) -> type[Backend]:
    """The class of the backend a run uses: the pipeline's for pp > 1 (with or without tp),
    tensor parallelism's for tp > 1 alone, else ``name``'s (already resolved)."""
    if layout.pp > 1:  # a pipeline's stages apply tensor parallelism themselves (tp x pp)
        return PipelineBackend
    if layout.tp > 1:
        return TensorParallel
    return BACKENDS.get(name)


def start_backend(
    name: str, layout: Layout, world: World, device: torch.device, spec: Spec | None = None
) -> Backend:
    """The backend of :func:`backend_class`, started for this rank (tensor parallelism over the
    layout's tp x dp mesh, splitting ``spec``'s model by its family's plan)."""
    cls = backend_class(name, layout)
    if cls is TensorParallel:
        return TensorParallel(world, device, layout, spec)
    return cls(world, device)
