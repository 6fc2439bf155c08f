"""Sweeps over one workload knob (``hpcdl sweep --knob NAME=V1,V2,...``): the same workload at
each value of a numeric knob (``batch_size``, ``seq_len``, ``image_size``, ``width``, ...), one
record per value at one rank count, and a summary of how each figure grows with the knob.

Values run in increasing order. Before a point runs, its memory is checked as a run checks it
(``harness.runner.preflight``): the first value that does not fit ends the sweep, said in one
line, and the points before it are kept. A point already recorded (valid, intact, same spec) is
not run again; a stopped sweep keeps its finished points and names the missing ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcdl import metrics
from hpcdl.errors import InputError, SpecError
from hpcdl.parallel.launch import STOPPED
from hpcdl.records import schema
from hpcdl.records.audit import audit
from hpcdl.records.loader import Record, Unreadable, read_record
from hpcdl.records.store import write_record
from hpcdl.scaling.sweep import run_point
from hpcdl.workloads.registry import canonical
from hpcdl.workloads.spec import Spec

if TYPE_CHECKING:
    from hpcdl.measure.config import RunConfig
    from hpcdl.parallel.world import World

MAX_VALUES = 64
"""the most values one sweep takes: a curve needs a handful, a typo in a range would run forever"""
REFUSED = 2
"""the exit code of a point its run refused (bad input for that value: it stops the sweep)"""
Fits = Callable[[Spec], str | None]
"""why a point's spec does not fit the device (a line), or None when it fits"""


@dataclass(frozen=True)
class KnobSweep:
    """One knob's values, each as the spec it makes (in increasing order)."""

    knob: str
    specs: dict[float, Spec]

    @property
    def values(self) -> list[float]:
        return list(self.specs)


def parse(spec: Spec, text: str, field: str = "knob") -> KnobSweep:
    """``NAME=V1,V2,...`` as the specs it makes from ``spec``; one line naming the option
    (``field``), the value and what is allowed when the knob is not a numeric knob of the
    family, a value does not parse or is out of its range, or the list is empty."""
    name, sep, listed = text.partition("=")
    known = type(spec).numeric()
    if not sep or not name:
        raise InputError(field, text, f"NAME=V1,V2,... with NAME one of {', '.join(known)}")
    if name not in known:
        raise InputError(field, name, f"a numeric knob of {spec.family}: {', '.join(known)}")
    words = [w.strip() for w in listed.split(",") if w.strip()]
    if not words:
        raise InputError(field, text, f"at least one value: {name}=V1,V2,...")
    if len(words) > MAX_VALUES:
        raise InputError(field, f"{len(words)} values", f"at most {MAX_VALUES} values in one sweep")
    specs: dict[float, Spec] = {}
    for word in words:
        value = type(spec).parse_knob(name, word)  # one line: family.NAME='x' is invalid: ...
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(f"{spec.family}.{name}", word, "a finite number")
        specs[value] = spec.replace(**{name: value})  # its range: family.NAME=V is invalid: ...
    return KnobSweep(name, dict(sorted(specs.items())))


def value_text(value: float) -> str:
    """A knob value as a record's name holds it: ``128``, ``0.1``, ``1e06``."""
    return str(value) if isinstance(value, int) else format(value, "g").replace("+", "")


def point_name(prefix: str, knob: str, value: float, np: int) -> str:
    return f"{prefix}-{knob}{value_text(value)}-np{np}"


def summary_name(prefix: str, knob: str, np: int) -> str:
    return f"{prefix}-{knob}-np{np}-summary.json"


def measured(path: Path, spec: Spec, np: int, fitted: bool) -> Record | None:
    """The record at ``path`` if it measured the point: same spec (any batch where ``--fit``
    chose it) and rank count, intact (``audit``), valid or not; else None."""
    try:
        record = read_record(path)
    except Unreadable:
        return None
    r = record.result

    def mine(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if not (fitted and k == "batch_size")}

    same = mine(canonical(r.spec) or {}) == mine(spec.to_dict())
    if not same or r.world_size != np or audit(record).problems:
        return None
    return record


def standing(path: Path, spec: Spec, np: int, fitted: bool) -> Record | None:
    """The record at ``path`` if it stands for the point (``measured``, and valid): a rerun
    skips it; else None."""
    record = measured(path, spec, np, fitted)
    return record if record is not None and record.result.validity.passed else None


def unfit(spec: Spec, cfg: RunConfig, world: World, budget: float | None = None) -> str | None:
    """Why ``spec`` does not fit a rank of ``world`` here, or None: the run's own refusal
    (``harness.runner.preflight``), or its estimated memory with the run's inputs
    (``Spec.memory_estimate``) over ``budget`` (default 1) of what a rank has. With ``--fit``
    the batch is the fit's, and only a batch of one that cannot fit is refused."""
    from hpcdl.device import malloc_library
    from hpcdl.harness.compose import run_layout
    from hpcdl.harness.runner import preflight
    from hpcdl.measure.fit import rank_memory
    from hpcdl.parallel.backends import resolve_backend_name
    from hpcdl.parallel.backends.choose import backend_class

    try:
        device = preflight(spec, cfg, world)
    except SpecError as e:
        if e.field != f"{spec.family}.batch_size":
            raise
        return e.allowed
    if cfg.fit_fraction > 0:
        return None
    rules = backend_class(resolve_backend_name(cfg.backend, world.size), run_layout(spec, cfg, world.size))
    have = rank_memory(device, world)
    need = spec.memory_estimate(
        spec.batch_size, cfg.optimizer, device.type, cfg.pool_batches, malloc_library(), rules.keeps_gradients
    )
    fraction = 1.0 if budget is None else budget
    if need <= fraction * have:
        return None
    gib = need / 2**30, have / 2**30
    return f"an estimated {gib[0]:.2f} GiB, more than {fraction:g} of the {gib[1]:.2f} GiB of a rank"


