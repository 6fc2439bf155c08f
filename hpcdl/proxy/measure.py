"""Measuring a profile: parameters, FLOPs, activation memory, kernel mix and step time of one
training step of a real model (or of an hpcdl workload, measured the same way)."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile
from torch.utils._python_dispatch import TorchDispatchMode

from hpcdl.device import synchronize
from hpcdl.errors import InputError
from hpcdl.measure import kernels
from hpcdl.measure.environment import environment
from hpcdl.proxy import structure
from hpcdl.proxy.document import Profile
from hpcdl.proxy.training import Batch, LossFn, Trainee, call, first_tensor, logits_of
from hpcdl.workloads.crosscheck import decomposed

WARMUP = 2
STEPS = 8
PROFILED_STEPS = 2
REFERENCE_SIDE = 512
REFERENCE_PRODUCTS = 8


def reference_work(device: torch.device) -> float:
    """Seconds of a fixed piece of work: ``REFERENCE_PRODUCTS`` fp32 products of two
    ``REFERENCE_SIDE``-square matrices and as many passes over a 16 MiB buffer.

    Timed after every step of a profile, it says how fast the machine ran at that moment: a
    step time divided by it (``step_time_spread.reference_s``) compares across moments of a
    shared machine, where raw step times drift by several times under other people's load."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(REFERENCE_SIDE, REFERENCE_SIDE, generator=gen, device=device)
    buf = torch.ones(1 << 22, device=device)  # not empty(): denormals in garbage would slow it
    synchronize(device)
    start = time.perf_counter()
    for _ in range(REFERENCE_PRODUCTS):
        torch.mm(a, a)
        buf.mul_(0.5)
    synchronize(device)
    return time.perf_counter() - start


def input_description(batch: Batch) -> tuple[str, tuple[int, ...], int]:
    """(kind, one sample's shape, batch size) of the batch's first tensor."""
    x = first_tensor(batch)
    if x is None or x.dim() < 2:
        got = None if x is None else tuple(x.shape)
        raise InputError("batch", got, "expected a tensor of shape (batch, ...) first in the batch")
    sample = tuple(int(d) for d in x.shape[1:])
    if not x.is_floating_point():
        if len(sample) != 1:
            raise InputError("batch", tuple(x.shape), "token ids must have shape (batch, tokens)")
        return "tokens", sample, int(x.shape[0])
    if len(sample) == 3:
        return "images", sample, int(x.shape[0])
    if len(sample) in (1, 2):
        return "features", sample, int(x.shape[0])
    raise InputError("batch", tuple(x.shape), "expected images (B, C, H, W) or features (B, F) / (B, T, F)")


class _Census(TorchDispatchMode):
    """The names (and GELU's approximation) of the operators one forward pass runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        kwargs = kwargs or {}
        if name == "gelu" and (kwargs.get("approximate") == "tanh" or "tanh" in args[1:]):
            name = "gelu_tanh"
        self.ops.add(name)
        return func(*args, **kwargs)


class _Attention(TorchFunctionMode):
    """Whether the model's ``scaled_dot_product_attention`` calls are causal, and their dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.causal: list[bool] = []
        self.dropout = 0.0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            self.causal.append(bool(kwargs.get("is_causal", False)) or structure.lower_triangular(mask))
            self.dropout = max(self.dropout, float(kwargs.get("dropout_p", 0.0) or 0.0))
        return func(*args, **kwargs)


def hints(model: nn.Module, ops: set[str], attention: _Attention) -> dict[str, Any]:
    """Features of the model that fix knobs of a fit: dropout, activation, the attention layers
    and their mask, the recurrent layers and their cell and size."""
    found: dict[str, Any] = {}
    dropout = max([m.p for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd)] or [0.0])
    dropout = max(dropout, attention.dropout)
    if dropout > 0:
        found["dropout"] = round(float(dropout), 4)
    # the tanh approximation written out shows as a tanh and a cube; the fused kernels by name
    for name, present in (
        ("gelu_tanh_composed", {"tanh", "pow"} <= ops),
        ("gelu_tanh", "gelu_tanh" in ops),
        ("gelu", "gelu" in ops),
        ("silu", "silu" in ops),
        ("relu", "relu" in ops),
    ):
        if present:
            found["activation"] = name
            break
    if attention.causal:
        found["causal"] = all(attention.causal)
        found["attention_layers"] = len(attention.causal)  # one attention call per layer
    rnns = [m for m in model.modules() if isinstance(m, nn.RNNBase)]
    if rnns:
        found["cell"] = {"LSTM": "lstm", "GRU": "gru"}.get(rnns[0].mode, "vanilla")
        found["recurrent_layers"] = sum(m.num_layers for m in rnns)
        found["hidden"] = rnns[0].hidden_size
        found["bidirectional"] = rnns[0].bidirectional
    return found


