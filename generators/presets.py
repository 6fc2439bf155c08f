"""Presets that mimic known models: knob settings whose parameter counts and FLOPs match the
published figures of the original networks, so that results can be compared with them.

Each entry is ``{"family": ..., **knobs}`` as ``hpcdl.workloads.registry.spec_from_dict`` takes it;
knobs left out keep their family's defaults.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # name: {"family": ..., knobs...}   with a comment citing the published figure
    # torchvision ResNet-50 (v1.5: stride on the 3x3 conv): 25,557,032 parameters, about
    # 4.1 GMACs per 224x224 image (torchvision's model table: 4.09 GFLOPS counted as MACs).
    "resnet50": {
        "family": "cnn",
        "image_size": 224,
        "in_channels": 3,
        "classes": 1000,
        "stem": "imagenet",
        "stages": 4,
        "blocks": [3, 4, 6, 3],
        "base_width": 64,
        "width_mult": 2.0,
        "max_width": 512,
        "kernel_size": 3,
        "block": "bottleneck",
        "expansion": 4,
        "downsample": "stride",
        "norm": "batch",
        "head_pool": "global",
        "head_layers": 0,
    },
    # torchvision VGG-16 (no batch norm; dropout left out): 138,357,544 parameters, about
    # 15.5 GMACs per 224x224 image (torchvision's model table: 15.47 GFLOPS counted as MACs).
    "vgg16": {
        "family": "cnn",
        "image_size": 224,
        "in_channels": 3,
        "classes": 1000,
        "stem": "none",
        "stages": 5,
        "blocks": [2, 2, 3, 3, 3],
        "base_width": 64,
        "width_mult": 2.0,
        "max_width": 512,
        "kernel_size": 3,
        "block": "plain",
        "downsample": "maxpool",
        "norm": "none",
        "head_pool": "flatten",
        "head_layers": 2,
        "head_width": 4096,
    },
    # Zaremba, Sutskever & Vinyals 2014, "large" PTB word LSTM: 10k-word vocabulary, 2 layers
    # of 1500 units, 1500-d embedding, 35 unrolled steps, untied softmax: 66M parameters.
    "lstm_lm": {
        "family": "rnn",
        "cell": "lstm",
        "layers": 2,
        "hidden": 1500,
        "vocab": 10000,
        "embedding": 1500,
        "seq_len": 35,
        "bidirectional": False,
        "output": "step",
        "classes": 10000,
    },
    # BERT-base (Devlin et al. 2019): 12 layers, 768 wide, 12 heads, 30,522 WordPiece vocabulary,
    # 512 positions, post-norm, MLM projection tied to the embedding: 110M parameters published
    # (108.9M here: no token-type embeddings, pooler or MLM transform layer). Sequence 128, the
    # length of most of its pre-training steps.
    "bert_base": {
        "family": "attention",
        "layers": 12,
        "width": 768,
        "heads": 12,
        "ffn_mult": 4.0,
        "seq_len": 128,
        "vocab": 30522,
        "positions": 512,
        "causal": False,
        "norm": "post",
        "head": "lm",
        "tie_embeddings": True,
        "activation": "gelu",
    },
    # GPT-2 small (Radford et al. 2019): 12 layers, 768 wide, 12 heads, 50,257 BPE vocabulary,
    # 1024-token context, causal, pre-norm, tied LM head: 124M parameters (Hugging Face's
    # GPT2LMHeadModel counts 124,439,808, which this reproduces exactly).
    "gpt2_small": {
        "family": "attention",
        "layers": 12,
        "width": 768,
        "heads": 12,
        "ffn_mult": 4.0,
        "seq_len": 1024,
        "vocab": 50257,
        "positions": 1024,
        "causal": True,
        "norm": "pre",
        "head": "lm",
        "tie_embeddings": True,
        "activation": "gelu",
    },
}
