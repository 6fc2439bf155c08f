"""A run's parallel layout made real: the layout checked against the world, the workload and
the backend (``hpcdl.parallel.layout`` parses it; ``parallel.backends.choose`` picks and starts the
backend that carries it out).

Where a kind of parallelism joins the run: tensor parallelism through
``backends.tensor.TensorParallel`` (and the family's plan, ``Spec.tp_splits``); pipeline
parallelism through ``backends.pipeline`` (its process group) and ``harness.pipelined.PipelinePlan``
(a stage's part of the one rank driver).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcdl.errors import SpecError
from hpcdl.parallel import pipeline
from hpcdl.parallel.backends.pipeline import PipelineBackend
from hpcdl.parallel.backends.tensor import TensorParallel
from hpcdl.parallel.layout import (
    FIELD,
    Layout,
    check_layout,
    crossing_warning,
    fit_layout,
    parse_layout,
    tp_crosses_nodes,
)

if TYPE_CHECKING:
    from hpcdl.measure.config import RunConfig
    from hpcdl.workloads.spec import Spec


def run_layout(spec: Spec, cfg: RunConfig, world_size: int) -> Layout:
    """The run's parallel layout (``run.layout``), fitted to the world and checked against the
    workload and the backend: a one-line error otherwise."""
    layout = fit_layout(parse_layout(cfg.layout), world_size)
    check_layout(layout, spec)
    if layout.pp > 1:
        check_pipeline(spec, cfg, layout)
    elif cfg.backend == PipelineBackend.name:
        raise SpecError("run.backend", cfg.backend, "only with a layout of pp > 1 (e.g. --layout pp=2)")
    carriers = ("auto", "torch", TensorParallel.name, *([PipelineBackend.name] if layout.pp > 1 else []))
    if layout.tp > 1 and cfg.backend not in carriers:
        raise SpecError(
            "run.backend",
            cfg.backend,
            f"auto, torch or {TensorParallel.name}: tensor parallelism runs on torch.distributed",
        )
    return layout


def check_pipeline(spec: Spec, cfg: RunConfig, layout: Layout) -> None:
    """What a pipeline cannot take: the model and batch (``pipeline.check``), and the run's
    settings that assume every rank holds the whole model or its own data."""
    pipeline.check(spec, layout.pp, layout.schedule, layout.chunks)
    if layout.tp > 1 and not spec.tp_in_stages:
        why = f"1 with pp > 1 for {spec.family}: its tensor-parallel pairs span pipeline blocks"
        raise SpecError(f"{FIELD}.tp", layout.tp, why)
    if cfg.backend not in ("auto", "torch", PipelineBackend.name):
        raise SpecError(
            "run.backend",
            cfg.backend,
            f"auto, torch or {PipelineBackend.name}: pipelines run on torch.distributed",
        )
    if cfg.data == "hdf5":
        raise SpecError("run.data", cfg.data, "random or learnable with pp > 1 (HDF5 shards are per rank)")
    if cfg.fit_fraction > 0:
        raise SpecError(
            "run.fit_fraction", cfg.fit_fraction, "0 with pp > 1: give a batch the microbatches divide"
        )
    if cfg.target_loss_fraction:
        raise SpecError("run.target_loss_fraction", cfg.target_loss_fraction, "0 with pp > 1")


def crossing_note(layout: Layout, nodes: list[int]) -> str | None:
    """The warning line of a layout whose tensor-parallel groups span nodes (``nodes[r]``: rank
    r's node), or None."""
    return crossing_warning(layout) if layout.tp > 1 and tp_crosses_nodes(layout, nodes) else None
