"""Cross-checks of the analytic counts against what PyTorch itself counts and keeps."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from hpcdl.workloads.spec import Spec


@contextlib.contextmanager
def decomposed() -> Iterator[None]:
    """Run RNNs and attention through their decomposed (counted, inspectable) kernels."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # oneDNN's TF32 notice when its flags are set
        with torch.backends.mkldnn.flags(enabled=False), sdpa_kernel(SDPBackend.MATH):
            yield


def counted_flops(spec: Spec, batch: int = 2) -> tuple[int, int]:
    """(forward, forward + backward) FLOPs per sample as ``FlopCounterMode`` counts them on
    the built model, in fp32 on the CPU.

    Fused kernels that the counter cannot see are switched off while counting: oneDNN's LSTM
    (counted as 0 otherwise) and the fused CPU attention kernel (also 0); the math path they
    fall back to runs the same products.
    """
    model = spec.build().train()
    inputs = spec.sample_inputs(batch, torch.Generator().manual_seed(spec.seed), torch.device("cpu"))
    with decomposed(), FlopCounterMode(display=False) as counter:
        out = model(inputs)
        forward = counter.get_total_flops()
        out.float().sum().backward()
        total = counter.get_total_flops()
    return forward // batch, total // batch


def saved_activation_elements(spec: Spec, batch: int = 2) -> int:
    """Elements per sample of the tensors autograd saves for backward (parameters excluded, and
    the batch itself, which is the run's inputs, ``Spec.input_bytes``; each storage counted
    once), measured with ``saved_tensors_hooks`` on a forward pass."""
    model = spec.build().train()
    inputs = spec.sample_inputs(batch, torch.Generator().manual_seed(spec.seed), torch.device("cpu"))
    excluded = {p.untyped_storage().data_ptr() for p in [*model.parameters(), inputs]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in excluded:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes() // max(t.element_size(), 1))
        return t

    # oneDNN's fused RNN saves one opaque byte workspace; the decomposed path saves real tensors
    with decomposed(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(inputs)
    return sum(seen.values()) // batch
