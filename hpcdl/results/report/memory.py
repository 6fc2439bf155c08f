"""The report's memory figure, as data: each record's input size per rank and step against its
measured peak memory and ``metrics.memory_estimate`` (docs/metrics.md, "Memory")."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import torch

from hpcdl.errors import HpcdlError
from hpcdl.metrics import memory_estimate
from hpcdl.records.audit import Audit
from hpcdl.results.report import figures
from hpcdl.results.report.data import labels, system_of
from hpcdl.results.report.plots import Plot
from hpcdl.workloads.registry import spec_from_dict

SIZE_KNOBS = ("batch_size", "seq_len", "image_size")  # what a workload may vary along one memory curve


def sample_elements(spec: Mapping[str, Any]) -> int | None:
    """Elements of one input sample of a record's spec (pixels × channels, tokens, features,
    spectrogram bins), or None when the spec is not valid. The sample is made on the meta
    device: its shape, and no memory."""
    try:
        parsed = spec_from_dict(dict(spec))
    except (HpcdlError, TypeError):  # TypeError: a knob of a type no spec has (a list)
        return None
    return parsed.sample_inputs(1, torch.Generator(), torch.device("meta")).numel()


def memory_points(records: Sequence[Audit]) -> list[figures.MemoryPoint]:
    """For each record with a peak memory figure and a valid spec: the input size of one rank's
    step (batch per rank × elements of one sample), the measured peak memory and
    ``metrics.memory_estimate`` for the same batch. Records of one workload, the same spec but
    for its size knobs on the same device and rank count with the same optimizer and kind of
    peak, share a key."""
    points = []
    names = labels(records)
    for a in records:
        r = a.result
        measured, batch = r.metrics.peak_memory_bytes, r.settings.batch_per_rank
        per_sample = sample_elements(r.spec)
        if measured <= 0 or batch <= 0 or not per_sample:
            continue
        optimizer = r.run.optimizer
        sample_bytes = r.counts.memory_bytes_per_sample or r.counts.activation_bytes_per_sample
        # the record's own split where it has one (docs/metrics.md, "Memory"); older records
        # lack it, and get the estimate recomputed from their counts
        split = r.metrics.memory.estimated
        estimate = split.total if split else memory_estimate(r.counts.params, sample_bytes, batch, optimizer)
        if estimate <= 0:  # counts of an edited record: nothing to draw on a log axis
            continue
        kind = r.metrics.peak_memory_kind
        workload = json.dumps(
            [
                {k: v for k, v in r.spec.items() if k not in SIZE_KNOBS},
                system_of(a),
                r.environment.device_name,
                r.world_size,
                optimizer,
                kind,
            ],
            sort_keys=True,
        )
        points.append(
            figures.MemoryPoint(
                names[a.path], r.family, workload, batch * per_sample, estimate, measured, kind
            )
        )
    return points


def memory_plots(records: Sequence[Audit]) -> list[Plot]:
    points = memory_points(records)
    if not points:
        return []
    caption = (
        "Peak memory per rank against the input size of one step (batch per rank × elements per "
        "sample), measured (filled) and estimated (hollow, dashed), by family; CPU peaks are process "
        "RSS, which includes the interpreter"
    )
    return [Plot("memory.png", caption, partial(figures.memory, points=points))]
