"""CLI commands that read result records: ``hpcdl rank``, ``hpcdl report`` (``hpcdl predict``:
``hpcdl.cli.predict``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hpcdl.cli.common import err
from hpcdl.errors import InputError


def cmd_rank(args: argparse.Namespace) -> int:
    from hpcdl.results import ranking as rank_mod  # the audit counts FLOPs with the families: torch
    from hpcdl.results.baseline import compare, load_baseline

    submissions = [rank_mod.parse_submission(a) for a in args.systems]
    baseline = load_baseline(args.baseline) if args.baseline is not None else None  # refused up front
    ranking = rank_mod.rank(submissions, say=err)
    paths = rank_mod.write(ranking, Path(args.output))
    print(rank_mod.terminal_table(ranking))
    for x in ranking.rejected:
        print(f"rejected: {x.path}: {x.reason}")
    print(
        f"{ranking.accepted} records accepted, {len(ranking.rejected)} rejected; wrote "
        + ", ".join(str(p) for p in paths)
    )
    if baseline is None:
        return 0
    passed = True
    for size_class, scores in ranking.lists.items():
        for s in scores:
            check = compare(ranking.records[s.system], baseline, size_class, args.baseline, s.world_size)
            print(f"{s.system}: " + "\n".join(check.lines()))
            passed = passed and check.passed
    return 0 if passed else 1


def cmd_report(args: argparse.Namespace) -> int:
    from hpcdl.results import diagnosis

    if len(args.paths) == 1 and diagnosis.is_diagnosis(Path(args.paths[0])):
        from hpcdl.results.report.diagnosis import write_diagnosis_page

        print(write_diagnosis_page(diagnosis.load_diagnosis(Path(args.paths[0])), Path(args.output)))
        return 0
    from hpcdl.results.ranking import parse_submission
    from hpcdl.results.report import write_report  # imports matplotlib: only when a report is made

    sources = [parse_submission(p, "report.path") if "=" in p else ("", Path(p)) for p in args.paths]
    if len({name for name, _ in sources if name}) != sum(1 for name, _ in sources if name):
        raise InputError("report.path", args.paths, "each system name once (NAME=DIR)")
    print(write_report(sources, Path(args.output), say=err))
    return 0


def add_parsers(sub: Any) -> None:
    rk = sub.add_parser("rank", help="verify records and write the ranking list (Markdown, HTML, CSV)")
    rk.add_argument("systems", nargs="+", help="one directory of records per system, or NAME=DIR")
    rk.add_argument("-o", "--output", default="ranking", help="output directory (default: ranking)")
    rk.add_argument(
        "--baseline",
        metavar="DIR",
        help="each system's class workloads against the records in DIR (a vendor's, or the site's "
        "acceptance run) at the scale of its score; exit 1 below 95 %% of it on any workload",
    )
    rk.set_defaults(func=cmd_rank)

    rp = sub.add_parser(
        "report", help="HTML report with plots of records and sweeps, or the page of one diagnosis"
    )
    rp.add_argument(
        "paths",
        nargs="+",
        help="record files or directories (searched recursively), each as NAME=DIR to name its system "
        "(as hpcdl rank takes them: two machines' records stay apart), or one diagnosis (hpcdl diagnose -o)",
    )
    rp.add_argument("-o", "--output", default="report", help="output directory (default: report)")
    rp.set_defaults(func=cmd_report)
