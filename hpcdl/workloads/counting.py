"""Analytic work counts: the one place where FLOPs of a matrix product are defined.

Convention (see docs/metrics.md): one multiply-accumulate is 2 FLOPs; only matrix products and
convolutions are counted (element-wise work -- activations, norms, softmax, optimizer -- is
not), which is also what ``torch.utils.flop_counter.FlopCounterMode`` counts. The backward
pass of a product ``Y = X @ W`` costs one product of the same size for each operand whose
gradient autograd computes: the weight's always, the input's unless the input is data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpcdl.workloads.precision import precision


@dataclass(frozen=True)
class Moment:
    """What is alive at one moment of a training step where its memory may peak. While a layer's
    backward runs (backward runs from the last layer to the first): per sample, the activations
    the layers before it keep (and its own, where its backward still holds them: ``transient``)
    and the gradients and buffers of its backward; in parameters, the gradients of the layers
    from it on (after it, for an element-wise layer) and autocast's 16-bit copies of the weights
    up to it (saved for their backward). While a layer's forward runs: what the layers up to it
    keep, its own temporaries, the copies made so far and no gradient (the previous step's are
    freed)."""

    kept: int
    workspace: int
    grads: int
    copies: int
    heap: int = 0
    """heap pages per-step layers have left resident by this moment beside what is live, where
    glibc's heap holds their rows (``Count.heap_row``; ``Tally.heap_states``)"""
    masks: int = 0
    """of ``kept``, the elements that are dropout masks as a CPU keeps them (``Tally.dropout``)"""
    mask_bytes: int = 0
    """the bytes the same masks take where CUDA keeps them, as booleans"""


@dataclass(frozen=True)
class Count:
    """Work of one sample of a workload (per training step, per sample)."""

    params: int
    """trainable parameters (shared weights counted once)"""
    forward_flops: int
    """FLOPs of the forward pass"""
    backward_flops: int
    """FLOPs of the backward pass (input and weight gradients, layer by layer)"""
    activation_elements: int
    """elements of the activations kept for the backward pass (an estimate)"""
    largest_param: int = 0
    """elements of the largest parameter tensor (a step's per-tensor optimizer temporaries)"""
    workspace_elements: int = 0
    """the most elements per sample a backward moment holds beyond ``activation_elements``
    (gradients and the backend's buffers, oneDNN's fused LSTM's; forward moments left out):
    ``activation + workspace`` is the backward's peak per sample without the loss's copies"""
    moments: tuple[Moment, ...] = ()
    """moments of the step where the memory may peak, the first as backward begins (the loss's
    copies of the logits alive); empty: one moment with everything (``metrics.memory_parts``)"""
    heap_row: int = 0
    """elements per sample of one step's state of the layers whose backward leaves heap pages
    resident (``Moment.heap``): where a batch of them is below glibc's mmap threshold, its heap
    holds them"""
    conv_shapes: int = 0
    """distinct convolutions (channels, kernel, groups, input and output maps): on a CPU oneDNN
    builds and keeps primitives for each (``metrics.CPU_CONV_PRIMITIVE_BYTES``)"""

    @property
    def train_flops(self) -> int:
        """forward + backward FLOPs of one sample: the work one training sample costs."""
        return self.forward_flops + self.backward_flops

    def activation_bytes(self, precision_name: str) -> int:
        """Estimated activation memory of one sample at the given precision."""
        return self.activation_elements * precision(precision_name).bytes

    def workspace_bytes(self, precision_name: str) -> int:
        """Estimated workspace of one sample at the given precision (``workspace_elements``)."""
        return self.workspace_elements * precision(precision_name).bytes


