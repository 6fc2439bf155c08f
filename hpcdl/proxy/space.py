"""The knob space a fit searches, per family: the knobs the profile fixes (the data's shape,
the output, the batch, the precision, the features in its hints) and the axes of the others,
each an ordered list of values so that a search can step to a neighbour.

A family takes part in fitting when it has a space here and its input fits the profile's:
``attention`` and ``rnn`` take tokens, ``rnn`` also sequences of features, ``mlp`` flat
features, ``cnn`` square images. (``speech`` and plug-in families have no space yet.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpcdl.errors import InputError, SpecError
from hpcdl.proxy import layout
from hpcdl.proxy.document import Profile
from hpcdl.proxy.objective import errors
from hpcdl.workloads.families.attention import ACTIVATIONS
from hpcdl.workloads.recipes import presets
from hpcdl.workloads.recurrent import CELLS
from hpcdl.workloads.registry import spec_from_dict
from hpcdl.workloads.spec import Spec

Point = tuple[int, ...]
"""one index into each axis"""
REACHED = 0.02
"""largest count error at which a network's own layout is taken as it is"""


@dataclass(frozen=True)
class Space:
    family: str
    fixed: dict[str, Any]
    axes: dict[str, tuple[Any, ...]]
    derive: Callable[[dict[str, Any]], dict[str, Any]]
    """axis values -> knobs (e.g. ``width`` = ``heads`` x ``head_dim``)"""
    invert: Callable[[dict[str, Any]], dict[str, Any]]
    """knobs -> axis values (the inverse of ``derive``), to start from known networks"""

    def anchors(self) -> list[Point]:
        """The points nearest to the family's presets: known, real architectures from which a
        search may start (a real model like one of them is then found again)."""
        return [
            self.nearest(self.invert(knobs)) for knobs in presets().values() if knobs["family"] == self.family
        ]

    def nearest(self, values: dict[str, Any]) -> Point:
        """Each axis' value nearest to the given one (its first value when it has none)."""
        point = []
        for name, axis in self.axes.items():
            value = values.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                point.append(min(range(len(axis)), key=lambda i: abs(axis[i] - value)))
            else:
                point.append(axis.index(value) if value in axis else 0)
        return tuple(point)

    def knobs(self, point: Point) -> dict[str, Any]:
        values = {name: axis[i] for (name, axis), i in zip(self.axes.items(), point, strict=True)}
        return {"family": self.family, **self.fixed, **self.derive(values)}

    def spec(self, point: Point) -> Spec | None:
        """The spec at ``point``, or None where the knobs are not a valid network."""
        try:
            return spec_from_dict(self.knobs(point))
        except SpecError:
            return None


def _steps(lo: float, hi: float, step: float) -> tuple[float, ...]:
    n = round((hi - lo) / step)
    return tuple(round(lo + i * step, 6) for i in range(n + 1))


def _ints(lo: int, hi: int, step: int = 1) -> tuple[int, ...]:
    return tuple(range(lo, hi + 1, step))


def _geometric(lo: int, hi: int, per_octave: int, extra: tuple[int, ...] = ()) -> tuple[int, ...]:
    values = {
        round(lo * 2 ** (i / per_octave)) for i in range(per_octave * 40) if lo * 2 ** (i / per_octave) <= hi
    }
    return tuple(sorted(values | set(extra)))


def _common(profile: Profile) -> dict[str, Any]:
    return {"batch_size": profile.batch_size, "precision": profile.precision}


def _per_position(profile: Profile, steps: int) -> bool:
    """Whether the model emits logits at every position (``[T, classes]``) or once (``[classes]``)."""
    if profile.output_shape == (steps, profile.classes):
        return True
    if len(profile.output_shape) == 1:
        return False
    raise InputError(
        "profile.output.shape", list(profile.output_shape), f"expected [{steps}, classes] or [classes]"
    )


def _identity(values: dict[str, Any]) -> dict[str, Any]:
    return values


