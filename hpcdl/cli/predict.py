"""``hpcdl predict``: the analytical scaling model on the command line (``hpcdl.scaling``).

Where γ comes from: a 1-rank record (``--base``), a given FLOP/s (``--gamma``) or one device's
samples/s measured elsewhere (``--throughput``). Where α and β come from: a collective sweep
(``--comm``; with ``--comm-inter`` a second, across two nodes: two levels), given numbers
(``--alpha``/``--beta``: one flat ring), or a system file (``--system``, repeatable: the same
workload on each, side by side). A prediction is written as ``hpcdl.prediction``: never a
measurement, and ``hpcdl rank`` refuses it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hpcdl.cli.common import add_workload_options, err, workload_specs
from hpcdl.errors import InputError
from hpcdl.records import schema
from hpcdl.records.loader import CommSweep, Unreadable, load_tree, read_comm, read_record
from hpcdl.records.store import write_record
from hpcdl.records.typed import to_json
from hpcdl.records.views import PredictionPoint, Result, Settings
from hpcdl.results.best import best_per_rank_count
from hpcdl.results.text import si, table
from hpcdl.scaling.system import System, load_system

if TYPE_CHECKING:  # the model and its fits import the backends (torch): the handler imports them
    from hpcdl.scaling import model as model_mod

T = TypeVar("T")
ACCUMULATION = "accumulation_steps"


def _int_list(field: str, text: str, high: int) -> list[int]:
    shown = text if len(text) <= 40 else text[:37] + "..."
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise InputError(field, shown, "comma-separated integers like 1,2,4") from None
    if not values or not all(1 <= v <= high for v in values):
        raise InputError(field, shown, f"integers in 1..{high}")
    return values


def _positive(field: str, value: float | None) -> float:
    if value is None or not 0 < value < float("inf"):
        raise InputError(field, value, "a finite number > 0")
    return value


def _read(field: str, path: str, read: Callable[[Path], T], what: str) -> T:
    try:
        return read(Path(path))
    except Unreadable as e:
        raise InputError(field, path, f"{what} ({e})") from None


def _accumulation(args: argparse.Namespace) -> int | None:
    """``accumulation_steps=N`` among the knobs (with ``--base``: the record's workload at N
    micro-batches per step); None when not given."""
    words = [w for w in args.knobs if w.startswith(ACCUMULATION + "=")]
    if not words:
        return None
    text = words[-1].partition("=")[2]
    try:
        value = int(text)
    except ValueError:
        raise InputError(ACCUMULATION, text, "an integer >= 1") from None
    if not 1 <= value <= 1 << 20:
        raise InputError(
            ACCUMULATION, text if len(text) <= 40 else text[:37] + "...", "an integer in 1..1048576"
        )
    return value


@dataclass(frozen=True)
class Calibration:
    """γ and the workload: what every system column shares."""

    spec: dict[str, Any]
    batch: int
    gamma: float
    base: Result | None = None


def calibration(args: argparse.Namespace) -> Calibration:
    if args.base:
        if args.workload or args.preset or args.gamma or args.throughput:
            raise InputError(
                "predict", "--base with --workload/--gamma/--throughput", "either a record or a workload"
            )
        base = _read("predict.base", args.base, read_record, "a 1-rank result record").result
        return Calibration(base.spec, base.settings.batch_per_rank, base.metrics.ai_ops_per_s, base)
    specs = workload_specs(args)
    if len(specs) != 1:
        raise InputError(
            "predict", "default suite", "one workload: --base RECORD, --workload FAMILY or --preset"
        )
    (spec,) = specs.values()
    if (args.gamma is None) == (args.throughput is None):
        raise InputError("predict.gamma", args.gamma, "either --gamma FLOP/s or --throughput SAMPLES/s")
    if args.throughput is not None:  # one device's samples/s: γ = F · X
        gamma = float(spec.count().train_flops) * _positive("predict.throughput", args.throughput)
    else:
        gamma = _positive("predict.gamma", args.gamma)
    return Calibration(spec.to_dict(), spec.batch_size, gamma)


def build(
    cal: Calibration, comm: Any, args: argparse.Namespace, backend: str, accum: int | None
) -> model_mod.Model:
    from hpcdl.scaling import fitting
    from hpcdl.scaling import model as model_mod
    from hpcdl.scaling.modelparallel import parse_layout

    kw: dict[str, Any] = {"backend": backend, "mode": args.mode, "overlap": args.overlap}
    if args.layout:
        kw["layout"] = parse_layout(args.layout)
    if cal.base is not None:
        return fitting.model_from_records(cal.base, comm, accumulation_steps=accum, **kw)
    if isinstance(comm, CommSweep):
        comm = fitting.fitted(comm)
    return model_mod.model_for(cal.spec, cal.batch, cal.gamma, comm, accumulation_steps=accum, **kw)


def given_comms(args: argparse.Namespace) -> dict[str, model_mod.Cost]:
    """``--alpha``/``--beta``: one latency and bandwidth for every collective (one flat ring)."""
    from hpcdl.parallel.backends import COLLECTIVES
    from hpcdl.scaling import model as model_mod

    beta = _positive("predict.beta", args.beta)
    return {
        c: model_mod.Comm(alpha_s=args.alpha or 0.0, beta_bytes_per_s=beta, collective=c) for c in COLLECTIVES
    }


def models_from_args(
    args: argparse.Namespace,
) -> tuple[list[tuple[str, model_mod.Model, int]], Calibration, str]:
    """(label, model, ranks per node) of each system asked for, the calibration, the backend."""
    from hpcdl.scaling import fitting
    from hpcdl.scaling import model as model_mod

    accum = _accumulation(args)
    cal = calibration(args)
    sources = sum(bool(x) for x in (args.system, args.comm, args.beta is not None))
    if sources != 1:
        raise InputError(
            "predict.comm",
            None,
            "one of --system NAME|FILE, --comm COMM.json (hpcdl comm -o) or --alpha/--beta",
        )
    if args.comm_inter and not args.comm:
        raise InputError(
            "predict.comm_inter", args.comm_inter, "goes with --comm (the sweep inside one node)"
        )
    if args.system:
        systems: list[System] = [load_system(name) for name in args.system]
        backend = args.backend or "torch"
        out = []
        for system in systems:
            rpn = args.ranks_per_node or system.devices_per_node
            comms = model_mod.system_comms(system, rpn)
            out.append((system.name, build(cal, comms, args, backend, accum), rpn))
        return out, cal, backend
    rpn = args.ranks_per_node or 1
    if args.comm:
        sweep: CommSweep = _read("predict.comm", args.comm, read_comm, "a collective sweep of hpcdl comm -o")
        backend = args.backend or sweep.backend
        model = build(cal, sweep, args, backend, accum)
        label = Path(args.comm).stem
        if args.comm_inter:
            inter = _read("predict.comm_inter", args.comm_inter, read_comm, "a sweep across two nodes")
            comms = fitting.hierarchy_comms(sweep, inter, model.traffic, rpn)
            model = replace(model, comms=comms)
            label += " + " + Path(args.comm_inter).stem
        return [(label, model, rpn)], cal, backend
    backend = args.backend or "horovod"
    return [("given alpha, beta", build(cal, given_comms(args), args, backend, accum), rpn)], cal, backend


def measured_points(
    folder: Path, spec: dict[str, Any], mode: str, backend: str, accumulation: int = 1
) -> dict[int, tuple[float, float | None]]:
    """Measured samples/s and overlap by rank count: the best valid record under ``folder`` of
    the same workload, backend and accumulation steps at each count. Weak scaling keeps the
    batch per rank; strong scaling the global micro-batch (``compared_batch``). Overlap is
    ``1 − exposed_s / allreduce_s`` where both were timed."""
    from hpcdl import metrics
    from hpcdl.workloads.registry import canonical

    def same(r: Result) -> bool:
        return (
            r.validity.passed
            and _but_batch(canonical(r.spec) or {}) == _but_batch(canonical(spec) or spec)
            and compared_batch(r.settings, mode) == spec["batch_size"]
            and r.settings.accumulation_steps == accumulation
            and (r.settings.world_size == 1 or r.settings.backend == backend)
        )

    found = [rec for rec in load_tree([folder]).records if same(rec.result)]
    best = best_per_rank_count(found, lambda r: r.metrics.samples_per_s)
    out = {}
    for n, rec in best.items():
        c = rec.result.metrics.communication
        hidden = None
        if c.exposed_s is not None and c.allreduce_s is not None:
            hidden = metrics.overlap_fraction(c.allreduce_s, c.exposed_s)
        out[n] = (rec.result.metrics.samples_per_s, hidden)
    return out


def compared_batch(s: Settings, mode: str) -> int:
    """The batch a measured point is matched on, as the model's ``batch`` means it: one rank's
    micro-batch (weak scaling) or the micro-batch of all ranks together (strong scaling), the
    accumulation steps compared apart (``global_batch`` counts them: it is not that)."""
    return s.batch_per_rank if mode == "weak" else s.batch_per_rank * s.world_size


def _but_batch(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in ("batch_size", ACCUMULATION)}


def cmd_predict(args: argparse.Namespace) -> int:
    from hpcdl.scaling import model as model_mod

    given = ",".join(map(str, model_mod.DEFAULT_NODES)) if args.nodes is None else args.nodes
    nodes = _int_list("predict.nodes", given, model_mod.MAX_NODES)
    if args.ranks_per_node is not None and not 1 <= args.ranks_per_node <= 4096:
        raise InputError("predict.ranks_per_node", args.ranks_per_node, "an integer in 1..4096")
    models, cal, backend = models_from_args(args)
    accumulation = models[0][1].accumulation_steps
    measured = {}
    if args.compare:
        measured = measured_points(Path(args.compare), cal.spec, args.mode, backend, accumulation)
    points: list[PredictionPoint] = []
    skipped: dict[str, list[int]] = {}
    for label, model, rpn in models:
        for n in nodes:
            p = n * rpn
            if not model.predictable(p):
                skipped.setdefault(label, []).append(p)
                continue
            pt = replace(model.point(p), system=label, nodes=n)
            if p in measured and len(models) == 1:
                rate, hidden = measured[p]
                error = model_mod.relative_error(pt.samples_per_s, rate)
                pt = replace(pt, measured_samples_per_s=rate, measured_overlap=hidden, error=error)
            points.append(pt)
    doc: dict[str, Any] = {
        "schema": schema.PREDICTION,  # extrapolated: never ranked
        "model": {**asdict(models[0][1]), "ranks_per_node": models[0][2]},
        "models": [{"system": label, "ranks_per_node": rpn, **asdict(m)} for label, m, rpn in models],
        "spec": cal.spec,
        "points": [to_json(pt) for pt in points],
    }
    if args.output:
        err(f"wrote {write_record(doc, args.output)}")
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    for label, model, rpn in models:
        describe(label, model, rpn, backend, skipped.get(label, []))
    print(render(points, several=len(models) > 1))
    print(
        "a prediction, not a measurement: +- is one standard error of the step time from the fits of "
        "gamma, alpha and beta (0 for figures given, not fitted)"
    )
    return 0


def describe(label: str, model: model_mod.Model, rpn: int, backend: str, skipped: list[int]) -> None:
    from hpcdl.scaling import model as model_mod

    print(
        f"model [{label}]: gamma {si(model.gamma_flops_per_s, 'FLOP/s')} per rank, {model.mode} scaling, "
        f"overlap {model.overlap}, {rpn} rank(s) per node, accumulation_steps {model.accumulation_steps}; "
        f"per step and rank ({backend}):"
    )
    for t in model.traffic:
        c = model.comms[t.collective]
        levels = [("", c)] if isinstance(c, model_mod.Comm) else [("intra ", c.intra), ("inter ", c.inter)]
        text = ", ".join(
            f"{name}alpha {lvl.alpha_s * 1e6:.1f} us beta {si(lvl.beta_bytes_per_s, 'B/s')}"
            for name, lvl in levels
        )
        print(f"  {t.collective}: {si(t.bytes, 'B')} in {t.calls} call(s); {text}")
    if skipped:
        print(f"  left out: {', '.join(map(str, skipped))} ranks, which the experts cannot be sharded across")


def render(points: list[PredictionPoint], several: bool) -> str:
    head = ["nodes", "ranks", "step ms", "+-", "compute ms", "comm ms", "hidden", "algorithm", "samples/s"]
    head += ["AI-ops/s", "efficiency", "measured", "meas. hidden", "error"]
    rows = []
    for p in points:
        hidden = "" if p.overlap is None else f"{p.overlap:.0%}"
        compared = p.error is not None and p.measured_samples_per_s is not None
        row = [
            str(p.nodes),
            str(p.np),
            f"{p.step_s * 1e3:.2f}",
            f"{p.step_rse:.1%}",
            f"{p.compute_s * 1e3:.2f}",
            f"{p.comm_s * 1e3:.2f}",
            hidden,
            p.algorithm,
            f"{p.samples_per_s:.4g}",
            si(p.ai_ops_per_s, "FLOP/s"),
            f"{p.efficiency:.1%}",
            f"{p.measured_samples_per_s:.4g}" if compared else "",
            f"{p.measured_overlap:.0%}" if p.measured_overlap is not None else "",
            f"{p.error:+.1%}" if p.error is not None else "",
        ]
        rows.append(([p.system] if several else []) + row)
    return table((["system"] if several else []) + head, rows)


def add_parsers(sub: Any) -> None:
    pr = sub.add_parser(
        "predict", help="analytical scaling model: throughput and efficiency up to 4096 nodes"
    )
    add_workload_options(pr)
    pr.add_argument("--base", help="a 1-rank record: calibrates gamma and names the workload")
    pr.add_argument(
        "--comm", help="a collective sweep record (hpcdl comm -o FILE), inside one node: fits alpha and beta"
    )
    pr.add_argument(
        "--comm-inter",
        dest="comm_inter",
        help="a second sweep, across two nodes (one rank each): the fabric's alpha and beta (two levels)",
    )
    pr.add_argument(
        "--system",
        action="append",
        help="a catalogue system (hpcdl/recipes/systems) or a system TOML file; repeat to compare",
    )
    pr.add_argument("--gamma", type=float, help="sustained training FLOP/s of one rank (without --base)")
    pr.add_argument(
        "--throughput", type=float, help="one device's samples/s measured elsewhere (instead of --gamma)"
    )
    pr.add_argument(
        "--alpha", type=float, help="latency per ring step in seconds, every collective (default 0)"
    )
    pr.add_argument("--beta", type=float, help="bus bandwidth in bytes/s, every collective (one flat ring)")
    pr.add_argument("--backend", help="horovod | torch | fsdp: the collectives of its step")
    pr.add_argument(
        "--nodes", help="node counts in 1..4096, e.g. 1,8,64 (default: every power of two up to 4096)"
    )
    pr.add_argument(
        "--ranks-per-node",
        dest="ranks_per_node",
        type=int,
        help="ranks per node (default: the system's devices per node, else 1)",
    )
    pr.add_argument(
        "--mode", default="weak", help="weak (batch per rank fixed) | strong (global batch fixed)"
    )
    pr.add_argument(
        "--overlap",
        default="bucketed",
        help="bucketed (default: gradient buckets behind backward) | none (compute + comm) | full (max)",
    )
    pr.add_argument(
        "--layout",
        help="dp=N,tp=N,pp=N[,microbatches=M,schedule=1f1b|gpipe,sp=1]: tensor and pipeline "
        "parallelism on top of data parallelism (dp omitted: the rest of the ranks)",
    )
    pr.add_argument("--compare", help="directory of measured records: show their samples/s and the error")
    pr.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pr.add_argument("-o", "--output", help="also write the prediction as JSON (schema hpcdl.prediction)")
    pr.set_defaults(func=cmd_predict)
