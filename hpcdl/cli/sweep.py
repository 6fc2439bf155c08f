"""``hpcdl sweep``: one workload over rank counts (weak or strong scaling), over power or clock
caps, or over the values of one of its knobs (``--knob``), a record per point."""

from __future__ import annotations

import argparse
import math
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcdl.cli.common import add_workload_options, err, workload_specs
from hpcdl.cli.run_options import add_run_options, run_argv, run_config
from hpcdl.errors import InputError
from hpcdl.parallel.world import World
from hpcdl.records.store import NAME_RE
from hpcdl.results.text import si, table

if TYPE_CHECKING:  # a sweep's modules import torch: the handlers import them (--help needs none)
    from hpcdl.measure.config import RunConfig
    from hpcdl.workloads.spec import Spec


def cmd_sweep(args: argparse.Namespace) -> int:
    from hpcdl.harness.runner import preflight
    from hpcdl.scaling import sweep as sweep_mod

    if not NAME_RE.fullmatch(args.prefix) or ".." in args.prefix:  # its files go into -o, nowhere else
        raise InputError("prefix", args.prefix, "a plain name: letters, digits and ._- (no '/' or '..')")
    specs = workload_specs(args)
    if len(specs) != 1:
        raise InputError(
            "sweep", "default suite", "a sweep takes one workload: --workload FAMILY or --preset NAME"
        )
    if args.knob is not None:
        return cmd_knob_sweep(args, next(iter(specs.values())))
    if args.np is None:
        raise InputError(
            "np", None, "rank counts like --np 1,2,4 (or --knob NAME=V1,V2,... at one rank count)"
        )
    args.mode = args.mode or "weak"
    try:
        nps = [int(x) for x in args.np.split(",") if x]
    except ValueError:
        raise InputError("sweep.np", args.np, "expected rank counts like 1,2,4") from None
    if not nps or min(nps) < 1:
        raise InputError("sweep.np", args.np, "expected rank counts >= 1, like 1,2,4")
    cfg = run_config(args)
    cap = cap_values(args, nps)
    (spec,) = specs.values()
    for np in nps:
        preflight(
            sweep_mod.point_spec(spec, args.mode, np) if args.mode in sweep_mod.MODES else spec,
            cfg,
            World(size=np),
        )
    run_args = run_argv(args)
    if cap is not None:
        return cmd_cap_sweep(args, spec, cfg, nps[0], run_args, *cap)
    summary, stopped = sweep_mod.sweep(
        spec,
        nps,
        args.mode,
        Path(args.output),
        run_args,
        prefix=args.prefix,
        redo=args.redo,
        timeout_s=args.timeout,
        say=err,
    )
    rows = [
        [
            str(p["np"]),
            f"{p['samples_per_s']:.1f}" if p["record"] else "failed",
            f"{p['speedup']:.2f}" if p["record"] else "",
            f"{p['efficiency'] * 100:.1f}%" if p["record"] else "",
        ]
        for p in summary["points"]
    ]
    print(table(["ranks", "samples/s", "speed-up", f"{args.mode} efficiency"], rows))
    if stopped is not None:
        return stopped
    return 0 if all(p["record"] for p in summary["points"]) else 1


def cmd_knob_sweep(args: argparse.Namespace, spec: Spec) -> int:
    """``hpcdl sweep --knob NAME=V1,V2,...``: the workload at each value, at one rank count
    (``scaling.knobsweep``)."""
    from hpcdl.scaling import knobsweep

    if args.power_limit is not None or args.clock_limit is not None:
        raise InputError("knob", args.knob, "one sweep per command: --knob, or a cap sweep (--power-limit)")
    if args.mode is not None:
        raise InputError("mode", args.mode, "weak or strong scaling is a rank sweep's: not with --knob")
    np = knob_ranks(args.np)
    sweep = knobsweep.parse(spec, args.knob)
    cfg = run_config(args)
    budget = cfg.fit_fraction if sweep.knob == "batch_size" and cfg.fit_fraction > 0 else None
    if budget is not None:  # the knob sets the batch: --fit is the memory each point must fit in
        args.fit, cfg = None, cfg.replace(fit_fraction=0.0)
    summary, stopped = knobsweep.knob_sweep(
        sweep,
        np,
        Path(args.output),
        run_argv(args),
        partial(knobsweep.unfit, cfg=cfg, world=World(size=np), budget=budget),
        fitted=cfg.fit_fraction > 0,
        prefix=args.prefix,
        redo=args.redo,
        timeout_s=args.timeout,
        say=err,
    )
    print(knob_table(summary))
    if stopped is not None:
        return stopped
    ran = [
        p
        for p in summary["points"]
        if summary["left_out"] is None or p["value"] < summary["left_out"]["value"]
    ]
    return 0 if all(p["record"] for p in ran) else 1


def knob_ranks(text: str | None) -> int:
    """The one rank count of a knob sweep (``--np``, default 1)."""
    if text is None:
        return 1
    if not text.strip().isdigit() or int(text) < 1:
        raise InputError(
            "np",
            text,
            "one rank count >= 1 with --knob (a knob sweep and a rank sweep are separate commands)",
        )
    return int(text)


