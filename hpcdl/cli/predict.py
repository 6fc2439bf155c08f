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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hpcdl.cli.common import add_workload_options, err, workload_specs
from hpcdl.errors import HpcdlError, InputError
from hpcdl.records import schema
from hpcdl.records.loader import CommSweep, Unreadable, load_tree, read_comm, read_record
from hpcdl.records.store import write_record
from hpcdl.records.typed import to_json
from hpcdl.records.views import PredictionPoint, Result, Settings
from hpcdl.results.best import best_per_rank_count
from hpcdl.results.prediction import describe, render
from hpcdl.results.text import wrapped
from hpcdl.scaling.cost import cost, energy_source, work_of
from hpcdl.scaling.system import System, load_system
from hpcdl.scaling.transfer import Measured, carry

if TYPE_CHECKING:  # the model and its fits import the backends (torch): the handler imports them
    from hpcdl.scaling import model as model_mod
    from hpcdl.workloads.spec import Spec

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
    """γ and the workload: what every system column starts from."""

    spec: dict[str, Any]
    batch: int
    gamma: float
    base: Result | None = None
    given: str = ""
    """the option γ came from where no record did (``--throughput 400``, ``--gamma 1e12``)"""
    per_system: dict[str, float] = field(default_factory=dict)
    """``--throughput NAME=X``: γ given for that system, by name"""
    rate_device: str = ""
    """the device a published rate (``generators/rates.toml``) was measured on, where γ is one"""

    @property
    def precision(self) -> str:
        return str(self.spec.get("precision", "fp32"))


MISSING_GAMMA = (
    "predict: a rank's speed is needed: give --base RECORD (a 1-rank record), --throughput SAMPLES/s "
    "(one device's; NAME=SAMPLES/s for one --system) or --gamma FLOP/s (a preset of "
    "generators/rates.toml, as published, starts from its published rate)"
)


def throughputs(args: argparse.Namespace) -> tuple[float | None, dict[str, float]]:
    """``--throughput``: one plain figure (at most), and figures for named systems."""
    plain: list[float] = []
    named: dict[str, float] = {}
    for text in args.throughput or []:
        name, sep, value = text.rpartition("=")
        try:
            x = float(value)
        except ValueError:
            raise InputError(
                "predict.throughput", text, "SAMPLES/s, or NAME=SAMPLES/s for one --system"
            ) from None
        x = _positive("predict.throughput", x)
        if not sep:
            plain.append(x)
        elif name not in (args.system or []):
            raise InputError(
                "predict.throughput", text, f"NAME is one of the --system names: {args.system or []}"
            )
        else:
            named[name] = x
    if len(plain) > 1:
        raise InputError(
            "predict.throughput", args.throughput, "one plain figure; NAME=SAMPLES/s for the others"
        )
    return (plain[0] if plain else None), named


def calibration(args: argparse.Namespace) -> Calibration:
    plain, named = throughputs(args)
    if args.base:
        if args.workload or args.preset or args.gamma or plain is not None:
            raise InputError(
                "predict", "--base with --workload/--gamma/--throughput", "either a record or a workload"
            )
        base = _read("predict.base", args.base, read_record, "a 1-rank result record").result
        return Calibration(base.spec, base.settings.batch_per_rank, base.metrics.ai_ops_per_s, base,
                           per_system=_gammas(base.spec, named))  # fmt: skip
    specs = workload_specs(args)
    if len(specs) != 1:
        raise InputError(
            "predict", "default suite", "one workload: --base RECORD, --workload FAMILY or --preset"
        )
    (spec,) = specs.values()
    if args.gamma is not None and plain is not None:
        raise InputError("predict.gamma", args.gamma, "either --gamma FLOP/s or --throughput SAMPLES/s")
    if args.gamma is None and plain is None and not named:
        return published(args, spec)
    per_system = _gammas(spec.to_dict(), named)
    if plain is not None:  # one device's samples/s: γ = F · X
        gamma, given = float(spec.count().train_flops) * plain, f"--throughput {plain:g} samples/s"
    elif args.gamma is not None:
        gamma, given = _positive("predict.gamma", args.gamma), f"--gamma {args.gamma:g} FLOP/s"
    else:  # only figures for named systems: each system must have one
        gamma, given = next(iter(per_system.values())), ""
    return Calibration(spec.to_dict(), spec.batch_size, gamma, given=given, per_system=per_system)


