"""The structure of a real network, read from one hooked forward pass: the sequence of its layers
with their shapes, so that a fit can fix what the network's layout already says (stage widths,
kernels, strides, the block kind, heads and head size, pre or post norm) and search only what
it does not.

Each layer is a small JSON object, in the order the forward pass ran them:

* ``{"kind": "conv", "in": 64, "out": 128, "kernel": 3, "stride": 2, "groups": 1, "bias": false,
  "size": 28, "padding": 1}`` -- a 2-d convolution and its output map's side (``padding`` may be
  absent, in documents written before it was recorded: then ``kernel // 2``)
* ``{"kind": "norm", "type": "batch" | "group" | "layer" | "other"}``
* ``{"kind": "pool", "type": "max" | "avg", "kernel": 3, "stride": 2, "size": 56}`` (an adaptive
  pool has ``"kernel": 0`` and its output side)
* ``{"kind": "add", "size": 28}`` -- a residual addition of two maps of the same shape (convolutional)
  or two sequences (``"size": 0``)
* ``{"kind": "linear", "in": 768, "out": 3072, "bias": true}``
* ``{"kind": "attention", "heads": 12, "head_dim": 64, "causal": false}`` -- one
  ``scaled_dot_product_attention`` call
* ``{"kind": "rnn", "cell": "gru", "layers": 2, "hidden": 256, "bidirectional": false}``
* ``{"kind": "embedding", "num": 30522, "dim": 768}``

and, beside the layers, ``"norm_position": "pre" | "post"`` when the network has layer norms and
attention: post when a layer norm's output is added to a residual (BERT), pre when it is not (GPT-2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from hpcdl.errors import InputError

KINDS = ("conv", "norm", "pool", "add", "linear", "attention", "rnn", "embedding")
MAX_LAYERS = 100_000
"""layers a structure may list (a document is data from anyone)"""
_ADDS = {"add", "add_"}


class _Recorder(TorchDispatchMode):
    """Residual additions, and whether a layer norm's output feeds one (post-norm)."""

    def __init__(self, layers: list[dict[str, Any]]) -> None:
        super().__init__()
        self.layers = layers
        self.norm_outputs: set[int] = set()
        self.kept: list[torch.Tensor] = []
        """the layer norms' outputs, held for the pass: a freed storage's address would be reused"""
        self.norm_added = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        tensors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
        if name in _ADDS and len(tensors) == 2 and tensors[0].shape == tensors[1].shape:
            shape = tensors[0].shape
            if len(shape) == 4 and tensors[0].is_floating_point():
                self.layers.append({"kind": "add", "size": int(shape[-1])})
            elif len(shape) == 3 and tensors[0].is_floating_point():
                self.layers.append({"kind": "add", "size": 0})
                if any(_key(t) in self.norm_outputs for t in tensors):
                    self.norm_added = True
        if name == "native_layer_norm" and isinstance(out, tuple):
            self.norm_outputs.add(_key(out[0]))
            self.kept.append(out[0])
        return out


