"""Attention: a transformer encoder or decoder over token ids (BERT- and GPT-like).

FLOP convention for attention: the scores ``Q K^T`` and the mix ``A V`` are each counted as a
full ``L x d_head x L`` product per head -- also with a causal mask, where half of the scores are
thrown away -- and both operands are activations, so the backward pass costs two products of
the same size each. That is what ``FlopCounterMode`` counts for ``scaled_dot_product_attention``
(on the math path and in its flash / efficient-attention formulas alike). Softmax, scaling,
norms, activations and embedding lookups are element-wise or lookups: not counted.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from hpcdl.errors import SpecError
from hpcdl.workloads import moe
from hpcdl.workloads.counting import Count, Tally
from hpcdl.workloads.parallelism import Allreduces, End, Parts, Split
from hpcdl.workloads.precision import FP32_IN_16BIT, precision
from hpcdl.workloads.registry import FAMILIES
from hpcdl.workloads.spec import Ranges, Spec, knob


class ComposedTanhGELU(nn.Module):
    """The tanh approximation of GELU written as separate tensor operations, as GPT-2's reference
    code computes it: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``. Each operation reads and
    writes the whole tensor and keeps its input for backward, which on a CPU costs far more than
    the one fused kernel of ``nn.GELU(approximate="tanh")``; a proxy of such a model needs that cost."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "gelu_tanh_composed": ComposedTanhGELU,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
}
"""feed-forward activation -> module: one fused kernel each, but ``gelu_tanh_composed``"""
COMPOSED_SAVED = 3
"""elements per hidden unit that ``gelu_tanh_composed`` keeps for backward beyond what a fused
activation keeps (4 tensors of the hidden size against 1, counted with ``saved_tensors_hooks``)"""
EMBED_STD = 0.02
"""initial std of the token and position tables (as BERT and GPT-2): N(0, 1) embeddings would
make tied-head logits of std ~sqrt(width) and the first losses huge"""


