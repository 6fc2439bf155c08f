"""``hpcdl comm``: collective-communication sweeps through a backend against raw MPI (allreduce,
all-gather, reduce-scatter, all-to-all), kept for the scaling model."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from hpcdl.cli.common import err, ranks_fit_here
from hpcdl.errors import InputError
from hpcdl.parallel.launch import launch, not_stopped
from hpcdl.parallel.world import init_world, under_mpi
from hpcdl.records import schema
from hpcdl.records.store import seal, write_record
from hpcdl.results.text import si, table

MAX_BUFFER = 1 << 34
"""16 GiB: larger buffers are a typo, not a benchmark"""


def buffer_sizes(text: str) -> list[int]:
    """``--sizes``: comma-separated byte counts, each from 4 (one float) to 16 GiB."""
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or not all(4 <= s <= MAX_BUFFER for s in sizes):
        raise InputError(
            "sizes", text, "comma-separated byte counts from 4 to 17179869184, e.g. 1024,1048576"
        )
    return sizes


def collectives_arg(text: str) -> list[str]:
    """``--collective``: comma-separated names, or ``all``."""
    from hpcdl.parallel.backends import COLLECTIVES

    names = list(COLLECTIVES) if text == "all" else [x for x in text.split(",") if x]
    for name in names:
        if name not in COLLECTIVES:
            raise InputError("comm.collective", name, "allowed: all, " + ", ".join(COLLECTIVES))
    return names


def cmd_comm(args: argparse.Namespace) -> int:
    """Collective sweeps through the backend and raw mpi4py, side by side."""
    from hpcdl.harness.runner import rank_device
    from hpcdl.measure.config import RunConfig
    from hpcdl.measure.environment import environment
    from hpcdl.parallel.backends import make_backend, resolve_backend_name
    from hpcdl.parallel.commbench import default_sizes, sweep

    collectives = collectives_arg(args.collective)
    sizes = buffer_sizes(args.sizes) if args.sizes else None  # checked before any rank starts
    if args.reps < 1:
        raise InputError("reps", args.reps, "timed repetitions per size: an integer >= 1")
    if args.np > 1 and not under_mpi():
        ranks_fit_here(args.np)
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
        raise InputError("np", world.size, "a collective benchmark needs at least 2 ranks (--np 2)")
    device = rank_device(cfg, world)
    sizes = sizes or default_sizes(device)
    backend = make_backend(name, world, device)
    try:
        rows = [r for c in collectives for r in sweep(world, backend, device, c, sizes, args.reps) or []]
    finally:
        backend.close()
    if world.rank != 0:
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
        not_stopped()  # the stop rule of records: only while the launcher still wants it
        err(f"wrote {write_record(record, args.output)}")
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for c in collectives:
            print(f"{c}, {world.size} ranks, {name} vs raw mpi4py (median of {args.reps}, slowest rank)")
            print(comm_table(name, [r for r in rows if r["collective"] == c]))
    return 0 if all(r["wrong"] == 0 for r in rows) else 1


def comm_table(name: str, rows: list[dict[str, Any]]) -> str:
    return table(
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


def add_parsers(sub: Any) -> None:
    cm = sub.add_parser(
        "comm", help="collective bandwidth sweeps (allreduce, all-gather, ...): the backend against raw MPI"
    )
    cm.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    cm.add_argument("--backend", default="auto", help="auto | horovod | torch | fsdp")
    cm.add_argument(
        "--collective",
        default="all",
        help="all (default) or some of allreduce,all_gather,reduce_scatter,all_to_all",
    )
    cm.add_argument("--device", default="auto")
    cm.add_argument("--sizes", help="comma-separated buffer sizes in bytes (default 1 KiB .. 64 MiB)")
    cm.add_argument("--reps", type=int, default=10)
    cm.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    cm.add_argument("-o", "--output", help="also write the sweep as a record (input of hpcdl predict)")
    cm.add_argument("--timeout", type=float)
    cm.set_defaults(func=cmd_comm)
