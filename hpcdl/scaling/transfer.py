"""Carrying one device's measured speed to another device (``hpcdl predict --system``): the
rule, stated wherever it is used.

γ, one rank's sustained training FLOP/s, is measured on one device (a record, or a samples/s
figure given with ``--throughput``). On a system whose device is another, ``hpcdl predict``
assumes the same MFU: γ' = γ x peak'/peak at the workload's precision, both peaks dense
datasheet figures (``measure.datasheets``; a CPU's, the formula's). It is an assumption, said
as one: a step bound by memory bandwidth or latency does not speed up with the peak. Where a
figure was measured on the system's own device, or given for it (``--throughput NAME=X``), it
is used as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpcdl.errors import InputError
from hpcdl.scaling.system import System


@dataclass(frozen=True)
class Measured:
    """Where γ was measured: the figure, the precision, and the device with its peak."""

    gamma: float
    precision: str
    device: str
    """the device's name ('' where not known: a figure given without a system)"""
    peak_flops: float | None
    """that device's dense peak at ``precision`` (None or NaN where not known)"""
    how: str
    """where the figure comes from, in words (``record R``, ``--throughput 400``)"""


@dataclass(frozen=True)
class Carried:
    """γ on one system's device, and the rule that gave it."""

    gamma: float
    rule: str


def carry(measured: Measured, system: System, option: str) -> Carried:
    """γ on ``system``'s device: as measured where it is the device measured on, else the same
    MFU on its peak; one line naming ``option`` (what to give instead) where that cannot be."""
    device = system.device
    if device is None:
        raise InputError(
            "predict.system", system.name, f"names no [device]: give {option} {system.name}=SAMPLES/s for it"
        )
    if measured.device == device.name:
        return Carried(measured.gamma, f"as measured on this device ({measured.how})")
    new = device.peak_flops.get(measured.precision)
    if new is None:
        raise InputError(
            "predict.system",
            system.name,
            f"its {device.name} has no {measured.precision} peak: give {option} {system.name}=SAMPLES/s",
        )
    old = measured.peak_flops
    if old is None or not (math.isfinite(old) and old > 0):
        raise InputError(
            "predict.base",
            measured.how,
            f"has no peak to carry its MFU to {device.name}: give {option} {system.name}=SAMPLES/s",
        )
    mfu = measured.gamma / old
    rule = (
        f"assumed: the same MFU as {measured.how} on {measured.device or 'its device'}, {mfu:.1%} of its "
        f"{_flops(old)} {measured.precision} peak, on {device.name}'s {_flops(new)} ({device.peak_source})"
    )
    return Carried(mfu * new, rule)


def _flops(x: float) -> str:
    return f"{x / 1e12:.3g} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.3g} GFLOP/s"
