"""The memory estimate's parts: weights, gradients, optimizer state, activations and workspace,
each from its own term (METRICS.md, "Memory estimate")."""

from __future__ import annotations

import json
import subprocess
import sys

from hpcdl import metrics
from hpcdl.workloads.registry import spec_from_dict

MLP = {"family": "mlp", "layers": 2, "width": 64, "input_size": 32, "output_size": 10, "batch_size": 4}


def test_the_parts_add_up_and_each_follows_its_term() -> None:
    spec = spec_from_dict(MLP)
    c = spec.count()
    mib = 1 << 20
    # one sample: the optimizer step is the peak (every gradient, AdamW's temporaries, no activation)
    step = spec.memory_parts(1, "adamw")
    parts = {"inputs", "weights", "gradients", "optimizer_state", "activations", "workspace", "libraries"}
    assert set(step) == parts
    # the batches of inputs the run keeps on the device: 32 fp32 features and an int64 label a
    # sample, in each of them (a trial keeps one, a run RunConfig.pool_batches)
    assert spec.input_bytes() == 32 * 4 + 8 and step["inputs"] == spec.input_bytes()
    assert spec.memory_parts(4096, "adamw", pool_batches=4)["inputs"] == 4 * 4096 * (32 * 4 + 8)
    assert step["weights"] == step["gradients"] == 4 * c.params and step["optimizer_state"] == 8 * c.params
    assert c.largest_param == 64 * 64  # the largest weight, not the sum of them
    assert step["activations"] == 0 and step["workspace"] == 2 * 4 * c.largest_param
    assert step["libraries"] == metrics.CPU_LIBRARY_BYTES[(False, False)] == 5 * mib
    assert spec.memory_parts(1, "adamw", "cuda")["libraries"] == 0
    # many samples: backward is the peak; as it begins only the head's gradient exists
    big = spec.memory_parts(4096, "adamw")
    assert big["gradients"] == 4 * (64 * 10 + 10) and big["optimizer_state"] == 8 * c.params
    assert spec.memory_parts(8192, "adamw")["activations"] == 2 * big["activations"]
    assert sum(big.values()) == spec.memory_estimate(4096, "adamw") > sum(step.values())
    assert big["activations"] + big["workspace"] == 4096 * spec.memory_per_sample()
    assert big["inputs"] == 4096 * spec.input_bytes()
    sgd = spec.memory_parts(1, "sgd")
    assert sgd["optimizer_state"] == 4 * c.params and sgd["workspace"] == 0
    # in bf16 autocast's 16-bit copies of the weights are saved for backward (gone by the step)
    bf16 = spec.replace(precision="bf16")
    assert bf16.memory_parts(4096, "adamw")["weights"] == 6 * c.params
    assert bf16.memory_parts(1, "adamw")["weights"] == 4 * c.params
    assert bf16.memory_parts(4096, "adamw")["activations"] < big["activations"]
    assert bf16.memory_parts(1, "adamw")["libraries"] == 12 * mib
    # a GRU runs step by step on a CPU: glibc keeps its small per-step tensors in its heap
    gru = spec_from_dict(
        {"family": "rnn", "cell": "gru", "layers": 1, "hidden": 8, "seq_len": 4, "vocab": 16}
    )
    assert gru.memory_parts(1, "adamw")["libraries"] == 12 * mib
    assert gru.replace(cell="lstm").memory_parts(1, "adamw")["libraries"] == 5 * mib
    # the logits' gradient is the loss's (LOSS_COPIES): the workspace counts hidden layers only
    assert c.workspace_elements == 2 * 64
    assert spec.memory_per_sample() == metrics.sample_memory(
        c.activation_bytes("fp32"), 10, c.workspace_bytes("fp32")
    )


def test_backward_moments_follow_the_layers_order() -> None:
    """Backward runs from the last layer to the first: where a layer's backward needs the most,
    the layers after it have their gradients and those up to it their activations."""
    spec = spec_from_dict({"family": "cnn", "image_size": 32, "stages": 2, "base_width": 8, "classes": 10})
    points = spec.count().moments
    first, placed = points[0], points[1:]
    assert placed, "every convolution's backward is a moment of its own"
    assert first.grads < spec.count().params and first.copies == spec.count().params
    grads = [p.grads for p in placed]
    assert grads == sorted(grads, reverse=True), "the earlier the layer, the more gradients exist"
    kept = [p.kept for p in placed]
    assert kept == sorted(kept), "the later the layer, the more activations are kept"
    # an unfused recurrent layer's forward is a moment of its own: no gradient exists yet
    gru = spec_from_dict({"family": "rnn", "cell": "gru", "layers": 2, "hidden": 64, "seq_len": 16})
    forward = [m for m in gru.count().moments if m.grads == 0]
    assert len(forward) == 2 and all(m.copies < gru.count().params for m in forward)


def test_generate_prints_where_the_memory_goes() -> None:
    args = [f"{k}={v}" for k, v in MLP.items() if k != "family"]
    p = subprocess.run(
        [sys.executable, "-m", "hpcdl", "generate", "mlp", *args, "--json"], capture_output=True, text=True
    )
    info = json.loads(p.stdout)
    assert sum(info["memory_parts_bytes"].values()) == info["memory_estimate_bytes"]["adamw"]
    assert info["memory_parts_bytes"] == spec_from_dict(MLP).memory_parts(4, "adamw")
