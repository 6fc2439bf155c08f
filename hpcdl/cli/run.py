"""``hpcdl run`` and ``hpcdl sweep``: measure workloads on this machine or as MPI ranks."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch

from hpcdl.cli.common import add_workload_options, err, suite_class, workload_specs
from hpcdl.cli.progress import LiveLine
from hpcdl.errors import InputError
from hpcdl.measure import caps
from hpcdl.measure.config import RunConfig
from hpcdl.measure.device import resolve_device
from hpcdl.measure.peaks import has_bf16
from hpcdl.measure.runner import RunResult, preflight, run
from hpcdl.parallel.launch import launch
from hpcdl.parallel.world import World, init_world, under_mpi
from hpcdl.records import mllog, repeats, schema
from hpcdl.records.store import read_steps, write_record
from hpcdl.records.views import Target
from hpcdl.results.text import mfu_text, si, table
from hpcdl.scaling import capsweep
from hpcdl.scaling import sweep as sweep_mod
from hpcdl.workloads import recipes
from hpcdl.workloads.spec import Spec

RUN_FLAGS = {
    "warmup": "warmup_steps",
    "steps": "steps",
    "duration": "duration_s",
    "min_duration": "min_duration_s",
    "data": "data",
    "data_dir": "data_dir",
    "workers": "data_workers",
    "optimizer": "optimizer",
    "lr": "lr",
    "device": "device",
    "peak_flops": "peak_flops",
    "backend": "backend",
    "fit": "fit_fraction",
    "stall": "stall_s",
    "target_loss_fraction": "target_loss_fraction",
}


def run_config(args: argparse.Namespace) -> RunConfig:
    values = {
        knob: RunConfig.parse_knob(knob, str(getattr(args, flag)))
        for flag, knob in RUN_FLAGS.items()
        if getattr(args, flag) is not None
    }
    if args.fit is not None and not 0 < values["fit_fraction"] <= 1:
        raise InputError("fit", args.fit, "a fraction of the device's memory in (0, 1], e.g. 0.8")
    target = args.target_loss_fraction
    if target is not None and not 0 < values["target_loss_fraction"] < 1:
        raise InputError("target-loss-fraction", target, "a fraction of the first loss in (0, 1), e.g. 0.5")
    if target is not None and args.min_duration is None:
        values["min_duration_s"] = 0.0  # a time to target is as short as the target makes it
    return RunConfig.from_dict(values)


def gpus_for(local: World, cfg: RunConfig) -> None:
    """Ranks started here share this host's GPUs: one each, or a one-line refusal."""
    device = resolve_device(cfg.device)
    if device.type != "cuda" or local.local_size == 1:
        return
    if device.index is not None:
        raise InputError("device", cfg.device, "several ranks cannot share one GPU; use auto or cuda")
    if local.local_size > torch.cuda.device_count():
        visible = torch.cuda.device_count()
        raise InputError("np", local.local_size, f"{visible} GPU(s) visible here: at most one rank per GPU")


def class_run(
    args: argparse.Namespace, specs: dict[str, Spec], cfg: RunConfig
) -> tuple[dict[str, Spec], RunConfig]:
    """For a size class's suite: the class and version in the run settings, and bf16 where the
    hardware computes it, fp32 elsewhere (said, and recorded in each record's precision)."""
    size_class = suite_class(args)
    if not size_class:
        return specs, cfg
    cfg = cfg.replace(suite_class=size_class, suite_version=recipes.suite(size_class).version)
    device = resolve_device(cfg.device)
    if any(s.precision == "bf16" for s in specs.values()) and not has_bf16(device):
        err(f"class {size_class}: {device} has no bf16 arithmetic; running its bf16 workloads in fp32")
        specs = {n: s.replace(precision="fp32") if s.precision == "bf16" else s for n, s in specs.items()}
    return specs, cfg


def summary_rows(results: dict[str, RunResult]) -> list[list[str]]:
    rows = []
    for name, res in results.items():
        view = res.result
        m, st = view.metrics, view.metrics.step_time_s
        rows.append(
            [
                name,
                si(view.counts.params),
                si(m.train_flops_per_sample, "FLOP"),
                f"{m.samples_per_s:.1f}",
                si(m.ai_ops_per_s, "FLOP/s"),
                f"{st.median * 1e3:.1f} ({st.p10 * 1e3:.1f}-{st.p90 * 1e3:.1f})",
                mfu_text(m.mfu, m.flags),
                "yes" if view.validity.passed else "NO",
            ]
        )
    return rows


