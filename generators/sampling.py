"""Generative sampling: draw architectures of a family within knob ranges from a seed, in the
spirit of ParaDnn's parameter sweeps and AIPerf's generated networks.

A range is a list of allowed values, drawn uniformly. The same (family, seed, ranges) always
gives the same spec, and the spec's seed (the drawn one) fixes weights and data.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from hpcdl.errors import SpecError
from hpcdl.workloads.registry import family_class, spec_from_dict
from hpcdl.workloads.spec import Spec

Ranges = dict[str, list[Any]]

RANGES: dict[str, Ranges] = {
    "mlp": {
        "layers": [1, 2, 3, 4, 6, 8],
        "width": [64, 128, 256, 512, 1024, 2048],
        "input_size": [32, 128, 512, 1024],
        "output_size": [10, 100, 1000],
    },
    "cnn": {
        "stages": [1, 2, 3, 4],
        "blocks_per_stage": [1, 2, 3],  # drawn once per stage into "blocks"
        "base_width": [8, 16, 32, 64],
        "width_mult": [1.5, 2.0],
        "kernel_size": [3, 5],
        "block": ["plain", "basic", "bottleneck", "separable"],
        "downsample": ["stride", "maxpool", "none"],
        "norm": ["batch", "group", "none"],
        "stem": ["none", "simple"],
        "image_size": [32, 64],
        "classes": [10, 100],
    },
    "rnn": {
        "cell": ["lstm", "gru", "vanilla"],
        "layers": [1, 2, 3],
        "hidden": [64, 128, 256, 512],
        "vocab": [0, 1000, 10000],
        "embedding": [64, 128, 256],
        "input_features": [16, 64, 128],
        "seq_len": [16, 32, 64],
        "bidirectional": [False, True],
        "output": ["step", "last"],
        "classes": [10, 100, 1000],
    },
    "attention": {
        "layers": [1, 2, 4, 6],
        "heads": [1, 2, 4, 8],
        "head_dim": [16, 32, 64],  # width = heads x head_dim, so heads always divide width
        "ffn_mult": [2.0, 4.0],
        "seq_len": [32, 64, 128, 256],
        "vocab": [1000, 8000, 32000],
        "causal": [False, True],
        "norm": ["pre", "post"],
        "head": ["lm", "cls"],
        "tie_embeddings": [False, True],
    },
    "speech": {
        "freq_bins": [41, 81, 161],
        "frames": [50, 100, 200],
        "conv_layers": [1, 2, 3],
        "conv_channels": [8, 16, 32],
        "cell": ["lstm", "gru", "vanilla"],
        "rnn_layers": [1, 2, 3],
        "hidden": [64, 128, 256],
        "bidirectional": [False, True],
    },
}


def _cnn(knobs: dict[str, Any], table: Ranges, rng: random.Random) -> dict[str, Any]:
    per_stage = knobs.pop("blocks_per_stage")  # the first stage's; the others are drawn below
    if "blocks" not in knobs:
        knobs["blocks"] = [per_stage] + [
            rng.choice(table["blocks_per_stage"]) for _ in range(knobs["stages"] - 1)
        ]
    return knobs


def _attention(knobs: dict[str, Any], table: Ranges, rng: random.Random) -> dict[str, Any]:
    head_dim = knobs.pop("head_dim")
    knobs.setdefault("width", knobs["heads"] * head_dim)
    return knobs


DERIVE: dict[str, Callable[[dict[str, Any], Ranges, random.Random], dict[str, Any]]] = {
    "cnn": _cnn,
    "attention": _attention,
}


def sample_spec(family: str, seed: int, ranges: Ranges | None = None, **fixed: Any) -> Spec:
    """Draw one spec of ``family``: each knob uniformly from its range (``ranges`` overrides
    the defaults in :data:`RANGES`), then ``fixed`` knobs set as given. Draws that make an
    impossible network (e.g. an image downsampled below one pixel) are redrawn."""
    family_class(family)  # a clear error for an unknown family
    table = {**RANGES[family], **(ranges or {})}
    for key, values in table.items():
        if not isinstance(values, list) or not values:
            raise SpecError(f"ranges.{key}", values, "expected a non-empty list of values")
    rng = random.Random(f"{family}:{seed}")
    last: SpecError | None = None
    for _ in range(100):
        knobs = {key: rng.choice(values) for key, values in table.items()} | fixed
        knobs = DERIVE.get(family, lambda k, t, r: k)(knobs, table, rng)  # keeps fixed knobs
        try:
            return spec_from_dict({"family": family, "seed": seed, **knobs})
        except SpecError as err:
            last = err
    assert last is not None
    raise last
