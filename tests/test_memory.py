"""The memory estimate's parts: weights, gradients, optimizer state, activations and workspace,
each from its own term (docs/metrics.md, "Memory"; docs/validation/2026-11-26-memory-estimate.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hpcdl_cli import hpcdl

from hpcdl import metrics
from hpcdl.measure.allocations import allocations, allocator_peak, sampled
from hpcdl.measure.fit import estimated_batch
from hpcdl.workloads import recipes
from hpcdl.workloads.counting import Tally
from hpcdl.workloads.recurrent import (
    FUSED_LSTM_INPUT_GRADIENT,
    HEAP_RESIDENT,
    count_stack,
    fused_lstm_runs,
    fused_lstm_wide_input,
    recurrent_stack,
)
from hpcdl.workloads.registry import spec_from_dict
from hpcdl.workloads.sampling import sample_spec

MLP = {"family": "mlp", "layers": 2, "width": 64, "input_size": 32, "output_size": 10, "batch_size": 4}


def test_the_parts_add_up_and_each_follows_its_term() -> None:
    spec = spec_from_dict(MLP)
    c = spec.count()
    mib = 1 << 20
    # one sample: the optimizer step is the peak (every gradient, AdamW's temporaries, no activation)
    step = spec.memory_parts(1, "adamw")
    parts = {
        "inputs",
        "weights",
        "gradients",
        "optimizer_state",
        "activations",
        "workspace",
        "libraries",
        "heap",
    }
    assert set(step) == parts and step["heap"] == 0  # no layer runs step by step
    # the batches of inputs the run keeps on the device: 32 fp32 features and an int64 label a
    # sample, in each of them (a trial keeps one, a run RunConfig.pool_batches)
    assert spec.input_bytes() == 32 * 4 + 8 and step["inputs"] == spec.input_bytes()
    assert spec.memory_parts(4096, "adamw", pool_batches=4)["inputs"] == 4 * 4096 * (32 * 4 + 8)
    assert step["weights"] == step["gradients"] == 4 * c.params and step["optimizer_state"] == 8 * c.params
    assert c.largest_param == 64 * 64  # the largest weight, not the sum of them
    assert step["activations"] == 0 and step["workspace"] == 2 * 4 * c.largest_param
    assert step["libraries"] == metrics.CPU_LIBRARY_BYTES[(False, False)] == 4.5 * mib
    assert spec.memory_parts(1, "adamw", "cuda")["libraries"] == 0
    # many samples: backward is the peak; as it begins only the head's gradient exists
    big = spec.memory_parts(4096, "adamw")
    assert big["gradients"] == 4 * (64 * 10 + 10) and big["optimizer_state"] == 8 * c.params
    assert spec.memory_parts(8192, "adamw")["activations"] == 2 * big["activations"]
    assert sum(big.values()) == spec.memory_estimate(4096, "adamw") > sum(step.values())
    assert big["activations"] + big["workspace"] == 4096 * spec.memory_per_sample()
    assert big["inputs"] == 4096 * spec.input_bytes()
    sgd = spec.memory_parts(1, "sgd")
    assert sgd["optimizer_state"] == 4 * c.params
    # SGD has no temporaries: the peak is the first layer's backward, with every gradient and its
    # output's (64 features of one sample)
    assert sgd["gradients"] == 4 * c.params and sgd["workspace"] == 4 * 64
    # in bf16 autocast's 16-bit copies of the weights are saved for backward (gone by the step);
    # at the peak, the last ReLU's backward, the head's backward has run and freed its own
    bf16 = spec.replace(precision="bf16")
    assert bf16.memory_parts(4096, "adamw")["weights"] == 4 * c.params + 2 * (c.params - (64 * 10 + 10))
    assert bf16.memory_parts(1, "adamw")["weights"] == 4 * c.params
    assert bf16.memory_parts(4096, "adamw")["activations"] < big["activations"]
    assert bf16.memory_parts(1, "adamw")["libraries"] == 10 * mib
    # a GRU runs step by step on a CPU: glibc keeps its small per-step tensors in its heap
    gru = spec_from_dict(
        {"family": "rnn", "cell": "gru", "layers": 1, "hidden": 8, "seq_len": 4, "vocab": 16}
    )
    assert gru.memory_parts(1, "adamw")["libraries"] == 9.5 * mib
    assert gru.replace(cell="lstm").memory_parts(1, "adamw")["libraries"] == 4.5 * mib
    assert gru.replace(precision="bf16").memory_parts(1, "adamw")["libraries"] == 15 * mib
    # the logits' gradient is the loss's (LOSS_COPIES): beyond everything kept (2 x 64), the
    # head's input gradient as backward begins (64); the last ReLU's backward holds its output's
    # and its input's gradients beside everything kept (2 x 64: the profiler's peak of a wide
    # MLP at a large batch, benchmarks/memory_allocator.py mlp:22:fp32:batch_size=14203)
    assert c.workspace_elements == 2 * 64
    # a sample's most is that moment: the loss's copies of the logits went with the head's backward
    kept_and_gradients = c.activation_bytes("fp32") + c.workspace_bytes("fp32")
    assert spec.memory_per_sample() == kept_and_gradients == 4 * (2 * 64 + 2 * 64)


def _distinct_convolutions(spec: Any) -> int:
    """The distinct convolutions (weight shape, stride, padding, groups, input shape) one
    sample's forward pass through the built model runs: each is a shape oneDNN builds primitives
    for on a CPU."""
    seen: set[tuple[Any, ...]] = set()
    model = spec.replace(batch_size=1).build()

    def hook(conv: torch.nn.Conv2d, inputs: tuple[torch.Tensor, ...], _: torch.Tensor) -> None:
        shape = (tuple(conv.weight.shape), conv.stride, conv.padding, conv.groups)
        seen.add((*shape, tuple(inputs[0].shape[1:])))

    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.register_forward_hook(hook)
    with torch.no_grad():
        model(spec.sample_inputs(1, torch.Generator(), torch.device("cpu")))
    return len(seen)


@pytest.mark.parametrize(
    "name",
    ["resnet50", "vgg16", "cnn:0", "cnn:2", "cnn:53", "cnn:59", "cnn:69", "speech:0", "speech:3"],
)
def test_each_distinct_convolution_costs_the_libraries_its_primitives(name: str) -> None:
    """A CPU step holds oneDNN's primitives for every distinct convolution it trains, outside
    PyTorch's allocator (``metrics.CPU_CONV_PRIMITIVE_BYTES``): the count, made analytically
    from the knobs, is the number of distinct convolutions the real model runs (block kinds,
    strides, depthwise groups, a speech model's convolutions over its spectrogram), and the
    libraries' part grows by it on a CPU only."""
    family, _, seed = name.partition(":")
    spec = sample_spec(family, int(seed), batch_size=32) if seed else recipes.preset(name, batch_size=32)
    convs = spec.count().conv_shapes
    assert convs == _distinct_convolutions(spec) > 0
    autocast_off = metrics.CPU_LIBRARY_BYTES[(False, spec.unfused_recurrent)]
    libraries = autocast_off + convs * metrics.CPU_CONV_PRIMITIVE_BYTES
    assert spec.memory_parts(32, "adamw")["libraries"] == libraries
    assert spec.memory_parts(32, "adamw", "cuda")["libraries"] == 0
    assert spec_from_dict(MLP).count().conv_shapes == 0


@pytest.mark.parametrize("cell", ["gru", "vanilla"])
def test_what_an_unfused_cell_saves_under_autocast_is_counted(cell: str) -> None:
    """Under CPU autocast a GRU's state stays fp32 (its gate arithmetic meets it), an Elman RNN's
    does not: what the bf16 run saves beyond half the fp32 run's bytes (saved_tensors_hooks)
    is what the count adds (recurrent.FP32_STATE_UNDER_AUTOCAST): one fp32 element per step and
    unit for a GRU, nothing for an Elman RNN."""
    steps, hidden, batch, features = 16, 128, 8, 8
    saved, counted = {}, {}
    for autocast in (False, True):
        layer, seen = recurrent_stack(cell, features, hidden, 1, False), {}

        def pack(t: torch.Tensor, seen: dict[int, int] = seen) -> torch.Tensor:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                layer(torch.randn(batch, steps, features))
        saved[autocast] = sum(seen.values())
        t = Tally()
        count_stack(t, cell, steps=steps, input_size=features, hidden=hidden, layers=1, directions=1,
                    data_input=True, autocast=autocast)  # fmt: skip
        counted[autocast] = batch * t.result().activation_bytes("bf16" if autocast else "fp32")
    fp32_state = steps * hidden * batch * 2 if cell == "gru" else 0  # 4 bytes where 2 were counted
    assert saved[True] - saved[False] // 2 == fp32_state
    assert counted[True] - counted[False] // 2 == fp32_state


AMX = "amx_bf16" in Path("/proc/cpuinfo").read_text()


def test_a_fused_lstm_over_a_wide_input_counts_onednns_buffers_in_fp32() -> None:
    """oneDNN's fused CPU LSTM keeps diff-state buffers as wide as a wider input outside the
    allocator (recurrent.fused_lstm_wide_input, measured on isolated layers): they are counted
    in its backward's moment, fp32 in every precision (two 16-bit elements each under autocast);
    an input no wider than the state adds none. Its input's gradient: two buffers as any layer's
    in fp32, under autocast an fp32 one beside its 16-bit copy (FUSED_LSTM_INPUT_GRADIENT)."""
    steps, hidden = 100, 64
    assert fused_lstm_wide_input(hidden, hidden) == fused_lstm_wide_input(16, hidden) == 0
    # measured beyond the 4 per unit: 1,562 and 2,785 per step and sample at 512 and 2,592 inputs
    assert fused_lstm_wide_input(512, hidden) == pytest.approx(1562 - 256, rel=0.11)
    assert fused_lstm_wide_input(2592, hidden) == pytest.approx(2785 - 256, rel=0.11)  # at its limit

    def workspace(fan_in: int, autocast: bool) -> int:
        t = Tally()
        count_stack(t, "lstm", steps=steps, input_size=fan_in, hidden=hidden, layers=1, directions=1,
                    data_input=False, autocast=autocast)  # fmt: skip
        return t.result().workspace_elements

    for fan_in in (512, 2592):
        wide = fused_lstm_wide_input(fan_in, hidden)
        gradients = 2 * steps * (fan_in - hidden)  # its input's gradient buffers, as any layer's
        assert workspace(fan_in, False) - workspace(hidden, False) == gradients + steps * int(wide)
        copies = FUSED_LSTM_INPUT_GRADIENT * steps * (fan_in - hidden)  # 16-bit elements
        assert workspace(fan_in, True) - workspace(hidden, True) == copies + steps * int(2 * wide)


@pytest.mark.skipif(not fused_lstm_runs(torch.bfloat16), reason="no fused bf16 LSTM in oneDNN on this CPU")
def test_a_fused_lstms_input_gradient_under_autocast_is_fp32_beside_its_16_bit_copy() -> None:
    """recurrent.FUSED_LSTM_INPUT_GRADIENT, in the profiler's allocations of a real layer's
    backward under CPU autocast: oneDNN returns the gradient of the layer's 16-bit input in fp32,
    and its 16-bit copy is allocated before the fp32 one is freed."""
    batch, steps, fan_in, hidden = 16, 50, 640, 32
    layer = torch.nn.LSTM(fan_in, hidden, batch_first=True)
    x = torch.randn(batch, steps, fan_in, dtype=torch.bfloat16, requires_grad=True)  # a conv's output
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = layer(x)
    loss = y.float().sum()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        loss.backward()
    made = [n for _, n in allocations(prof)]
    fp32 = batch * steps * fan_in * 4
    first = made.index(fp32)
    copy = made.index(fp32 // 2, first)
    assert -fp32 not in made[first:copy], made
    assert x.grad is not None and x.grad.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("name", "within"),
    [
        ("attention:28:fp32", 0.03),  # a small head: the peak is the feed-forward's backward
        # under autocast the residual stream stays fp32; measured with oneDNN's AMX kernels: others
        # may allocate their scratch space through PyTorch's allocator
        pytest.param("attention:27:bf16", 0.03, marks=pytest.mark.skipif(not AMX, reason="no AMX")),
        ("attention:0:fp32", 0.03),  # a language model's head: the loss's backward is the peak
        ("speech:14:fp32", 0.1),  # a GRU over 656 features: its backward frees its state first
        # where activations outweigh the weights (as at the batches --fit chooses): the last
        # ReLU's backward, its two gradients beside everything kept (0.948 before they were)
        ("mlp:22:fp32:batch_size=2000", 0.03),
        # basic blocks without norms: the last conv's output gradient is the identity shortcut's
        # (1.145 when counted twice, with the batch counted as an activation beside the inputs);
        # 1.000 with AVX2, 0.904 with AVX-512 (a Zen 5), where oneDNN's 16-channel blocks pad its
        # 8 channels to twice the map in its backward's copies (not modelled)
        ("cnn:17:fp32", 0.10),
        # its peak: a stride-2 conv's backward, whose two copies are the input's size (0.930 when
        # the second was counted the output's size)
        ("cnn:13:fp32", 0.03),
        # a 32,000-token head: no gradient exists in the loss's backward, where it peaks (1.047
        # when the head's weight gradient was counted there)
        ("attention:11:fp32", 0.03),
        # a bidirectional GRU over an embedding under autocast: each direction of its later layer
        # casts the layer's fp32 input to 16 bits for its projection and keeps the copy (0.919
        # before it was counted; ISA-independent: the unfused GRU runs ATen's ops)
        ("rnn:38:bf16", 0.05),
    ],
)
def test_the_estimates_tensors_meet_the_allocators_peak(name: str, within: float) -> None:
    """The estimate's tensors against the peak of bytes PyTorch's allocator had live in a real
    step (the profiler's allocations, ``hpcdl/measure/allocations.py``; nothing outside the
    allocator): each layer's backward is a moment of its own, with its output's and input's
    gradients beside what the layers before it keep. These read 1.23, 0.93, 1.02 and 1.18 when
    the moment as backward began counted two gradients of the largest layer output beside
    everything kept, the residual stream 16-bit, and an unfused layer's backward its own state
    beside two gradients as wide as its wider side."""
    spec, tensors = sampled(name)
    peak, _ = allocator_peak(spec)
    assert tensors / peak == pytest.approx(1.0, abs=within), (tensors, peak)


def test_an_elman_rnns_heap_pages_count_where_glibc_holds_its_states() -> None:
    """An Elman RNN's per-step states below glibc's mmap threshold live in its heap, whose pages
    its layers leave resident (recurrent.HEAP_RESIDENT: half a state per step and unit from each
    layer's forward, then twice the largest layer's from backward). Above the threshold glibc maps
    each state on its own and nothing is left; on a GPU, or where jemalloc is the process's
    ``malloc``, there is no such heap. Auto-fit's
    starting batch stays within its target across the threshold."""
    spec = spec_from_dict(
        {"family": "rnn", "cell": "vanilla", "layers": 2, "hidden": 256, "seq_len": 32, "vocab": 1000}
    )
    forward, backward = HEAP_RESIDENT["vanilla"]
    state = 32 * 256  # elements of one layer's states of one sample: a step's row is 1 KiB in fp32
    first, *placed = spec.count().moments
    assert first.heap == 2 * forward * state  # both layers' forward, as backward begins
    made = [m.heap for m in placed if m.grads == 0]  # in forward, layer by layer, then at the head
    assert made == [forward * state, 2 * forward * state, 2 * forward * state]
    assert {m.heap for m in placed if m.grads} == {(2 * forward + backward) * state}
    in_heap, mapped = 1000, 1100  # 1,024,000 and 1,126,400 bytes a row; glibc maps 1 MiB and up
    assert spec.memory_parts(in_heap, "adamw")["heap"] == in_heap * 4 * first.heap  # its peak: the loss
    assert spec.memory_parts(mapped, "adamw")["heap"] == 0
    assert spec.memory_parts(in_heap, "adamw", "cuda")["heap"] == 0
    assert spec.memory_parts(in_heap, "adamw", malloc="jemalloc")["heap"] == 0  # preloaded: no glibc heap
    assert spec.replace(cell="gru").memory_parts(in_heap, "adamw")["heap"] == 0
    for target in (200e6, 260e6, 320e6):  # the fill batch either side of the threshold
        batch = estimated_batch(spec, "adamw", 1.0, int(target))
        assert spec.memory_estimate(batch, "adamw") <= target < spec.memory_estimate(batch + 1, "adamw") or (
            batch + 1 >= mapped  # past the threshold the estimate drops: the line's batch
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
    # an unfused recurrent layer's forward is a moment of its own, and so is the head's copy of the
    # output (a linear over every step): no gradient exists yet, nor the head's weights' copies
    gru = spec_from_dict({"family": "rnn", "cell": "gru", "layers": 2, "hidden": 64, "seq_len": 16})
    forward = [m for m in gru.count().moments if m.grads == 0]
    assert len(forward) == 3 and all(m.copies < gru.count().params for m in forward)
    assert [m.kept for m in forward] == sorted(m.kept for m in forward)


def test_generate_prints_where_the_memory_goes() -> None:
    args = [f"{k}={v}" for k, v in MLP.items() if k != "family"]
    p = hpcdl("generate", "mlp", *args, "--json")
    info = json.loads(p.stdout)
    assert sum(info["memory_parts_bytes"].values()) == info["memory_estimate_bytes"]["adamw"]
    assert info["memory_parts_bytes"] == spec_from_dict(MLP).memory_parts(4, "adamw")


DROPPED = [
    {"family": "attention", "layers": 2, "width": 32, "heads": 2, "seq_len": 8, "vocab": 50, "dropout": 0.1},
    {"family": "rnn", "cell": "lstm", "hidden": 16, "layers": 1, "seq_len": 6, "vocab": 20, "embedding": 8,
     "dropout": 0.3, "output": "step"},
    {"family": "rnn", "cell": "gru", "hidden": 16, "layers": 1, "seq_len": 6, "input_features": 5, "vocab": 0,
     "dropout": 0.3, "output": "step"},
    {"family": "cnn", "image_size": 16, "base_width": 8, "head_layers": 2, "head_width": 32, "dropout": 0.5},
]  # fmt: skip
"""workloads whose every dropout is an ``nn.Dropout`` module (an rnn of one layer: none inside
the stack), each family that has one"""
UNFUSED = "no fused LSTM under autocast here: the layer computes in fp32, the count takes 16 bits"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("knobs", DROPPED, ids=["attention", "rnn-lstm", "rnn-gru", "cnn"])
def test_a_dropout_mask_counts_what_autograd_keeps_on_a_cpu(knobs: dict[str, Any], precision: str) -> None:
    """What the dropouts keep for backward, measured with ``saved_tensors_hooks`` inside the
    ``nn.Dropout`` modules: on a CPU a scaled copy of the noise in the dropped tensor's dtype
    (fp32 even under autocast where the tensor is fp32: an embedding, a residual sum), not a
    1-byte boolean. The count's masks (``Tally.dropout``, ``Moment.masks``) in the precision's
    elements are exactly those bytes; CUDA's booleans are their elements, one byte each."""
    batch = 2
    spec = spec_from_dict({**knobs, "precision": precision, "batch_size": batch})
    if knobs.get("cell") == "lstm" and precision == "bf16" and not fused_lstm_runs(torch.bfloat16):
        pytest.skip(UNFUSED)
    model = spec.build().train()
    inside, kept = [False], []
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
            m.register_forward_hook(lambda *_: inside.__setitem__(0, False))

    def pack(t: torch.Tensor) -> torch.Tensor:
        if inside[0]:
            kept.append((t.dtype, t.numel() * t.element_size()))
        return t

    x = spec.sample_inputs(batch, torch.Generator().manual_seed(0), torch.device("cpu"))
    with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x)
    assert kept and torch.bool not in {dtype for dtype, _ in kept}
    first = spec.count().moments[0]  # as backward begins: every mask kept
    size = 2 if precision == "bf16" else 4
    assert first.masks * size * batch == sum(n for _, n in kept)
    elements = sum(n // (2 if dtype == torch.bfloat16 else 4) for dtype, n in kept)
    assert first.mask_bytes * batch == elements  # CUDA's booleans: a byte an element


def test_a_cuda_estimate_counts_its_masks_as_bytes() -> None:
    """The same moments on CUDA: each mask a byte an element (``native_dropout``'s booleans)
    where the CPU keeps one element of the dropped tensor."""
    spec = spec_from_dict({**DROPPED[0], "batch_size": 2})
    first = spec.count().moments[0]
    assert first.masks > 0
    cpu, cuda = spec.memory_per_sample("cpu"), spec.memory_per_sample("cuda")
    assert cpu - cuda == first.masks * 4 - first.mask_bytes


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_masks_between_a_stacks_layers_are_of_the_layers_outputs(cell: str, precision: str) -> None:
    """Inside ``nn.LSTM`` and ``nn.GRU`` the dropout between layers is no module: what the whole
    model keeps with dropout, less what it keeps without, is every mask the count holds, in the
    dtype of the layers' outputs (a GRU's fp32 under autocast: ``recurrent.output_scale``)."""
    batch = 2
    knobs = {**DROPPED[1], "cell": cell, "layers": 2, "precision": precision, "batch_size": batch}
    if cell == "lstm" and precision == "bf16" and not fused_lstm_runs(torch.bfloat16):
        pytest.skip(UNFUSED)

    def kept_bytes(dropout: float) -> int:
        spec = spec_from_dict({**knobs, "dropout": dropout})
        model, total = spec.build().train(), [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            total[0] += t.numel() * t.element_size()
            return t

        x = spec.sample_inputs(batch, torch.Generator().manual_seed(0), torch.device("cpu"))
        with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                model(x)
        return total[0]

    masks = spec_from_dict({**knobs, "dropout": 0.3}).count().moments[0].masks
    size = 2 if precision == "bf16" else 4
    assert kept_bytes(0.3) - kept_bytes(0.0) == masks * size * batch
