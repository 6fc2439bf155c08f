"""Real implementations of the models hpcdl's presets mimic, built with random weights (nothing
is downloaded), each with an example batch: for ``bench_fidelity.py``, ``bench_fit.py`` and as
import references (``hpcdl profile benchmarks/real_models.py:gpt2``).

* BERT-base and GPT-2 small: Hugging Face ``transformers`` (``pip install -e '.[fidelity]'``),
  built from their default configs, with their own dropout and activations;
* ResNet-50: ``transformers``' ResNet (torchvision's layout, v1.5);
* VGG-16: torchvision, when it imports (see ``torchvision_models``);
* the LSTM language model: no package ships PyTorch's word-language-model example, so it is
  torch's own ``nn.Embedding``, ``nn.LSTM`` and ``nn.Linear`` composed as that example composes
  them, at Zaremba et al.'s large settings (dropout 0.65 on the embedding, between the layers
  and on the output).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from typing import Any

import torch
from torch import nn

SEED = 0


def _ids(vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(vocab, (batch, seq), generator=torch.Generator().manual_seed(SEED))


def _images(batch: int, size: int) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(SEED))


def gpt2(seq: int = 128, batch: int = 2, **config: Any) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Hugging Face ``GPT2LMHeadModel`` (GPT-2 small unless ``config`` says otherwise)."""
    torchvision_models()  # before transformers imports it
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    cfg = GPT2Config(**config)
    return GPT2LMHeadModel(cfg), {"input_ids": _ids(cfg.vocab_size, batch, seq)}


def bert(seq: int = 128, batch: int = 4, **config: Any) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Hugging Face ``BertForMaskedLM`` (BERT-base unless ``config`` says otherwise), logits for
    every token."""
    torchvision_models()  # before transformers imports it
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(SEED)
    cfg = BertConfig(**config)
    return BertForMaskedLM(cfg), {"input_ids": _ids(cfg.vocab_size, batch, seq)}


def resnet(image: int = 112, batch: int = 4, **config: Any) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Hugging Face ``ResNetForImageClassification``, 1000 classes: ResNet-50 v1.5 unless
    ``config`` says otherwise (``layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128,
    256, 512]`` is ResNet-18)."""
    torchvision_models()  # before transformers imports it
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(SEED)
    cfg = ResNetConfig(**config)
    cfg.num_labels = 1000
    model = ResNetForImageClassification(cfg)
    return model, {"pixel_values": _images(batch, image)}


def resnet50(image: int = 112, batch: int = 4) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """ResNet-50 v1.5 (Hugging Face's, in torchvision's layout)."""
    return resnet(image, batch)


@functools.cache
def torchvision_models() -> Any:
    """``torchvision.models``, or None when torchvision is missing.

    The torchvision wheels paired with torch on the package registry are CUDA builds whose C++
    extension does not load on the CPU build of torch, and ``import torchvision`` then fails on
    its ``nms`` operator. Declaring the schemas of the two operators it registers lets the
    pure-Python classification models import; they never call them. ``transformers`` imports
    torchvision when it is installed, so its models call this first."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:  # a build that matches torch (a GPU machine's) loads its own operators
        import torchvision

        return torchvision.models
    except RuntimeError:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]  # the half-imported package, imported again below
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)  # the definitions last as long as the library object
    import torchvision

    return torchvision.models


_KEEP: list[Any] = []


def vgg16(image: int = 112, batch: int = 2) -> tuple[nn.Module, torch.Tensor]:
    """torchvision's VGG-16 (dropout 0.5 in its classifier)."""
    models = torchvision_models()
    if models is None:
        raise ImportError("torchvision is not installed")
    torch.manual_seed(SEED)
    return models.vgg16(), _images(batch, image)


class WordLM(nn.Module):
    """Embedding, dropout, a stacked LSTM with dropout between layers, dropout, a linear decoder."""

    def __init__(self, vocab: int, size: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.encoder = nn.Embedding(vocab, size)
        self.drop = nn.Dropout(dropout)
        self.rnn = nn.LSTM(size, size, layers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(size, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.drop(self.encoder(ids)))
        return self.decoder(self.drop(out))


def lstm_lm(seq: int = 35, batch: int = 8) -> tuple[nn.Module, torch.Tensor]:
    """Zaremba et al.'s large PTB model: 10k words, 2 layers of 1500, dropout 0.65."""
    torch.manual_seed(SEED)
    return WordLM(10000, 1500, 2, 0.65), _ids(10000, batch, seq)
