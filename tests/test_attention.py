"""The attention family: its analytic counts against the built network and FlopCounterMode,
and the BERT / GPT-2 presets against their published sizes."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from hpcdl.errors import SpecError
from hpcdl.workloads.crosscheck import counted_flops, saved_activation_elements
from hpcdl.workloads.families.attention import ACTIVATIONS, AttentionSpec
from hpcdl.workloads.recipes import presets
from hpcdl.workloads.registry import spec_from_dict

pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration:UserWarning")

# causal x norm x head x tie: 16 combinations, activations alternating, sizes drawn at random
COMBOS = list(itertools.product((False, True), ("pre", "post"), ("lm", "cls"), (False, True)))


def random_spec(i: int) -> AttentionSpec:
    causal, norm, head, tie = COMBOS[i % len(COMBOS)]
    rng = random.Random(i)
    heads = rng.choice((1, 2, 4))
    seq_len = rng.randint(1, 8)
    return AttentionSpec(
        causal=causal,
        norm=norm,
        head=head,
        tie_embeddings=tie,
        activation=tuple(ACTIVATIONS)[i % len(ACTIVATIONS)],
        layers=rng.randint(1, 3),
        heads=heads,
        width=heads * rng.randint(1, 4),
        ffn_mult=rng.choice((0.5, 1.0, 1.5, 2.7, 4.0)),
        seq_len=seq_len,
        positions=rng.choice((0, seq_len, seq_len + 3)),
        vocab=rng.randint(2, 40),
        classes=rng.randint(2, 7),
        seed=i,
    )


SPECS = [random_spec(i) for i in range(20)]


def _id(spec: AttentionSpec) -> str:
    return f"{'causal' if spec.causal else 'full'}-{spec.norm}-{spec.head}-tie{int(spec.tie_embeddings)}"


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_params_match_module(spec: AttentionSpec) -> None:
    model = spec.build()
    assert spec.count().params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_flops_match_flop_counter(spec: AttentionSpec) -> None:
    # exact: full L x L score and mix products, causal or not (see hpcdl.workloads.families.attention)
    count = spec.count()
    forward, total = counted_flops(spec)
    assert count.forward_flops == forward
    assert count.train_flops == total


@pytest.mark.parametrize("spec", SPECS[:4], ids=_id)
def test_activation_estimate(spec: AttentionSpec) -> None:
    spec = spec.replace(width=32, heads=4, seq_len=16, positions=0, vocab=64)
    assert 0.5 <= spec.count().activation_elements / saved_activation_elements(spec) <= 3


@pytest.mark.parametrize("spec", SPECS[:8], ids=_id)
def test_output_shape(spec: AttentionSpec) -> None:
    inputs = spec.sample_inputs(3, torch.Generator().manual_seed(0), torch.device("cpu"))
    out = spec.build()(inputs)
    assert out.shape == (3, *spec.target_shape(), spec.num_classes)


def test_tied_head_shares_the_embedding() -> None:
    spec = AttentionSpec(width=16, heads=2, vocab=50, tie_embeddings=True)
    untied = spec.replace(tie_embeddings=False)
    assert untied.count().params - spec.count().params == 16 * 50
    assert untied.count().forward_flops == spec.count().forward_flops


def test_seed_fixes_weights() -> None:
    spec = AttentionSpec(width=16, heads=2, vocab=50, seed=3)
    a, b, c = spec.build(), spec.build(), spec.replace(seed=4).build()
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(x, z) for x, z in zip(a.parameters(), c.parameters(), strict=True))


@pytest.mark.parametrize(
    ("knobs", "field"),
    [
        ({"width": 10, "heads": 4}, "attention.heads"),
        ({"seq_len": 0}, "attention.seq_len"),
        ({"seq_len": 64, "positions": 32}, "attention.positions"),
        ({"heads": 0}, "attention.heads"),
        ({"ffn_mult": 0}, "attention.ffn_mult"),
        ({"vocab": 1}, "attention.vocab"),
        ({"norm": "sandwich"}, "attention.norm"),
        ({"head": "seq2seq"}, "attention.head"),
        ({"activation": "swish"}, "attention.activation"),
        ({"causal": 1}, "attention.causal"),
    ],
)
def test_bad_knobs_name_the_knob(knobs: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as err:
        AttentionSpec(**knobs)  # type: ignore[arg-type]
    assert err.value.field == field


def _meta_params(spec: AttentionSpec) -> int:
    with torch.device("meta"):  # the real module, without allocating or initialising it
        return sum(p.numel() for p in spec.build_module().parameters())


def test_bert_base_preset() -> None:
    # published: 110M; here 108,890,112 (no token-type embeddings, pooler or MLM transform)
    spec = spec_from_dict(presets()["bert_base"])
    assert isinstance(spec, AttentionSpec)
    assert spec.count().params == pytest.approx(110e6, rel=0.02)
    assert spec.count().params == _meta_params(spec)


def test_gpt2_small_preset() -> None:
    spec = spec_from_dict(presets()["gpt2_small"])
    assert isinstance(spec, AttentionSpec)
    count = spec.count()
    assert count.params == 124_439_808  # Hugging Face GPT2LMHeadModel, exactly
    assert count.params == pytest.approx(124e6, rel=0.02)
    assert count.params == _meta_params(spec)

    # Kaplan et al. 2020, Table 1: forward FLOPs per token = 2 N + 2 n_layer n_ctx d_model, with
    # N = 12 n_layer d_model^2 the non-embedding weights, plus the de-embedding 2 d_model n_vocab.
    # Their attention term is one L x d product per token (Q K^T, or both products at half size
    # under the causal mask); we count Q K^T and A V at full size, as FlopCounterMode does, so
    # ours exceeds Kaplan's by exactly one more 2 n_layer n_ctx d_model (7% for GPT-2 small).
    n_layer, d, n_ctx, n_vocab = spec.layers, spec.width, spec.seq_len, spec.vocab
    kaplan = 2 * 12 * n_layer * d**2 + 2 * n_layer * n_ctx * d + 2 * d * n_vocab
    per_token = count.forward_flops / n_ctx
    assert per_token - 2 * n_layer * n_ctx * d == pytest.approx(kaplan, rel=0.02)
    assert per_token == kaplan + 2 * n_layer * n_ctx * d  # exact: biases and norms cost no FLOPs


def test_gpt2_small_forward_flops_on_meta() -> None:
    # the full-size model's forward pass, counted on meta tensors (no memory, no arithmetic)
    spec = spec_from_dict(presets()["gpt2_small"])
    assert isinstance(spec, AttentionSpec)
    with torch.device("meta"):
        model = spec.build_module()
        ids = torch.zeros(1, spec.seq_len, dtype=torch.long)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids)
    assert counter.get_total_flops() == spec.count().forward_flops
