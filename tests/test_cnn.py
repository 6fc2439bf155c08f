"""The CNN family: analytic counts against the built model and FlopCounterMode, layouts,
seeding, knob validation, and the ResNet-50 / VGG-16 presets against published figures."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hpcdl.errors import SpecError
from hpcdl.workloads.counting import Tally
from hpcdl.workloads.crosscheck import counted_flops, saved_activation_elements
from hpcdl.workloads.families.cnn import CNNSpec
from hpcdl.workloads.recipes import presets
from hpcdl.workloads.registry import spec_from_dict

N_RANDOM = 20


def _draw(rng: random.Random) -> CNNSpec:
    """A small random spec; layouts that shrink the image to nothing are drawn again."""
    while True:
        stages = rng.randint(1, 4)
        knobs: dict[str, Any] = {
            "batch_size": 2,
            "seed": rng.randrange(1000),
            "image_size": rng.randint(6, 24),
            "in_channels": rng.randint(1, 4),
            "classes": rng.randint(2, 12),
            "stem": rng.choice(["none", "simple", "imagenet"]),
            "stages": stages,
            "blocks": [rng.randint(1, 2) for _ in range(rng.choice([1, stages]))],
            "base_width": rng.randint(2, 8),
            "width_mult": rng.choice([1.0, 1.5, 2.0]),
            "max_width": rng.randint(4, 32),
            "kernel_size": rng.choice([1, 3, 5]),
            "block": rng.choice(["plain", "basic", "bottleneck", "separable"]),
            "expansion": rng.randint(1, 4),
            "downsample": rng.choice(["stride", "maxpool", "none"]),
            "norm": rng.choice(["batch", "group", "none"]),
            "head_pool": rng.choice(["global", "flatten"]),
            "head_layers": rng.randint(0, 2),
            "head_width": rng.randint(4, 24),
        }
        try:
            return CNNSpec(**knobs)
        except SpecError as e:
            assert e.field == "cnn.image_size", e


SPECS = [_draw(random.Random(seed)) for seed in range(N_RANDOM)]
BLOCK_KINDS = ["plain", "basic", "bottleneck", "separable", "inverted"]


def _counter_counts_grouped_weight_grad_per_group() -> bool:
    """FlopCounterMode (torch 2.13) counts a grouped conv's weight gradient as if it were
    ungrouped, i.e. ``groups`` times too much (fixed upstream: pytorch/pytorch#183405)."""
    conv = nn.Conv2d(4, 4, 3, groups=4, bias=False)
    with FlopCounterMode(display=False) as counter:
        out = conv(torch.randn(1, 4, 5, 5))  # data input: only the weight gets a gradient
        forward = counter.get_total_flops()
        out.sum().backward()
    return counter.get_total_flops() - forward == 4 * forward


GROUPED_BUG = _counter_counts_grouped_weight_grad_per_group()


def _counter_excess(spec: CNNSpec) -> int:
    """Backward FLOPs per sample that FlopCounterMode adds over the true count (depthwise convs)."""
    if not GROUPED_BUG or spec.block not in ("separable", "inverted"):
        return 0
    excess = 0
    for stage in spec.plan().stages:
        for b in stage:
            c = b.hidden if spec.block == "inverted" else b.c_in
            t = Tally()
            t.conv2d((b.size_out, b.size_out), c, c, (b.kernel,) * 2, groups=c)
            excess += (c - 1) * t.forward
    return excess


def _draw_layout(rng: random.Random) -> CNNSpec:
    """A small random spec with a stage-by-stage layout (the knobs that describe a given network)."""
    while True:
        stages = rng.randint(1, 3)
        stem = rng.choice(["none", "simple", "imagenet"])
        knobs: dict[str, Any] = {
            "batch_size": 2,
            "image_size": rng.randint(8, 24),
            "classes": rng.randint(2, 12),
            "stem": stem,
            "stages": stages,
            "blocks": [rng.randint(1, 2) for _ in range(stages)],
            "base_width": rng.randint(2, 8),
            "widths": [rng.randint(2, 12) for _ in range(stages)],
            "kernels": [rng.choice([1, 3, 5]) for _ in range(stages)],
            "downsamples": [rng.choice(["stride", "maxpool", "none"]) for _ in range(stages)],
            "expansions": [rng.randint(1, 4) for _ in range(stages)],
            "block": rng.choice(BLOCK_KINDS),
            "norm": rng.choice(["batch", "none"]),
            "head_conv": rng.choice([0, rng.randint(2, 16)]),
            "head_layers": rng.randint(0, 1),
            "head_width": rng.randint(4, 24),
        }
        if stem != "none":
            knobs |= {"stem_kernel": rng.choice([0, 3, 5]), "stem_stride": rng.choice([0, 1, 2])}
        try:
            return CNNSpec(**knobs)
        except SpecError as e:
            assert e.field == "cnn.image_size", e


LAYOUTS = [_draw_layout(random.Random(100 + seed)) for seed in range(N_RANDOM)]
FIRES = [
    # SqueezeNet 1.1's layout, small: unpadded strided stem, 3x3/2 ceil-mode pools, a conv classifier
    CNNSpec(image_size=29, classes=7, stem="imagenet", stem_kernel=3, stem_stride=2, stem_padding=0,
            base_width=8, block="fire", stages=3, blocks=[2, 1, 2], widths=[16, 24, 32], norm="none",
            downsamples=["maxpool", "maxpool", "none"], pool="ceil3", classifier="conv", dropout=0.5),
    # no stem (the first squeeze reads the data), strided and 5x5 expands, batch norm, a linear head
    CNNSpec(image_size=12, stem="none", block="fire", stages=2, blocks=[1, 2], widths=[10, 12],
            kernels=[5, 3], downsamples=["stride", "stride"], squeeze_ratio=0.3, expand_split=0.25,
            head_layers=1, head_width=8),
    CNNSpec(image_size=16, block="fire", stages=2, base_width=8, norm="group", downsample="maxpool",
            classifier="conv"),
]  # fmt: skip


def test_random_specs_cover_every_block_kind() -> None:
    assert {s.block for s in SPECS} | {"inverted"} == set(BLOCK_KINDS)
    assert {s.block for s in LAYOUTS} == set(BLOCK_KINDS)
    assert {d for s in LAYOUTS for d in s.downsamples} == {"stride", "maxpool", "none"}


@pytest.mark.parametrize(
    "spec",
    SPECS + LAYOUTS + FIRES,
    ids=[f"r{i}-{s.block}" for i, s in enumerate(SPECS)]
    + [f"l{i}-{s.block}" for i, s in enumerate(LAYOUTS)]
    + [f"f{i}-fire" for i in range(len(FIRES))],
)
def test_count_matches_model(spec: CNNSpec) -> None:
    count = spec.count()
    model = spec.build()
    assert sum(p.numel() for p in model.parameters()) == count.params

    out = model(spec.sample_inputs(2, torch.Generator().manual_seed(0), torch.device("cpu")))
    assert tuple(out.shape) == (2, *spec.target_shape(), spec.num_classes)

    forward, total = counted_flops(spec)
    assert forward == count.forward_flops
    assert total - forward == count.backward_flops + _counter_excess(spec)

    # what each layer keeps is counted as autograd saves it (0.96-1.16 on these specs)
    saved = saved_activation_elements(spec)
    assert 0.9 <= count.activation_elements / saved <= 1.2, (count.activation_elements, saved)


def test_depthwise_backward_is_exact_apart_from_counter_bug() -> None:
    """A MobileNet-like net: the only disagreement is FlopCounterMode's grouped-conv excess."""
    spec = CNNSpec(image_size=16, stem="none", block="separable", base_width=6, stages=2)
    forward, total = counted_flops(spec)
    assert forward == spec.count().forward_flops
    excess = _counter_excess(spec)
    assert total - forward - excess == spec.count().backward_flops
    assert not GROUPED_BUG or excess > 0


def test_same_seed_same_weights() -> None:
    spec = CNNSpec(image_size=16, base_width=4, stages=2, seed=3)
    a, b = spec.build().state_dict(), spec.build().state_dict()
    c = spec.replace(seed=4).build().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point() and a[k].numel() > 1)


