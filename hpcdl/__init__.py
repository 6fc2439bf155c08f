"""hpcdl: generated deep-learning workloads that score HPC systems.

The Python API::

    import hpcdl
    spec = hpcdl.spec_from_dict({"family": "attention", "layers": 4, "width": 256})
    model = hpcdl.build_model(spec)            # torch.nn.Module, weights from spec.seed
    work = hpcdl.count(spec)                   # params, forward/training FLOPs per sample
    x, y = hpcdl.make_batch(spec, 8, "cpu")    # synthetic inputs and labels
    result = hpcdl.run(spec, hpcdl.RunConfig(duration_s=5))   # measured, record written
    resnet = hpcdl.preset("resnet50", batch_size=32)          # a preset, knobs overridden
    suite = hpcdl.suite("M").specs(precision="bf16")          # a size class's workloads
    drawn = hpcdl.sample_spec("cnn", seed=3)                  # an architecture from a seed
    prof = hpcdl.profile(my_model, example_batch)   # what a real model's training step costs
    proxy = hpcdl.fit(prof)                         # the hpcdl workload that costs the same

Each name is imported when it is first used (PEP 562): ``import hpcdl`` itself imports no
torch, so that the ``hpcdl`` command (``hpcdl.cli``), which imports this package first, answers
``--help`` at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hpcdl.errors import HpcdlError, InputError, SpecError

if TYPE_CHECKING:  # what mypy and readers see; at run time __getattr__ imports each on first use
    from torch import nn

    from hpcdl.harness.runner import RunResult, run
    from hpcdl.measure.config import RunConfig
    from hpcdl.measure.data import make_batch
    from hpcdl.proxy import fit, profile
    from hpcdl.workloads.counting import Count
    from hpcdl.workloads.families.attention import AttentionSpec
    from hpcdl.workloads.families.cnn import CNNSpec
    from hpcdl.workloads.families.mlp import MLPSpec
    from hpcdl.workloads.families.rnn import RNNSpec
    from hpcdl.workloads.families.speech import SpeechSpec
    from hpcdl.workloads.recipes import preset, suite
    from hpcdl.workloads.registry import FAMILIES, spec_from_args, spec_from_dict
    from hpcdl.workloads.sampling import sample_spec
    from hpcdl.workloads.spec import Spec

_LAZY = {
    # name: the module that defines it
    "RunResult": "hpcdl.harness.runner",
    "run": "hpcdl.harness.runner",
    "RunConfig": "hpcdl.measure.config",
    "make_batch": "hpcdl.measure.data",
    "fit": "hpcdl.proxy",
    "profile": "hpcdl.proxy",
    "Count": "hpcdl.workloads.counting",
    "AttentionSpec": "hpcdl.workloads.families.attention",
    "CNNSpec": "hpcdl.workloads.families.cnn",
    "MLPSpec": "hpcdl.workloads.families.mlp",
    "RNNSpec": "hpcdl.workloads.families.rnn",
    "SpeechSpec": "hpcdl.workloads.families.speech",
    "preset": "hpcdl.workloads.recipes",
    "suite": "hpcdl.workloads.recipes",
    "FAMILIES": "hpcdl.workloads.registry",
    "spec_from_args": "hpcdl.workloads.registry",
    "spec_from_dict": "hpcdl.workloads.registry",
    "sample_spec": "hpcdl.workloads.sampling",
    "Spec": "hpcdl.workloads.spec",
}


def __getattr__(name: str) -> Any:
    """``hpcdl.NAME`` of the API: its module is imported on first use, then the name is kept here."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hpcdl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def build_model(spec: Spec) -> nn.Module:
    """The network of ``spec`` on the CPU in fp32, with weights drawn from ``spec.seed``."""
    return spec.build()


def count(spec: Spec) -> Count:
    """Parameters, forward and training FLOPs, and activation estimate of one sample of ``spec``."""
    return spec.count()


__all__ = [
    "FAMILIES",
    "AttentionSpec",
    "CNNSpec",
    "Count",
    "HpcdlError",
    "InputError",
    "MLPSpec",
    "RNNSpec",
    "RunConfig",
    "RunResult",
    "SpecError",
    "SpeechSpec",
    "Spec",
    "build_model",
    "count",
    "fit",
    "make_batch",
    "preset",
    "profile",
    "run",
    "sample_spec",
    "spec_from_args",
    "spec_from_dict",
    "suite",
]
