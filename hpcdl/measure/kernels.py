"""Kernel classes: the share of a training step's time and FLOPs spent in each kind of kernel.

Time comes from the PyTorch profiler: every operator's self time (its own time, children
excluded; on a GPU the device time of the kernels it launched) is given to one class, so the
shares add up to the step. FLOPs come from ``FlopCounterMode``, per operator and per module.

How an operator is classed (first rule that applies):

* everything under ``Optimizer.step`` or ``Optimizer.zero_grad`` is ``optimizer``;
* everything under an attention operator (``scaled_dot_product_attention`` and its fused
  kernels), a recurrent one (``lstm``, ``gru``, ``rnn_tanh``, oneDNN's and cuDNN's RNN kernels)
  or a convolution is that class, whatever it calls;
* batched products of two activations (``bmm``, ``baddbmm``) are ``attention``: models apply
  their weights as 2-D products (``mm``, ``addmm``), so batched ones are the scores and the mix of
  attention written out by hand, or SDPA's math path;
* matrix products (``mm``, ``addmm``, ``matmul``, ``linear``, ...) are ``gemm``;
* the rest (activations, norms, softmax, dropout, embeddings, copies, the loss) is ``elementwise``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

CLASSES = ("gemm", "convolution", "recurrent", "attention", "elementwise", "optimizer")
"""the kernel classes of a profile's mix, in the order they are printed"""

_INHERITED = (
    ("optimizer", re.compile(r"^Optimizer\.(step|zero_grad)")),
    ("attention", re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention")),
    (
        "recurrent",
        re.compile(r"^aten::(lstm|gru|rnn_tanh|rnn_relu|mkldnn_rnn|_cudnn_rnn|miopen_rnn|_thnn_fused)"),
    ),
    ("convolution", re.compile(r"^aten::\w*conv(olution|\dd|_transpose|_depthwise)")),
)
_BATCHED = re.compile(r"^aten::(bmm|baddbmm)$")
_GEMM = re.compile(r"^aten::(mm|addmm|matmul|linear|addmv|mv|dot|_addmm_activation|addbmm)$")


def op_class(name: str) -> str | None:
    """The class an operator imposes on itself and its children, or None (decided by the leaf)."""
    for cls, pattern in _INHERITED:
        if pattern.search(name):
            return cls
    return None


def leaf_class(name: str) -> str:
    """The class of an operator's own time when no ancestor decided it."""
    if _BATCHED.match(name):
        return "attention"
    if _GEMM.match(name):
        return "gemm"
    return "elementwise"


def time_shares(events: Iterable[Any], device: torch.device) -> dict[str, float]:
    """Share of the profiled time in each class, from the profiler's event tree
    (``torch.profiler.profile(...).events()``); the shares add up to 1."""
    totals = dict.fromkeys(CLASSES, 0.0)
    cuda = device.type == "cuda"

    def visit(event: Any, inherited: str | None) -> None:
        cls = inherited or op_class(event.name)
        own = event.self_device_time_total if cuda else event.self_cpu_time_total
        totals[cls or leaf_class(event.name)] += max(float(own), 0.0)
        for child in event.cpu_children:
            visit(child, cls)

    for event in events:
        if event.cpu_parent is None:
            visit(event, None)
    return normalised(totals)


def flop_shares(counts: Mapping[str, Mapping[Any, int]], model: nn.Module) -> dict[str, float]:
    """Share of the counted FLOPs in each class, from ``FlopCounterMode.get_flop_counts()``
    taken over a forward and backward pass of ``model``.

    Recurrent layers run as plain products while they are counted (their fused kernels are
    invisible to the counter): their FLOPs are found by module, the rest by operator."""
    totals = dict.fromkeys(CLASSES, 0.0)
    for op, flops in counts.get("Global", {}).items():
        name = f"aten::{str(op).removeprefix('aten.').split('.')[0]}"
        totals[op_class(name) or leaf_class(name)] += flops
    recurrent = 0
    root = type(model).__name__
    for path, module in model.named_modules():
        if isinstance(module, nn.RNNBase | nn.RNNCellBase) and not _inside_recurrent(model, path):
            recurrent += sum(counts.get(f"{root}.{path}", {}).values())
    # the recurrent layers' products were counted above as gemm: move them
    totals["gemm"] -= recurrent
    totals["recurrent"] += recurrent
    return normalised(totals)


def _inside_recurrent(model: nn.Module, path: str) -> bool:
    parts = path.split(".")
    for i in range(1, len(parts)):
        parent = model.get_submodule(".".join(parts[:i]))
        if isinstance(parent, nn.RNNBase | nn.RNNCellBase):
            return True
    return False


def normalised(totals: Mapping[str, float]) -> dict[str, float]:
    """Shares that add up to 1 (all zero when nothing was measured)."""
    whole = sum(totals.values())
    return {cls: (totals.get(cls, 0.0) / whole if whole > 0 else 0.0) for cls in CLASSES}


def mix_distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Total variation distance of two mixes, ``½ Σ |a_c − b_c|``: 0 when alike, 1 when they
    share nothing; the fraction of the step that would have to move to another class."""
    return 0.5 * sum(abs(a.get(cls, 0.0) - b.get(cls, 0.0)) for cls in CLASSES)
