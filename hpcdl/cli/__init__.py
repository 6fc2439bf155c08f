"""The ``hpcdl`` command line. Bad input prints one line and exits with code 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from hpcdl import metrics
from hpcdl.cli import results as cli_results
from hpcdl.cli.common import Parser, add_workload_options, err, workload_specs
from hpcdl.errors import HpcdlError, SpecError
from hpcdl.measure import hdf5 as h5data
from hpcdl.measure.config import RunConfig
from hpcdl.measure.device import device_name, memory_capacity, resolve_device
from hpcdl.measure.environment import availability, environment
from hpcdl.measure.peaks import datasheet_peak, matmul_probe
from hpcdl.measure.runner import RunResult, preflight, rank_device, run
from hpcdl.parallel.launch import launch
from hpcdl.parallel.world import World, end_all_ranks, init_world, rank_of_process, under_mpi
from hpcdl.records import schema
from hpcdl.records.store import seal, write_record
from hpcdl.results.text import si, table
from hpcdl.scaling import sweep as sweep_mod
from hpcdl.workloads.precision import PRECISIONS
from hpcdl.workloads.registry import FAMILIES, family_class, parse_assignments, spec_from_args

# command-line flag -> RunConfig knob
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
}


def run_config(args: argparse.Namespace) -> RunConfig:
    values = {
        knob: RunConfig.parse_knob(knob, str(getattr(args, flag)))
        for flag, knob in RUN_FLAGS.items()
        if getattr(args, flag) is not None
    }
    return RunConfig.from_dict(values)


def summary_rows(results: dict[str, RunResult]) -> list[list[str]]:
    rows = []
    for name, res in results.items():
        m, c = res.record["metrics"], res.record["counts"]
        st = m["step_time_s"]
        rows.append(
            [
                name,
                si(c["params"]),
                si(m["train_flops_per_sample"], "FLOP"),
                f"{m['samples_per_s']:.1f}",
                si(m["ai_ops_per_s"], "FLOP/s"),
                f"{st['median'] * 1e3:.1f} ({st['p10'] * 1e3:.1f}-{st['p90'] * 1e3:.1f})",
                f"{m['mfu'] * 100:.1f}%",
                "yes" if res.passed else "NO",
            ]
        )
    return rows


def cmd_run(args: argparse.Namespace) -> int:
    specs = workload_specs(args)
    cfg = run_config(args)
    if len(specs) > 1 and args.duration is None and args.steps is None:
        cfg = cfg.replace(duration_s=12.0)  # the default suite: ~2 minutes on a 2-core CPU
    for spec in specs.values():
        preflight(spec, cfg, World(size=args.np))  # refuse bad input before anything is measured
    if args.np > 1 and not under_mpi():
        return launch(args.np, args.argv, timeout_s=args.timeout)
    world = init_world()
    say = err if world.rank == 0 else (lambda _m: None)
    out = Path(args.output)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stamp = world.bcast(stamp)
    results: dict[str, RunResult] = {}
    for i, (name, spec) in enumerate(specs.items(), 1):
        prefix = f"[{i}/{len(specs)}] {name}"
        params = si(spec.count().params)
        say(
            f"{prefix}: {spec.family}, {params} params, {spec.precision}, "
            f"batch {spec.batch_size}/rank x {world.size} ranks"
        )

        def progress(message: str, prefix: str = prefix) -> None:
            err(f"{prefix}: {message}")

        record_name = args.name if args.name and len(specs) == 1 else f"{stamp}-{name}"
        res = run(spec, cfg, output_dir=out, name=record_name, progress=progress, world=world)
        results[name] = res
        say(f"{prefix}: {res.metrics['samples_per_s']:.1f} samples/s -> {res.path}")
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
    first = next(iter(results.values())).record["metrics"]
    print(f"MFU is against {si(first['peak_flops'], 'FLOP/s')} ({first['peak_source']}). Records in {out}/")
    if len(results) > 1:
        summary = {
            "schema": schema.SUITE,
            "created": stamp,
            "records": {n: r.path.name if r.path else None for n, r in results.items()},
        }
        write_record(summary, out / f"{stamp}-suite.json")
    return 0 if all(r.passed for r in results.values()) else 1


def cmd_sweep(args: argparse.Namespace) -> int:
    specs = workload_specs(args)
    if len(specs) != 1:
        raise SpecError(
            "sweep", "default suite", "a sweep takes one workload: --workload FAMILY or --preset NAME"
        )
    try:
        nps = [int(x) for x in args.np.split(",") if x]
    except ValueError:
        raise SpecError("sweep.np", args.np, "expected rank counts like 1,2,4") from None
    if not nps or min(nps) < 1:
        raise SpecError("sweep.np", args.np, "expected rank counts >= 1, like 1,2,4")
    cfg = run_config(args)
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
    summary = sweep_mod.sweep(
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
    return 0 if all(p["record"] for p in summary["points"]) else 1


def cmd_comm(args: argparse.Namespace) -> int:
    """Allreduce sweep through the backend and raw mpi4py, side by side."""
    from hpcdl.parallel.backends import make_backend, resolve_backend_name
    from hpcdl.parallel.commbench import DEFAULT_SIZES, allreduce_sweep

    if args.np > 1 and not under_mpi():
        return launch(args.np, args.argv, timeout_s=args.timeout)
    world = init_world()
    cfg = RunConfig.from_dict(
        {
            "backend": RunConfig.parse_knob("backend", args.backend),
            "device": RunConfig.parse_knob("device", args.device),
        }
    )
    name = resolve_backend_name(cfg.backend, world.size)
    if world.size < 2:
        raise SpecError("np", world.size, "an allreduce benchmark needs at least 2 ranks (--np 2)")
    device = rank_device(cfg, world)
    backend = make_backend(name, world, device)
    try:
        sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
        rows = allreduce_sweep(world, backend, device, sizes, reps=args.reps)
    finally:
        backend.close()
    if rows is None:
        return 0
    result = {"ranks": world.size, "backend": name, "rows": rows}
    if args.output:
        record = seal(
            {
                "schema": schema.COMM,
                "schema_version": 1,
                "created": datetime.now(UTC).isoformat(timespec="seconds"),  # as result records
                **result,
                "reps": args.reps,
                "environment": environment(device),
            }
        )
        err(f"wrote {write_record(record, args.output)}")
    if args.json:
        print(json.dumps(result, indent=1))
        return 0 if all(r["wrong"] == 0 for r in rows) else 1
    print(f"allreduce, {world.size} ranks, {name} vs raw mpi4py (median of {args.reps}, slowest rank)")
    print(
        table(
            ["bytes", f"{name} us", "algbw", "busbw", "mpi us", "algbw", "busbw", "ratio busbw", "#wrong"],
            [
                [
                    si(r["bytes"], "B"),
                    f"{r['backend_s'] * 1e6:.1f}",
                    si(r["backend_algbw"], "B/s"),
                    si(r["backend_busbw"], "B/s"),
                    f"{r['mpi_s'] * 1e6:.1f}",
                    si(r["mpi_algbw"], "B/s"),
                    si(r["mpi_busbw"], "B/s"),
                    f"{r['backend_busbw'] / r['mpi_busbw']:.2f}",
                    str(r["wrong"]),
                ]
                for r in rows
            ],
        )
    )
    return 0 if all(r["wrong"] == 0 for r in rows) else 1


def cmd_generate(args: argparse.Namespace) -> int:
    import generators

    if args.sample is not None:
        fixed = parse_assignments(family_class(args.family), args.knobs)
        spec = generators.sample_spec(args.family, args.sample, **fixed)
    elif args.family in generators.PRESETS:
        base = generators.preset(args.family)
        spec = generators.preset(args.family, **parse_assignments(type(base), args.knobs))
    else:
        spec = spec_from_args(args.family, args.knobs)
    c = spec.count()
    act = c.activation_bytes(spec.precision)
    info: dict[str, Any] = {
        "spec": spec.to_dict(),
        "params": c.params,
        "forward_flops_per_sample": c.forward_flops,
        "train_flops_per_sample": c.train_flops,
        "activation_bytes_per_sample": act,
        "memory_estimate_bytes": {
            opt: metrics.memory_estimate(c.params, act, spec.batch_size, opt) for opt in ("adamw", "sgd")
        },
    }
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    if args.print_model:
        print(spec.build())
    print(table(["knob", "value"], [[k, str(v)] for k, v in spec.to_dict().items()], numeric=False))
    print()
    print(
        table(
            ["figure", "value"],
            [
                ["parameters", f"{c.params:,}"],
                ["forward FLOPs / sample", f"{c.forward_flops:,} ({si(c.forward_flops / 2, 'MAC')})"],
                [
                    "training FLOPs / sample",
                    f"{c.train_flops:,} ({c.train_flops / max(c.forward_flops, 1):.2f}x fwd)",
                ],
                ["activations / sample", si(act, "B")],
                [f"memory, batch {spec.batch_size} (AdamW)", si(info["memory_estimate_bytes"]["adamw"], "B")],
            ],
            numeric=False,
        )
    )
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    env = environment(device)
    rows = [[k, str(v)] for k, v in env.items() if k not in ("gpus",)]
    rows.append(["gpus", ", ".join(env["gpus"]) or "none"])
    rows.append(["memory available", si(memory_capacity(device), "B")])
    for prec in PRECISIONS:
        sheet = datasheet_peak(device_name(device), prec)
        rows.append(
            [
                f"datasheet peak {prec}",
                f"{si(sheet.flops, 'FLOP/s')} ({sheet.source})" if sheet else "unknown",
            ]
        )
        if args.probe:
            rows.append([f"measured matmul {prec}", si(matmul_probe(device, prec), "FLOP/s")])
    for name, where in availability().items():
        rows.append([name, where or "not found"])
    print(table(["item", "value"], rows, numeric=False))
    return 0


def cmd_io(args: argparse.Namespace) -> int:
    spec = spec_from_args(args.family, args.knobs)
    w = h5data.write_shards(spec, args.dir, batches=args.batches, shards=args.shards)
    r = h5data.read_throughput(args.dir, args.workers, epochs=args.epochs)
    print(
        table(
            ["path", "samples", "bytes", "seconds", "samples/s", "bytes/s"],
            [
                [
                    p,
                    str(s.samples),
                    si(s.bytes, "B"),
                    f"{s.seconds:.3f}",
                    f"{s.samples_per_s:.1f}",
                    si(s.bytes_per_s, "B/s"),
                ]
                for p, s in (("write", w), ("read", r))
            ],
        )
    )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    import generators

    for family, cls in FAMILIES.items():
        print(f"{family}: {(cls.__doc__ or '').strip().splitlines()[0]}")
        for name, f in cls.knobs().items():
            print(f"  {name} = {f.default!r:<12} {f.metadata['doc']}")
    print("\npresets: " + ", ".join(generators.PRESETS))
    print("default suite: " + ", ".join(generators.DEFAULT_SUITE))
    return 0


def status_table(rows: Sequence[Any]) -> str:
    return table(
        ["point", "nodes", "ranks", "job id", "state", "detail"],
        [[r.name, str(r.nodes), str(r.ranks), r.job_id or "-", r.state, r.detail] for r in rows],
        numeric=False,
    )


def cmd_submit(args: argparse.Namespace) -> int:
    """One Slurm job per node count of a job file (see hpcdl/submit.py)."""
    from hpcdl.schedulers import submit as submit_mod
    from hpcdl.schedulers.jobfile import load_job

    job = load_job(args.jobfile)
    submit_mod.preflight_job(job)
    out = job.output_dir()
    if args.dry_run:
        for n in sorted(job.nodes):
            layout = f"{n} node(s) x {job.tasks_per_node} task(s)"
            print(f"# ---- {job.point_name(n)}: {layout}, not submitted (--dry-run)")
            print(submit_mod.sbatch_script(job, n, out))
        return 0
    done = submit_mod.submit(
        job, executor=args.executor, redo=args.redo, job_file=str(Path(args.jobfile).resolve())
    )
    print(f"records: {out}/{job.name}-n<nodes>.json; state: {submit_mod.state_path(out)}")
    names = [d.point.name for d in done]
    if any(d.point.cluster == "local" for d in done):
        rows = submit_mod.status(out, names)  # the local executor has run them already
    elif args.wait:
        rows = submit_mod.wait(out, names)
    else:
        print(f"follow with: hpcdl status {out}")
        return 0
    print(status_table(rows))
    return 0 if all(r.state == "done" for r in rows) else 1


def cmd_status(args: argparse.Namespace) -> int:
    from hpcdl.schedulers import submit as submit_mod

    rows = submit_mod.status(Path(args.dir))
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=1))
    else:
        print(status_table(rows))
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    from hpcdl.schedulers import submit as submit_mod

    out = Path(args.dir)
    points = submit_mod.collect(out)["points"]
    rows = [
        [
            p["point"],
            str(p["nodes"]),
            str(p["ranks"]),
            f"{p['samples_per_s']:.1f}" if "record" in p else p["state"],
            f"{p['speedup']:.2f}" if "record" in p else "",
            f"{p['efficiency'] * 100:.1f}%" if "record" in p else "",
            p.get("record", ""),
        ]
        for p in points
    ]
    print(table(["point", "nodes", "ranks", "samples/s", "speed-up", "weak efficiency", "record"], rows))
    have = sum("record" in p for p in points)
    print(f"{have} of {len(points)} points have a valid record -> {out / submit_mod.COLLECTED_FILE}")
    return 0


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
    r.add_argument("--timeout", type=float, help="end a multi-rank run that takes longer than this (seconds)")


def build_parser() -> Parser:
    p = Parser(prog="hpcdl", description="Benchmark a system on generated deep-learning training workloads.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    r = sub.add_parser("run", help="measure the default suite, one workload, or a preset")
    add_workload_options(r)
    add_run_options(r)
    r.add_argument("--np", type=int, default=1, help="ranks to start on this machine with mpirun (default 1)")
    r.add_argument("--name", help="record file stem (one workload only)")
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
    sw.set_defaults(func=cmd_sweep)

    gen = sub.add_parser("generate", help="print a workload's size, FLOPs and memory without running it")
    gen.add_argument("family", help="a family (cnn, rnn, attention, mlp, speech) or a preset name")
    gen.add_argument("knobs", nargs="*", help="key=value knob settings")
    gen.add_argument(
        "--sample", type=int, metavar="SEED", help="draw the architecture from the family's ranges"
    )
    gen.add_argument("--json", action="store_true", help="print JSON")
    gen.add_argument("--print-model", action="store_true", help="also print the torch module")
    gen.set_defaults(func=cmd_generate)

    i = sub.add_parser("info", help="devices, peaks, and which optional parts are installed")
    i.add_argument("--device", default="auto")
    i.add_argument("--probe", action="store_true", help="also measure matmul FLOP/s in each precision")
    i.set_defaults(func=cmd_info)

    io = sub.add_parser("io", help="HDF5 write and read throughput of a workload's samples")
    io.add_argument("--dir", required=True, help="directory for the shards")
    io.add_argument("--batches", type=int, default=32)
    io.add_argument("--shards", type=int, default=4)
    io.add_argument("--workers", type=int, default=2)
    io.add_argument("--epochs", type=int, default=1)
    io.add_argument("family", nargs="?", default="cnn", choices=list(FAMILIES))
    io.add_argument("knobs", nargs="*")
    io.set_defaults(func=cmd_io)

    cm = sub.add_parser("comm", help="allreduce bandwidth sweep: the backend against raw MPI")
    cm.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    cm.add_argument("--backend", default="auto", help="auto | horovod | torch")
    cm.add_argument("--device", default="auto")
    cm.add_argument("--sizes", help="comma-separated buffer sizes in bytes (default 1 KiB .. 64 MiB)")
    cm.add_argument("--reps", type=int, default=10)
    cm.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    cm.add_argument("-o", "--output", help="also write the sweep as a record (input of hpcdl predict)")
    cm.add_argument("--timeout", type=float)
    cm.set_defaults(func=cmd_comm)

    sb = sub.add_parser("submit", help="submit a job file to Slurm: one job per node count (submitit)")
    sb.add_argument("jobfile", help="TOML job file (see jobs/)")
    sb.add_argument(
        "--dry-run", action="store_true", help="print the sbatch script of each point; submit nothing"
    )
    sb.add_argument("--wait", action="store_true", help="wait until every point has ended, then show status")
    sb.add_argument(
        "--executor", default="auto", help="auto (slurm where sbatch is on PATH, else local) | slurm | local"
    )
    sb.add_argument("--redo", action="store_true", help="submit points that already have a valid record")
    sb.set_defaults(func=cmd_submit)

    st = sub.add_parser("status", help="state of each submitted point: done, queued, running, failed and why")
    st.add_argument("dir", help="the job's output directory (holds hpcdl-jobs.json)")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.set_defaults(func=cmd_status)

    co = sub.add_parser("collect", help="gather the valid records of a job's points into collected.json")
    co.add_argument("dir", help="the job's output directory (holds hpcdl-jobs.json)")
    co.set_defaults(func=cmd_collect)

    cli_results.add_parsers(sub)

    lst = sub.add_parser("list", help="families and their knobs, presets, the default suite")
    lst.set_defaults(func=cmd_list)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value words after options (``generate cnn --json layers=3``) are knobs too
    words = [w for w in extra if "=" in w and not w.startswith("-")]
    if len(words) < len(extra) or (words and not hasattr(args, "knobs")):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if words:
        args.knobs = [*args.knobs, *words]
    args.argv = argv
    if isinstance(getattr(args, "np", None), int) and args.np < 1:
        err(f"hpcdl: error: np={args.np} is invalid: must be >= 1")
        return 2
    try:
        return int(args.func(args))
    except HpcdlError as e:
        if rank_of_process() == 0:  # every rank meets the same bad input: say it once
            err(f"hpcdl: error: {e}")
        return 2
    except torch.OutOfMemoryError as e:  # before Exception, which it is one of
        err(f"hpcdl: error: out of device memory ({str(e).splitlines()[0]}); lower batch_size")
        return 2
    except BrokenPipeError:  # output piped into `head`: not an error of the run
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except Exception as e:
        end_all_ranks(e)  # under MPI: name this rank, end every rank rather than let them hang
        raise
    except KeyboardInterrupt:
        err("hpcdl: interrupted; records already written are kept")
        return 130


if __name__ == "__main__":
    sys.exit(main())