def test_a_mobilenet_v2_layout_counts_like_the_published_one() -> None:
    # MobileNetV2 (1.0, 224 px): 3,504,872 parameters and 300 M multiply-adds, published
    spec = CNNSpec(
        image_size=224, classes=1000, stem="simple", stem_stride=2, base_width=32, block="inverted",
        stages=7, blocks=[1, 2, 3, 4, 3, 3, 1], widths=[16, 24, 32, 64, 96, 160, 320],
        expansions=[1, 6, 6, 6, 6, 6, 6], head_conv=1280,
        downsamples=["none", "stride", "stride", "stride", "none", "stride", "none"],
    )  # fmt: skip
    assert spec.count().params == 3_504_872
    assert spec.count().forward_flops / 2 == pytest.approx(300e6, rel=0.02)
    assert sum(p.numel() for p in spec.build().parameters()) == 3_504_872


def test_a_fire_block_is_squeezenets() -> None:
    # SqueezeNet 1.1 (224 px, 1000 classes): 1,235,496 parameters and 0.35 G multiply-adds, published
    spec = CNNSpec(
        image_size=224, classes=1000, stem="imagenet", stem_kernel=3, stem_stride=2, stem_padding=0,
        base_width=64, block="fire", stages=4, blocks=[2, 2, 2, 2], widths=[128, 256, 384, 512],
        downsamples=["maxpool", "maxpool", "none", "none"], norm="none", pool="ceil3", classifier="conv",
        dropout=0.5,
    )  # fmt: skip
    assert spec.count().params == 1_235_496
    assert spec.count().forward_flops / 2 == pytest.approx(0.35e9, rel=0.02)
    fire = spec.build()[4]
    assert (fire.squeeze[0].out_channels, fire.expand1[0].out_channels, fire.expand_k[0].out_channels) == (
        16,
        64,
        64,
    )


