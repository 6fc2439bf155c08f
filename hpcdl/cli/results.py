"""CLI commands that read result records: ``hpcdl rank``, ``hpcdl predict``, ``hpcdl report``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from hpcdl.cli.common import add_workload_options, err, workload_specs
from hpcdl.errors import InputError
from hpcdl.parallel.backends import COLLECTIVES
from hpcdl.records import schema
from hpcdl.records.loader import CommSweep, Unreadable, load_tree, read_comm, read_record
from hpcdl.records.store import write_record
from hpcdl.records.views import Result
from hpcdl.results import ranking as rank_mod
from hpcdl.results.best import best_per_rank_count
from hpcdl.results.text import si, table
from hpcdl.scaling import model as model_mod
from hpcdl.workloads.registry import canonical

T = TypeVar("T")


def cmd_rank(args: argparse.Namespace) -> int:
    submissions = [rank_mod.parse_submission(a) for a in args.systems]
    ranking = rank_mod.rank(submissions, say=err)
    paths = rank_mod.write(ranking, Path(args.output))
    print(rank_mod.terminal_table(ranking))
    for x in ranking.rejected:
        print(f"rejected: {x.path}: {x.reason}")
    print(
        f"{ranking.accepted} records accepted, {len(ranking.rejected)} rejected; wrote "
        + ", ".join(str(p) for p in paths)
    )
    return 0


def _int_list(field: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise InputError(field, text, "comma-separated integers like 1,2,4") from None
    if not values or min(values) < 1:
        raise InputError(field, text, "integers >= 1")
    return values


def _positive(field: str, value: float | None) -> float:
    if value is None or not value > 0:
        raise InputError(field, value, "a number > 0")
    return value


def _read(field: str, path: str, read: Callable[[Path], T], what: str) -> T:
    try:
        return read(Path(path))
    except Unreadable as e:
        raise InputError(field, path, f"{what} ({e})") from None


def given_comms(args: argparse.Namespace) -> dict[str, model_mod.Comm]:
    """``--alpha``/``--beta``: one latency and bandwidth for every collective."""
    beta = _positive("predict.beta", args.beta)
    return {
        c: model_mod.Comm(alpha_s=args.alpha or 0.0, beta_bytes_per_s=beta, collective=c) for c in COLLECTIVES
    }


def model_from_args(args: argparse.Namespace) -> tuple[model_mod.Model, dict[str, Any], str]:
    """The model from a 1-rank record and a collective sweep, or from a workload and given
    gamma, alpha and beta; and the spec the measured points must match."""
    if args.base:
        if args.workload or args.preset or args.gamma:
            raise InputError(
                "predict", "--base with --workload/--gamma", "either records or a workload with gamma"
            )
        if not args.comm and args.beta is None:
            raise InputError("predict.comm", None, "--comm COMM.json (hpcdl comm -o) or --alpha/--beta")
        base = _read("predict.base", args.base, read_record, "a 1-rank result record").result
        if args.comm:
            sweep = _read("predict.comm", args.comm, read_comm, "a collective sweep of hpcdl comm -o")
            comms: CommSweep | dict[str, model_mod.Comm] = sweep
            backend = args.backend or sweep.backend
        else:
            comms = given_comms(args)
            backend = args.backend or "horovod"
        model = model_mod.model_from_records(
            base, comms, backend=backend, mode=args.mode, overlap=args.overlap
        )
        return model, base.spec, backend
    specs = workload_specs(args)
    if len(specs) != 1:
        raise InputError(
            "predict", "default suite", "one workload: --base RECORD, --workload FAMILY or --preset"
        )
    (spec,) = specs.values()
    gamma = _positive("predict.gamma", args.gamma)
    backend = args.backend or "horovod"
    model = model_mod.model_for(
        spec.to_dict(),
        spec.batch_size,
        gamma,
        given_comms(args),
        backend=backend,
        mode=args.mode,
        overlap=args.overlap,
    )
    return model, spec.to_dict(), backend


def measured_points(folder: Path, spec: dict[str, Any], mode: str, backend: str) -> dict[int, float]:
    """Measured samples/s by rank count: the best valid record under ``folder`` of the same
    workload and backend at each count. Weak scaling keeps the batch per rank; strong scaling
    the global batch."""

    def same(r: Result) -> bool:
        s = r.settings
        batch = s.batch_per_rank if mode == "weak" else s.global_batch
        return (
            r.validity.passed
            and _but_batch(canonical(r.spec) or {}) == _but_batch(canonical(spec) or spec)
            and batch == spec["batch_size"]
            and (s.world_size == 1 or s.backend == backend)
        )

    found = [rec for rec in load_tree([folder]).records if same(rec.result)]
    best = best_per_rank_count(found, lambda r: r.metrics.samples_per_s)
    return {n: rec.result.metrics.samples_per_s for n, rec in best.items()}


def _but_batch(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "batch_size"}


def cmd_predict(args: argparse.Namespace) -> int:
    model, spec, backend = model_from_args(args)
    nodes = _int_list("predict.nodes", args.nodes)
    if args.ranks_per_node < 1:
        raise InputError("predict.ranks_per_node", args.ranks_per_node, "an integer >= 1")
    measured = measured_points(Path(args.compare), spec, args.mode, backend) if args.compare else {}
    points: list[dict[str, Any]] = []
    skipped = []
    for n in nodes:
        p = n * args.ranks_per_node
        if not model.predictable(p):
            skipped.append(p)
            continue
        pt = {"nodes": n, **model.point(p)}
        if p in measured:
            pt["measured_samples_per_s"] = measured[p]
            pt["error"] = model_mod.relative_error(pt["samples_per_s"], pt["measured_samples_per_s"])
        points.append(pt)
    doc: dict[str, Any] = {
        "schema": schema.PREDICTION,  # extrapolated: never ranked
        "model": {**asdict(model), "ranks_per_node": args.ranks_per_node},
        "spec": spec,
        "points": points,
    }
    if args.output:
        err(f"wrote {write_record(doc, args.output)}")
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(
        f"model: gamma {si(model.gamma_flops_per_s, 'FLOP/s')} per rank, {model.mode} scaling, "
        f"overlap {model.overlap}; per step and rank ({backend}):"
    )
    for t in model.traffic:
        c = model.comms[t.collective]
        print(
            f"  {t.collective}: {si(t.bytes, 'B')} in {t.calls} call(s), "
            f"alpha {c.alpha_s * 1e6:.1f} us, beta {si(c.beta_bytes_per_s, 'B/s')}"
        )
    if skipped:
        print(f"  left out: {', '.join(map(str, skipped))} ranks, which the experts cannot be sharded across")
    print(
        table(
            [
                "nodes",
                "ranks",
                "step ms",
                "compute ms",
                "comm ms",
                "samples/s",
                "AI-ops/s",
                "efficiency",
                "measured",
                "error",
            ],
            [
                [
                    str(p["nodes"]),
                    str(p["np"]),
                    f"{p['step_s'] * 1e3:.2f}",
                    f"{p['compute_s'] * 1e3:.2f}",
                    f"{p['comm_s'] * 1e3:.2f}",
                    f"{p['samples_per_s']:.4g}",
                    si(p["ai_ops_per_s"], "FLOP/s"),
                    f"{p['efficiency']:.1%}",
                    f"{p['measured_samples_per_s']:.4g}" if "error" in p else "",
                    f"{p['error']:+.1%}" if "error" in p else "",
                ]
                for p in points
            ],
        )
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from hpcdl.results.report import write_report  # imports matplotlib: only when a report is made

    print(write_report([Path(p) for p in args.paths], Path(args.output), say=err))
    return 0


def add_parsers(sub: Any) -> None:
    rk = sub.add_parser("rank", help="verify records and write the ranking list (Markdown, HTML, CSV)")
    rk.add_argument("systems", nargs="+", help="one directory of records per system, or NAME=DIR")
    rk.add_argument("-o", "--output", default="ranking", help="output directory (default: ranking)")
    rk.set_defaults(func=cmd_rank)

    pr = sub.add_parser(
        "predict", help="analytical scaling model: throughput and efficiency up to 4096 nodes"
    )
    add_workload_options(pr)
    pr.add_argument("--base", help="a 1-rank record: calibrates gamma and names the workload")
    pr.add_argument(
        "--comm",
        help="a collective sweep record (hpcdl comm -o FILE): fits alpha and beta of each collective",
    )
    pr.add_argument("--gamma", type=float, help="sustained training FLOP/s of one rank (without --base)")
    pr.add_argument(
        "--alpha", type=float, help="latency per ring step in seconds, every collective (default 0)"
    )
    pr.add_argument("--beta", type=float, help="bus bandwidth in bytes/s, every collective (without --comm)")
    pr.add_argument(
        "--backend", help="horovod | torch | fsdp: the collectives of its step (default: the sweep's)"
    )
    pr.add_argument(
        "--nodes", default=",".join(map(str, model_mod.DEFAULT_NODES)), help="node counts (1..4096)"
    )
    pr.add_argument("--ranks-per-node", dest="ranks_per_node", type=int, default=1, help="ranks per node")
    pr.add_argument(
        "--mode", default="weak", help="weak (batch per rank fixed) | strong (global batch fixed)"
    )
    pr.add_argument("--overlap", default="none", help="none: step = compute + comm | full: max of the two")
    pr.add_argument("--compare", help="directory of measured records: show their samples/s and the error")
    pr.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pr.add_argument("-o", "--output", help="also write the prediction as JSON (schema hpcdl.prediction)")
    pr.set_defaults(func=cmd_predict)

    rp = sub.add_parser("report", help="HTML report with plots of records and sweeps")
    rp.add_argument("paths", nargs="+", help="record files or directories (searched recursively)")
    rp.add_argument("-o", "--output", default="report", help="output directory (default: report)")
    rp.set_defaults(func=cmd_report)