def cmd_run(args: argparse.Namespace) -> int:
    specs, cfg = class_run(args, workload_specs(args), run_config(args))
    if len(specs) > 1 and args.duration is None and args.steps is None:
        cfg = cfg.replace(duration_s=12.0)  # the default suite: ~2 minutes on a 2-core CPU
    if args.repeat < 1:
        raise InputError("repeat", args.repeat, "runs of each workload, >= 1")
    local = World(size=args.np, local_size=1 if under_mpi() else args.np)  # --np: all ranks here
    for spec in specs.values():
        preflight(spec, cfg, local)  # refuse bad input before anything is measured
    if args.mllog:
        check_log(Path(args.mllog))
    if not under_mpi():
        gpus_for(local, cfg)
    if args.np > 1 and not under_mpi():
        return launch(args.np, args.argv, timeout_s=args.timeout)
    world = init_world()
    say = err if world.rank == 0 else (lambda _m: None)
    out = Path(args.output)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stamp = world.bcast(stamp)
    results: dict[str, RunResult] = {}
    runs = [(name, spec, r) for name, spec in specs.items() for r in range(1, args.repeat + 1)]
    for i, (name, spec, r) in enumerate(runs, 1):
        label = repeats.repeat_name(name, r, args.repeat)
        prefix = f"[{i}/{len(runs)}] {label}"
        params = si(spec.count().params)
        say(
            f"{prefix}: {spec.family}, {params} params, {spec.precision}, "
            f"batch {spec.batch_size}/rank x {world.size} ranks"
        )
        base = args.name if args.name and len(specs) == 1 else f"{stamp}-{name}"
        started = time.time()
        with LiveLine(prefix, cfg.steps, cfg.duration_s) as line:
            res = run(
                spec,
                cfg,
                output_dir=out,
                name=repeats.repeat_name(base, r, args.repeat),
                progress=line.say,
                world=world,
                ticks=line.timed,
            )
        results[label] = res
        say(f"{prefix}: {res.result.metrics.samples_per_s:.1f} samples/s -> {res.path}")
        if args.mllog and world.rank == 0 and res.steps_path is not None:
            mllog.append(Path(args.mllog), mllog.run_lines(res.result, read_steps(res.steps_path), started))
    if world.rank != 0:
        return 0  # rank 0 reports, and its exit code is the run's
    headers = [
        "workload",
        "params",
        "train/sample",
        "samples/s",
        "AI-ops/s",
        "step ms med (p10-p90)",
        "MFU",
        "valid",
    ]
    print(table(headers, summary_rows(results)))
    for name, res in results.items():
        for flag in res.result.metrics.flags:
            print(f"(!) {name}: {flag}")
        if (target := res.result.metrics.target) is not None:
            print(f"{name}: {target_text(target)}")
    first = next(iter(results.values())).result.metrics
    print(f"MFU is against {si(first.peak_flops, 'FLOP/s')} ({first.peak_source}). Records in {out}/")
    if args.repeat > 1:
        print(repeat_table(specs, results, args.repeat, out, stamp))
    if len(results) > 1:
        summary = {
            "schema": schema.SUITE,
            "created": stamp,
            "records": {n: r.path.name if r.path else None for n, r in results.items()},
        }
        write_record(summary, out / f"{stamp}-suite.json")
    return 0 if all(r.passed for r in results.values()) else 1


def check_log(path: Path) -> None:
    """Refuse a log file that cannot be appended to, before anything is measured."""
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise InputError("mllog", str(path), f"a file hpcdl can append to ({e.strerror or e})") from None


def target_text(target: Target) -> str:
    """Time to target in words, for the run's summary."""
    fall = f"loss {target.loss_first:.4g} -> {target.loss_final:.4g}"
    if target.time_to_target_s is None or target.samples_to_target is None:
        return f"target {target.fraction:g} of the first loss not reached within the limit ({fall})"
    return (
        f"reached {target.fraction:g} of the first loss in {target.time_to_target_s:.3g} s, "
        f"{target.samples_to_target} samples ({fall})"
    )


