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
    adamw = spec.memory_parts(4, "adamw")
    assert set(adamw) == {"weights", "gradients", "optimizer_state", "activations", "workspace"}
    assert adamw["weights"] == adamw["gradients"] == 4 * c.params and adamw["optimizer_state"] == 8 * c.params
    assert c.largest_param == 64 * 64  # the largest weight, not the sum of them
    assert adamw["workspace"] == 4 * c.workspace_bytes("fp32") + 2 * 4 * c.largest_param
    assert sum(adamw.values()) == spec.memory_estimate(4, "adamw")
    assert spec.memory_parts(8, "adamw")["activations"] == 2 * adamw["activations"]
    sgd = spec.memory_parts(4, "sgd")
    assert sgd["optimizer_state"] == 4 * c.params and sgd["workspace"] == 4 * c.workspace_bytes("fp32")
    # in bf16 autocast keeps 16-bit copies of the weights; activations and workspace halve
    bf16 = spec.replace(precision="bf16").memory_parts(4, "adamw")
    assert bf16["weights"] == 6 * c.params
    assert bf16["activations"] < adamw["activations"] and bf16["workspace"] < adamw["workspace"]
    # the logits' gradient is the loss's (LOSS_COPIES): the workspace counts hidden layers only
    assert c.workspace_elements == 2 * 64
    assert spec.memory_per_sample() == metrics.sample_memory(
        c.activation_bytes("fp32"), 10, c.workspace_bytes("fp32")
    )


def test_generate_prints_where_the_memory_goes() -> None:
    args = [f"{k}={v}" for k, v in MLP.items() if k != "family"]
    p = subprocess.run(
        [sys.executable, "-m", "hpcdl", "generate", "mlp", *args, "--json"], capture_output=True, text=True
    )
    info = json.loads(p.stdout)
    assert sum(info["memory_parts_bytes"].values()) == info["memory_estimate_bytes"]["adamw"]
    assert info["memory_parts_bytes"] == spec_from_dict(MLP).memory_parts(4, "adamw")
