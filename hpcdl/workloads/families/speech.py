"""Speech: a Deep Speech 2-like acoustic model -- a 2D convolutional front end over a
spectrogram, a stack of (bidirectional) recurrent layers, and a per-frame classifier.

Loss is per-frame cross-entropy against one label per output frame (not CTC): the work of
the network is the same, and the benchmark needs no alignment-free loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from hpcdl.workloads.counting import Count, Tally, conv_out
from hpcdl.workloads.precision import precision
from hpcdl.workloads.recurrent import CELLS, count_stack, keep_output_copy, recurrent_stack
from hpcdl.workloads.registry import FAMILIES
from hpcdl.workloads.spec import Ranges, Spec, knob

ACTIVATIONS = ("hardtanh", "relu")
MERGES = ("concat", "sum")

# Deep Speech 2's convolutions over (frequency, time): (kernel, stride, padding).
CONV_LAYOUT: tuple[tuple[tuple[int, int], tuple[int, int], tuple[int, int]], ...] = (
    ((41, 11), (2, 2), (20, 5)),
    ((21, 11), (2, 1), (10, 5)),
    ((21, 11), (2, 1), (10, 5)),
)
CLIP = 20.0
"""Deep Speech 2's clipped ReLU: min(max(x, 0), 20)"""


