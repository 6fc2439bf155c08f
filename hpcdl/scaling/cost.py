"""Time and energy to train a data set (``hpcdl predict --samples N --epochs E``, or ``--tokens``
for a model of sequences): at each node count, the hours from the predicted samples/s, and the
energy from a record's measured joules per sample where it was measured on the system's device,
else from the system file's node power, which is an estimate and said to be one
(docs/metrics.md, "Prediction")."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from hpcdl import metrics
from hpcdl.errors import InputError
from hpcdl.records.views import PredictionPoint, Result
from hpcdl.scaling.system import System

JOULES_PER_KWH = 3.6e6
MAX_SAMPLES = 1e18
"""beyond any data set: a typo, not a question"""


@dataclass(frozen=True)
class Work:
    """What a training goes through: ``samples`` per epoch, ``epochs`` times."""

    samples: float
    epochs: float
    how: str
    """in words: ``100,000,000 samples x 10 epochs``"""

    @property
    def total(self) -> float:
        return self.samples * self.epochs


@dataclass(frozen=True)
class EnergySource:
    """Where a system's energy comes from: measured joules per sample, a node's power, or none."""

    joules_per_sample: float | None
    node_power_w: float | None
    rule: str


def number(field: str, text: str | None, low: float, what: str) -> float | None:
    """``text`` as a finite number above ``low`` (at least 1 where ``low`` is 1) and at most
    ``MAX_SAMPLES``, or None when not given; one line otherwise."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    above = low <= value if low >= 1 else low < value
    if not (math.isfinite(value) and above and value <= MAX_SAMPLES):
        bound = f">= {low:g}" if low >= 1 else f"> {low:g}"
        raise InputError(field, text, f"{what}: a finite number {bound}, at most {MAX_SAMPLES:g}")
    return value


def work_of(samples: str | None, epochs: str | None, tokens: str | None, spec: dict[str, Any]) -> Work | None:
    """The work ``--samples``/``--tokens`` and ``--epochs`` describe (None when neither names a
    data set); tokens are counted in sequences of the workload's ``seq_len``."""
    n = number("predict.samples", samples, 1, "samples in the data set")
    t = number("predict.tokens", tokens, 1, "tokens in the data set")
    e = number("predict.epochs", epochs, 0, "passes over the data set")
    if n is not None and t is not None:
        raise InputError("predict.tokens", tokens, "either --samples or --tokens")
    if n is None and t is None:
        if e is not None:
            raise InputError("predict.epochs", epochs, "goes with --samples N or --tokens N (the data set)")
        return None
    e = 1.0 if e is None else e
    if t is not None:
        seq = spec.get("seq_len")
        if not isinstance(seq, int) or seq < 1:
            raise InputError(
                "predict.tokens",
                tokens,
                f"for a workload of sequences (seq_len); {spec.get('family')} has none",
            )
        return Work(t / seq, e, f"{t:,.0f} tokens ({t / seq:,.0f} sequences of {seq}) x {e:g} epochs")
    assert n is not None
    return Work(n, e, f"{n:,.0f} samples x {e:g} epochs")


def energy_source(record: Result | None, system: System | None) -> EnergySource:
    """A 1-rank record's measured joules per sample where it ran on the system's device (or no
    system is named), else the system's node power, else none."""
    if record is not None and record.world_size == 1:
        e = record.metrics.energy.energy_per_sample_j
        device = record.environment.device_name
        if e and (system is None or (system.device is not None and system.device.name == device)):
            parts = record.metrics.energy.measured
            return EnergySource(
                e, None, f"measured: record {record.name}, {e:.3g} J/sample ({parts}) / efficiency"
            )
    if system is not None and system.node_power_w:
        rule = f"estimated: {system.node_power_w:g} W per node x hours ({system.node_power_source})"
        return EnergySource(None, system.node_power_w, rule)
    why = "no [node] power in the system file" if system is not None else "no --system with a [node] power"
    return EnergySource(None, None, f"none: no record measured J/sample on this device, and {why}")


def cost(point: PredictionPoint, work: Work, source: EnergySource) -> PredictionPoint:
    """A prediction's point with the hours and kWh to train ``work`` at it, and whether the
    energy is estimated (None: no energy; no hours where its step never ends)."""
    rate, efficiency = point.samples_per_s, point.efficiency
    if not (0 < rate < math.inf and 0 < efficiency < math.inf):  # a step the figures make endless
        return replace(point, costed=True)
    seconds = metrics.time_to_train_s(work.total, rate)
    energy, estimated = None, None
    if source.joules_per_sample is not None:
        energy, estimated = metrics.energy_to_train_j(work.total, source.joules_per_sample, efficiency), False
    elif source.node_power_w is not None:
        energy, estimated = metrics.node_energy_j(point.nodes, source.node_power_w, seconds), True
    return replace(
        point,
        costed=True,
        train_hours=seconds / 3600,
        train_energy_kwh=None if energy is None else energy / JOULES_PER_KWH,
        energy_estimated=estimated,
    )
