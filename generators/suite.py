"""The default suite: one workload per family, sized so that ``hpcdl run`` with no arguments
finishes in about two minutes on a 2-core CPU (and far sooner on a GPU, where a user would
scale the batch up with ``batch_size=...``)."""

from __future__ import annotations

from typing import Any

# name -> spec dict. Small but representative of each family's dominant kernels.
DEFAULT_SUITE: dict[str, dict[str, Any]] = {
    "cnn-resnet-small": {
        "family": "cnn",
        "image_size": 32,
        "stages": 3,
        "blocks": [2],
        "base_width": 32,
        "block": "basic",
        "stem": "simple",
        "classes": 10,
        "batch_size": 32,
    },
    "rnn-lstm-lm": {
        "family": "rnn",
        "cell": "lstm",
        "layers": 2,
        "hidden": 256,
        "vocab": 2000,
        "embedding": 128,
        "seq_len": 32,
        "output": "step",
        "classes": 2000,
        "batch_size": 32,
    },
    "attention-gpt-mini": {
        "family": "attention",
        "layers": 4,
        "width": 256,
        "heads": 4,
        "seq_len": 128,
        "vocab": 4000,
        "causal": True,
        "norm": "pre",
        "head": "lm",
        "tie_embeddings": True,
        "batch_size": 8,
    },
    "mlp-wide": {
        "family": "mlp",
        "layers": 4,
        "width": 1024,
        "input_size": 1024,
        "output_size": 1000,
        "batch_size": 128,
    },
    "speech-ds2-mini": {
        "family": "speech",
        "freq_bins": 81,
        "frames": 100,
        "conv_layers": 2,
        "conv_channels": 16,
        "cell": "gru",
        "rnn_layers": 2,
        "hidden": 128,
        "batch_size": 8,
    },
}
