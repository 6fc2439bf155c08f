"""The smallest spec of each family that still trains: knobs shared by the tests that run every
family end to end in seconds (compiled against eager, operator classes by phase)."""

TINY = {
    "mlp": {"layers": 2, "width": 32, "input_size": 16, "output_size": 4, "batch_size": 8},
    "cnn": {"image_size": 16, "stages": 1, "blocks": [1], "base_width": 8, "classes": 4, "batch_size": 4},
    "rnn": {"layers": 1, "hidden": 16, "vocab": 50, "embedding": 8, "seq_len": 8, "classes": 50,
            "batch_size": 4},
    "attention": {"layers": 1, "width": 32, "heads": 2, "seq_len": 8, "vocab": 50, "batch_size": 4},
    "speech": {"freq_bins": 16, "frames": 16, "conv_layers": 1, "conv_channels": 4, "rnn_layers": 1,
               "hidden": 16, "classes": 10, "batch_size": 4},
}  # fmt: skip