class Tally:
    """Accumulates parameters, FLOPs and saved activations layer by layer."""

    def __init__(self) -> None:
        self.params = 0
        self.forward = 0
        self.backward = 0
        self.activations = 0
        self.largest_param = 0
        self.last_linear = 0  # the latest linear's output: the logits if nothing follows it
        self.last_input = 0  # the head's input gradient, the first made as backward begins
        # each layer's backward (and each forward that needs temporaries) as (kept, workspace,
        # parameters before the layer or None in forward, parameters up to it, the layers that
        # leave heap resident so far with what their forward left, and the dropout masks kept so
        # far as elements and as CUDA's bytes): Moment's
        self.points: list[tuple[int, int, int | None, int, tuple[int, int], tuple[int, int]]] = []
        self.linear_point = 0  # the latest linear's: the head's, if nothing follows it
        self.layer_start = 0  # parameters before the latest layer that has some
        self.head_params = 0  # the latest layer's parameters: the head's, once the network ends
        self.heaps: list[int] = []  # each layer's heap left resident by its backward (heap_states)
        self.heap_forward = 0  # what the forward of such layers has left resident so far
        self.heap_row = 0
        self.convs: set[tuple[object, ...]] = set()  # each distinct convolution's shape
        self.masks = 0  # of ``activations``, dropout masks (elements, as a CPU keeps them)
        self.mask_bytes = 0  # the same masks' bytes as CUDA keeps them

    def matmul(self, m: int, k: int, n: int, *, grads: int = 2, times: int = 1) -> None:
        """A product of an (m x k) and a (k x n) matrix, ``times`` times.

        ``grads`` is how many of the two operands get a gradient in the backward pass:
        2 for a layer inside the network (weight and input), 1 for a layer fed with data
        (weight only), 2 for a product of two activations (attention scores).
        """
        flops = 2 * m * k * n * times
        self.forward += flops
        self.backward += grads * flops

    def linear(
        self, tokens: int, fan_in: int, fan_out: int, *, bias: bool = True, data_input: bool = False
    ) -> None:
        """An ``nn.Linear`` applied to ``tokens`` rows; its input and output are kept for backward."""
        self._layer(fan_in * fan_out + (fan_out if bias else 0))
        self.matmul(tokens, fan_in, fan_out, grads=1 if data_input else 2)
        self.largest_param = max(self.largest_param, fan_in * fan_out)
        inputs = 0 if data_input else tokens * fan_in  # the data takes no gradient
        # its backward holds its output's gradient and makes its input's (and its weight's)
        self.linear_point = len(self.points)
        self._backward_point(inputs + tokens * fan_out, self.layer_start)
        self.activations += tokens * fan_out
        self.last_linear = tokens * fan_out
        self.last_input = inputs

    def conv2d(
        self,
        out_hw: tuple[int, int],
        c_in: int,
        c_out: int,
        kernel: tuple[int, int],
        *,
        groups: int = 1,
        bias: bool = False,
        data_input: bool = False,
        in_hw: tuple[int, int] | None = None,
        keep_output: bool = True,
        alive: int = 0,
    ) -> None:
        """An ``nn.Conv2d``: each output element is a dot product over (c_in/groups) x kh x kw.

        The conv keeps its input, which whatever made it counts; ``keep_output``: a norm after it
        keeps its output (a ReLU or a sum right after it keeps nothing of it: the ReLU saves its
        own result). ``in_hw``: the input's map (default ``out_hw``: stride 1); ``alive``:
        elements of other gradients alive during its backward (a residual's other branch's).
        """
        kh, kw = kernel
        self.convs.add((c_in, c_out, kernel, groups, tuple(in_hw or out_hw), tuple(out_hw)))
        self._layer(c_out * (c_in // groups) * kh * kw + (c_out if bias else 0))
        out_elems = out_hw[0] * out_hw[1]
        self.matmul(out_elems, (c_in // groups) * kh * kw, c_out, grads=1 if data_input else 2)
        self.largest_param = max(self.largest_param, c_out * (c_in // groups) * kh * kw)
        in_elems, out = c_in * math.prod(in_hw or out_hw), out_elems * c_out
        # oneDNN's convolution backward (measured with the profiler's memory timeline, CPU):
        # beside the output's gradient it allocates the input's and, for the weight gradient,
        # reorders a copy of the input and of the output's gradient, while the layers before it
        # still keep theirs and those after it have freed theirs. A strided dense conv's second
        # copy is the input's size, not the output's (8 -> 12 channels at stride 2: 3.0 inputs
        # beside its output's gradient, not 2.4; ``benchmarks/memory_allocator.py --timeline``);
        # its map shrinking stands for the stride (an unpadded conv's shrinks by a few rows)
        strided = groups == 1 and tuple(in_hw or out_hw) != tuple(out_hw)
        copies = in_elems + (max(in_elems, out) if strided else out)
        self.transient(out + in_elems + copies + alive)
        if keep_output:
            self.activations += out
        self.last_linear = 0

    def transient(self, elements: int) -> None:
        """``elements`` alive only while the latest layer's backward runs, beside what is kept so
        far (the layers after it have run their backward and freed theirs; placed before the
        layer's ``keep``, its own saved tensors are left out: freed before that moment)."""
        self._point(elements, self.layer_start)

    def _backward_point(self, gradients: int, before: int) -> None:
        """The backward of a layer about to be counted: the gradients of its output and input
        (``gradients`` elements) beside what the layers before it keep (those after it have run
        their backward and freed what they saved; what it saved itself is left out, as the next
        layer's input is freed by then); ``before``: parameters whose gradient does not exist
        yet."""
        self._point(gradients, before)

    def forward_transient(self, elements: int) -> None:
        """``elements`` alive only while the latest layer's forward runs, beside what the layers up
        to it keep (no gradient exists yet)."""
        self._point(elements, None)

    def _point(self, elements: int, before: int | None) -> None:
        """A moment at the latest layer: what is kept so far beside ``elements``; ``before``:
        parameters whose gradient does not exist yet (None: in forward, no gradient at all)."""
        heaps, masks = (len(self.heaps), self.heap_forward), (self.masks, self.mask_bytes)
        self.points.append((self.activations, elements, before, self.params, heaps, masks))

    def _layer(self, params: int) -> None:
        """A layer with ``params`` parameters starts (in forward order)."""
        self.layer_start = self.params
        self.params += params
        self.head_params = params

    def add_params(self, n: int) -> None:
        """Parameters that cost no counted FLOPs (embeddings, norm scales and shifts, biases)."""
        self._layer(n)
        self.largest_param = max(self.largest_param, n)

    def tied_head(self, params: int, inputs: int) -> None:
        """The head is a product with ``params`` parameters counted earlier (a token table) over
        ``inputs`` elements: its gradients (its weight's, its input's) are the first to exist in
        backward; its output, the logits, is kept by no layer (the loss's copies count it)."""
        self.head_params = params
        self.last_input = inputs
        self.last_linear = 0

    def heap_states(self, elements: int, row: int, *, forward: int, backward: int) -> None:
        """Per-step states kept for backward (``elements`` per sample in all, ``row`` per step)
        of a layer that leaves heap pages resident until the step ends where glibc's heap holds
        such rows (``Moment.heap``): ``forward`` elements its forward leaves beside its states
        (every later moment counts them), ``backward`` its backward leaves (its backward's moment
        and those of the layers before it count the most any such layer left: an earlier layer's
        backward reuses those pages)."""
        self.keep(elements)
        self.heap_forward += forward
        self.heaps.append(backward)
        self.heap_row = max(self.heap_row, row)

    def keep(self, elements: int, *, gradients: int = 0) -> None:
        """Activations kept for backward by element-wise layers (norms, activations, dropout) or
        a layer's saved state. ``gradients``: the elements of its output's and input's gradients
        its backward holds (an element-wise layer's: twice its output), placed as its moment (the
        gradients of its own parameters, a norm's scale and shift, left out); half of them are its
        input's, the head's input gradient if the network ends here."""
        if gradients:
            self._backward_point(gradients, self.params)
            self.last_input = gradients // 2
        self.activations += elements
        self.last_linear = 0

    def dropout(self, elements: int, width: int = 1) -> None:
        """A dropout's mask over ``elements`` elements, kept for its backward. On a CPU torch's
        dropout multiplies by a scaled copy of its noise, which autograd keeps: one element of the
        dropped tensor per element, ``width`` elements of the count each (``FP32_IN_16BIT`` for an
        fp32 tensor under autocast); CUDA's ``native_dropout`` keeps a boolean, one byte each
        (``MASK_BYTES_CUDA``; ``saved_tensors_hooks``, torch 2.13: ``MulBackward0``'s fp32 or
        bf16 operand on a CPU, ``NativeDropoutBackward0``'s bool mask). Counted in the CPU's
        elements, with the bytes CUDA's would take beside them (``Moment.mask_bytes``)."""
        self.activations += elements * width
        self.masks += elements * width
        self.mask_bytes += elements * MASK_BYTES_CUDA
        self.last_linear = 0

    def result(self) -> Count:
        # the logits (the last linear's output, nothing after it) are kept by no layer: the
        # loss's log-softmax keeps its own output, counted with the loss's copies
        kept = self.activations - self.last_linear
        # while a layer's backward runs, the gradients of its output and of its input are alive
        # beside what the layers before it keep; the layers after it have freed theirs. Each
        # layer's backward is a moment of its own (``_backward_point``, ``transient``). As
        # backward begins everything is kept, the head's gradients exist (its weight's and its
        # input's) and every weight's copy; the loss's copies hold the logits' gradient
        # (metrics.LOSS_COPIES): a linear head's own moment is this one (``Spec._moment_bytes``
        # splits it: the loss's backward, then the head's)
        points = [p for i, p in enumerate(self.points) if not (self.last_linear and i == self.linear_point)]
        first = Moment(
            kept,
            self.last_input,
            self.head_params,
            self.params,
            heap=self.heap_forward,
            masks=self.masks,
            mask_bytes=self.mask_bytes,
        )
        # a backward moment comes with and after the backward of the layers from it on: the heap
        # they left is resident; in forward it is yet to be made
        placed = [
            Moment(k, w, 0, upto, heap=made, masks=m, mask_bytes=mb)
            if before is None
            else Moment(
                k,
                w,
                self.params - before,
                upto,
                heap=self.heap_forward + max(self.heaps[n:], default=0),
                masks=m,
                mask_bytes=mb,
            )
            for k, w, before, upto, (n, made), (m, mb) in points
        ]
        backward = [k + w - kept for k, w, before, *_ in points if before is not None]
        return Count(
            self.params,
            self.forward,
            self.backward,
            kept,
            self.largest_param,
            max([self.last_input, *backward]),
            moments=(first, *placed),
            heap_row=self.heap_row,
            conv_shapes=len(self.convs),
        )


MASK_BYTES_CUDA = 1
"""bytes per element of the mask CUDA's dropout (``native_dropout``) keeps for backward: a boolean"""
GRADIENT_BUFFERS = 2
"""activation gradients alive at once in backward: a layer's output gradient and its input's"""


def conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length of a convolution or pooling window along one dimension."""
    return (size + 2 * padding - kernel) // stride + 1
