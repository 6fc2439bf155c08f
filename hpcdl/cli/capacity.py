"""``hpcdl capacity``: M independent instances of one workload at once (harness/capacity.py)."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import Any

from hpcdl.cli.common import add_workload_options, err, workload_specs
from hpcdl.cli.run_options import add_run_options, run_config
from hpcdl.errors import InputError
from hpcdl.parallel.launch import mpirun_command, supervise
from hpcdl.parallel.world import World, under_mpi
from hpcdl.records.store import check_name, check_output
from hpcdl.results.text import si, table


def cmd_capacity(args: argparse.Namespace) -> int:
    from hpcdl.harness import capacity  # imports torch, which --help does without
    from hpcdl.harness.runner import preflight
    from hpcdl.measure.limits import nvml

    specs = workload_specs(args)
    if len(specs) != 1:
        raise InputError(
            "capacity", "default suite", "capacity runs one workload: --workload FAMILY or --preset NAME"
        )
    (spec,) = specs.values()
    cfg = run_config(args)
    layout = capacity.Layout(args.instances, args.ranks_per_instance, args.per_device)
    out = Path(args.output)
    if under_mpi():  # a rank of the job started below (or by a scheduler)
        summary = capacity.run_capacity(spec, cfg, layout, out, args.name, say=err)
        if summary is None:
            return 0
        print(capacity_table(summary))
        return 0 if summary["passed"] else 1
    # the launcher: refuse what cannot run before any rank starts
    preflight(spec, cfg, World(size=layout.ranks_per_instance, local_size=layout.ranks))
    gpus = capacity.gpu_inventory(nvml()) if capacity.on_gpus(cfg.device) else None
    cores = sorted(os.sched_getaffinity(0))
    capacity.place_node(layout, range(layout.ranks), socket.gethostname(), cores, gpus)
    check_name(f"{args.name}-capacity")
    check_output(out)  # last: it creates the directory
    note = capacity.mig_note(gpus, layout.per_device)
    err(f"capacity: {layout.instances} x {layout.ranks_per_instance} rank(s); {note}")
    command = mpirun_command(layout.ranks, ["hpcdl", *args.argv])
    return supervise(command, f"capacity run of {layout.ranks} ranks", args.timeout)


def capacity_table(summary: dict[str, Any]) -> str:
    """Each instance's rate and slowdown against running alone, then the system's figures."""
    rows = [
        [
            str(i["instance"]),
            str(i["seed"]),
            f"{i['samples_per_s']:.1f}",
            f"{i['slowdown']:.2f}x",
            "yes" if i["passed"] else "NO",
            i["record"],
        ]
        for i in summary["instances"]
    ]
    alone = summary["alone"]
    rows.append(["alone", "", f"{alone['samples_per_s']:.1f}", "1.00x", "", alone["record"]])
    head = ["instance", "seed", "samples/s", "slowdown", "valid", "record"]
    return "\n".join(
        [
            table(head, rows),
            f"capacity: {summary['total_samples']} samples in {summary['wall_s']:.3g} s (earliest start "
            f"to latest end) = {summary['samples_per_s']:.1f} samples/s, "
            f"{si(summary['ai_ops_per_s'], 'FLOP/s')}; "
            f"spread over instances {summary['instance_spread']:.1%}",
        ]
    )


def add_parsers(sub: Any) -> None:
    c = sub.add_parser("capacity", help="M independent instances of one workload at once (MLPerf HPC-style)")
    add_workload_options(c)
    add_run_options(c)
    c.add_argument("--instances", type=int, required=True, metavar="M", help="instances running at once")
    c.add_argument(
        "--ranks-per-instance",
        dest="ranks_per_instance",
        type=int,
        default=1,
        metavar="S",
        help="ranks of each (1)",
    )
    c.add_argument(
        "--per-device",
        dest="per_device",
        type=int,
        default=1,
        metavar="K",
        help="instances sharing each device: its cores, a GPU, or a MIG device each where MIG is on (1)",
    )
    c.add_argument("--name", default="capacity", help="record names NAME-iI, NAME-alone (default: capacity)")
    c.set_defaults(func=cmd_capacity)