def repeat_table(specs: dict[str, Spec], results: dict[str, RunResult], n: int, out: Path, stamp: str) -> str:
    """Write each workload's repeats summary (records/repeats.py) and return them as a table."""
    rows = []
    for name in specs:
        views = [results[repeats.repeat_name(name, r, n)].result for r in range(1, n + 1)]
        summary = repeats.summarize(name, views)
        write_record(summary, out / f"{stamp}-{name}-repeats.json")
        x = summary["samples_per_s"]
        row = [name, str(n), f"{x['olympic_mean']:.1f}", f"{x['median']:.1f}", f"{x['spread']:.1%}"]
        t = summary.get("time_to_target_s")
        row.append(f"{t['olympic_mean']:.3g} s ({summary['targets_reached']}/{n})" if t else "")
        rows.append(row)
    head = ["workload", "runs", "olympic mean samples/s", "median", "spread", "time to target (reached)"]
    return table(head, rows)


def cmd_sweep(args: argparse.Namespace) -> int:
    specs = workload_specs(args)
    if len(specs) != 1:
        raise InputError(
            "sweep", "default suite", "a sweep takes one workload: --workload FAMILY or --preset NAME"
        )
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
    run_args = [
        f"--{flag.replace('_', '-')}={getattr(args, flag)}"
        for flag in RUN_FLAGS
        if getattr(args, flag) is not None
    ]
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


def cap_values(args: argparse.Namespace, nps: list[int]) -> tuple[str, list[float]] | None:
    """``--power-limit`` or ``--clock-limit`` as (kind, caps), or None; one line for bad input
    (a cap sweep runs the same work, ``--steps``, at one rank count)."""
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
    if args.steps is None:
        raise InputError("steps", None, "a cap sweep compares the same work at every cap: give --steps N")
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


def add_run_options(r: argparse.ArgumentParser) -> None:
    """Options shared by ``run`` and ``sweep``."""
    r.add_argument("-o", "--output", default="results", help="directory for records (default: results)")
    r.add_argument("--warmup", help="untimed warm-up steps (default 3)")
    r.add_argument("--steps", help="timed steps (default: as many as fit in --duration)")
    r.add_argument(
        "--duration", help="timed window in seconds when --steps is not given (default 10; suite 12)"
    )
    r.add_argument(
        "--min-duration", dest="min_duration", help="validity: shortest valid timed window (default 1)"
    )
    r.add_argument("--data", help="random | learnable (default) | hdf5")
    r.add_argument("--data-dir", dest="data_dir", help="HDF5 shard directory for --data hdf5")
    r.add_argument("--workers", help="DataLoader workers for --data hdf5 (default 2)")
    r.add_argument("--optimizer", help="adamw (default) | sgd")
    r.add_argument("--lr", help="learning rate (default 1e-3)")
    r.add_argument("--device", help="auto (default) | cpu | cuda | cuda:N")
    r.add_argument(
        "--peak-flops", dest="peak_flops", help="peak FLOP/s for MFU (default: datasheet, else probe)"
    )
    r.add_argument("--backend", help="gradient reduction: auto (default) | horovod | torch")
    r.add_argument(
        "--stall",
        metavar="S",
        help="end a multi-rank run when a rank makes no step for max(S, 20 x median step) s (default 120)",
    )
    r.add_argument(
        "--fit",
        nargs="?",
        const="0.8",
        metavar="FRACTION",
        help="size each workload's batch per rank to fill this fraction of the device memory (default 0.8)",
    )
    r.add_argument("--timeout", type=float, help="end a multi-rank run that takes longer than this (seconds)")
    r.add_argument(
        "--target-loss-fraction",
        dest="target_loss_fraction",
        metavar="Q",
        help="time to target: end the timed window once the loss has fallen to Q of the first timed step's "
        "(learnable data; --steps or --duration stay the limit)",
    )


def add_parsers(sub: Any) -> None:
    r = sub.add_parser("run", help="measure the default suite, one workload, or a preset")
    add_workload_options(r)
    add_run_options(r)
    r.add_argument("--np", type=int, default=1, help="ranks to start on this machine with mpirun (default 1)")
    r.add_argument("--name", help="record file stem (one workload only)")
    r.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run each workload N times (records NAME-r1 ...): olympic mean, median and spread",
    )
    r.add_argument("--mllog", metavar="FILE", help="append MLPerf-style :::MLLOG lines of every run to FILE")
    r.set_defaults(func=cmd_run)

    sw = sub.add_parser("sweep", help="weak or strong scaling over rank counts, one record per point")
    add_workload_options(sw)
    add_run_options(sw)
    sw.add_argument("--np", required=True, help="rank counts, e.g. 1,2,4")
    sw.add_argument(
        "--mode", default="weak", help="weak (batch per rank fixed) | strong (global batch fixed)"
    )
    sw.add_argument("--prefix", default="sweep", help="record name prefix (default: sweep)")
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
