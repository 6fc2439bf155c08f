"""One training step of any model: a real one (a module, an example batch, a loss) or an hpcdl
spec, run the same way so that their figures and times compare.

The step is hpcdl's: forward in the precision's autocast, the loss in fp32, backward, AdamW
(the optimizer of ``hpcdl run``), gradients set to None; the device is synchronised at its end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hpcdl.device import synchronize
from hpcdl.errors import InputError
from hpcdl.measure.data import make_batch
from hpcdl.workloads.precision import PRECISIONS, needs_loss_scaling
from hpcdl.workloads.precision import precision as precision_of
from hpcdl.workloads.spec import Spec

Batch = torch.Tensor | Sequence[Any] | Mapping[str, Any]
"""an example batch: one tensor, positional arguments, or keyword arguments of the model"""
LossFn = Callable[[Any], torch.Tensor]
"""the model's output -> a scalar loss"""
LR = 1e-3
"""AdamW's learning rate: ``hpcdl run``'s default (it does not change a step's cost)"""


def call(model: nn.Module, batch: Batch) -> Any:
    """The model applied to a batch given as a tensor, a sequence or a mapping."""
    if isinstance(batch, torch.Tensor):
        return model(batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    return model(*batch)


def first_tensor(batch: Batch) -> torch.Tensor | None:
    """The batch's first tensor (its size along dimension 0 is the batch size)."""
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


def to_device(batch: Batch, device: torch.device) -> Batch:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in batch]


def logits_of(output: Any) -> torch.Tensor | None:
    """The logits in a model's output: the tensor itself, ``.logits``, or the first element."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, Sequence) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


@dataclass
class CrossEntropy:
    """The default loss, hpcdl's own: the output's ``.loss`` when the model computed one (labels
    in the batch), else cross-entropy of the logits against fixed random labels, one per logit
    row, so that a real model and its proxy pay for the same loss."""

    seed: int = 0
    _targets: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)

    def __call__(self, output: Any) -> torch.Tensor:
        loss = getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor):
            return loss
        logits = logits_of(output)
        if logits is None:
            raise TypeError("the model's output has no logits tensor; pass loss_fn")
        rows = logits.reshape(-1, logits.shape[-1])
        key = tuple(rows.shape)
        if key not in self._targets:  # made once, on the first (warm-up) step
            gen = torch.Generator().manual_seed(self.seed)
            self._targets[key] = torch.randint(rows.shape[1], (rows.shape[0],), generator=gen).to(rows.device)
        return F.cross_entropy(rows.float(), self._targets[key])


class Trainee:
    """A model, its batch, loss and optimizer on one device, ready to take timed steps."""

    def __init__(
        self,
        model: nn.Module,
        batch: Batch,
        loss_fn: LossFn | None = None,
        *,
        precision: str = "fp32",
        device: torch.device | str = "cpu",
    ) -> None:
        if precision not in PRECISIONS:
            raise InputError("precision", precision, "allowed: " + ", ".join(PRECISIONS))
        self.device = torch.device(device)
        self.model = model.to(self.device).train()
        self.batch = to_device(batch, self.device)
        self.loss_fn: LossFn = loss_fn or CrossEntropy()
        self.precision = precision_of(precision)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=needs_loss_scaling(self.precision, self.device, self.model)
        )

    def loss(self) -> torch.Tensor:
        """Forward pass and loss (in the precision's autocast; the loss itself in fp32)."""
        autocast = self.precision.autocast
        with torch.autocast(self.device.type, dtype=self.precision.dtype, enabled=autocast):
            output = call(self.model, self.batch)
        return self.loss_fn(output).float()

    def step(self) -> float:
        """One training step; its wall time in seconds, the device synchronised at both ends."""
        synchronize(self.device)
        start = time.perf_counter()
        self.scaler.scale(self.loss()).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        synchronize(self.device)
        return time.perf_counter() - start

    def steps(self, n: int) -> list[float]:
        return [self.step() for _ in range(n)]


def spec_trainee(spec: Spec, device: torch.device | str = "cpu") -> Trainee:
    """An hpcdl workload as a trainee: its network, one random batch and its labels, hpcdl's loss."""
    inputs, targets = make_batch(spec, spec.batch_size, "cpu")
    dev = torch.device(device)
    targets = targets.to(dev)

    def loss(output: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), targets.reshape(-1))

    return Trainee(spec.build(), inputs, loss, precision=spec.precision, device=dev)
