"""How a training step executes: eager PyTorch or ``torch.compile`` (and, on CUDA, its steps
captured as CUDA graphs), the fused optimizer, the convolutions' memory format and cuDNN's
autotuner. What the fastest honest implementations of a model run (torchtitan, NVIDIA's MLPerf
code, nanoGPT), chosen per run and named in its record (``settings.execution``).

The choices a device makes by itself (``auto``) come from measurements: docs/validation/
2026-12-02-fast-path.md (``benchmarks/bench_fastpath.py``)."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from hpcdl.errors import SpecError
from hpcdl.workloads.spec import Spec

MODES = ("eager", "compile")
CPU_CHANNELS_LAST = False
"""channels-last convolutions on CPUs: 0.87x (cnn) and 0.95x (speech) the step time of class S on
the CPU measured, but oneDNN in torch 2.13 crashed (SIGSEGV) training a small CNN at batch 261
(docs/validation/2026-12-02-fast-path.md): offered by --memory-format, never chosen by auto"""
CPU_FUSED_OPTIMIZER = True
"""fused AdamW on CPUs: faster than the per-parameter loop for every class S workload on the CPU
measured (the same entry: 0.68-0.98x the step time); not where parameters are DTensors (FSDP,
tensor parallelism), which torch's CPU kernel refuses"""


@dataclass(frozen=True)
class Execution:
    """What a run's steps execute with (the record's ``settings.execution``)."""

    mode: str
    """eager, or compile (``torch.compile``, inductor)"""
    graphs: bool
    """the compiled steps captured as CUDA graphs (``mode="reduce-overhead"``)"""
    fused_optimizer: bool
    """the optimizer's fused implementation (one kernel for every parameter's update)"""
    memory_format: str
    """contiguous, or channels_last for the convolutions' weights and inputs"""
    cudnn_benchmark: bool
    """cuDNN's autotuner chose each convolution's algorithm (CUDA)"""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve(
    mode: str,
    graphs: bool,
    fused: str,
    memory_format: str,
    spec: Spec,
    device: torch.device,
    pipeline: bool = False,
    dtensors: bool = False,
) -> Execution:
    """The execution of a run of ``spec`` from its settings (``auto`` decided for ``device``);
    a setting the device, the layout or the host cannot run is a one-line error naming it.
    Channels-last is for families whose convolutions can run it (``Spec.channels_last``);
    ``dtensors``: the backend or layout shards parameters as DTensors (FSDP, tp > 1)."""
    if mode not in MODES:
        raise SpecError("run.mode", mode, "allowed: " + ", ".join(MODES))
    cuda = device.type == "cuda"
    if graphs and not cuda:
        raise SpecError("run.graphs", graphs, "CUDA graphs need a CUDA device; this run is on " + device.type)
    if graphs and mode != "compile":
        raise SpecError("run.graphs", graphs, "graphs capture compiled steps: give --compile too")
    if mode == "compile" and pipeline:
        raise SpecError("run.mode", mode, "not with pipeline parallelism yet (pp > 1): run it eager")
    if mode == "compile" and not cuda and shutil.which("g++") is None and shutil.which("c++") is None:
        raise SpecError("run.mode", mode, "inductor compiles C++ for a CPU: no C++ compiler (g++) on PATH")
    if memory_format == "channels_last" and not spec.channels_last:
        allowed = f"channels_last is for families with convolutions, not {spec.family}"
        raise SpecError("run.memory_format", memory_format, allowed)
    if fused == "on" and dtensors and not cuda:
        allowed = "off or auto on a CPU with sharded parameters (FSDP, tp > 1): its kernel refuses DTensors"
        raise SpecError("run.fused_optimizer", fused, allowed)
    if fused == "auto":
        use_fused = cuda or (CPU_FUSED_OPTIMIZER and not dtensors)
    else:
        use_fused = fused == "on"
    if memory_format == "auto":
        last = spec.channels_last and (cuda or CPU_CHANNELS_LAST)
        memory_format = "channels_last" if last else "contiguous"
    return Execution(mode, graphs, use_fused, memory_format, cudnn_benchmark=cuda)


def prepare(model: nn.Module, execution: Execution) -> nn.Module:
    """``model`` in the execution's memory format (in place), with cuDNN's autotuner set."""
    if execution.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    if execution.memory_format == "channels_last":
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model


def inputs(x: torch.Tensor, execution: Execution) -> torch.Tensor:
    """A batch of inputs in the execution's memory format (images: N, C, H, W)."""
    if execution.memory_format == "channels_last" and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def compiled(model: nn.Module, execution: Execution, blocks: list[nn.Module] | None = None) -> nn.Module:
    """``model`` compiled (``torch.compile``, inductor): whole, or, with ``blocks`` (the units
    FSDP shards), each block replaced in its container by its compiled self, as torchtitan does
    (FSDP's hooks then stay outside the compiled code). The parameters are the same tensors.
    Eager: ``model`` itself."""
    if execution.mode != "compile":
        return model
    from torch._dynamo.utils import counters

    torch.compiler.reset()  # a run compiles its own model: no cache of another's graphs to outgrow
    counters.clear()  # what ``compiled_graphs`` reports is this model's
    options: dict[str, Any] = {"mode": "reduce-overhead"} if execution.graphs else {}
    if blocks is None:
        return torch.compile(model, **options)  # type: ignore[return-value]
    wanted = {id(b) for b in blocks}
    for parent in list(model.modules()):  # a snapshot: a compiled block holds the block again
        for name, child in list(parent.named_children()):
            if id(child) in wanted:
                setattr(parent, name, torch.compile(child, **options))
    return model


def compiled_graphs() -> dict[str, int]:
    """What dynamo compiled since ``compiled`` last compiled: graphs, and the breaks between them
    (code that ran eagerly between compiled graphs)."""
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }
