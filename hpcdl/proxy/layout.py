"""From a network's structure (``hpcdl.proxy.structure``) to a family's knobs: what the real
layout fixes, stage by stage, so that a fit searches only what it does not.

Each function returns the knobs it could read (an empty dict when the structure is not one the
family can say), never raises on a structure it does not understand: the fit then searches as
it would without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Layer = dict[str, Any]


@dataclass
class _Block:
    """One block of a convolutional body, as read from its convolutions."""

    c_in: int
    width: int
    c_out: int
    stride: int
    kernel: int
    expansion: int = 1
    pooled: bool = False
    """a max pool follows the block"""


def _depthwise(c: Layer) -> bool:
    return bool(c["groups"] > 1 and c["groups"] == c["in"] == c["out"])


def cnn(layers: list[Layer]) -> dict[str, Any]:
    """The cnn family's knobs for a convolutional classifier's structure: stem, block kind, norm,
    per-stage widths, block counts, kernels, downsampling and expansions, and the head."""
    try:
        return _cnn(layers)
    except (KeyError, IndexError, ValueError, ZeroDivisionError):
        return {}


def _cnn(layers: list[Layer]) -> dict[str, Any]:
    # the body ends at the first adaptive pool or linear layer
    end = next(
        (
            i
            for i, e in enumerate(layers)
            if e["kind"] == "linear" or (e["kind"] == "pool" and e["kernel"] == 0)
        ),
        len(layers),
    )
    body, head = layers[:end], layers[end:]
    convs = [e for e in body if e["kind"] == "conv"]
    if not convs:
        return {}
    norms = {e["type"] for e in body if e["kind"] == "norm"}
    norm = "batch" if "batch" in norms else "group" if "group" in norms else "none" if not norms else ""
    residual = any(e["kind"] == "add" for e in body)
    depthwise = any(_depthwise(c) for c in convs)
    knobs: dict[str, Any] = {"norm": norm}
    # --- the stem: a strided first conv (and the max pool right after it), or the first conv
    # of a residual or depthwise network
    items = [e for e in body if e["kind"] in ("conv", "pool", "add")]
    first = items[0]
    rest = items[1:]
    if first["kind"] != "conv":
        return {}
    if first["stride"] > 1 or residual or depthwise:
        pooled = bool(rest) and rest[0]["kind"] == "pool" and rest[0]["type"] == "max"
        if pooled and (rest[0]["kernel"], rest[0]["stride"]) != (3, 2):
            return {}
        knobs |= {
            "stem": "imagenet" if pooled else "simple",
            "stem_kernel": first["kernel"],
            "stem_stride": first["stride"],
            "base_width": first["out"],
        }
        rest = rest[1:] if pooled else rest
    else:
        knobs["stem"] = "none"
        rest = items
    # --- the blocks
    if depthwise:
        kind = "inverted" if residual else "separable"
        blocks, trailing = _depthwise_blocks(rest, kind)
    elif residual:
        blocks, trailing, kind = _residual_blocks(rest)
    else:
        kind = "plain"
        blocks, trailing = _plain_blocks(rest)
    if not blocks:
        return {}
    if trailing:  # a 1x1 conv between the last block and the pool (MobileNetV2's 1280)
        if len(trailing) != 1 or trailing[0]["kernel"] != 1 or kind not in ("inverted", "separable"):
            return {}
        knobs["head_conv"] = trailing[0]["out"]
    knobs["block"] = kind
    knobs |= _stages(blocks, kind)
    knobs |= _head(head)
    return knobs


def _plain_blocks(items: list[Layer]) -> tuple[list[_Block], list[Layer]]:
    blocks: list[_Block] = []
    for e in items:
        if e["kind"] == "pool":
            if not blocks or e["type"] != "max" or (e["kernel"], e["stride"]) != (2, 2):
                return [], []
            blocks[-1].pooled = True
        elif e["kind"] == "conv":
            if e["groups"] != 1:
                return [], []
            blocks.append(_Block(e["in"], e["out"], e["out"], e["stride"], e["kernel"]))
    return blocks, []


def _depthwise_blocks(items: list[Layer], kind: str) -> tuple[list[_Block], list[Layer]]:
    """Separable: depthwise then pointwise; inverted: [1x1 expand], depthwise, 1x1 project."""
    blocks: list[_Block] = []
    convs = [e for e in items if e["kind"] == "conv"]
    i = 0
    while i < len(convs):
        expand = None
        if (
            kind == "inverted"
            and not _depthwise(convs[i])
            and i + 1 < len(convs)
            and _depthwise(convs[i + 1])
        ):
            expand, i = convs[i], i + 1
        if not _depthwise(convs[i]):
            return blocks, convs[i:]
        dw = convs[i]
        if i + 1 >= len(convs) or convs[i + 1]["kernel"] != 1:
            return [], []
        project = convs[i + 1]
        c_in = expand["in"] if expand else dw["in"]
        expansion = dw["in"] // c_in
        if expansion * c_in != dw["in"]:
            return [], []
        blocks.append(_Block(c_in, project["out"], project["out"], dw["stride"], dw["kernel"], expansion))
        i += 2
    return blocks, []


def _residual_blocks(items: list[Layer]) -> tuple[list[_Block], list[Layer], str]:
    """Basic (two kxk convs) or bottleneck (1x1, kxk, 1x1) blocks, each ended by its addition;
    a 1x1 conv with the block's stride beside them is the projection of its shortcut."""
    blocks: list[_Block] = []
    kinds: set[str] = set()
    convs: list[Layer] = []
    for e in items:
        if e["kind"] == "conv":
            convs.append(e)
        elif e["kind"] == "add":
            spatial = [c for c in convs if c["kernel"] > 1]
            if len(spatial) not in (1, 2):
                return [], [], ""
            kinds.add("basic" if len(spatial) == 2 else "bottleneck")
            c_out = max(c["out"] for c in convs)
            stride = max(c["stride"] for c in convs)
            width = spatial[0]["out"]
            blocks.append(_Block(convs[0]["in"], width, c_out, stride, spatial[0]["kernel"], c_out // width))
            convs = []
        else:
            return [], [], ""
    if len(kinds) != 1 or convs:
        return [], [], ""
    return blocks, [], kinds.pop()


def _stages(blocks: list[_Block], kind: str) -> dict[str, Any]:
    """Blocks grouped into stages: a stage starts where the width changes, a block strides or a
    max pool ended the one before."""
    stages: list[list[_Block]] = []
    for b in blocks:
        prev = stages[-1][-1] if stages else None
        if prev is None or b.width != prev.width or b.stride > 1 or prev.pooled:
            stages.append([b])
        else:
            stages[-1].append(b)
    widths, counts, kernels, downs, expansions = [], [], [], [], []
    for stage in stages:
        head, tail = stage[0], stage[1:]
        if any(b.kernel != head.kernel or b.stride != 1 for b in tail) or any(b.pooled for b in stage[:-1]):
            raise ValueError("a stage whose blocks differ")
        if kind in ("inverted", "bottleneck") and any(b.expansion != head.expansion for b in tail):
            raise ValueError("a stage whose expansions differ")
        if head.stride not in (1, 2) or (head.stride == 2 and stage[-1].pooled):
            raise ValueError("a stage that strides other than 2, or strides and pools")
        widths.append(head.width)
        counts.append(len(stage))
        kernels.append(head.kernel)
        downs.append("stride" if head.stride == 2 else "maxpool" if stage[-1].pooled else "none")
        expansions.append(head.expansion)
    knobs: dict[str, Any] = {
        "stages": len(stages),
        "blocks": counts,
        "widths": widths,
        "kernels": kernels,
        "downsamples": downs,
    }
    if kind in ("inverted", "bottleneck"):
        knobs["expansions"] = expansions
    return knobs


def _head(head: list[Layer]) -> dict[str, Any]:
    pools = [e for e in head if e["kind"] == "pool"]
    linears = [e for e in head if e["kind"] == "linear"]
    if not linears:
        raise ValueError("no classifier")
    side = pools[0]["size"] if pools else 1
    if side not in (1, 7):
        raise ValueError("a head pool the family does not have")
    hidden = [e["out"] for e in linears[:-1]]
    if len(set(hidden)) > 1:
        raise ValueError("hidden head layers of different widths")
    knobs: dict[str, Any] = {"head_pool": "global" if side == 1 else "flatten", "head_layers": len(hidden)}
    if hidden:
        knobs["head_width"] = hidden[0]
    return knobs


def attention(layers: list[Layer], norm_position: str | None) -> dict[str, Any]:
    """The attention family's knobs a transformer's structure fixes: heads, head size (so the
    width), pre or post norm."""
    calls = [e for e in layers if e["kind"] == "attention"]
    if not calls or len({(e["heads"], e["head_dim"]) for e in calls}) != 1:
        return {}
    knobs: dict[str, Any] = {"heads": calls[0]["heads"], "head_dim": calls[0]["head_dim"]}
    if norm_position:
        knobs["norm"] = norm_position
    return knobs


def rnn(layers: list[Layer]) -> dict[str, Any]:
    """The rnn family's knobs a recurrent model's structure fixes: the token embedding's size
    and vocabulary."""
    embeddings = [e for e in layers if e["kind"] == "embedding"]
    if len(embeddings) != 1:
        return {}
    return {"embedding": embeddings[0]["dim"], "vocab": embeddings[0]["num"]}