@FAMILIES.register
@dataclass(frozen=True, kw_only=True)
class SpeechSpec(Spec):
    """Deep Speech 2-like model on spectrograms of shape ``(1, freq_bins, frames)``: up to three
    strided 2D convs (+ batch norm + clipped ReLU), then ``rnn_layers`` recurrent layers over
    the output frames, then a fully connected classifier at every output frame."""

    family: ClassVar[str] = "speech"
    channels_last: ClassVar[bool] = True
    sampling: ClassVar[Ranges] = {
        "freq_bins": [41, 81, 161],
        "frames": [50, 100, 200],
        "conv_layers": [1, 2, 3],
        "conv_channels": [8, 16, 32],
        "cell": ["lstm", "gru", "vanilla"],
        "rnn_layers": [1, 2, 3],
        "hidden": [64, 128, 256],
        "bidirectional": [False, True],
        "merge": ["concat", "sum"],
    }

    freq_bins: int = knob(161, lo=1, hi=1 << 14, doc="frequency bins of the input spectrogram")
    frames: int = knob(100, lo=1, hi=1 << 20, doc="time frames of the input spectrogram")
    conv_layers: int = knob(2, lo=1, hi=len(CONV_LAYOUT), doc="convolutional layers of the front end")
    conv_channels: int = knob(32, lo=1, hi=1 << 12, doc="channels of each convolutional layer")
    conv_activation: str = knob(
        "hardtanh", choices=ACTIVATIONS, doc="after each conv: hardtanh (DS2's ReLU clipped at 20) or relu"
    )
    cell: str = knob(
        "gru", choices=tuple(CELLS), doc="recurrent cell: nn.GRU, nn.LSTM or nn.RNN (vanilla, tanh)"
    )
    rnn_layers: int = knob(3, lo=1, hi=64, doc="recurrent layers")
    hidden: int = knob(256, lo=1, hi=1 << 14, doc="hidden units per direction")
    bidirectional: bool = knob(True, doc="run each recurrent layer both ways")
    merge: str = knob(
        "concat",
        choices=MERGES,
        doc="the two directions' outputs: concatenated, or summed as Deep Speech 2 does (the next "
        "layer then reads hidden, not 2 x hidden, features)",
    )
    classes: int = knob(
        29, lo=2, hi=1 << 20, doc="output symbols per frame (DS2: 26 letters, space, ', blank)"
    )

    @property
    def num_classes(self) -> int:
        return self.classes

    @property
    def unfused_recurrent(self) -> bool:
        return self.cell != "lstm"

    def conv_sizes(self) -> list[tuple[int, int]]:
        """(freq, time) sides after each conv layer."""
        sizes, f, t = [], self.freq_bins, self.frames
        for (kf, kt), (sf, st), (pf, pt) in CONV_LAYOUT[: self.conv_layers]:
            f, t = conv_out(f, kf, sf, pf), conv_out(t, kt, st, pt)
            sizes.append((f, t))
        return sizes

    def target_shape(self) -> tuple[int, ...]:
        return (self.conv_sizes()[-1][1],)

    @property
    def rnn_input(self) -> int:
        """Features per frame fed to the first recurrent layer: channels x frequency bins."""
        return self.conv_channels * self.conv_sizes()[-1][0]

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def summed(self) -> bool:
        return self.bidirectional and self.merge == "sum"

    @property
    def rnn_output(self) -> int:
        """Features per frame out of each recurrent layer."""
        return self.hidden if self.summed else self.directions * self.hidden

    def build_module(self) -> nn.Module:
        convs: list[nn.Module] = []
        c_in = 1
        for kernel, stride, padding in CONV_LAYOUT[: self.conv_layers]:
            act = nn.Hardtanh(0.0, CLIP) if self.conv_activation == "hardtanh" else nn.ReLU()
            convs += [
                # no bias: the batch norm right after it would cancel it
                nn.Conv2d(c_in, self.conv_channels, kernel, stride=stride, padding=padding, bias=False),
                nn.BatchNorm2d(self.conv_channels),
                act,
            ]
            c_in = self.conv_channels
        if self.summed:
            rnn: nn.Module = SummedBidirectional(self.cell, self.rnn_input, self.hidden, self.rnn_layers)
        else:
            rnn = recurrent_stack(self.cell, self.rnn_input, self.hidden, self.rnn_layers, self.bidirectional)
        fc = nn.Linear(self.rnn_output, self.classes)
        return DeepSpeech(nn.Sequential(*convs), rnn, fc)

    def sample_inputs(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        return torch.randn(n, 1, self.freq_bins, self.frames, generator=generator, device=device)

    # --- analytic count ------------------------------------------------------------------
    def count(self) -> Count:
        t = Tally()
        if precision(self.precision).autocast:  # the first conv keeps a 16-bit copy of the
            t.keep(self.freq_bins * self.frames)  # spectrogram (the fp32 batch is the run's inputs)
        c_in, in_hw = 1, (self.freq_bins, self.frames)
        for i, (f, frames) in enumerate(self.conv_sizes()):
            kernel = CONV_LAYOUT[i][0]
            t.conv2d((f, frames), c_in, self.conv_channels, kernel, data_input=i == 0, in_hw=in_hw)
            in_hw = (f, frames)
            t.add_params(2 * self.conv_channels)  # batch norm scale and shift
            t.keep(self.conv_channels * f * frames)  # the activation's input (batch norm output)
            if i < len(self.conv_sizes()) - 1:  # its output, the next conv's input (the last one's
                t.keep(self.conv_channels * f * frames)  # is the recurrent layers', below)
            c_in = self.conv_channels
        frames = self.target_shape()[0]
        # the convolutions' output needs its gradient: no layer reads data. Hardtanh keeps its
        # input, so its output, what the first recurrent layer reads (batch-first), is held only
        # until the forward pass ends (a ReLU keeps its output: counted above). Summed directions
        # are layers of their own: each next one reads the sum (time-major), which keeps nothing
        conv_out = frames * self.rnn_input if self.conv_activation == "hardtanh" else 0
        stacks = [(self.rnn_layers, self.rnn_input)]
        if self.summed:
            stacks = [(1, self.rnn_input if i == 0 else self.hidden) for i in range(self.rnn_layers)]
        for i, (layers, fan_in) in enumerate(stacks):
            count_stack(
                t,
                self.cell,
                steps=frames,
                input_size=fan_in,
                hidden=self.hidden,
                layers=layers,
                directions=self.directions,
                data_input=False,
                autocast=precision(self.precision).autocast,
                fp32_input=False,  # the convolutions' output: 16-bit under autocast
                batch_first=i == 0,
                # a summed layer's output (both directions) lives on through the next one's forward
                input_alive=conv_out + (frames * self.directions * self.hidden if i else 0),
            )
        keep_output_copy(t, frames, self.rnn_output, alive=conv_out)
        t.linear(frames, self.rnn_output, self.classes)
        return t.result()


class SummedBidirectional(nn.Module):
    """Bidirectional recurrent layers whose two directions are summed before the next layer
    (Deep Speech 2's h = h_forward + h_backward), instead of concatenated."""

    def __init__(self, cell: str, input_size: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.layers = nn.ModuleList(
            recurrent_stack(cell, input_size if i == 0 else hidden, hidden, 1, True) for i in range(layers)
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        for layer in self.layers:
            out, _ = layer(x)
            x = out[..., : self.hidden] + out[..., self.hidden :]
        return x, None


class DeepSpeech(nn.Module):
    """Convs over ``(batch, 1, freq, time)``, then an RNN over time, then logits per frame."""

    def __init__(self, convs: nn.Module, rnn: nn.Module, fc: nn.Linear) -> None:
        super().__init__()
        self.convs = convs
        self.rnn = rnn
        self.fc = fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.convs(x)  # (batch, channels, freq, time)
        x = x.flatten(1, 2).transpose(1, 2)  # (batch, time, channels x freq)
        x, _ = self.rnn(x)
        return self.fc(x)  # (batch, time, classes)
