"""The compute precisions a workload may train in: the one table of their names, torch dtypes,
autocast use and bytes per element."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Precision:
    name: str
    dtype: torch.dtype
    """the dtype of matrix products (autocast's, or the model's own for fp32)"""
    autocast: bool
    """weights stay fp32 and autocast runs the products in ``dtype`` (mixed precision)"""
    loss_scaling: bool
    """fp16's narrow exponent needs a gradient scaler; bf16's does not"""

    @property
    def bytes(self) -> int:
        """Bytes of one element in ``dtype`` (activations kept for backward are stored so)."""
        return torch.empty((), dtype=self.dtype).element_size()


TABLE: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp32", torch.float32, autocast=False, loss_scaling=False),
        Precision("bf16", torch.bfloat16, autocast=True, loss_scaling=False),
        Precision("fp16", torch.float16, autocast=True, loss_scaling=True),
    )
}
PRECISIONS = tuple(TABLE)
"""every precision a spec may name; none below 16 bits, so every one of them may rank"""
FP32_IN_16BIT = 2
"""16-bit elements (the unit of a count under autocast) that one fp32 element takes: autocast
leaves some tensors fp32 (16-bit compute precisions only: bf16, fp16)"""
GRADIENT_BYTES = 4
"""gradients (and the weights they update) are fp32 in every precision: mixed precision keeps
fp32 master weights, so the bytes reduced across ranks are 4 per parameter"""


def precision(name: str) -> Precision:
    return TABLE[name]


def needs_loss_scaling(p: Precision, device: torch.device, model: nn.Module) -> bool:
    """Whether training needs a gradient scaler: in fp16; and in bf16 on CUDA where the model
    has recurrent layers, which autocast runs through cuDNN in fp16 whatever its dtype
    (ATen's AutocastRNN casts their inputs and weights to half)."""
    if p.loss_scaling:
        return True
    cudnn_rnn = any(isinstance(m, nn.RNNBase) for m in model.modules())
    return p.autocast and device.type == "cuda" and cudnn_rnn
