"""Recurrent layers (LSTM, GRU, Elman RNN): the one place they are built and counted, for every
family that stacks them (``rnn``, ``speech``).

FLOP convention for one layer and direction over ``T`` steps, ``G`` gate blocks of ``H`` units
(4 for an LSTM, 3 for a GRU, 1 for an Elman RNN), as autograd computes it on the unfused path
(the path ``FlopCounterMode`` can see; see ``hpcdl.workloads.crosscheck``):

* input projection ``x_t @ W_ih^T`` for all steps at once: ``2*T*in*G*H``; backward: the
  weight gradient always, the input gradient unless the input is data (raw features into the
  first layer; token embeddings and convolution outputs need it);
* recurrent projection ``h_{t-1} @ W_hh^T``: ``2*T*H*G*H``; backward: the weight gradient for
  all ``T`` steps but the hidden-state gradient for ``T-1`` steps only, because the initial
  state ``h_0`` is a constant zero tensor and autograd computes no gradient for it (measured);
* a GRU applies its reset gate to ``W_hn h + b_hn`` after the product (cuDNN's formulation), so
  its recurrent product is still one ``H x 3H`` matmul per step (measured to match).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from hpcdl.workloads.counting import GRADIENT_BUFFERS, Tally
from hpcdl.workloads.precision import FP32_IN_16BIT


@functools.cache
def fused_lstm_runs(dtype: torch.dtype) -> bool:
    """Whether oneDNN's fused CPU LSTM runs under CPU autocast to ``dtype`` on this machine. It
    has no such primitive on a CPU without AVX-512 (an AMD EPYC with AVX2 only, torch 2.13, bf16
    and fp16: "could not create a primitive descriptor for the LSTM forward propagation
    primitive"), where PyTorch still chooses it; a tiny layer tells."""
    layer = nn.LSTM(8, 8)
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            layer(torch.zeros(2, 1, 8))
    except RuntimeError:
        return False
    return True


class LSTM(nn.LSTM):
    """``nn.LSTM`` that runs under CPU autocast where oneDNN's fused LSTM cannot
    (:func:`fused_lstm_runs`): there it takes PyTorch's unfused path, with oneDNN off for the
    layer, which computes in fp32 (autocast casts nothing for it). Elsewhere it is ``nn.LSTM``."""

    def forward(  # type: ignore[override]
        self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        dtype = torch.get_autocast_dtype("cpu")
        if not (input.is_cpu and torch.is_autocast_enabled("cpu")) or fused_lstm_runs(dtype):
            return super().forward(input, hx)
        was = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]  # a ContextProp: sets the flag
        try:
            return super().forward(input, hx)
        finally:
            torch.backends.mkldnn.enabled = was  # type: ignore[assignment]


CELLS: dict[str, Callable[..., nn.RNNBase]] = {"lstm": LSTM, "gru": nn.GRU, "vanilla": nn.RNN}
"""cell name -> PyTorch module (vanilla: Elman RNN with tanh)"""
GATES = {"lstm": 4, "gru": 3, "vanilla": 1}
"""gate blocks of ``hidden`` units that each input and recurrent product produces"""
SAVED_PER_STEP: dict[str, float] = {"lstm": 8, "gru": 7, "vanilla": 1}
"""elements per step and unit a cell saves for backward in one direction. Unfused (GRU, Elman
RNN), beside the layer's input and output, which ``count_stack`` counts apart: 7 for a GRU (gate
activations, pre-activations and states) and 1 for an Elman RNN (the new state), measured with
``saved_tensors_hooks`` (fp32, batch 64, 32 steps, 64 to 256 units and inputs: 7.2-7.5 and
1.1-1.2 per unit in one direction and in two, with the weights; ``benchmarks/memory_rss.py
saved``). oneDNN's fused CPU LSTM keeps an
opaque workspace instead, of which about 8 per unit, its input and output included, are resident
after the forward pass (the rise of the resident set: 6-10), the rest only in its backward
(``FUSED_LSTM_BACKWARD``)."""
FP32_STATE_UNDER_AUTOCAST = {"gru"}
"""cells whose state stays fp32 under CPU autocast when their input is fp32 (the initial state
takes the input's dtype: data or an embedding, not a convolution's 16-bit output, as in the speech
family): the GRU's products are 16-bit, but its gate arithmetic meets the fp32 state, so one
element it saves per step and unit is fp32 where a 16-bit one is counted, with its input and
output eight per unit (``saved_tensors_hooks``, bf16, 2 layers of 512 units over 64 steps: 17.9
bytes, against 16 counted). Its forward's outputs are fp32 too (the output sequence: 4.19 MB for
64 steps of 512 units at batch 32, rnn seed 17, ``benchmarks/memory_allocator.py --timeline``;
a speech GRU's over 16-bit input, 1.64 MB for 100 steps of 256, is 16-bit), its input projection
16-bit. Over a previous layer's fp32 output autocast casts a 16-bit copy for each direction's
input projection, which keeps it for its weight gradient; a first layer's time-major copy of its
input is 16-bit already (``saved_tensors_hooks``). rnn seed 38, a bidirectional GRU, keeps 4.19
MB a direction for its second layer's 64 steps of 1,024 features at batch 32; with the copies
counted its tensors over the allocator's peak went from 0.919 to 0.959, and those of the six
GRUs among the first 24 rnn specs in bf16 that peak in their forward from 0.92-0.98 to 0.95-1.00
(``memory_allocator.py --first 24 rnn:bf16``). An Elman RNN's tanh stays 16-bit.
Counted on every device, as the CPU runs it: on a GPU cuDNN runs the layer (an overestimate
there, as ``FUSED_LSTM_BACKWARD``)"""
HEAP_RESIDENT = {"vanilla": (0.5, 2.0)}
"""cells whose per-step tensors leave glibc's heap pages resident beyond what is live, where the
heap holds them (a batch's state below its mmap threshold, ``device.MMAP_THRESHOLD_BYTES``, as
auto-fit's trials fix it), in elements per step and unit of the state: (what a layer's forward
leaves, until the step ends; what its backward leaves, the most of any layer: an earlier layer's
backward reuses those pages) (``Tally.heap_states``). The two factors are fitted to Elman RNNs'
measured peaks (``benchmarks/memory_rss.py trace``, ``bench_memory.py --families rnn``) in
docs/validation/2026-11-26-memory-estimate.md; a GRU's pages are not counted."""
FUSED_LSTM_BACKWARD = 17
"""elements per step and unit resident while oneDNN's fused CPU LSTM runs one layer's and
direction's backward: its whole workspace, beside the gradients of its input and output
(measured with ``VmHWM`` on a CPU with oneDNN, ``benchmarks/memory_onednn.py lstm``;
docs/validation/2026-11-26-memory-estimate.md)"""
FUSED_LSTM_INPUT_GRADIENT = 1 + FP32_IN_16BIT
"""16-bit elements per input feature, step and sample that a fused CPU LSTM layer's input
gradient takes under autocast at the end of its backward: oneDNN returns it in fp32, and autograd
casts it to its input's 16 bits while the fp32 one and the layer's workspace are still alive. The
profiler's allocations, speech seed 36 in bf16 (2,592 features into 64 units over 100 steps at
batch 32; ``benchmarks/memory_allocator.py --timeline 4e6 speech:36:bf16``): +33.2 MB in
``mkldnn_rnn_layer_backward``, then +16.6 MB in ``_to_copy``, the step's peak, which the resident
set's trace shows too (``benchmarks/memory_rss.py trace speech:36:bf16``). Counted beside the
output's gradient (``hidden``) where fp32 counts ``GRADIENT_BUFFERS * max(hidden, fan_in)``; not
for a first layer over data, whose input needs no gradient (measured in
docs/validation/2026-11-26-memory-estimate.md)."""


def fused_lstm_wide_input(fan_in: int, hidden: int) -> float:
    """fp32 elements per step and sample that oneDNN's fused CPU LSTM holds outside PyTorch's
    allocator in one layer's and direction's backward beyond ``FUSED_LSTM_BACKWARD`` (which has
    the 4 per unit of ``fan_in == hidden``): its buffers of diff states have rows as wide as the
    wider of input and state, so they grow with the input up to a limit where a row spans pages
    of which only the first are written. The isolated layer's ``VmHWM`` rise in backward less
    the profiler's allocations (fp32, 100 steps, batch 32, 64 to 2,592 inputs, 64 to 256 units,
    15 shapes, ``benchmarks/memory_onednn.py lstm``; within 12 % of each in fp32):
    ``min(2.7 max(in, H) + 1.3 H, 12 H + 2048)``, e.g. 256 at 64 x 64 (so 0 beyond the 4 per
    unit), 2,816 at 2,592 inputs into 64 units (2,560 beyond).
    In bf16 about as large (within 10 % of it on 11 of the 15 shapes on a Zen 5 EPYC, 2026-11-29),
    but 64 units do not reach the limit: 1.13-1.30 of it from 1,536 inputs up. Counted on every
    device, as the CPU runs it (an overestimate on a GPU, whose cuDNN LSTM keeps its reserve space
    in the caching allocator)"""
    return max(0.0, min(2.7 * max(fan_in, hidden) + 1.3 * hidden, 12 * hidden + 2048) - 4 * hidden)


def recurrent_stack(
    cell: str, input_size: int, hidden: int, layers: int, bidirectional: bool, dropout: float = 0.0
) -> nn.RNNBase:
    """``layers`` recurrent layers over batch-first sequences; ``dropout`` between layers."""
    between = dropout if layers > 1 else 0.0  # one layer has no "between" (torch warns otherwise)
    return CELLS[cell](
        input_size, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional, dropout=between
    )


def output_scale(cell: str, autocast: bool, fp32_input: bool = True) -> int:
    """Elements of the count per element of a layer's output (:func:`count_stack`'s): 2 where
    it is fp32 under autocast (a GRU's over fp32 input: ``FP32_STATE_UNDER_AUTOCAST``), else 1."""
    return FP32_IN_16BIT if autocast and fp32_input and cell in FP32_STATE_UNDER_AUTOCAST else 1


def count_stack(
    t: Tally,
    cell: str,
    *,
    steps: int,
    input_size: int,
    hidden: int,
    layers: int,
    directions: int,
    data_input: bool,
    autocast: bool = False,
    fp32_input: bool = True,
    batch_first: bool = True,
    input_alive: int = 0,
) -> int:
    """Parameters, FLOPs and saved activations of a stack like :func:`recurrent_stack`, its
    first layer's input and each later layer's included (whatever made them keeps nothing of
    them); its last layer's output is left to what reads it (:func:`keep_output_copy`).
    ``data_input``: the first layer reads data that needs no gradient; ``autocast``: it runs
    under autocast (elements are of the compute precision); ``fp32_input``: its input is fp32
    there (data, an embedding), not a 16-bit product's output: a layer's state takes its input's
    dtype (``FP32_STATE_UNDER_AUTOCAST``); ``batch_first``: the input is batch-first, so each
    direction of an unfused first layer copies it time-major for its input projection (the
    copies are what it keeps: ``saved_tensors_hooks``, one per direction); ``input_alive``:
    elements per sample of the first layer's input that its maker holds until the forward pass
    ends (an embedding's output: the embedding keeps only the ids). Returns the width of the
    stack's output per step (``directions * hidden``)."""
    fp32_state = autocast and fp32_input and cell in FP32_STATE_UNDER_AUTOCAST
    scale = output_scale(cell, autocast, fp32_input)
    fused = cell == "lstm"
    if fused:  # oneDNN keeps one time-major copy of its input in its workspace; data in the batch
        t.keep(0 if data_input else steps * input_size)
    else:
        t.keep(steps * input_size * (directions if batch_first else 1))
    fan_in = input_size
    for layer in range(layers):
        # a later direction's backward runs beside the input gradient the earlier ones made
        # (summed into the layer's once all are done), but where each direction has its own
        # copy of the input, that of an earlier one was freed with its backward
        own_copies = layer == 0 and not fused and batch_first
        for direction in range(directions):
            earlier = 0 if (data_input and layer == 0) or own_copies else direction * steps * fan_in
            if fp32_state and layer > 0:  # autocast casts the previous layer's fp32 output to 16
                t.keep(steps * fan_in)  # bits for each direction's projection, which keeps the copy
            _layer(
                t,
                cell,
                steps,
                fan_in,
                hidden,
                data_input=data_input and layer == 0,
                alive=earlier,
                autocast=autocast,
                fp32_state=fp32_state,
            )
        output = steps * directions * hidden * scale
        if not fused:
            # its forward's moment, at the last direction's end: that direction's input projection
            # (every step's at once), each direction's stacked output beside their concatenation
            # when there are two, and the layer's output, which the next layer keeps as its input
            # (the last layer's is alive until the forward ends)
            stacked = output if directions > 1 else 0
            t.forward_transient(steps * GATES[cell] * hidden + stacked + output + input_alive)
            if layer < layers - 1:
                t.keep(output)
        fan_in = directions * hidden
    return fan_in


def keep_output_copy(t: Tally, steps: int, width: int, alive: int = 0) -> None:
    """A linear over every step of a recurrent stack's batch-first output, a time-major tensor
    seen transposed: it copies the output contiguous and keeps the copy, while the original is
    alive until the forward pass ends (with ``alive`` more elements per sample)."""
    t.keep(steps * width)
    t.forward_transient(steps * width + alive)


def _layer(
    t: Tally,
    cell: str,
    steps: int,
    fan_in: int,
    hidden: int,
    *,
    data_input: bool,
    alive: int = 0,
    autocast: bool = False,
    fp32_state: bool = False,
) -> None:
    """One direction of one layer: input and recurrent projections with their two biases, and
    the cell's saved state; ``alive``: elements of other gradients alive during its backward;
    ``autocast``: elements are 16-bit, an fp32 one counts as two; ``fp32_state``: its state is
    fp32 (``FP32_STATE_UNDER_AUTOCAST``)."""
    width = GATES[cell] * hidden
    t.add_params(width * (fan_in + hidden + 2))  # W_ih, W_hh, b_ih, b_hh
    t.matmul(steps, fan_in, width, grads=1 if data_input else 2)
    # step 0 multiplies the constant h_0 = 0: only its weight gradient is computed
    t.matmul(1, hidden, width, grads=1)
    t.matmul(1, hidden, width, grads=2, times=steps - 1)
    saved = int(steps * (SAVED_PER_STEP[cell] + (FP32_IN_16BIT - 1 if fp32_state else 0)) * hidden)
    # its backward runs when the layers after it have freed what they keep (and made their
    # gradients). An unfused layer's peak is its input projection's backward, after the steps':
    # every step's gate gradients stacked and its input's gradient, its own saved state freed
    # step by step (the profiler's allocations: a GRU's stack of 3 H per step beside an input
    # gradient of 656 features per step, and nothing of the state, on speech seed 14:
    # ``benchmarks/memory_allocator.py --timeline``)
    if cell == "lstm":  # oneDNN's fused LSTM: its workspace beside its input's and output's gradients
        # and its buffers as wide as a wider input (fp32 in every precision)
        t.keep(saved)
        wide = fused_lstm_wide_input(fan_in, hidden) * (FP32_IN_16BIT if autocast else 1)
        extra = int(FUSED_LSTM_BACKWARD - SAVED_PER_STEP[cell]) * hidden + int(wide)
        gradients = GRADIENT_BUFFERS * max(hidden, fan_in)
        if autocast and not data_input:  # the input's gradient in fp32 and its 16-bit copy
            gradients = hidden + FUSED_LSTM_INPUT_GRADIENT * fan_in
        t.transient(steps * (extra + gradients) + alive)
    else:  # placed before its keep: its state is freed by then
        t.transient(steps * (GATES[cell] * hidden + (0 if data_input else fan_in)) + alive)
        if cell in HEAP_RESIDENT:
            forward, backward = HEAP_RESIDENT[cell]
            t.heap_states(saved, saved // steps, forward=int(forward * saved), backward=int(backward * saved))
        else:
            t.keep(saved)