def _key(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


class _Attention(TorchFunctionMode):
    def __init__(self, layers: list[dict[str, Any]]) -> None:
        super().__init__()
        self.layers = layers

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and args and isinstance(args[0], torch.Tensor):
            q = args[0]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            causal = bool(kwargs.get("is_causal", False)) or lower_triangular(mask)
            heads = int(q.shape[-3]) if q.dim() >= 3 else 1
            self.layers.append(
                {"kind": "attention", "heads": heads, "head_dim": int(q.shape[-1]), "causal": causal}
            )
        return func(*args, **kwargs)


def lower_triangular(mask: Any) -> bool:
    """A mask that lets each position see itself and the ones before it, and nothing after."""
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or mask.shape[-1] != mask.shape[-2]:
        return False
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    allowed = allowed.reshape(-1, *mask.shape[-2:])[0]
    return bool(torch.equal(allowed.cpu(), torch.ones_like(allowed, device="cpu").tril()))


def _side(x: Any) -> int:
    return int(x.shape[-1]) if isinstance(x, torch.Tensor) and x.dim() >= 3 else 0


def _pair(v: Any) -> int:
    return int(v[0] if isinstance(v, tuple | list) else v)


def _padding(conv: nn.Conv2d) -> int:
    """A convolution's padding along the height; ``"same"`` pads half the kernel, ``"valid"`` none."""
    if isinstance(conv.padding, str):
        return _pair(conv.kernel_size) // 2 if conv.padding == "same" else 0
    return _pair(conv.padding)


def describe(module: nn.Module, output: Any) -> dict[str, Any] | None:
    """One layer's entry, or None for a module that is not one of :data:`KINDS`."""
    if isinstance(module, nn.Conv2d):
        return {
            "kind": "conv",
            "in": module.in_channels,
            "out": module.out_channels,
            "kernel": _pair(module.kernel_size),
            "stride": _pair(module.stride),
            "groups": module.groups,
            "bias": module.bias is not None,
            "size": _side(output),
            "padding": _padding(module),
        }
    if isinstance(module, nn.modules.batchnorm._BatchNorm | nn.GroupNorm | nn.LayerNorm):
        kind = "batch" if isinstance(module, nn.modules.batchnorm._BatchNorm) else None
        kind = kind or ("group" if isinstance(module, nn.GroupNorm) else "layer")
        return {"kind": "norm", "type": kind}
    if isinstance(module, nn.MaxPool2d | nn.AvgPool2d):
        kind = "max" if isinstance(module, nn.MaxPool2d) else "avg"
        return {"kind": "pool", "type": kind, "kernel": _pair(module.kernel_size),
                "stride": _pair(module.stride or module.kernel_size), "size": _side(output)}  # fmt: skip
    if isinstance(module, nn.AdaptiveAvgPool2d | nn.AdaptiveMaxPool2d):
        kind = "max" if isinstance(module, nn.AdaptiveMaxPool2d) else "avg"
        return {"kind": "pool", "type": kind, "kernel": 0, "stride": 0, "size": _side(output)}
    if isinstance(module, nn.Linear):
        return {
            "kind": "linear",
            "in": module.in_features,
            "out": module.out_features,
            "bias": module.bias is not None,
        }
    if isinstance(module, nn.RNNBase):
        cell = {"LSTM": "lstm", "GRU": "gru"}.get(module.mode, "vanilla")
        return {"kind": "rnn", "cell": cell, "layers": module.num_layers, "hidden": module.hidden_size,
                "bidirectional": module.bidirectional}  # fmt: skip
    if isinstance(module, nn.Embedding):
        return {"kind": "embedding", "num": module.num_embeddings, "dim": module.embedding_dim}
    return None


@contextmanager
def recording() -> Iterator[dict[str, Any]]:
    """Record the structure of every forward pass run inside: ``with recording() as s: model(x)``;
    ``s`` holds ``layers`` (and ``norm_position``) once the block ends. Hooks go on every module
    (``nn.Module`` global hooks), so the model needs no changes."""
    layers: list[dict[str, Any]] = []
    structure: dict[str, Any] = {"layers": layers}

    def hook(module: nn.Module, _inputs: Any, output: Any) -> None:
        entry = describe(module, output)
        if entry is not None and len(layers) < MAX_LAYERS:
            layers.append(entry)

    recorder, attention = _Recorder(layers), _Attention(layers)
    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        with attention, recorder:
            yield structure
    finally:
        handle.remove()
    kinds = {entry["kind"] for entry in layers}
    if "attention" in kinds and any(e.get("type") == "layer" for e in layers):
        structure["norm_position"] = "post" if recorder.norm_added else "pre"


def read(model: nn.Module, forward: Callable[[], Any]) -> dict[str, Any]:
    """The structure of ``model`` from one forward pass ``forward()`` (no gradients)."""
    with torch.no_grad(), recording() as found:
        forward()
    return found


# --- validation of a structure read from a document -------------------------------------------

_FIELDS: dict[str, dict[str, type]] = {
    "conv": {"in": int, "out": int, "kernel": int, "stride": int, "groups": int, "bias": bool, "size": int},
    "norm": {"type": str},
    "pool": {"type": str, "kernel": int, "stride": int, "size": int},
    "add": {"size": int},
    "linear": {"in": int, "out": int, "bias": bool},
    "attention": {"heads": int, "head_dim": int, "causal": bool},
    "rnn": {"cell": str, "layers": int, "hidden": int, "bidirectional": bool},
    "embedding": {"num": int, "dim": int},
}


_OPTIONAL: dict[str, dict[str, type]] = {"conv": {"padding": int}}
"""fields a layer may lack (recorded since a later version); when present, checked like the others"""


def validate(value: Any, where: str = "profile.structure") -> dict[str, Any]:
    """A structure from a document, checked field by field; a bad one is a one-line ``InputError``."""
    if not isinstance(value, dict) or not isinstance(value.get("layers"), list):
        raise InputError(where, type(value).__name__, "expected a table with a list of layers")
    layers = value["layers"]
    if len(layers) > MAX_LAYERS:
        raise InputError(f"{where}.layers", len(layers), f"at most {MAX_LAYERS} layers")
    for i, entry in enumerate(layers):
        at = f"{where}.layers[{i}]"
        if not isinstance(entry, dict) or entry.get("kind") not in _FIELDS:
            raise InputError(at, entry, "expected a layer whose kind is one of " + ", ".join(KINDS))
        optional = _OPTIONAL.get(entry["kind"], {})
        for name, kind in (_FIELDS[entry["kind"]] | optional).items():
            if name in optional and name not in entry:
                continue
            v = entry.get(name)
            ok = isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
            if not ok or (isinstance(v, int) and not 0 <= v < 1 << 40):
                raise InputError(f"{at}.{name}", v, f"expected {'a name' if kind is str else kind.__name__}")
    position = value.get("norm_position")
    if position not in (None, "pre", "post"):
        raise InputError(f"{where}.norm_position", position, "allowed: pre, post")
    return value
