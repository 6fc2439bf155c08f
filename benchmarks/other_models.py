"""Networks that no hpcdl preset mimics, for ``bench_fit.py --others``: Hugging Face models built
from their configs (random weights, no download) and small networks written here the way
tutorials and papers' baselines write them, and MobileNet V3 from torchvision when it imports
(its wheels are CUDA builds, see ``real_models.torchvision_models``; VGG-11 is written out as
torchvision lays it out, so that the set runs without it)."""

from __future__ import annotations

from typing import Any

import real_models
import torch
import torch.nn.functional as F
from torch import nn

SEED = 0
Made = tuple[nn.Module, Any]


def _images(batch: int, size: int) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(SEED))


def _ids(vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(vocab, (batch, seq), generator=torch.Generator().manual_seed(SEED))


def resnet18(image: int = 112, batch: int = 4) -> Made:
    return real_models.resnet(
        image, batch, layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512]
    )


def resnet34(image: int = 112, batch: int = 4) -> Made:
    return real_models.resnet(
        image, batch, layer_type="basic", depths=[3, 4, 6, 3], hidden_sizes=[64, 128, 256, 512]
    )


def mobilenet_v2(image: int = 112, batch: int = 4) -> Made:
    real_models.torchvision_models()  # before transformers imports it
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(SEED)
    cfg = MobileNetV2Config(image_size=image, tf_padding=False, num_labels=1000)
    return MobileNetV2ForImageClassification(cfg), {"pixel_values": _images(batch, image)}


def mobilenet_v1(image: int = 112, batch: int = 4) -> Made:
    real_models.torchvision_models()
    from transformers import MobileNetV1Config, MobileNetV1ForImageClassification

    torch.manual_seed(SEED)
    # its default classifier dropout is 0.999 (a TF checkpoint's); torchvision's MobileNets use 0.2
    cfg = MobileNetV1Config(image_size=image, tf_padding=False, num_labels=1000, classifier_dropout_prob=0.2)
    return MobileNetV1ForImageClassification(cfg), {"pixel_values": _images(batch, image)}


def mobilenet_v3_small(image: int = 112, batch: int = 4) -> Made:
    """torchvision's MobileNet V3 small (squeeze-excitation, hard-swish, 3x3 and 5x5 depthwise
    kernels, dropout 0.2 in the classifier); ImportError without torchvision."""
    models = real_models.torchvision_models()
    if models is None:
        raise ImportError("torchvision is not installed")
    torch.manual_seed(SEED)
    return models.mobilenet_v3_small(), _images(batch, image)


class VGG(nn.Module):
    """torchvision's VGG: 3x3 convs with ReLU, 2x2 max pools, a 7x7 average pool, three linear
    layers with dropout 0.5 (VGG-11: configuration "A", no batch norm)."""

    def __init__(self, layout: list[int | str], classes: int = 1000) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        c = 3
        for v in layout:
            if v == "M":
                mods.append(nn.MaxPool2d(2, 2))
            else:
                assert isinstance(v, int)
                mods += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU(inplace=True)]
                c = v
        self.features = nn.Sequential(*mods)
        self.avgpool = nn.AdaptiveAvgPool2d(7)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 49, 4096), nn.ReLU(True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(0.5), nn.Linear(4096, classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def vgg11(image: int = 64, batch: int = 2) -> Made:
    torch.manual_seed(SEED)
    return VGG([64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]), _images(batch, image)


class PlainCNN(nn.Module):
    """The issue's tutorial CNN: no residuals, max-pool downsampling, irregular widths, a 5x5
    first convolution, no normalisation, a global-pool head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 48, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(48, 96, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(96, 160, 3, padding=1), nn.ReLU(), nn.Conv2d(160, 160, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(160, 320, 3, padding=1), nn.ReLU(),
        )  # fmt: skip
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(320, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def plain_cnn(image: int = 64, batch: int = 16) -> Made:
    torch.manual_seed(SEED)
    return PlainCNN(), _images(batch, image)


class Fire(nn.Module):
    """SqueezeNet's fire module: a 1x1 squeeze, then 1x1 and 3x3 expands side by side, concatenated."""

    def __init__(self, c_in: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(c_in, squeeze, 1)
        self.e1 = nn.Conv2d(squeeze, expand, 1)
        self.e3 = nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.e1(s)), F.relu(self.e3(s))], 1)


def squeezenet(image: int = 112, batch: int = 8) -> Made:
    """SqueezeNet 1.1's layout, 100 classes."""
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, stride=2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(64, 16, 64), Fire(128, 16, 64), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(128, 32, 128), Fire(256, 32, 128), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256),
        nn.Dropout(0.5), nn.Conv2d(512, 100, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )  # fmt: skip
    return model, _images(batch, image)


def distilbert(seq: int = 128, batch: int = 4) -> Made:
    real_models.torchvision_models()
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    torch.manual_seed(SEED)
    cfg = DistilBertConfig()
    return DistilBertForMaskedLM(cfg), {"input_ids": _ids(cfg.vocab_size, batch, seq)}


class PreNormBlock(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, ffn), nn.Linear(ffn, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Decoder(nn.Module):
    """A small pre-norm decoder LM (nanoGPT-like, no dropout): 6 layers of 384, 6 heads of 64."""

    def __init__(self, vocab: int = 8192, width: int = 384, heads: int = 6, layers: int = 6, seq: int = 256):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(PreNormBlock(width, heads, 4 * width) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.out(self.ln(x))


def prenorm_decoder(seq: int = 256, batch: int = 4) -> Made:
    torch.manual_seed(SEED)
    return Decoder(seq=seq), _ids(8192, batch, seq)


class GRULM(nn.Module):
    def __init__(self, vocab: int = 10000, embedding: int = 256, hidden: int = 512, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.rnn = nn.GRU(embedding, hidden, layers, batch_first=True, dropout=0.2)
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.drop(self.embed(ids)))
        return self.out(self.drop(h))


def gru_lm(seq: int = 64, batch: int = 8) -> Made:
    torch.manual_seed(SEED)
    return GRULM(), _ids(10000, batch, seq)
