"""The rnn family: its analytic counts against the built network and against FlopCounterMode."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from hpcdl.errors import SpecError
from hpcdl.workloads import recurrent
from hpcdl.workloads.crosscheck import counted_flops, saved_activation_elements
from hpcdl.workloads.families.rnn import CELLS, RNNSpec
from hpcdl.workloads.precision import needs_loss_scaling, precision
from hpcdl.workloads.recipes import presets
from hpcdl.workloads.registry import spec_from_dict

# flopcheck toggles oneDNN, whose flag setter warns about TF32 on Intel GPUs
pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration:UserWarning")

# every combination of the discrete choices, with sizes drawn at random per combination
COMBOS = list(itertools.product(CELLS, ("step", "last"), (False, True), (False, True)))


def random_spec(i: int) -> RNNSpec:
    cell, output, bidirectional, tokens = COMBOS[i % len(COMBOS)]
    rng = random.Random(i)
    return RNNSpec(
        cell=cell,
        output=output,
        bidirectional=bidirectional,
        vocab=rng.randint(2, 40) if tokens else 0,
        embedding=rng.randint(1, 8),
        input_features=rng.randint(1, 8),
        layers=rng.randint(1, 3),
        hidden=rng.randint(1, 12),
        seq_len=rng.randint(1, 6),
        classes=rng.randint(2, 9),
        seed=i,
    )


SPECS = [random_spec(i) for i in range(len(COMBOS))]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.cell}-{s.output}-bi{int(s.bidirectional)}")
def test_params_match_module(spec: RNNSpec) -> None:
    model = spec.build()
    assert spec.count().params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.cell}-{s.output}-bi{int(s.bidirectional)}")
def test_flops_match_flop_counter(spec: RNNSpec) -> None:
    # exact: the count models autograd's unfused path product by product (h_0 gets no gradient)
    count = spec.count()
    forward, total = counted_flops(spec)
    assert count.forward_flops == forward
    assert count.train_flops == total


@pytest.mark.parametrize("cell", CELLS)
def test_single_step_has_no_recurrent_input_gradient(cell: str) -> None:
    # with one step the only recurrent product multiplies h_0 = 0, which needs no gradient
    spec = RNNSpec(cell=cell, vocab=0, input_features=3, hidden=5, layers=1, seq_len=1, classes=2)
    forward, total = counted_flops(spec)
    assert spec.count().backward_flops == total - forward


@pytest.mark.parametrize("spec", SPECS[:: len(CELLS)], ids=lambda s: s.cell)
def test_activation_estimate(spec: RNNSpec) -> None:
    spec = spec.replace(hidden=32, seq_len=8, embedding=16, input_features=16)
    # oneDNN's fused CPU LSTM saves an opaque uint8 workspace that the hook counts in bytes;
    # the estimate follows the unfused path, the one the FLOP count follows too
    with torch.backends.mkldnn.flags(enabled=False):
        measured = saved_activation_elements(spec)
    assert 0.5 <= spec.count().activation_elements / measured <= 3


@pytest.mark.parametrize("spec", SPECS[:8], ids=lambda s: f"{s.cell}-{s.output}")
def test_output_shape(spec: RNNSpec) -> None:
    inputs = spec.sample_inputs(3, torch.Generator().manual_seed(0), torch.device("cpu"))
    out = spec.build()(inputs)
    assert out.shape == (3, *spec.target_shape(), spec.num_classes)


def test_seed_fixes_weights() -> None:
    spec = RNNSpec(hidden=16, vocab=20, classes=5, seed=3)
    a, b, c = spec.build(), spec.build(), spec.replace(seed=4).build()
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(x, z) for x, z in zip(a.parameters(), c.parameters(), strict=True))


@pytest.mark.parametrize(
    ("knobs", "field"),
    [
        ({"vocab": 100, "embedding": 0}, "rnn.embedding"),
        ({"vocab": 0, "input_features": 0}, "rnn.input_features"),
        ({"seq_len": 0}, "rnn.seq_len"),
        ({"hidden": 0}, "rnn.hidden"),
        ({"layers": 0}, "rnn.layers"),
        ({"cell": "transformer"}, "rnn.cell"),
        ({"output": "mean"}, "rnn.output"),
        ({"classes": 1}, "rnn.classes"),
        ({"bidirectional": "yes"}, "rnn.bidirectional"),
    ],
)
def test_bad_knobs_name_the_knob(knobs: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as err:
        RNNSpec(**knobs)  # type: ignore[arg-type]
    assert err.value.field == field


def test_lstm_lm_preset_matches_zaremba() -> None:
    # Zaremba et al. 2014, large PTB model: 66M parameters
    spec = spec_from_dict(presets()["lstm_lm"])
    assert spec.count().params == pytest.approx(66e6, rel=0.02)
    with torch.device("meta"):  # the real module, without allocating or initialising it
        model = spec.build_module()
    assert spec.count().params == sum(p.numel() for p in model.parameters())


def test_recurrent_layers_get_a_loss_scaler_under_bf16_on_cuda() -> None:
    # cuDNN runs recurrent layers in fp16 under any autocast; decided from the model, no GPU needed
    rnn = spec_from_dict(
        {**presets()["lstm_lm"], "layers": 1, "hidden": 8, "embedding": 8, "vocab": 16, "classes": 16}
    ).build()
    mlp = spec_from_dict({"family": "mlp", "layers": 1, "width": 8, "input_size": 4}).build()
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert needs_loss_scaling(precision("bf16"), cuda, rnn)
    assert not needs_loss_scaling(precision("bf16"), cpu, rnn)  # CPU autocast keeps bf16
    assert not needs_loss_scaling(precision("bf16"), cuda, mlp)
    assert not needs_loss_scaling(precision("fp32"), cuda, rnn)
    assert needs_loss_scaling(precision("fp16"), cpu, mlp)


@pytest.mark.parametrize("fused", [True, False], ids=["this-cpu", "unfused-fallback"])
def test_an_lstm_trains_under_cpu_bf16_autocast(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN has no bf16 LSTM on a CPU without AVX-512: torch 2.13 on an AVX2-only EPYC raised
    "could not create a primitive descriptor for the LSTM forward propagation primitive" and
    ``hpcdl run --workload rnn precision=bf16`` ended in that traceback. hpcdl's LSTM takes
    PyTorch's unfused path there (``recurrent.fused_lstm_runs``). ``this-cpu`` runs whichever
    path this CPU has; ``unfused-fallback`` forces the fallback on any CPU."""
    if not fused:
        monkeypatch.setattr(recurrent, "fused_lstm_runs", lambda dtype: False)
    spec = RNNSpec(cell="lstm", layers=2, hidden=16, vocab=32, embedding=8, seq_len=5, classes=7)
    model = spec.build()
    x = spec.sample_inputs(4, torch.Generator().manual_seed(0), torch.device("cpu"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    logits.float().sum().backward()
    grads = [p.grad for p in model.rnn.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) and bool(g.any()) for g in grads)
    assert torch.backends.mkldnn.enabled  # the fallback gives oneDNN back to every other layer
