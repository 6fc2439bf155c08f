"""Records of older schema versions read as the current one: one table of migrations, each
upgrading a record's JSON from its version to the next, applied in turn up to
``schema.RESULT_VERSION`` before the record's view is parsed (``views.read_result``). The record
as written stays as it was (``Result.raw``: its digest covers it; the audit checks that).

The versions (docs/changelog.md has each bump):

1. The first records: their digest does not cover the steps file. Not read.
2. The digest also covers the steps file (``steps_sha256``). Fields came in while version 2
   was written, each absent from the records before it.
3. Every field a run writes is present, typed (``metrics.memory``, ``metrics.io``,
   ``metrics.fit``, ``run``). A version 2 record reads with what the version's readers assumed
   where a field was absent (:func:`v2_to_v3`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hpcdl.records.schema import RESULT_VERSION
from hpcdl.records.typed import MalformedRecord

OLDEST = 2
"""the oldest version a migration reads"""

Json = dict[str, Any]

ESTIMATE_PARTS = ("weights", "gradients", "optimizer_state", "activations", "workspace", "libraries")
LATER_PARTS = ("inputs", "heap")
"""parts of the memory estimate counted from late in version 2 on (inputs, heap: 2026-11-27)"""


def upgrade(record: Mapping[str, Any]) -> Json:
    """``record`` (a result record's JSON) at the current version: a copy, each migration from
    its version on applied in turn; :class:`MalformedRecord` for a version none reads. What the
    migrations cannot place (a block that is not an object) is left for the parser to name."""
    version = record.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or not OLDEST <= version <= RESULT_VERSION:
        raise MalformedRecord(
            f"record.schema_version: {version!r}: this hpcdl reads versions {OLDEST} to {RESULT_VERSION}"
        )
    data = dict(record)
    for step in range(version, RESULT_VERSION):
        data = MIGRATIONS[step](data)
        data["schema_version"] = step + 1
    return data


def v2_to_v3(record: Json) -> Json:
    """Version 2 -> 3: the fields version 2's later writers added, made explicit where a record
    lacks them, as version 2's readers took them: one micro-batch and eager execution, a peak
    of unknown kind and no flags, no memory figures (an estimate's later parts 0, its total
    their sum), the default suite's first version, and null for a figure not measured (a rank's
    computation alone and CPU time, the window's ends, the time to the first step, a fit's
    later fields)."""
    from hpcdl.workloads.recipes import DEFAULT_CLASS  # torch: only when a record is upgraded

    out = dict(record)
    _fill(out, "settings", accumulation_steps=1, execution={})
    _fill(out, "counts", memory_bytes_per_sample=None)
    # written before size classes existed, it ran the default suite: class S version 1 (the same
    # workloads), as which version 2's scoring counted it
    _fill(out, "run", suite_class=DEFAULT_CLASS, suite_version=1)
    metrics = _fill(
        out,
        "metrics",
        peak_kind="unknown",
        flags=[],
        io={},
        memory={"estimated": None, "measured": None},
        window_start_unix=None,
        window_end_unix=None,
        time_to_first_step_s=None,
    )
    if metrics is None:
        return out
    rows = metrics.get("per_rank")
    if isinstance(rows, list):
        unknown = dict.fromkeys(("compute_only_s", "on_cpu_s", "descheduled_s"))
        metrics["per_rank"] = [_filled(r, **unknown) for r in rows]
    memory = _fill(metrics, "memory", estimated=None, measured=None)
    if memory is not None and isinstance(memory.get("estimated"), dict):
        estimate = _filled(memory["estimated"], **dict.fromkeys((*ESTIMATE_PARTS, *LATER_PARTS), 0))
        if "total" not in memory["estimated"]:
            estimate["total"] = sum(v for k, v in estimate.items() if isinstance(v, int | float))
        memory["estimated"] = estimate
    if isinstance(metrics.get("fit"), dict):
        later = ("mmap_threshold_bytes", "allocator", "oversize_threshold_bytes", "shard", "run_peak_bytes")
        metrics["fit"] = _filled(
            metrics["fit"], fixed_bytes=None, per_sample_bytes=None, kept_grads=False, **dict.fromkeys(later)
        )
    return out


MIGRATIONS: dict[int, Callable[[Json], Json]] = {2: v2_to_v3}
"""version -> the function that upgrades a record of it to the next version"""


def _filled(block: Any, **absent: Any) -> Any:
    """A copy of ``block`` (an object) with each of ``absent`` set where it is missing; anything
    else as it is."""
    return {**absent, **block} if isinstance(block, dict) else block


def _fill(parent: Json, key: str, **absent: Any) -> Json | None:
    """``parent[key]`` replaced by a filled copy (:func:`_filled`); the copy, or None where it is
    no object."""
    if key not in parent:
        return None
    parent[key] = _filled(parent[key], **absent)
    return parent[key] if isinstance(parent[key], dict) else None