def published(args: argparse.Namespace, spec: Spec) -> Calibration:
    """γ from a published rate of the preset (``generators/rates.toml``), where the workload is
    that preset as published (a batch or seed of its own aside) and a --system names the
    device to carry it to; else the one line that says which option to give."""
    from hpcdl.workloads import recipes

    rate = recipes.rates().get(args.preset or "")
    own = {w.partition("=")[0] for w in args.knobs} - {"batch_size", "seed"}
    if rate is None or own or spec.precision != rate["precision"] or not args.system:
        raise HpcdlError(MISSING_GAMMA)
    x = float(rate["samples_per_s"])
    given = f"published: {x:g} samples/s at batch {rate['batch']} ({rate['source']})"
    gamma = float(spec.count().train_flops) * x
    return Calibration(spec.to_dict(), spec.batch_size, gamma, given=given, rate_device=str(rate["device"]))


def _gammas(spec: dict[str, Any], named: dict[str, float]) -> dict[str, float]:
    """γ of each ``--throughput NAME=X``: F · X."""
    from hpcdl.workloads.registry import spec_from_dict  # the families: torch

    flops = float(spec_from_dict(dict(spec)).count().train_flops)
    return {name: flops * x for name, x in named.items()}


def measured_on(cal: Calibration, model: model_mod.Model, first: System) -> Measured:
    """Where γ was measured: the base record's device, or (a figure given) the first system's."""
    if cal.base is not None:
        b = cal.base
        per_device = b.metrics.peak_flops / max(b.world_size, 1)
        return Measured(model.gamma_flops_per_s, b.settings.precision, b.environment.device_name, per_device,
                        f"record {b.name}")  # fmt: skip
    if cal.rate_device:
        from hpcdl.measure.datasheets import datasheet_entry

        found = datasheet_entry(cal.rate_device)
        peak = found[0].get(cal.precision) if found else None
        return Measured(cal.gamma, cal.precision, cal.rate_device, peak, cal.given)
    device = first.device
    peak = device.peak_flops.get(cal.precision) if device else None
    name = device.name if device else ""
    return Measured(cal.gamma, cal.precision, name, peak, cal.given)


def carried_model(
    cal: Calibration, model: model_mod.Model, system: System, first: System
) -> tuple[model_mod.Model, str]:
    """The model on ``system``'s device: γ given for it, or carried there (``scaling.transfer``);
    the optimizer's time scales with γ. Returns the model and the rule in words."""
    if system.name in cal.per_system:
        gamma = cal.per_system[system.name]
        rule = f"given for this system (--throughput {system.name}=...)"
    elif cal.base is None and not cal.given:
        raise InputError("predict.throughput", system.name, f"give --throughput {system.name}=SAMPLES/s too")
    else:
        carried = carry(measured_on(cal, model, first), system, "--throughput")
        gamma, rule = carried.gamma, carried.rule
    scale = model.gamma_flops_per_s / gamma
    return replace(model, gamma_flops_per_s=gamma, optimizer_s=model.optimizer_s * scale), rule


def build(
    cal: Calibration, comm: Any, args: argparse.Namespace, backend: str, accum: int | None
) -> model_mod.Model:
    from hpcdl.scaling import fitting
    from hpcdl.scaling import model as model_mod
    from hpcdl.scaling.modelparallel import parse_layout

    kw: dict[str, Any] = {"backend": backend, "mode": args.mode, "overlap": args.overlap}
    if args.layout:
        kw["layout"] = parse_layout(args.layout)
    kw["sync_calls"] = _count("predict.sync", args.sync)
    if cal.base is not None:
        model = fitting.model_from_records(cal.base, comm, accumulation_steps=accum, **kw)
    else:
        if isinstance(comm, CommSweep):
            comm = fitting.fitted(comm)
        model = model_mod.model_for(cal.spec, cal.batch, cal.gamma, comm, accumulation_steps=accum, **kw)
    # what the options say, over what a record measured
    if args.step_cv is not None:
        model = replace(model, step_cv=_fraction("predict.step_cv", args.step_cv))
    if args.data_rate is not None:
        model = replace(model, data_rate=_positive("predict.data_rate", args.data_rate))
    return model


def _count(field: str, value: int | None) -> int:
    if value is None:
        return 0
    if not 0 <= value <= 1 << 20:
        raise InputError(field, value, "an integer in 0..1048576")
    return value


def _fraction(field: str, value: float) -> float:
    if not 0 <= value < 1:
        raise InputError(
            field, value, "a fraction in [0, 1): the step time's standard deviation over its mean"
        )
    return value


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
) -> tuple[list[tuple[str, model_mod.Model, int, str]], Calibration, str]:
    """(label, model, ranks per node, the rule of its γ) of each system asked for, the
    calibration, the backend."""
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
            model, rule = carried_model(cal, build(cal, comms, args, backend, accum), system, systems[0])
            out.append((system.name, model, rpn, rule))
        return out, cal, backend
    if cal.per_system:
        raise InputError("predict.throughput", args.throughput, "NAME=SAMPLES/s goes with --system NAME")
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
        return [(label, model, rpn, gamma_rule(cal))], cal, backend
    backend = args.backend or "horovod"
    model = build(cal, given_comms(args), args, backend, accum)
    return [("given alpha, beta", model, rpn, gamma_rule(cal))], cal, backend


