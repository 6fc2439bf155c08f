"""Operator classes: the share of a training step's time and FLOPs spent in each kind of kernel,
for ``hpcdl profile`` (a real model) and ``hpcdl run --profile`` (``measure.profiled``, per
phase), with one classifier for both.

Time comes from the PyTorch profiler: every operator's self time (its own time, children
excluded; on a GPU the device time of the kernels it launched, which the profiler reads through
CUPTI) is given to one class, so the shares add up to the step. FLOPs come from
``FlopCounterMode``, per operator and per module.

How an operator is classed (first rule that applies):

* everything under ``Optimizer.step`` or ``Optimizer.zero_grad`` is ``optimizer``;
* a collective and what it calls (``c10d::``, gloo's, NCCL's and MPI's operators, DDP's reducer)
  is ``communication``; a ``DataLoader``'s next batch is ``data`` (a run also gives its whole
  ``data`` phase to ``data``: ``measure.profiled``);
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

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from hpcdl import metrics

CLASSES = (
    "gemm",
    "convolution",
    "recurrent",
    "attention",
    "elementwise",
    "optimizer",
    "communication",
    "data",
)
"""the operator classes of a mix, in the order they are printed"""

_INHERITED = (
    ("optimizer", re.compile(r"^Optimizer\.(step|zero_grad)")),
    (
        "communication",
        re.compile(
            r"^(c10d::|_?c10d_functional::|gloo:|nccl:|mpi:|record_param_comms)|ddp\.reducer|::reducer::"
        ),
    ),
    ("data", re.compile(r"^enumerate\(DataLoader\)")),
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


@dataclass(frozen=True)
class Classed:
    """One operator of a profile: its class, its own time and the root of its event tree."""

    event: Any
    cls: str
    seconds: float
    """self time: the device time of its kernels on a GPU, its CPU time elsewhere"""
    root: Any
    """the outermost event above it (itself for a root): a run's phase label, or where a thread
    of its own began (a collective's worker thread)"""


def classify(events: Iterable[Any], device: torch.device) -> list[Classed]:
    """Every event of the profiler's event tree (``torch.profiler.profile(...).events()``) with
    the class the rules give it, roots first, each child after its parent."""
    cuda = device.type == "cuda"
    out: list[Classed] = []

    def visit(event: Any, inherited: str | None, root: Any) -> None:
        cls = inherited or op_class(event.name)
        own = event.self_device_time_total if cuda else event.self_cpu_time_total
        out.append(Classed(event, cls or leaf_class(event.name), max(float(own), 0.0) / 1e6, root))
        for child in event.cpu_children:
            visit(child, cls, root)

    for event in events:
        # a GPU kernel is an event of its own as well as its launcher's device time: once
        if event.cpu_parent is None and event.device_type == DeviceType.CPU:
            visit(event, None, event)
    return out


def time_shares(events: Iterable[Any], device: torch.device) -> dict[str, float]:
    """Share of the profiled time in each class, from the profiler's event tree
    (``torch.profiler.profile(...).events()``); the shares add up to 1."""
    totals = dict.fromkeys(CLASSES, 0.0)
    for c in classify(events, device):
        totals[c.cls] += c.seconds
    return normalised(totals)


def _conv_backward_flops(
    grad_out_shape: Any,
    x_shape: Any,
    w_shape: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: Any,
    output_padding: Any,
    groups: int,
    output_mask: list[bool],
    out_shape: Any,
    **kwargs: Any,
) -> int:
    """The counter's own formula, but a grouped convolution's weight gradient costs one
    ``groups``-th of what it counts: torch 2.13 counts it as if the convolution were ungrouped
    (tests/test_cnn.py; fixed upstream in pytorch/pytorch#183405)."""
    args = (
        grad_out_shape,
        x_shape,
        w_shape,
        bias,
        stride,
        padding,
        dilation,
        transposed,
        output_padding,
        groups,
    )
    # the registered formula is wrapped to take shapes and the output as ``out_val``
    formula: Callable[..., int] = flop_counter.conv_backward_flop
    grad_input = formula(*args, [output_mask[0], False], out_val=out_shape)
    grad_weight = formula(*args, [False, output_mask[1]], out_val=out_shape)
    return int(grad_input + grad_weight // groups)


def counter() -> FlopCounterMode:
    """``FlopCounterMode`` with its grouped-convolution gap closed; use it inside
    ``hpcdl.workloads.crosscheck.decomposed()``, which closes the fused-kernel gaps."""
    return FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flops}
    )


def flop_shares(counts: Mapping[str, Mapping[Any, int]], model: nn.Module) -> dict[str, float]:
    """Share of the counted FLOPs in each class, from ``FlopCounterMode.get_flop_counts()``
    taken over a forward and backward pass of ``model`` (:func:`flop_classes`)."""
    return normalised(flop_classes(counts, model))


def flop_classes(counts: Mapping[str, Mapping[Any, int]], model: nn.Module) -> dict[str, float]:
    """The counted FLOPs of each class, from ``FlopCounterMode.get_flop_counts()``.

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
    return totals


def _inside_recurrent(model: nn.Module, path: str) -> bool:
    parts = path.split(".")
    for i in range(1, len(parts)):
        parent = model.get_submodule(".".join(parts[:i]))
        if isinstance(parent, nn.RNNBase | nn.RNNCellBase):
            return True
    return False


def normalised(totals: Mapping[str, float]) -> dict[str, float]:
    """Shares of every class that add up to 1 (all zero when nothing was measured)."""
    return metrics.shares({cls: totals.get(cls, 0.0) for cls in CLASSES})


def mix_distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Total variation distance of two mixes, ``½ Σ |a_c − b_c|``: 0 when alike, 1 when they
    share nothing; the fraction of the step that would have to move to another class."""
    return 0.5 * sum(abs(a.get(cls, 0.0) - b.get(cls, 0.0)) for cls in CLASSES)


PROFILER_LINES = (b"USDT:", b"STAGE:")
"""what the profiler's C++ library (Kineto) writes to stderr at each start and stop, whatever
its log level (``KINETO_LOG_LEVEL`` leaves them): noise in hpcdl's output"""


@contextlib.contextmanager
def quiet_profiler() -> Iterator[None]:
    """While inside: file descriptor 2 held in a temporary file; then every line of it but the
    profiler's own given back to stderr (a warning written meanwhile is kept, only later)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [
                line for line in held.read().splitlines(keepends=True) if not line.startswith(PROFILER_LINES)
            ]
            os.write(2, b"".join(kept))