def test_stage_widths_are_capped() -> None:
    spec = CNNSpec(base_width=16, width_mult=2.0, max_width=48, stages=4)
    assert spec.stage_widths() == (16, 32, 48, 48)


@pytest.mark.parametrize(
    ("knobs", "field"),
    [
        ({"kernel_size": 4}, "cnn.kernel_size"),
        ({"stages": 3, "blocks": [1, 2]}, "cnn.blocks"),
        ({"image_size": 8, "stages": 4, "downsample": "maxpool"}, "cnn.image_size"),
        ({"image_size": 16, "stem": "imagenet", "stages": 3, "downsample": "maxpool"}, "cnn.image_size"),
        ({"block": "inception"}, "cnn.block"),
        ({"norm": "layer"}, "cnn.norm"),
        ({"stages": 0}, "cnn.stages"),
        ({"stages": 2, "widths": [8]}, "cnn.widths"),
        ({"stages": 2, "kernels": [3, 4]}, "cnn.kernels"),
        ({"stages": 1, "downsamples": ["avgpool"]}, "cnn.downsamples"),
        ({"stem": "none", "stem_kernel": 5}, "cnn.stem_kernel"),
        ({"stem_kernel": 4}, "cnn.stem_kernel"),
        ({"block": "fire", "widths": [8, 1], "stages": 2}, "cnn.expand_split"),
        ({"block": "fire", "expand_split": 1.0}, "cnn.expand_split"),
        ({"squeeze_ratio": 0}, "cnn.squeeze_ratio"),
        ({"classifier": "conv", "head_layers": 1}, "cnn.classifier"),
        ({"pool": "avg"}, "cnn.pool"),
        ({"stem_padding": 9}, "cnn.stem_padding"),
        ({"stem": "none", "stem_padding": 0}, "cnn.stem_padding"),
    ],
)
def test_bad_knobs_name_the_knob(knobs: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        CNNSpec(**knobs)
    assert info.value.field == field
    assert field in str(info.value)


def test_shrink_error_says_smallest_image() -> None:
    with pytest.raises(SpecError, match=r"image_size >= 16"):
        CNNSpec(image_size=8, stem="none", stages=4, downsample="maxpool")
    CNNSpec(image_size=16, stem="none", stages=4, downsample="maxpool")  # the bound is tight


def test_resnet50_preset_matches_torchvision() -> None:
    spec = spec_from_dict(presets()["resnet50"])
    count = spec.count()
    assert count.params == 25_557_032
    assert count.forward_flops / 2 == pytest.approx(4.1e9, rel=0.02)
    stem = Tally()
    stem.conv2d((112, 112), 3, 64, (7, 7))  # fed by the image: no input gradient
    assert count.backward_flops == 2 * count.forward_flops - stem.forward
    model = spec.build()
    assert sum(p.numel() for p in model.parameters()) == count.params
    assert spec_from_dict(spec.to_dict()) == spec


def test_vgg16_preset_matches_torchvision() -> None:
    spec = spec_from_dict(presets()["vgg16"])
    count = spec.count()
    assert count.params == 138_357_544
    assert count.forward_flops / 2 == pytest.approx(15.5e9, rel=0.02)