def flops(trainee: Trainee) -> tuple[int, int, dict[str, float]]:
    """(forward, forward + backward) FLOPs of the batch and the FLOP mix, counted with
    ``FlopCounterMode``; fused kernels it cannot see (oneDNN's RNN, the CPU attention kernel)
    are switched off while counting, as in ``hpcdl.workloads.crosscheck``, and its grouped
    convolutions' weight gradients are counted right."""
    with decomposed(), kernels.counter() as count:
        loss = trainee.loss()
        forward = count.get_total_flops()
        loss.backward()
        total = count.get_total_flops()
        mix = kernels.flop_shares(count.get_flop_counts(), trainee.model)
    trainee.optimizer.zero_grad()
    return forward, total, mix


def saved_bytes(trainee: Trainee) -> int:
    """Bytes of the tensors autograd keeps for backward in one forward pass of the batch
    (each storage once, parameters excluded), with the kernels training really uses."""
    params = {p.untyped_storage().data_ptr() for p in trainee.model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainee.loss()
    return sum(seen.values())


def time_mix(trainee: Trainee, steps: int = PROFILED_STEPS) -> dict[str, float]:
    """Share of ``steps`` training steps' time in each kernel class, from the PyTorch profiler."""
    activities = [ProfilerActivity.CPU]
    if trainee.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with kernels.quiet_profiler(), torch_profile(activities=activities) as prof:
        trainee.steps(steps)
    return kernels.time_shares(prof.events(), trainee.device)


@contextlib.contextmanager
def _observed() -> Iterator[tuple[_Census, _Attention]]:
    census, attention = _Census(), _Attention()
    with torch.no_grad(), attention, census:
        yield census, attention


def measure(
    trainee: Trainee,
    *,
    name: str = "model",
    source: dict[str, Any] | None = None,
    warmup: int = WARMUP,
    steps: int = STEPS,
    progress: Callable[[str], None] | None = None,
) -> Profile:
    """The profile of a trainee: every figure measured on its device, in its precision."""
    say = progress or (lambda _: None)
    if steps < 1 or warmup < 0:
        raise InputError("steps", steps, "expected at least 1 timed step (and warm-up >= 0)")
    kind, shape, batch = input_description(trainee.batch)
    say("forward pass (output, operators)")
    try:
        with _observed() as (census, attention), structure.recording() as layout:
            output = logits_of(call(trainee.model, trainee.batch))
    except (RuntimeError, TypeError, ValueError, IndexError, AttributeError) as e:
        # a batch that does not match the model, or a forward the hooks cannot follow
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise InputError(
            "model", name, f"its forward pass fails on the example batch ({type(e).__name__}: {first})"
        ) from None
    if output is None or output.dim() < 2:
        raise InputError(
            "model output", type(output).__name__, "expected logits of shape (batch, ..., classes)"
        )
    params = sum(p.numel() for p in trainee.model.parameters() if p.requires_grad)
    say("FLOPs (FlopCounterMode)")
    forward, total, flop_mix = flops(trainee)
    say("saved activations")
    act = saved_bytes(trainee)
    say(f"{warmup} warm-up and {steps} timed steps")
    trainee.steps(warmup)
    times, reference = [], []
    for _ in range(steps):
        times.append(trainee.step())
        reference.append(reference_work(trainee.device))
    say(f"kernel mix ({PROFILED_STEPS} profiled steps)")
    mix = time_mix(trainee)
    p10, p90 = np.percentile(times, [10, 90])
    figures: dict[str, float] = {
        "params": params,
        "forward_flops_per_sample": forward // batch,
        "train_flops_per_sample": total // batch,
        "activation_bytes_per_sample": act // batch,
        "arithmetic_intensity": total / (4 * params + act),
        "step_time_s": statistics.median(times),
    }
    return Profile(
        name=name,
        input_kind=kind,
        input_shape=shape,
        batch_size=batch,
        output_shape=tuple(int(d) for d in output.shape[1:]),
        figures=figures,
        precision=trainee.precision.name,
        time_mix=mix,
        flop_mix=flop_mix,
        hints=hints(trainee.model, census.ops, attention),
        structure=layout,
        source=source or {},
        environment=environment(trainee.device),
        step_time_spread={
            "p10": float(p10),
            "p90": float(p90),
            "n": len(times),
            "reference_s": statistics.median(reference),
        },
    )


def profile(
    model: nn.Module,
    example_inputs: Batch,
    loss_fn: LossFn | None = None,
    *,
    precision: str = "fp32",
    device: torch.device | str = "cpu",
    name: str = "model",
    steps: int = STEPS,
) -> Profile:
    """Profile a real model: parameters, forward and training FLOPs per sample, activation
    memory, arithmetic intensity, kernel mix and step time of training it on ``example_inputs``
    (a tensor, a tuple of positional arguments or a dict of keyword arguments; the batch size
    is the first tensor's first dimension) with AdamW, in ``precision`` on ``device``.

    ``loss_fn(output)`` defaults to the output's ``.loss`` if the model computes one, else
    cross-entropy of its logits against fixed random labels (hpcdl's own loss). The model is
    trained in place: pass a copy if its weights matter."""
    if not isinstance(model, nn.Module):
        raise InputError("model", type(model).__name__, "expected a torch.nn.Module")
    trainee = Trainee(model, example_inputs, loss_fn, precision=precision, device=device)
    return measure(trainee, name=name, steps=steps)