def gamma_rule(cal: Calibration) -> str:
    """Where γ came from, without a system to carry it to."""
    return f"measured (record {cal.base.name})" if cal.base is not None else f"from {cal.given}"


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
    work = work_of(args.samples, args.epochs, args.tokens, cal.spec)
    systems = {s.name: s for s in map(load_system, args.system or [])}
    sources = {label: energy_source(cal.base, systems.get(label)) for label, _, _, _ in models}
    accumulation = models[0][1].accumulation_steps
    measured = {}
    if args.compare:
        measured = measured_points(Path(args.compare), cal.spec, args.mode, backend, accumulation)
    points: list[PredictionPoint] = []
    skipped: dict[str, list[int]] = {}
    for label, model, rpn, _ in models:
        for n in nodes:
            p = n * rpn
            if not model.predictable(p):
                skipped.setdefault(label, []).append(p)
                continue
            pt = replace(model.point(p), system=label, nodes=n)
            if work is not None:
                pt = cost(pt, work, sources[label])
            if p in measured and len(models) == 1:
                rate, hidden = measured[p]
                error = model_mod.relative_error(pt.samples_per_s, rate)
                pt = replace(pt, measured_samples_per_s=rate, measured_overlap=hidden, error=error)
            points.append(pt)
    doc: dict[str, Any] = {
        "schema": schema.PREDICTION,  # extrapolated: never ranked
        "model": {**asdict(models[0][1]), "ranks_per_node": models[0][2]},
        "models": [
            {"system": label, "ranks_per_node": rpn, "gamma_rule": rule, **asdict(m)}
            for label, m, rpn, rule in models
        ],
        "spec": cal.spec,
        "points": [to_json(pt) for pt in points],
    }
    if work is not None:
        doc["work"] = {"samples": work.samples, "epochs": work.epochs, "total_samples": work.total}
        doc["energy"] = {label: source.rule for label, source in sources.items()}
    if args.output:
        err(f"wrote {write_record(doc, args.output)}")
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    for label, model, rpn, rule in models:
        describe(label, model, rpn, backend, skipped.get(label, []), rule)
        if work is not None:
            print(wrapped(f"energy: {sources[label].rule}", indent="  "))
    if work is not None:
        print(f"to train: {work.how}")
    print(render(points, several=len(models) > 1))
    print(
        wrapped(
            "a prediction, not a measurement: +- is one standard error of the step time from the fits "
            "of gamma, alpha and beta (0 for figures given, not fitted)"
        )
    )
    return 0


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
        "--throughput",
        action="append",
        metavar="[NAME=]SAMPLES/s",
        help="one device's samples/s measured elsewhere (instead of --gamma): carried to each --system's "
        "device at the same MFU (the first system's device is the one measured); NAME=SAMPLES/s: "
        "given for system NAME (repeatable)",
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
    pr.add_argument(
        "--samples",
        metavar="N",
        help="samples in the data set: also print the hours and the energy (kWh) to train on it",
    )
    pr.add_argument(
        "--tokens",
        metavar="N",
        help="tokens in the data set, for a workload of sequences (N / seq_len samples): hours and kWh",
    )
    pr.add_argument("--epochs", metavar="E", help="passes over the data set, > 0 (default 1)")
    pr.add_argument(
        "--step-cv",
        dest="step_cv",
        type=float,
        metavar="CV",
        help="one rank's step-time spread sigma/mean: each step waits for the slowest of the ranks "
        "(default: --base's record's, else 0)",
    )
    pr.add_argument(
        "--sync",
        type=int,
        metavar="N",
        help="latency-bound allreduces per step beside the gradients' (the ranks agreeing on each step; "
        "default 0)",
    )
    pr.add_argument(
        "--data-rate",
        dest="data_rate",
        type=float,
        metavar="SAMPLES/s",
        help="samples/s one node's input pipeline delivers, shared by its ranks (default: --base's "
        "record's HDF5 read rate, else none)",
    )
    pr.add_argument("--compare", help="directory of measured records: show their samples/s and the error")
    pr.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pr.add_argument("-o", "--output", help="also write the prediction as JSON (schema hpcdl.prediction)")
    pr.set_defaults(func=cmd_predict)
