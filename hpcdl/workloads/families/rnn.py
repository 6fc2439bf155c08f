"""RNN: stacked LSTM / GRU / Elman layers over token ids or feature vectors -- a latency-bound
workload of many small, sequential matrix products. The recurrent layers and their FLOP
convention are in :mod:`hpcdl.workloads.recurrent`, shared with the speech family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from hpcdl.errors import SpecError
from hpcdl.workloads.counting import Count, Tally
from hpcdl.workloads.precision import FP32_IN_16BIT, precision
from hpcdl.workloads.recurrent import CELLS, count_stack, keep_output_copy, output_scale, recurrent_stack
from hpcdl.workloads.registry import FAMILIES
from hpcdl.workloads.spec import Ranges, Spec, knob


@FAMILIES.register
@dataclass(frozen=True, kw_only=True)
class RNNSpec(Spec):
    """Recurrent network: optional token embedding, ``layers`` recurrent layers, a linear head
    on every step (sequence labelling / language modelling) or on the last one (classification)."""

    family: ClassVar[str] = "rnn"
    sampling: ClassVar[Ranges] = {
        "cell": ["lstm", "gru", "vanilla"],
        "layers": [1, 2, 3],
        "hidden": [64, 128, 256, 512],
        "vocab": [0, 1000, 10000],
        "embedding": [64, 128, 256],
        "input_features": [16, 64, 128],
        "seq_len": [16, 32, 64],
        "bidirectional": [False, True],
        "output": ["step", "last"],
        "classes": [10, 100, 1000],
    }

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
    dropout: float = knob(
        0.0,
        lo=0.0,
        hi=0.95,
        doc="dropout on the recurrent stack's input, between its layers and on its output "
        "(Zaremba et al.'s large LSTM: 0.65)",
    )

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
    def unfused_recurrent(self) -> bool:
        return self.cell != "lstm"

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
        T = self.seq_len
        autocast = precision(self.precision).autocast
        embedded = 0  # the embedding's output: fp32 (autocast casts no lookup), alive in forward
        if self.vocab > 0:
            t.add_params(self.vocab * self.embedding)  # a lookup: no FLOPs, keeps the ids only
            embedded = T * self.embedding * (FP32_IN_16BIT if autocast else 1)
        width = count_stack(
            t,
            self.cell,
            steps=T,
            input_size=self.input_size,
            hidden=self.hidden,
            layers=self.layers,
            directions=self.directions,
            data_input=self.vocab == 0,  # raw features need no gradient; an embedding's output does
            autocast=autocast,
            input_alive=embedded,
        )
        if self.dropout:
            # the masks of the input dropout, over an embedding's fp32 output (over data, which
            # takes no gradient, autograd keeps none), and of the dropout between the layers and
            # on a per-step output, over the layers' outputs
            if self.vocab > 0:
                t.dropout(T * self.input_size, FP32_IN_16BIT if autocast else 1)
            scale = output_scale(self.cell, autocast)
            t.dropout(T * width * (self.layers - 1), scale)
            if self.output == "step":  # the last state goes to the head undropped
                t.dropout(T * width, scale)
        if self.output == "step":
            keep_output_copy(t, T, width, alive=embedded)
        t.linear(T if self.output == "step" else 1, width, self.classes)
        return t.result()

    def sample_inputs(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        if self.vocab > 0:
            return torch.randint(self.vocab, (n, self.seq_len), generator=generator, device=device)
        return torch.randn(n, self.seq_len, self.input_features, generator=generator, device=device)


class RNNNet(nn.Module):
    """Embedding (optional) -> recurrent stack -> linear head on every step or the last state."""

    def __init__(self, spec: RNNSpec) -> None:
        super().__init__()
        self.last = spec.output == "last"
        self.directions = spec.directions
        self.embed = nn.Embedding(spec.vocab, spec.embedding) if spec.vocab > 0 else None
        self.rnn = recurrent_stack(
            spec.cell, spec.input_size, spec.hidden, spec.layers, spec.bidirectional, spec.dropout
        )
        # no module at all without dropout: even p = 0 would run a kernel per call
        self.drop = nn.Dropout(spec.dropout) if spec.dropout else nn.Identity()
        self.head = nn.Linear(spec.directions * spec.hidden, spec.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        out, state = self.rnn(self.drop(x))
        if not self.last:
            return self.head(self.drop(out))
        h_n = state[0] if isinstance(state, tuple) else state  # an LSTM returns (h_n, c_n)
        # the final states of the top layer, both directions: the reversed pass ends at step 0
        top = h_n[-self.directions :].transpose(0, 1).reshape(x.shape[0], -1)
        return self.head(top)
