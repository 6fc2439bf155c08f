"""A run's parallel layout made real: the layout checked against the world, the workload and
the backend, and the backend that carries it out (``hpcdl.parallel.layout`` parses it).

The one place where a kind of parallelism joins the run: tensor parallelism through
``backends.tensor.TensorParallel``; pipeline parallelism's hook is :func:`run_layout`'s refusal of
pp > 1 until ``hpcdl.parallel.pipeline`` exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hpcdl.errors import SpecError
from hpcdl.parallel.backends import Backend, make_backend
from hpcdl.parallel.backends.tensor import TensorParallel
from hpcdl.parallel.layout import (
    Layout,
    check_layout,
    crossing_warning,
    fit_layout,
    parse_layout,
    tp_crosses_nodes,
)
from hpcdl.parallel.world import World

if TYPE_CHECKING:
    from hpcdl.measure.config import RunConfig
    from hpcdl.workloads.spec import Spec


def run_layout(spec: Spec, cfg: RunConfig, world_size: int) -> Layout:
    """The run's parallel layout (``run.layout``), fitted to the world and checked against the
    workload and the backend: a one-line error otherwise."""
    layout = fit_layout(parse_layout(cfg.layout), world_size)
    check_layout(layout, spec)
    if layout.pp > 1:  # the hook of hpcdl.parallel.pipeline
        raise SpecError("run.layout.pp", layout.pp, "1: pipeline parallelism is not built yet")
    if layout.tp > 1 and cfg.backend not in ("auto", "torch", TensorParallel.name):
        raise SpecError(
            "run.backend", cfg.backend, "auto or torch: tensor parallelism runs on torch.distributed"
        )
    return layout


def run_backend(name: str, layout: Layout, world: World, device: torch.device) -> tuple[str, Backend]:
    """The backend of a run: tensor parallelism's for a layout with tp > 1, else ``name``'s."""
    if layout.tp > 1:
        return TensorParallel.name, TensorParallel(world, device, layout)
    return name, make_backend(name, world, device)


def crossing_note(layout: Layout, nodes: list[int]) -> str | None:
    """The warning line of a layout whose tensor-parallel groups span nodes (``nodes[r]``: rank
    r's node), or None."""
    return crossing_warning(layout) if layout.tp > 1 and tp_crosses_nodes(layout, nodes) else None
