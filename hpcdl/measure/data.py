"""Synthetic data on the device: random tensors, or inputs labelled by a fixed teacher network.

Both are created once, before timing, and cycled during the timed loop, so the loop copies
nothing from the host. Learnable data makes the loss fall: labels are the argmax of a teacher
network of the same architecture with other weights, so the task is realisable.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from hpcdl.workloads.spec import Spec

TEACHER_SEED_OFFSET = 1_000_003  # teacher weights differ from the student's, whatever the seed


def data_generator(spec: Spec, device: torch.device, stream: int = 0) -> torch.Generator:
    """The generator of one data stream (e.g. one rank's shard): a function of seed and stream."""
    return torch.Generator(device=device).manual_seed((spec.seed * 7919 + stream + 1) % 2**63)


def random_targets(spec: Spec, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    shape = (n, *spec.target_shape())
    return torch.randint(0, spec.num_classes, shape, generator=generator, device=device)


@torch.no_grad()
def teacher_targets(spec: Spec, inputs: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """Labels of ``inputs`` from the teacher: argmax of its logits (eval mode, fp32)."""
    teacher = spec.replace(seed=(spec.seed + TEACHER_SEED_OFFSET) % 2**63).build()
    teacher = teacher.to(inputs.device).eval()
    parts = [teacher(inputs[i : i + chunk]).argmax(dim=-1) for i in range(0, len(inputs), chunk)]
    return torch.cat(parts)


def make_batch(
    spec: Spec,
    batch_size: int | None = None,
    device: torch.device | str = "cpu",
    *,
    learnable: bool = False,
    stream: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One (inputs, targets) batch for ``spec``; deterministic in (seed, stream)."""
    device = torch.device(device)
    n = batch_size or spec.batch_size
    gen = data_generator(spec, device, stream)
    inputs = spec.sample_inputs(n, gen, device)
    targets = teacher_targets(spec, inputs) if learnable else random_targets(spec, n, gen, device)
    return inputs, targets


class DevicePool:
    """A fixed pool of batches resident on the device, handed out in turn."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches
        self._it = self._cycle()

    def _cycle(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield from self.batches

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        return next(self._it)


def device_pool(
    spec: Spec, device: torch.device, batches: int, *, learnable: bool, stream: int = 0
) -> DevicePool:
    """``batches`` batches of ``spec.batch_size`` made on the device in one go."""
    x, y = make_batch(spec, spec.batch_size * batches, device, learnable=learnable, stream=stream)
    return DevicePool(list(zip(x.split(spec.batch_size), y.split(spec.batch_size), strict=True)))
