"""What one training step of a spec moves per rank at a rank count, as a run records it: the
backend's collectives on the spec's model (built on the meta device, its experts placed as at
that many ranks) and the experts' all-to-alls; and the share of the parameters a rank holds only
a slice of (FSDP's, sharded experts')."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hpcdl.parallel.backends import BACKENDS, Traffic
from hpcdl.parallel.placement import rank_local, spread
from hpcdl.workloads import moe


def placed_model(spec: Any, ranks: int) -> nn.Module:
    """The spec's model on the meta device (no memory), its experts placed as at ``ranks`` ranks."""
    with torch.device("meta"):
        model = spec.build()
    spread(model, 0, ranks, None, torch.device("meta"))
    return model


def sharded_fraction(spec: Any, backend: str, ranks: int) -> float:
    """Of the spec's parameters, the fraction each of ``ranks`` ranks holds only 1/ranks of."""
    if BACKENDS.get(backend).shards_state:
        return 1.0
    model = placed_model(spec, ranks)
    local = rank_local(model)
    held = sum(p.numel() for p in model.parameters() if id(p) in local)
    return held * ranks / spec.count().params


def step_traffic(spec: Any, backend: str, ranks: int, batch_per_rank: int) -> list[Traffic]:
    """What one training step of ``spec`` moves per rank at ``ranks`` ranks: the backend's rule
    on the spec's model (built on the meta device, its experts placed as at ``ranks``) and the
    experts' all-to-alls of ``batch_per_rank`` sequences -- what a run records."""
    model = placed_model(spec, ranks)
    traffic = BACKENDS.get(backend).traffic(model)
    layers = sum(isinstance(m, moe.MoE) and m.ranks > 1 for m in model.modules())
    if layers:
        calls = moe.ALL_TO_ALLS_PER_LAYER * layers
        nbytes = calls * moe.dispatch_bytes(spec, batch_per_rank, spec.precision)
        traffic.append(Traffic("all_to_all", nbytes, calls))
    return traffic
