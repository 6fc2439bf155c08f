"""The speech family (Deep Speech 2-like): analytic counts against the built model and
FlopCounterMode, output shape, seeding and knob validation."""

from __future__ import annotations

import random
import warnings
from typing import Any

import pytest
import torch

from hpcdl.errors import SpecError
from hpcdl.workloads.crosscheck import counted_flops, saved_activation_elements
from hpcdl.workloads.families.speech import SpeechSpec

N_RANDOM = 20


def _draw(rng: random.Random) -> SpeechSpec:
    knobs: dict[str, Any] = {
        "batch_size": 2,
        "seed": rng.randrange(1000),
        "freq_bins": rng.randint(1, 48),
        "frames": rng.randint(1, 24),
        "conv_layers": rng.randint(1, 3),
        "conv_channels": rng.randint(1, 4),
        "conv_activation": rng.choice(["hardtanh", "relu"]),
        "cell": rng.choice(["gru", "lstm", "vanilla"]),
        "rnn_layers": rng.randint(1, 3),
        "hidden": rng.randint(1, 12),
        "bidirectional": rng.random() < 0.5,
        "merge": rng.choice(["concat", "sum"]),
        "classes": rng.randint(2, 12),
    }
    return SpeechSpec(**knobs)


SPECS = [_draw(random.Random(seed)) for seed in range(N_RANDOM)]


def test_random_specs_cover_every_cell() -> None:
    assert {s.cell for s in SPECS} == {"gru", "lstm", "vanilla"}
    assert {s.bidirectional for s in SPECS} == {True, False}
    assert {s.conv_layers for s in SPECS} == {1, 2, 3}


@pytest.mark.parametrize("spec", SPECS, ids=[f"r{i}-{s.cell}" for i, s in enumerate(SPECS)])
def test_count_matches_model(spec: SpeechSpec) -> None:
    count = spec.count()
    model = spec.build()
    assert sum(p.numel() for p in model.parameters()) == count.params

    out = model(spec.sample_inputs(2, torch.Generator().manual_seed(0), torch.device("cpu")))
    assert tuple(out.shape) == (2, *spec.target_shape(), spec.num_classes)

    # exact: the first step's zero hidden state gets no gradient (see _count_rnn_direction)
    forward, total = counted_flops(spec)
    assert forward == count.forward_flops
    assert total - forward == count.backward_flops

    # measured on the path counted_flops sees: with oneDNN on, the CPU LSTM instead keeps one
    # opaque uint8 workspace, which saved_activation_elements counts byte by byte
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # oneDNN's TF32 notice when its flags are set
        with torch.backends.mkldnn.flags(enabled=False):
            saved = saved_activation_elements(spec)
    assert 0.5 <= count.activation_elements / saved <= 3.0, (count.activation_elements, saved)


def test_deep_speech_2_shapes() -> None:
    """161 bins, 100 frames: the first conv halves both axes, the later ones only frequency."""
    spec = SpeechSpec(conv_layers=3, conv_channels=32)
    assert spec.conv_sizes() == [(81, 50), (41, 50), (21, 50)]
    assert spec.target_shape() == (50,)
    assert spec.rnn_input == 32 * 21


def test_rnn_params_per_cell() -> None:
    """nn.LSTM/GRU/RNN keep two biases per direction: (in + hidden + 2) x gates x hidden."""
    for cell, gates in (("lstm", 4), ("gru", 3), ("vanilla", 1)):
        spec = SpeechSpec(
            freq_bins=8, frames=4, conv_layers=1, conv_channels=2, cell=cell, rnn_layers=1, hidden=5
        )
        one_layer = spec.replace(bidirectional=False).count().params
        two_ways = spec.count().params
        fc_growth = 5 * spec.classes  # the classifier sees 2 x hidden features
        assert two_ways - one_layer - fc_growth == (spec.rnn_input + 5 + 2) * gates * 5


def test_same_seed_same_weights() -> None:
    spec = SpeechSpec(freq_bins=16, frames=8, hidden=8, rnn_layers=1, seed=5)
    a, b = spec.build().state_dict(), spec.build().state_dict()
    c = spec.replace(seed=6).build().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point() and a[k].numel() > 1)


@pytest.mark.parametrize(
    ("knobs", "field"),
    [
        ({"conv_layers": 4}, "speech.conv_layers"),
        ({"conv_layers": 0}, "speech.conv_layers"),
        ({"cell": "transformer"}, "speech.cell"),
        ({"conv_activation": "gelu"}, "speech.conv_activation"),
        ({"freq_bins": 0}, "speech.freq_bins"),
        ({"hidden": 0}, "speech.hidden"),
        ({"bidirectional": 1}, "speech.bidirectional"),
    ],
)
def test_bad_knobs_name_the_knob(knobs: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        SpeechSpec(**knobs)
    assert info.value.field == field
    assert field in str(info.value)
