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
    squeeze: int = 0
    """fire: channels of the squeeze"""
    spatial: int = 0
    """fire: output channels of the kxk expand"""


def _depthwise(c: Layer) -> bool:
    return bool(c["groups"] > 1 and c["groups"] == c["in"] == c["out"])


def _fire_at(layers: list[Layer], i: int) -> bool:
    """Whether ``layers[i:i+3]`` is a fire module: a 1x1 squeeze whose output feeds a 1x1 and a
    kxk expand."""
    if i + 2 >= len(layers) or any(e["kind"] != "conv" for e in layers[i : i + 3]):
        return False
    squeeze, e1, ek = layers[i : i + 3]
    return bool(
        squeeze["kernel"] == e1["kernel"] == 1
        and e1["in"] == ek["in"] == squeeze["out"]
        and e1["stride"] == ek["stride"] == 1
        and squeeze["groups"] == e1["groups"] == ek["groups"] == 1
    )


def cnn(layers: list[Layer]) -> dict[str, Any]:
    """The cnn family's knobs for a convolutional classifier's structure: stem, block kind, norm,
    per-stage widths, block counts, kernels, downsampling and expansions, the max pools, and the
    head."""
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
    fire = not residual and not depthwise and any(_fire_at(convs, i) for i in range(len(convs)))
    knobs: dict[str, Any] = {"norm": norm}
    pools: set[str] = set()
    """the max pools' kind: "standard", "ceil3", or "either" where their sides do not tell"""
    # --- the stem: a strided first conv (and the max pool right after it), or the first conv
    # of a residual or depthwise network
    items = [e for e in body if e["kind"] in ("conv", "pool", "add")]
    first = items[0]
    rest = items[1:]
    if first["kind"] != "conv":
        return {}
    if first["stride"] > 1 or residual or depthwise or fire:
        pooled = bool(rest) and rest[0]["kind"] == "pool" and rest[0]["type"] == "max"
        if pooled and (rest[0]["kernel"], rest[0]["stride"]) != (3, 2):
            return {}
        knobs |= {
            "stem": "imagenet" if pooled else "simple",
            "stem_kernel": first["kernel"],
            "stem_stride": first["stride"],
            "base_width": first["out"],
        }
        padding = first.get("padding", first["kernel"] // 2)
        if padding != first["kernel"] // 2:
            knobs["stem_padding"] = padding
        if pooled:  # the imagenet stem's pool, padded, rounds an odd side up; SqueezeNet's down
            side, halved = rest[0]["size"], first["size"] / 2
            pools.add("either" if side == halved else "standard" if side > halved else "ceil3")
        rest = rest[1:] if pooled else rest
    else:
        knobs["stem"] = "none"
        rest = items
    # --- the blocks
    if depthwise:
        kind = "inverted" if residual else "separable"
        blocks, trailing = _depthwise_blocks(rest, kind)
    elif fire:
        kind = "fire"
        blocks, trailing = _fire_blocks(rest, pools)
        knobs |= _fire_split(blocks)
    elif residual:
        blocks, trailing, kind = _residual_blocks(rest)
    else:
        kind = "plain"
        blocks, trailing = _plain_blocks(rest, pools)
    if not blocks:
        return {}
    classifier = not any(e["kind"] == "linear" for e in head)
    if classifier and kind == "plain" and not blocks[-1].pooled:  # its last conv classifies
        trailing, blocks = [convs[-1]], blocks[:-1]
    if classifier:  # a 1x1 conv to the classes before the pool is the classifier (SqueezeNet)
        if not trailing or trailing[-1]["kernel"] != 1 or not trailing[-1]["bias"]:
            return {}
        trailing = trailing[:-1]
    if trailing:  # a 1x1 conv between the last block and the pool (MobileNetV2's 1280)
        if len(trailing) != 1 or trailing[0]["kernel"] != 1 or kind not in ("inverted", "separable"):
            return {}
        knobs["head_conv"] = trailing[0]["out"]
    if len(pools - {"either"}) > 1:
        return {}
    if "ceil3" in pools:
        knobs["pool"] = "ceil3"
    knobs["block"] = kind
    knobs |= _stages(blocks, kind)
    knobs |= {"classifier": "conv", "head_pool": "global", "head_layers": 0} if classifier else _head(head)
    return knobs


def _stage_pool(e: Layer, blocks: list[_Block], pools: set[str]) -> bool:
    """Mark the block before a max pool that ends a stage (2x2/2, or SqueezeNet's 3x3/2 in ceil
    mode: both halve the side, rounding down); False for any other pool."""
    window = (e["kernel"], e["stride"])
    if not blocks or e["type"] != "max" or window not in ((2, 2), (3, 2)):
        return False
    pools.add("standard" if window == (2, 2) else "ceil3")
    blocks[-1].pooled = True
    return True


def _fire_blocks(items: list[Layer], pools: set[str]) -> tuple[list[_Block], list[Layer]]:
    """Fire modules (squeeze, 1x1 expand, kxk expand), a max pool after some; the convs after the
    last one are returned apart."""
    blocks: list[_Block] = []
    j = 0
    while j < len(items):
        if items[j]["kind"] == "pool":
            if not _stage_pool(items[j], blocks, pools):
                return [], []
            j += 1
        elif _fire_at(items, j):
            squeeze, e1, ek = items[j : j + 3]
            width = e1["out"] + ek["out"]
            blocks.append(
                _Block(squeeze["in"], width, width, squeeze["stride"], ek["kernel"],
                       squeeze=squeeze["out"], spatial=ek["out"])
            )  # fmt: skip
            j += 3
        else:
            trailing = items[j:]
            return (blocks, trailing) if all(e["kind"] == "conv" for e in trailing) else ([], [])
    return blocks, []


def _fire_split(blocks: list[_Block]) -> dict[str, Any]:
    """The squeeze ratio and expand split that give every fire block its channels."""
    for b in blocks:
        ratio, split = b.squeeze / b.c_out, b.spatial / b.c_out
        if all(
            (max(1, round(c.c_out * ratio)), round(c.c_out * split)) == (c.squeeze, c.spatial) for c in blocks
        ):
            return {"squeeze_ratio": ratio, "expand_split": split}
    raise ValueError("fire blocks whose squeeze or split differ")


def _plain_blocks(items: list[Layer], pools: set[str]) -> tuple[list[_Block], list[Layer]]:
    blocks: list[_Block] = []
    for e in items:
        if e["kind"] == "pool":
            if not _stage_pool(e, blocks, pools):
                return [], []
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