def knob_table(summary: dict[str, Any]) -> str:
    """The summary of a knob sweep as a table: throughput, MFU and memory at each value."""

    def mem(value: float | None) -> str:
        return "n/a" if value is None else si(value, "B")

    rows = []
    for p in summary["points"]:
        left = summary["left_out"]
        if not p["record"]:
            why = "does not fit" if left is not None and p["value"] >= left["value"] else "no record"
            rows.append([knob_value(p["value"]), why, "", "", "", "", ""])
            continue
        mfu = "n/a" if p["mfu"] is None else f"{p['mfu']:.1%}"
        rows.append(
            [
                knob_value(p["value"]) + ("" if p["valid"] else " (invalid)"),
                str(p["batch_per_rank"]),
                f"{p['samples_per_s']:.1f}",
                si(p["ai_ops_per_s"], "FLOP/s"),
                mfu,
                mem(p["peak_memory_bytes"]),
                mem(p["estimated_memory_bytes"]),
            ]
        )
    head = [summary["knob"], "batch/rank", "samples/s", "AI-ops/s", "MFU", "peak memory", "estimated"]
    return table(head, rows)


def knob_value(value: float) -> str:
    from hpcdl.scaling.knobsweep import value_text

    return value_text(value)


def cap_values(args: argparse.Namespace, nps: list[int]) -> tuple[str, list[float]] | None:
    """``--power-limit`` or ``--clock-limit`` as (kind, caps), or None; one line for bad input
    (a cap sweep runs the same work, ``--steps``, at one rank count)."""
    from hpcdl.measure import caps

    given = [(kind, text) for kind in caps.KINDS if (text := getattr(args, f"{kind}_limit")) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise InputError("power-limit", args.power_limit, "one of --power-limit and --clock-limit per sweep")
    (kind, text), unit = given[0], caps.KINDS[given[0][0]]
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise InputError(f"{kind}-limit", text, f"caps in {unit} > 0, like 200,250,300")
    if len(nps) != 1:
        raise InputError("sweep.np", args.np, "a cap sweep runs at one rank count, like --np 1")
    if args.steps is None or not args.steps.strip().isdigit() or int(args.steps) < 1:
        # --steps 0 is a timed window (run's meaning): each cap would do different work
        raise InputError(
            "steps", args.steps, "a cap sweep compares the same work at every cap: give --steps N >= 1"
        )
    return kind, values


def cmd_cap_sweep(
    args: argparse.Namespace,
    spec: Spec,
    cfg: RunConfig,
    np: int,
    run_args: list[str],
    kind: str,
    values: list[float],
) -> int:
    """``hpcdl sweep --power-limit/--clock-limit``: the same work at every cap (capsweep.py)."""
    from hpcdl.device import resolve_device
    from hpcdl.scaling import capsweep

    limits = capsweep.limits_for(kind, resolve_device(cfg.device), np)
    summary, stopped = capsweep.cap_sweep(
        spec,
        kind,
        values,
        np,
        Path(args.output),
        run_args,
        limits,
        prefix=args.prefix,
        redo=args.redo,
        timeout_s=args.timeout,
        say=err,
    )
    print(cap_table(summary))
    if stopped is not None:
        return stopped
    return 0 if all(p["record"] for p in summary["points"]) else 1


def cap_table(summary: dict[str, Any]) -> str:
    """The summary of a cap sweep as a table; the cap of the lowest EDP marked."""

    def num(value: float | None, unit: str = "") -> str:
        return "n/a" if value is None else si(value, unit)

    rows = []
    for p in summary["points"]:
        if not p["record"]:
            rows.append([f"{p['cap']:g}", "failed", "", "", "", "", "", ""])
            continue
        best = " (best EDP)" if p["cap"] == summary["best_edp_cap"] else ""
        rows.append(
            [
                f"{p['cap']:g}{best}",
                f"{p['time_s']:.3g}",
                f"{p['time_per_step_s'] * 1e3:.3g}",
                f"{p['samples_per_s']:.1f}",
                num(p["energy_to_solution_j"], "J"),
                num(p["avg_power_w"], "W"),
                num(p["energy_delay_product_js"], "J·s"),
                num(p["samples_per_joule"]),
            ]
        )
    head = [
        f"cap {summary['unit']}",
        "time s",
        "step ms",
        "samples/s",
        "ETS",
        "avg power",
        "EDP",
        "samples/J",
    ]
    return table(head, rows)


def add_parsers(sub: Any) -> None:
    sw = sub.add_parser("sweep", help="weak or strong scaling over rank counts, one record per point")
    add_workload_options(sw)
    add_run_options(sw)
    sw.add_argument("--np", help="rank counts, e.g. 1,2,4 (a knob sweep: one count, default 1)")
    sw.add_argument(
        "--mode", help="rank sweep: weak (default: batch per rank fixed) | strong (global batch fixed)"
    )
    sw.add_argument(
        "--knob",
        metavar="NAME=V1,V2,...",
        help="one record per value of a numeric knob of the workload (batch_size, seq_len, width, ...), "
        "at one rank count; stops at the first value that does not fit the device (with --fit and "
        "batch_size: in that fraction of its memory)",
    )
    sw.add_argument("--prefix", default="sweep", help="record name prefix, a plain name (default: sweep)")
    sw.add_argument("--redo", action="store_true", help="rerun points that already have a valid record")
    sw.add_argument(
        "--power-limit",
        dest="power_limit",
        metavar="W,...",
        help="one record per power cap: GPUs through NVML, else the CPU packages' RAPL limit (needs --steps)",
    )
    sw.add_argument(
        "--clock-limit",
        dest="clock_limit",
        metavar="MHz,...",
        help="one record per clock cap: GPU locked clocks, else the CPUs' scaling_max_freq (needs --steps)",
    )
    sw.set_defaults(func=cmd_sweep)
