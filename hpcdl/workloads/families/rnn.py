"""RNN: stacked LSTM / GRU / Elman layers over token ids or feature vectors -- a latency-bound
workload of many small, sequential matrix products.

FLOP convention for one layer and direction over ``T`` steps, ``G`` gate blocks of ``hidden``
(4 for an LSTM, 3 for a GRU, 1 for a vanilla RNN), as autograd computes it on the unfused path
(the path ``FlopCounterMode`` can see; see ``hpcdl.workloads.crosscheck``):

* input projection ``x_t @ W_ih^T`` for all steps: ``2*T*in*G*H``; backward: the weight gradient
  always, the input gradient unless the input is data (raw features into layer 1; token
  embeddings do need it, because the embedding table is trained);
* recurrent projection ``h_{t-1} @ W_hh^T``: ``2*T*H*G*H``; backward: the weight gradient for all
  ``T`` steps but the hidden-state gradient for ``T-1`` steps only, because the initial state
  ``h_0`` is a constant zero tensor and autograd computes no gradient for it (measured);
* a GRU applies its reset gate to ``W_hn h + b_hn`` after the product, so its recurrent product
  is still one ``H x 3H`` matmul per step (measured to match).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from hpcdl.errors import SpecError
from hpcdl.workloads.counting import Count, Tally
from hpcdl.workloads.spec import Spec, knob

CELLS: dict[str, Callable[..., nn.RNNBase]] = {"lstm": nn.LSTM, "gru": nn.GRU, "vanilla": nn.RNN}
GATES = {"lstm": 4, "gru": 3, "vanilla": 1}
"""gate blocks of ``hidden`` units that each input and recurrent product produces"""


@dataclass(frozen=True, kw_only=True)
class RNNSpec(Spec):
    """Recurrent network: optional token embedding, ``layers`` recurrent layers, a linear head
    on every step (sequence labelling / language modelling) or on the last one (classification)."""

    family: ClassVar[str] = "rnn"

    cell: str = knob("lstm", choices=tuple(CELLS), doc="recurrent cell (vanilla = Elman RNN with tanh)")
    layers: int = knob(2, lo=1, hi=1000, doc="stacked recurrent layers")
    hidden: int = knob(128, lo=1, hi=1 << 16, doc="hidden units per layer and direction")
    vocab: int = knob(
        256, lo=0, hi=1 << 24, doc="token vocabulary (0 = inputs are float feature vectors, no embedding)"
    )
    embedding: int = knob(64, lo=0, hi=1 << 16, doc="token embedding size (used when vocab > 0)")
    input_features: int = knob(64, lo=0, hi=1 << 20, doc="features per step (used when vocab = 0)")
    seq_len: int = knob(32, lo=1, hi=1 << 20, doc="time steps per sample")
    bidirectional: bool = knob(False, doc="run a second, reversed pass in every layer")
    output: str = knob(
        "step", choices=("step", "last"), doc="logits at every step, or only from the final hidden state"
    )
    classes: int = knob(256, lo=2, hi=1 << 24, doc="output classes (set to vocab for a language model)")

    def check(self) -> None:
        if self.vocab > 0 and self.embedding < 1:
            raise SpecError(f"{self.family}.embedding", self.embedding, "must be >= 1 when vocab > 0")
        if self.vocab == 0 and self.input_features < 1:
            raise SpecError(
                f"{self.family}.input_features", self.input_features, "must be >= 1 when vocab = 0"
            )

    @property
    def num_classes(self) -> int:
        return self.classes

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def input_size(self) -> int:
        """Width of what the first recurrent layer reads at each step."""
        return self.embedding if self.vocab > 0 else self.input_features

    def target_shape(self) -> tuple[int, ...]:
        return (self.seq_len,) if self.output == "step" else ()

    def build_module(self) -> nn.Module:
        return RNNNet(self)

    def count(self) -> Count:
        t = Tally()
        T, H, D, G = self.seq_len, self.hidden, self.directions, GATES[self.cell]
        if self.vocab > 0:
            t.add_params(self.vocab * self.embedding)  # a lookup: no FLOPs
            t.keep(T * self.embedding)
        fan_in = self.input_size
        for layer in range(self.layers):
            # raw features need no gradient; an embedding's output (and any layer's) does
            data_input = layer == 0 and self.vocab == 0
            for _ in range(D):
                _recurrent_layer(t, T, fan_in, H, G, data_input=data_input)
                _keep_cell_state(t, self.cell, T, H)
            fan_in = D * H
        head_rows = T if self.output == "step" else 1
        t.linear(head_rows, D * H, self.classes)
        return t.result()

    def sample_inputs(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        if self.vocab > 0:
            return torch.randint(self.vocab, (n, self.seq_len), generator=generator, device=device)
        return torch.randn(n, self.seq_len, self.input_features, generator=generator, device=device)


def _recurrent_layer(t: Tally, steps: int, fan_in: int, hidden: int, gates: int, *, data_input: bool) -> None:
    """One direction of one layer: input and recurrent projections with their two biases."""
    width = gates * hidden
    t.add_params(width * (fan_in + hidden + 2))  # W_ih, W_hh, b_ih, b_hh
    t.matmul(steps, fan_in, width, grads=1 if data_input else 2)
    # step 0 multiplies the constant h_0 = 0: only its weight gradient is computed
    t.matmul(1, hidden, width, grads=1)
    t.matmul(1, hidden, width, grads=2, times=steps - 1)


def _keep_cell_state(t: Tally, cell: str, steps: int, hidden: int) -> None:
    """What the unfused cell saves for backward, per step: about ``7.5 * hidden`` for an LSTM
    or a GRU (gate activations, pre-activations and states) and ``1.5 * hidden`` for a vanilla
    RNN (the new state, the previous one), measured with ``saved_tensors_hooks`` and rounded up.
    oneDNN's fused CPU LSTM keeps an opaque workspace of about 16 floats per step and unit instead.
    """
    per_step = {"lstm": 8, "gru": 8, "vanilla": 2}[cell]
    t.keep(steps * per_step * hidden)


class RNNNet(nn.Module):
    """Embedding (optional) -> recurrent stack -> linear head on every step or the last state."""

    def __init__(self, spec: RNNSpec) -> None:
        super().__init__()
        self.last = spec.output == "last"
        self.directions = spec.directions
        self.embed = nn.Embedding(spec.vocab, spec.embedding) if spec.vocab > 0 else None
        self.rnn = CELLS[spec.cell](
            spec.input_size,
            spec.hidden,
            num_layers=spec.layers,
            batch_first=True,
            bidirectional=spec.bidirectional,
        )
        self.head = nn.Linear(spec.directions * spec.hidden, spec.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        out, state = self.rnn(x)
        if not self.last:
            return self.head(out)
        h_n = state[0] if isinstance(state, tuple) else state  # an LSTM returns (h_n, c_n)
        # the final states of the top layer, both directions: the reversed pass ends at step 0
        top = h_n[-self.directions :].transpose(0, 1).reshape(x.shape[0], -1)
        return self.head(top)