@FAMILIES.register
@dataclass(frozen=True, kw_only=True)
class AttentionSpec(Spec):
    """Transformer over token ids: learned token and position embeddings, ``layers`` blocks of
    multi-head self-attention and a feed-forward network, then a per-token language-model head
    or a mean-pooled classifier."""

    family: ClassVar[str] = "attention"
    tp_in_stages: ClassVar[bool] = True  # each block holds its own column/row pairs
    sampling: ClassVar[Ranges] = {
        "layers": [1, 2, 4, 6],
        "heads": [1, 2, 4, 8],
        "head_dim": [16, 32, 64],  # width = heads x head_dim (from_drawn): heads always divide it
        "ffn_mult": [2.0, 4.0],
        "seq_len": [32, 64, 128, 256],
        "vocab": [1000, 8000, 32000],
        "causal": [False, True],
        "norm": ["pre", "post"],
        "head": ["lm", "cls"],
        "tie_embeddings": [False, True],
    }

    layers: int = knob(2, lo=1, hi=1000, doc="transformer blocks")
    width: int = knob(128, lo=1, hi=1 << 16, doc="model width (d_model)")
    heads: int = knob(4, lo=1, hi=1 << 12, doc="attention heads (must divide width)")
    ffn_mult: float = knob(4.0, lo=0.01, hi=64, doc="feed-forward hidden size as a multiple of width")
    seq_len: int = knob(32, lo=1, hi=1 << 20, doc="tokens per sample")
    vocab: int = knob(256, lo=2, hi=1 << 24, doc="token vocabulary")
    positions: int = knob(0, lo=0, hi=1 << 20, doc="learned position embeddings (0 = seq_len; >= seq_len)")
    causal: bool = knob(False, doc="causal (decoder) self-attention mask")
    norm: str = knob(
        "pre",
        choices=("pre", "post"),
        doc="LayerNorm placement: pre (GPT-2; adds a final norm) or post (BERT; adds an embedding norm)",
    )
    head: str = knob(
        "lm", choices=("lm", "cls"), doc="lm: logits over vocab per token; cls: mean-pool, then classes"
    )
    classes: int = knob(2, lo=2, hi=1 << 24, doc="output classes of the cls head")
    tie_embeddings: bool = knob(False, doc="lm head reuses the token embedding (no extra params; lm only)")
    activation: str = knob(
        "gelu",
        choices=tuple(ACTIVATIONS),
        doc="feed-forward activation: gelu (exact), gelu_tanh (fused tanh approximation), "
        "gelu_tanh_composed (the same written as element-wise ops, as GPT-2's code), relu, silu",
    )
    dropout: float = knob(
        0.0,
        lo=0.0,
        hi=0.95,
        doc="dropout on the embeddings, the attention probabilities and both residual branches "
        "(BERT and GPT-2: 0.1); on a CPU attention dropout leaves the fused kernel",
    )
    # mixture of experts (hpcdl.workloads.moe): each block's feed-forward network becomes experts
    experts: int = knob(0, lo=0, hi=1 << 16, doc="experts per feed-forward layer (0 = one dense network)")
    top_k: int = knob(2, lo=1, hi=1 << 16, doc="experts each token is routed to (<= experts)")
    capacity_factor: float = knob(
        1.25, lo=0.01, hi=1024, doc="slots per expert and sequence: ceil(this x seq_len x top_k / experts)"
    )
    expert_parallel: bool = knob(
        True, doc="shard the experts across ranks (experts a multiple of the ranks); tokens go by all-to-all"
    )

    @classmethod
    def from_drawn(cls, drawn: dict[str, Any], ranges: Ranges, rng: random.Random) -> dict[str, Any]:
        """``width`` = ``heads`` x the drawn ``head_dim``, unless the caller fixed the width."""
        knobs = dict(drawn)
        head_dim = knobs.pop("head_dim")
        knobs.setdefault("width", knobs["heads"] * head_dim)
        return knobs

    def check(self) -> None:
        if self.width % self.heads:
            raise SpecError(f"{self.family}.heads", self.heads, f"must divide width={self.width}")
        if self.positions and self.positions < self.seq_len:
            raise SpecError(
                f"{self.family}.positions", self.positions, f"must be 0 or >= seq_len={self.seq_len}"
            )
        moe.check(self)

    def to_dict(self) -> dict[str, Any]:
        return moe.without_dense_defaults(super().to_dict())

    @property
    def num_classes(self) -> int:
        return self.vocab if self.head == "lm" else self.classes

    @property
    def ffn_hidden(self) -> int:
        return max(1, round(self.ffn_mult * self.width))

    @property
    def max_positions(self) -> int:
        return self.positions or self.seq_len

    def target_shape(self) -> tuple[int, ...]:
        return (self.seq_len,) if self.head == "lm" else ()

    def build_module(self) -> nn.Module:
        return Transformer(self)

    def count(self) -> Count:
        return self._count(1)

    def tp_count(self, tp: int) -> Count:
        """One rank's work under tensor parallelism over ``tp`` ranks: heads, q/k/v, the output
        projection's inputs and the feed-forward's hidden units split; embeddings, norms and
        the head whole."""
        return self._count(tp)

    def _count(self, tp: int) -> Count:
        t = Tally()
        L, W = self.seq_len, self.width
        t.add_params((self.vocab + self.max_positions) * W)  # lookups: no FLOPs
        # the embedding sum (fp32 under autocast: the lookups are not products, and the
        # residual stream it starts stays fp32, an element of two)
        t.keep(L * W * _residual(self))
        if self.norm == "post":
            _layer_norm(t, L, W, _residual(self))
        if self.dropout:
            t.dropout(L * W, _residual(self))  # the embedding dropout's, over the fp32 sum
        for _ in range(self.layers):
            _block(t, self, L, W, tp)
        if self.norm == "pre":
            _layer_norm(t, L, W, _residual(self))
        if self.head == "cls":
            t.linear(1, W, self.classes)
        elif self.tie_embeddings:
            # the product still runs (and gets both gradients); its weight is the token table
            t.matmul(L, W, self.vocab)
            t.tied_head(self.vocab * W, inputs=L * W)
        else:
            t.linear(L, W, self.vocab, bias=False)
        return t.result()

    def sample_inputs(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        return torch.randint(self.vocab, (n, self.seq_len), generator=generator, device=device)

    # --- tensor and pipeline parallelism (``hpcdl.parallel``) -----------------------------
    def tp_sizes(self) -> dict[str, int]:
        return {"heads": self.heads, "width": self.width, "ffn_hidden": self.ffn_hidden}

    def tp_splits(self, model: nn.Module) -> dict[nn.Module, Split]:
        """Megatron's plan in every block: the fused q/k/v projection and the feed-forward's
        first layer by columns (each rank its heads, its hidden units), the output projection
        and the feed-forward's second layer by rows; embeddings, norms and the head whole."""
        splits: dict[nn.Module, Split] = {}
        for block in model.modules():
            if isinstance(block, Block):
                splits |= {block.qkv: "columns", block.proj: "rows", block.ffn[0]: "columns"}
                splits[block.ffn[2]] = "rows"
        return splits

    def tp_allreduces(self, blocks: int | None = None) -> Allreduces:
        """2 allreduces forward per block (after the row-parallel projections) and 2 backward
        (the gradients of the column-parallel layers' replicated inputs), each of batch x
        seq_len x width elements: forward ones in the compute precision (autocast's products),
        backward ones in fp32 (the gradients of layer-norm outputs and of the residual stream,
        which autocast keeps in fp32)."""
        calls = 2 * (self.layers if blocks is None else blocks)  # each way
        elements = calls * self.batch_size * self.seq_len * self.width
        return Allreduces(elements * (precision(self.precision).bytes + 4), 2 * calls)

    def pp_blocks(self) -> int:
        return self.layers

    def pp_parts(self, model: nn.Module) -> Parts:
        """The embeddings before the blocks, the final norm and the head after them. A tied lm
        head multiplies by the token table: the last stage holds the table too (its rank's
        copy, the same weights from the seed), and the two ends sum their gradients of it."""
        m: Any = model  # a Transformer
        tied = m.head is None
        after = (m.final_norm, m.tokens if tied else m.head)
        return Parts(
            End(m.embed, (m.tokens, m.positions, m.embed_norm, m.embed_drop)),
            list(m.blocks),
            End(m.finish, after),
            (m.tokens.weight,) if tied else (),
        )

    def pp_boundary_bytes(self) -> int:
        """A block's output: seq_len x width of the residual stream, fp32 under autocast too."""
        return self.seq_len * self.width * 4


def _residual(spec: AttentionSpec) -> int:
    """Elements per element of the residual stream: under autocast it stays fp32 (the sum of
    the fp32 embeddings and each block's 16-bit outputs), two 16-bit elements."""
    return FP32_IN_16BIT if precision(spec.precision).autocast else 1


def _layer_norm(t: Tally, tokens: int, width: int, residual: int = 1) -> None:
    """A LayerNorm: scale and shift; keeps its output plus a mean and a 1/std per token. Its
    backward's gradients are the residual stream's (``residual``: elements per element)."""
    t.add_params(2 * width)
    t.keep(tokens * (width + 2), gradients=2 * tokens * width * residual)


def _block(t: Tally, spec: AttentionSpec, tokens: int, width: int, tp: int = 1) -> None:
    """One transformer block (the norm placement does not change what is counted; dropout and
    the activation are element-wise: they change what is kept, not the FLOPs); its feed-forward
    network is a mixture of experts when the spec has experts. Under tensor parallelism over
    ``tp`` ranks, one rank's share: ``heads / tp`` heads, ``hidden / tp`` hidden units."""
    d_head = width // spec.heads
    heads, hidden = spec.heads // tp, spec.ffn_hidden // tp
    local = heads * d_head  # this rank's share of the width in the attention
    _layer_norm(t, tokens, width, _residual(spec))
    t.linear(tokens, width, 3 * local)  # fused q, k, v (column-parallel)
    t.matmul(tokens, d_head, tokens, times=heads)  # scores Q K^T
    t.matmul(tokens, tokens, d_head, times=heads)  # A V
    # flash-style kernels keep the output and a log-sum-exp per row, not the L x L scores
    # its backward holds its output's gradient and makes those of q, k and v
    t.keep(tokens * (local + heads), gradients=4 * tokens * local)
    if spec.dropout:
        # no fused CPU kernel takes attention dropout: the math path keeps three L x L tensors
        # (probabilities, the mask as floats, the dropped probabilities) and scaled copies of Q and
        # K, but not the fused kernel's output and log-sum-exp (measured with saved_tensors_hooks;
        # GPU kernels regenerate the mask: an overestimate there)
        scores = heads * tokens * tokens
        # its backward: two gradients of the scores
        t.keep(3 * scores + tokens * local - heads * tokens, gradients=2 * scores)
        t.dropout(2 * tokens * width)  # the two residual dropouts', over the branches' outputs
    t.linear(tokens, local, width)  # output projection (row-parallel; its bias whole)
    t.keep(tokens * width * (_residual(spec) - 1))  # the residual sum's rest in fp32
    _residual_sum(t, spec, tokens, width)
    _layer_norm(t, tokens, width, _residual(spec))
    if spec.experts:
        moe.count(t, spec)
    else:
        t.linear(tokens, width, hidden)
        t.keep(tokens * hidden, gradients=2 * tokens * hidden)  # activation output
        if spec.activation == "gelu_tanh_composed":
            t.keep(COMPOSED_SAVED * tokens * hidden)
        t.linear(tokens, hidden, width)
    t.keep(tokens * width * (_residual(spec) - 1))
    _residual_sum(t, spec, tokens, width)


def _residual_sum(t: Tally, spec: AttentionSpec, tokens: int, width: int) -> None:
    """The forward moment of a residual sum: the branch's output, which the sum frees, beside
    the sum (counted kept) and, under autocast, the branch's fp32 copy that the sum reads; after
    a post-norm also the norm's fp32 output, the sum's other input, of which only the next
    product's 16-bit copy is kept: a post-norm encoder in bf16 can peak there (measured with the
    profiler's allocations, docs/validation/2026-11-26-memory-estimate.md)."""
    autocast = precision(spec.precision).autocast
    norm_output = FP32_IN_16BIT if autocast and spec.norm == "post" else 0
    t.forward_transient(tokens * width * (2 * _residual(spec) - 1 + norm_output))


def _dropout(spec: AttentionSpec) -> nn.Module:
    # no module at all without dropout: even p = 0 would run a kernel per call
    return nn.Dropout(spec.dropout) if spec.dropout else nn.Identity()


class Block(nn.Module):
    """Self-attention and feed-forward sublayers, each with a residual and a LayerNorm."""

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__()
        self.d_head = spec.width // spec.heads
        self.causal = spec.causal
        self.attention_dropout = spec.dropout
        self.pre_norm = spec.norm == "pre"
        self.norm1 = nn.LayerNorm(spec.width)
        self.qkv = nn.Linear(spec.width, 3 * spec.width)
        self.proj = nn.Linear(spec.width, spec.width)
        self.norm2 = nn.LayerNorm(spec.width)
        self.proj_drop = _dropout(spec)
        self.ffn = (
            nn.Sequential(moe.MoE(spec, ACTIVATIONS[spec.activation]()), _dropout(spec))
            if spec.experts
            else nn.Sequential(
                nn.Linear(spec.width, spec.ffn_hidden),
                ACTIVATIONS[spec.activation](),
                nn.Linear(spec.ffn_hidden, spec.width),
                _dropout(spec),
            )
        )

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        # (batch, tokens, heads, 3, d_head) -> three (batch, heads, tokens, d_head) views: each
        # head's q, k and v are adjacent rows of the fused weight, so a column-parallel split of
        # it (tensor parallelism) gives each rank whole heads; the heads are then counted from
        # the rows this rank holds
        q, k, v = self.qkv(x).view(batch, tokens, -1, 3, self.d_head).permute(3, 0, 2, 1, 4).unbind(0)
        # the fused SDPA kernels (flash attention on GPUs) never materialise the L x L scores
        p = self.attention_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)
        return self.proj_drop(self.proj(y.transpose(1, 2).reshape(batch, tokens, -1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attend(self.norm1(x))
            return x + self.ffn(self.norm2(x))
        x = self.norm1(x + self.attend(x))
        return self.norm2(x + self.ffn(x))


class Transformer(nn.Module):
    """Token + position embeddings -> blocks -> LM head (optionally tied) or pooled classifier."""

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__()
        self.tokens = nn.Embedding(spec.vocab, spec.width)
        self.positions = nn.Embedding(spec.max_positions, spec.width)
        nn.init.normal_(self.tokens.weight, std=EMBED_STD)
        nn.init.normal_(self.positions.weight, std=EMBED_STD)
        # post-norm (BERT) normalises the embeddings; pre-norm (GPT-2) the last block's output
        self.embed_norm = nn.LayerNorm(spec.width) if spec.norm == "post" else nn.Identity()
        self.embed_drop = _dropout(spec)
        self.blocks = nn.Sequential(*(Block(spec) for _ in range(spec.layers)))
        self.final_norm = nn.LayerNorm(spec.width) if spec.norm == "pre" else nn.Identity()
        self.pool = spec.head == "cls"
        self.tied = spec.head == "lm" and spec.tie_embeddings
        out = spec.classes if self.pool else spec.vocab
        # an untied lm head has no bias (as GPT-2); the classifier has one
        self.head = None if self.tied else nn.Linear(spec.width, out, bias=self.pool)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.finish(self.blocks(self.embed(ids)))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> the first block's input (a pipeline's first stage runs it)."""
        x = self.tokens(ids) + self.positions.weight[: ids.shape[1]]
        return self.embed_drop(self.embed_norm(x))

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output -> logits (a pipeline's last stage runs it)."""
        x = self.final_norm(x)
        if self.pool:
            x = x.mean(dim=1)
        if self.head is None:
            return F.linear(x, self.tokens.weight)
        return self.head(x)
