"""Small real models for the proxy tests, as import references (``tests/proxy_models.py:NAME``):
Hugging Face ``transformers`` models built from tiny configs (random weights, no download)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 97, "n_positions": 16}
"""GPT-2's code (dropout 0.1, its written-out tanh GELU, causal SDPA) at a tiny size"""
SEQ, BATCH = 12, 2


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))


def tiny_gpt2() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**GPT2)), {"input_ids": _ids(GPT2["vocab_size"])}


def tiny_bert() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=89
    )
    return BertForMaskedLM(cfg), {"input_ids": _ids(89)}


def tiny_cnn() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)
    )
    return model, torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def returns_a_number() -> Any:
    return 3


def returns_no_module() -> Any:
    return "not a module", torch.zeros(2, 3)


def plain_cnn() -> tuple[nn.Module, torch.Tensor]:
    """The issue's tutorial CNN, small: no residuals, max-pool downsampling, irregular widths, a
    5x5 first convolution, no normalisation, a global-pool head."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 12, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(12, 20, 3, padding=1), nn.ReLU(), nn.Conv2d(20, 20, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(20, 36, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(36, 7),
    )  # fmt: skip
    return model, torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))


class Fire(nn.Module):
    """SqueezeNet's fire module as torchvision writes it: functional ReLUs, a concatenation."""

    def __init__(self, c_in: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(c_in, squeeze, 1)
        self.e1 = nn.Conv2d(squeeze, expand, 1)
        self.e3 = nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.e1(s)), torch.relu(self.e3(s))], 1)


def squeezenet() -> tuple[nn.Module, torch.Tensor]:
    """SqueezeNet 1.1's layout, small: an unpadded strided stem, 3x3/2 ceil-mode pools, fire
    modules, dropout and a 1x1 conv classifier before the global pool."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(16, 4, 8), Fire(16, 4, 8), nn.MaxPool2d(3, 2, ceil_mode=True), Fire(16, 12, 24),
        nn.Dropout(0.5), nn.Conv2d(48, 7, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )  # fmt: skip
    return model, torch.randn(2, 3, 30, 30, generator=torch.Generator().manual_seed(0))


def wrong_input() -> tuple[nn.Module, torch.Tensor]:
    """A model and a batch that does not match it (5 channels for a 3-channel conv)."""
    model, _ = tiny_cnn()
    return model, torch.zeros(2, 5, 8, 8)


def raises() -> Any:
    """A model function that fails before it returns (a missing file, a bad setting)."""
    raise FileNotFoundError("weights.pt: no such file")


def raises_in_backward() -> tuple[nn.Module, torch.Tensor, Any]:
    """A model whose loss fails once it is called (after the first forward pass)."""
    model, batch = tiny_cnn()

    def loss(output: Any) -> Any:
        raise ValueError("the loss cannot take this output")

    return model, batch, loss