def first_unfit(sweep: KnobSweep, fits: Fits) -> tuple[float, str] | None:
    """The first value (in increasing order) that does not fit, and why; None when all do."""
    for value, spec in sweep.specs.items():
        reason = fits(spec)
        if reason is not None:
            return value, reason
    return None


def knob_sweep(
    sweep: KnobSweep,
    np: int,
    out: Path,
    run_args: Sequence[str],
    fits: Fits,
    *,
    fitted: bool = False,
    prefix: str = "sweep",
    redo: bool = False,
    timeout_s: float | None = None,
    say: Callable[[str], None] = print,
) -> tuple[dict[str, Any], int | None]:
    """Run every value that fits (skipping those with a standing record), write the summary and
    return it with the exit code of a stop (None when the sweep was not stopped). ``fitted``:
    ``--fit`` chooses each point's batch. A point its run refuses ends the sweep as one that
    does not fit; a point that fails otherwise is said and left out."""
    unfit = first_unfit(sweep, fits)
    if unfit is not None and unfit[0] == sweep.values[0]:
        raise InputError("knob", f"{sweep.knob}={value_text(unfit[0])}", f"does not fit: {unfit[1]}")
    name = sweep.knob
    stopped, left_out = None, None
    if unfit is not None:
        value, reason = unfit
        left_out = {"value": value, "reason": reason}
        say(f"{name}={value_text(value)} does not fit ({reason}): the sweep stops before it")
    for value, spec in sweep.specs.items():
        if unfit is not None and value >= unfit[0]:
            break
        stem = point_name(prefix, name, value, np)
        if not redo and standing(out / f"{stem}.json", spec, np, fitted) is not None:
            say(f"{name}={value_text(value)}: valid record {stem}.json exists, skipped")
            continue
        say(f"{name}={value_text(value)}: running")
        code = run_point(spec, np, stem, out, run_args, timeout_s)
        if code in STOPPED:
            stopped = code
            break
        if code == REFUSED:
            left_out = {"value": value, "reason": "its run refused it (the line above says why)"}
            say(f"{name}={value_text(value)}: refused; the sweep stops, the points before it are kept")
            break
        if code != 0:
            say(f"{name}={value_text(value)}: failed with exit code {code}")
    summary = summarize(out, sweep, np, prefix, fitted, left_out)
    if stopped is not None:
        missing = ", ".join(value_text(p["value"]) for p in summary["points"] if not p["record"])
        say(f"stopped (exit code {stopped}); finished points kept, missing: {name}={missing}")
    write_record(summary, out / summary_name(prefix, name, np))
    return summary, stopped


def summarize(
    out: Path,
    sweep: KnobSweep,
    np: int,
    prefix: str,
    fitted: bool,
    left_out: dict[str, Any] | None,
) -> dict[str, Any]:
    """Each value's figures where it has a record (``measured``; ``valid`` says whether it
    passed its checks: docs/metrics.md, "Summaries")."""
    points: list[dict[str, Any]] = []
    for value, spec in sweep.specs.items():
        stem = point_name(prefix, sweep.knob, value, np)
        record = measured(out / f"{stem}.json", spec, np, fitted)
        points.append({"value": value, "record": None} if record is None else point_figures(value, record))
    base = next(iter(sweep.specs.values()))
    return {
        "schema": schema.KNOB_SWEEP,
        "knob": sweep.knob,
        "np": np,
        "fitted": fitted,
        "spec": base.to_dict(),
        "points": points,
        "left_out": left_out,
    }


def point_figures(value: float, record: Record) -> dict[str, Any]:
    """What the summary and the report take from a point's record."""
    r = record.result
    m = r.metrics
    estimated = m.memory.estimated.total if m.memory.estimated is not None else None
    return {
        "value": value,
        "record": record.path.name,
        "valid": r.validity.passed,
        "samples_per_s": m.samples_per_s,
        "ai_ops_per_s": m.ai_ops_per_s,
        "mfu": m.mfu if math.isfinite(m.mfu) else None,
        "batch_per_rank": r.settings.batch_per_rank,
        "peak_memory_bytes": m.peak_memory_bytes,
        "peak_memory_kind": m.peak_memory_kind,
        "estimated_memory_bytes": estimated,
        "phase_shares": phase_shares({p: s.median for p, s in m.phases_s.items()}),
    }


def phase_shares(medians: dict[str, float]) -> dict[str, float]:
    """Each phase's median over the sum of the medians (``metrics.shares``)."""
    return metrics.shares({p: v for p, v in medians.items() if math.isfinite(v)})