def _reaches(profile: Profile, knobs: dict[str, Any]) -> bool:
    """Whether these knobs are a valid network whose analytic counts reach the profile's."""
    try:
        count = spec_from_dict(knobs).count()
    except SpecError:
        return False
    figures: dict[str, float] = {"params": count.params, "train_flops_per_sample": count.train_flops}
    return all(abs(e) <= REACHED for e in errors(profile, figures).values())


def attention(profile: Profile) -> Space:
    (steps,) = profile.input_shape
    lm = _per_position(profile, steps)
    hints = profile.hints
    read = layout.attention(profile.structure.get("layers", []), profile.structure.get("norm_position"))
    fixed = {
        **_common(profile),
        "seq_len": steps,
        "head": "lm" if lm else "cls",
        "dropout": float(hints.get("dropout", 0.0)),
        "activation": hints["activation"] if hints.get("activation") in ACTIVATIONS else "gelu",
        "causal": bool(hints.get("causal", False)),
        "norm": read.get("norm", "pre" if hints.get("causal") else "post"),
    }
    if lm:
        fixed["vocab"] = profile.classes
    else:
        fixed["classes"] = profile.classes
    axes: dict[str, tuple[Any, ...]] = {
        "layers": (hints["attention_layers"],) if hints.get("attention_layers") else _ints(1, 64),
        # the heads and head size the attention calls showed, else every one
        "heads": (read["heads"],) if read else _ints(1, 64),
        "head_dim": (read["head_dim"],) if read else (16, 32, 64, 128),
        "ffn_mult": _steps(0.5, 8.0, 1 / 16),
        "positions": (0, *(p for p in (512, 1024, 2048, 4096, 8192) if p > steps)),
    }
    if lm:
        axes["tie_embeddings"] = (True, False)
    else:
        axes["vocab"] = _geometric(256, 262144, 8)

    def derive(values: dict[str, Any]) -> dict[str, Any]:
        knobs = dict(values)
        knobs["width"] = knobs["heads"] * knobs.pop("head_dim")
        return knobs

    def invert(knobs: dict[str, Any]) -> dict[str, Any]:
        return {**knobs, "head_dim": knobs["width"] // knobs["heads"]}

    return Space("attention", fixed, axes, derive, invert)


def cnn(profile: Profile) -> Space:
    channels, height, width = profile.input_shape
    if height != width:
        raise InputError(
            "profile.input.shape", list(profile.input_shape), "the cnn family takes square images"
        )
    if len(profile.output_shape) != 1:
        raise InputError("profile.output.shape", list(profile.output_shape), "the cnn family gives [classes]")
    fixed = {
        **_common(profile),
        "in_channels": channels,
        "image_size": height,
        "classes": profile.classes,
        "dropout": float(profile.hints.get("dropout", 0.0)),
    }
    read = layout.cnn(profile.structure.get("layers", []))
    if read and _reaches(profile, {"family": "cnn", **fixed, **read}):
        # the network's own layout, stage by stage, costs what the profile says: nothing is left
        # to search (counts alone do not pin a CNN's layout down, its structure does)
        return Space("cnn", {**fixed, **read}, {}, _identity, _identity)
    stages = 6
    axes: dict[str, tuple[Any, ...]] = {
        "stem": ("imagenet", "simple", "none"),
        "block": ("bottleneck", "basic", "plain", "separable", "fire"),
        "stages": _ints(1, stages),
        **{f"blocks{i}": _ints(1, 12) for i in range(stages)},
        "base_width": _ints(8, 256, 8),
        "width_mult": (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0),
        "max_width": (128, 256, 512, 1024, 2048),
        "expansion": (1, 2, 4, 6),
        "kernel_size": (3, 5, 7),
        "downsample": ("stride", "maxpool", "none"),
        "norm": ("batch", "none"),
        "head_pool": ("global", "flatten"),
        "head_layers": _ints(0, 3),
        "head_width": (256, 512, 1024, 2048, 4096, 8192),
    }

    def derive(values: dict[str, Any]) -> dict[str, Any]:
        knobs = {k: v for k, v in values.items() if not k.startswith("blocks")}
        knobs["blocks"] = [values[f"blocks{i}"] for i in range(values["stages"])]
        return knobs

    def invert(knobs: dict[str, Any]) -> dict[str, Any]:
        blocks = list(knobs["blocks"]) * (knobs["stages"] if len(knobs["blocks"]) == 1 else 1)
        return {**knobs, **{f"blocks{i}": n for i, n in enumerate(blocks)}}

    return Space("cnn", fixed, axes, derive, invert)


def rnn(profile: Profile) -> Space:
    steps = profile.input_shape[0]
    tokens = profile.input_kind == "tokens"
    if not tokens and len(profile.input_shape) != 2:
        raise InputError(
            "profile.input.shape", list(profile.input_shape), "the rnn family takes [T] tokens or [T, F]"
        )
    per_step = _per_position(profile, steps)
    fixed: dict[str, Any] = {
        **_common(profile),
        "seq_len": steps,
        "output": "step" if per_step else "last",
        "classes": profile.classes,
        "dropout": float(profile.hints.get("dropout", 0.0)),
    }
    axes: dict[str, tuple[Any, ...]] = {}
    if profile.hints.get("cell") in CELLS:
        fixed["cell"] = profile.hints["cell"]
    else:
        axes["cell"] = tuple(CELLS)
    hints = profile.hints
    axes |= {
        "layers": (hints["recurrent_layers"],) if hints.get("recurrent_layers") else _ints(1, 8),
        "hidden": (hints["hidden"],) if hints.get("hidden") else _ints(16, 4096, 16),
        "bidirectional": (hints["bidirectional"],) if "bidirectional" in hints else (False, True),
    }
    read = layout.rnn(profile.structure.get("layers", []))
    if tokens and read:  # the embedding the forward pass showed
        axes |= {"embedding": (read["embedding"],), "vocab": (read["vocab"],)}
    elif tokens:
        # a language model's vocabulary is usually its output's: offer that value exactly
        axes |= {"embedding": _ints(16, 4096, 16), "vocab": _geometric(256, 262144, 8, (profile.classes,))}
    else:
        fixed |= {"vocab": 0, "input_features": profile.input_shape[1]}
    return Space("rnn", fixed, axes, _identity, _identity)


def mlp(profile: Profile) -> Space:
    if len(profile.output_shape) != 1:
        raise InputError("profile.output.shape", list(profile.output_shape), "the mlp family gives [classes]")
    fixed = {**_common(profile), "input_size": profile.input_shape[0], "output_size": profile.classes}
    return Space("mlp", fixed, {"layers": _ints(1, 32), "width": _ints(16, 16384, 16)}, _identity, _identity)


BUILDERS: dict[str, Callable[[Profile], Space]] = {"attention": attention, "cnn": cnn, "rnn": rnn, "mlp": mlp}
TAKES = {"attention": ("tokens",), "rnn": ("tokens", "features"), "mlp": ("features",), "cnn": ("images",)}
"""the input kinds each family's space takes"""


def takes(family: str, profile: Profile) -> bool:
    if profile.input_kind not in TAKES.get(family, ()):
        return False
    # features: one vector per sample for the mlp, a sequence for the rnn
    return family != "mlp" or len(profile.input_shape) == 1


def space(profile: Profile, family: str) -> Space:
    """The space of ``family`` for this profile; an ``InputError`` when it cannot take its data."""
    if family not in BUILDERS:
        raise InputError("family", family, "families that can be fitted: " + ", ".join(BUILDERS))
    if not takes(family, profile):
        shape = [profile.input_kind, *profile.input_shape]
        able = [f for f in BUILDERS if takes(f, profile)] or ["none"]
        raise InputError(
            "family", family, f"cannot take inputs {shape}; families that can: {', '.join(able)}"
        )
    return BUILDERS[family](profile)


def spaces(profile: Profile) -> list[Space]:
    """The spaces of every family that can take the profile's data."""
    found = [BUILDERS[f](profile) for f in BUILDERS if takes(f, profile)]
    if not found:
        raise InputError("profile.input", profile.input_kind, "no family can be fitted to this input")
    return found
