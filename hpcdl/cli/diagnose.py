"""``hpcdl diagnose``: which device, node or link is below its peers, measured now (here, or
as N MPI ranks) or read from an existing multi-rank record; an ``--exclude`` list for sbatch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hpcdl.cli.common import ranks_fit_here
from hpcdl.errors import InputError
from hpcdl.parallel.launch import launch
from hpcdl.parallel.world import init_world, under_mpi
from hpcdl.results import diagnosis


def cmd_diagnose(args: argparse.Namespace) -> int:
    from hpcdl.workloads.precision import PRECISIONS  # the precision table holds torch's dtypes

    threshold = diagnosis.check_threshold(args.threshold)  # refused before any rank starts
    baseline = diagnosis.load_baseline(Path(args.baseline)) if args.baseline else None
    if args.precision not in PRECISIONS:
        raise InputError("precision", args.precision, "allowed: " + ", ".join(PRECISIONS))
    if not args.seconds > 0:
        raise InputError("seconds", args.seconds, "seconds per figure, > 0")
    about: dict[str, Any] = {"precision": args.precision, "baseline": args.baseline}
    if args.record:
        measured = diagnosis.from_record(Path(args.record))
    else:
        if args.np > 1 and not under_mpi():
            ranks_fit_here(args.np)
            return launch(args.np, args.argv, timeout_s=args.timeout)
        from hpcdl.harness.runner import rank_device
        from hpcdl.measure.config import RunConfig
        from hpcdl.measure.diagnose import measure

        world = init_world()
        found = measure(
            world, rank_device(RunConfig(device=args.device), world), args.precision, args.seconds
        )
        if found is None:  # not rank 0
            return 0
        measured = found
        about["world_size"] = world.size
    doc = diagnosis.diagnosis(measured, threshold, baseline, **about)
    if args.output:
        diagnosis.write(doc, Path(args.output))
    print(diagnosis.report(doc))
    if args.report:
        from hpcdl.results.report.diagnosis import write_diagnosis_page

        print(f"report: wrote {write_diagnosis_page(doc, Path(args.report), 'diagnose.report')}")
    return 1 if doc["flags"] else 0


def add_parsers(sub: Any) -> None:
    d = sub.add_parser(
        "diagnose",
        help="name the device, node or link below its peers; print an sbatch --exclude list",
    )
    d.add_argument("--np", type=int, default=1, help="ranks to start here through mpirun (default 1)")
    d.add_argument("--precision", default="fp32", help="GEMM precision, as workloads name it (default fp32)")
    d.add_argument("--device", default="auto", help="auto (GPU local_rank if any), cpu, cuda")
    d.add_argument("--seconds", type=float, default=1.0, help="seconds per device figure (default 1)")
    d.add_argument(
        "--threshold",
        type=float,
        default=diagnosis.DEFAULT_THRESHOLD,
        help="flag figures below this fraction of the median (or the baseline), in (0,1); default 0.9",
    )
    d.add_argument(
        "--baseline", metavar="FILE", help="compare with an earlier diagnosis (-o) instead of the median"
    )
    d.add_argument(
        "--record", metavar="FILE", help="analyse a multi-rank record's per-rank compute-only times"
    )
    d.add_argument("-o", "--output", metavar="FILE", help="write the diagnosis as JSON")
    d.add_argument(
        "--report", metavar="DIR", help="write its page, DIR/index.html (later: hpcdl report FILE -o DIR)"
    )
    d.add_argument("--timeout", type=float, default=None, help="end the ranks after this many seconds")
    d.set_defaults(func=cmd_diagnose)
