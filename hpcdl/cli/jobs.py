"""``hpcdl submit``, ``status`` and ``collect``: job files on a scheduler."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcdl.cli.common import err
from hpcdl.results.text import table

if TYPE_CHECKING:
    from hpcdl.records.audit import Audit
    from hpcdl.results.verdict import Verdict


def status_table(rows: Sequence[Any]) -> str:
    return table(
        ["point", "nodes", "ranks", "job id", "state", "detail"],
        [[r.name, str(r.nodes), str(r.ranks), r.job_id or "-", r.state, r.detail] for r in rows],
        numeric=False,
    )


def status_lines(
    out: Path, rows: Sequence[Any], baseline: tuple[str, list[Audit]] | None = None
) -> tuple[list[str], bool]:
    """Below the status table: why each record that does not count does not, then each class
    job's score (``class_lines``) and, with a baseline (its folder and accepted records), each
    class job's workloads against it. Returns the lines and whether every baseline check passed."""
    verdicts = class_verdicts(out, rows)
    lines = [f"{r.name}: {problem}" for r in rows if not r.size_class for problem in r.problems]
    lines += class_lines(verdicts, every=True)
    if baseline is None:
        return lines, True
    from hpcdl.results.baseline import compare

    folder, base = baseline
    passed = True
    for job, verdict in verdicts.items():
        check = compare(verdict.accepted, base, verdict.size_class, folder, verdict.score.world_size)
        lines += [f"{job}: {line}" if i == 0 else line for i, line in enumerate(check.lines())]
        passed = passed and check.passed
    return lines, passed


def class_verdicts(out: Path, rows: Sequence[Any]) -> dict[str, Verdict]:
    """Each class job's records so far, judged as ``hpcdl rank`` would (``results.verdict``)."""
    from hpcdl.schedulers.state import entries

    known = entries(out)
    classes: dict[str, tuple[str, list[Path]]] = {}
    for r in rows:
        if r.size_class:
            found = [p for p in r.records if p.exists()]
            classes.setdefault(known[r.name].point.job, (r.size_class, []))[1].extend(found)
    if not classes:
        return {}
    from hpcdl.results.verdict import judge  # the audit counts FLOPs with the families: torch

    return {job: judge(paths, size_class) for job, (size_class, paths) in classes.items()}


def class_lines(verdicts: dict[str, Verdict], every: bool = False) -> list[str]:
    """For each class job, its score as ``hpcdl rank`` computes it from the records its points
    wrote so far, and whether it is rankable; ``every``: and each record that does not count,
    with why."""
    return [f"{job}: {line}" for job, v in verdicts.items() for line in v.lines(rejected=every)]


def print_lines(lines: Sequence[str]) -> None:
    for line in lines:
        print(line)


def cmd_submit(args: argparse.Namespace) -> int:
    """One job per node count of a job file (see hpcdl/schedulers/submit.py)."""
    from hpcdl.schedulers.load import load_job
    from hpcdl.schedulers.point import points
    from hpcdl.schedulers.protocol import choose
    from hpcdl.schedulers.state import state_path
    from hpcdl.schedulers.status import status, wait
    from hpcdl.schedulers.submit import Stopped, preflight_job, submit

    job = load_job(args.jobfile)
    preflight_job(job)
    scheduler = choose(args.executor)
    out = job.output_dir()
    if args.dry_run:
        for point in points(job, scheduler.name, out):
            layout = f"{point.nodes} node(s) x {point.tasks_per_node} task(s)"
            print(f"# ---- {point.name}: {layout}, not submitted (--dry-run, {scheduler.name})")
            if point.workloads:
                suite = ", ".join(point.workloads)
                what = f"class {job.size_class}" if job.size_class else "sweep"
                print(f"# {what}: {suite}, one after another, a record each")
            print(scheduler.script(job, point))
        return 0
    try:
        done = submit(job, scheduler, redo=args.redo, job_file=str(Path(args.jobfile).resolve()))
    except Stopped as e:
        err(f"hpcdl: {e}")
        return e.code
    stems = f"{job.name}-n<nodes>-<workload>" if job.size_class else f"{job.name}-n<nodes>"
    if job.sweep:
        stems = f"{job.name}-n<nodes>-{job.knob_sweep().knob}<value>"
    print(f"records: {out}/{stems}.json; state: {state_path(out)}")
    names = [d.point.name for d in done]
    if scheduler.here:
        rows = status(out, names)  # they have run already
    elif args.wait:
        rows = wait(out, names)
    else:
        print(f"follow with: hpcdl status {out}")
        return 0
    print(status_table(rows))
    print_lines(status_lines(out, rows)[0])
    return 0 if all(r.state == "done" for r in rows) else 1


def cmd_status(args: argparse.Namespace) -> int:
    from hpcdl.schedulers.status import status

    out = Path(args.dir)
    baseline = None
    if args.baseline is not None:  # before anything is printed: a bad folder is one line
        from hpcdl.results.baseline import load_baseline

        baseline = (args.baseline, load_baseline(args.baseline))
    rows = status(out)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=1))
        return 0
    print(status_table(rows))
    lines, passed = status_lines(out, rows, baseline)
    print_lines(lines)
    return 0 if passed else 1


def cmd_collect(args: argparse.Namespace) -> int:
    from hpcdl.schedulers.collect import COLLECTED_FILE, collect

    out = Path(args.dir)
    points = collect(out)["points"]
    rows = [
        [
            "/".join(x for x in (p["point"], p.get("workload")) if x),
            str(p["nodes"]),
            str(p["ranks"]),
            f"{p['samples_per_s']:.1f}" if "record" in p else p["state"],
            f"{p['speedup']:.2f}" if "record" in p else "",
            f"{p['efficiency'] * 100:.1f}%" if "record" in p else "",
            p.get("record", p.get("refused", "")),
        ]
        for p in points
    ]
    print(table(["point", "nodes", "ranks", "samples/s", "speed-up", "weak efficiency", "record"], rows))
    have = sum("record" in p for p in points)
    rows_are = "workloads of points" if any(p.get("workload") for p in points) else "points"
    print(f"{have} of {len(points)} {rows_are} have a valid record -> {out / COLLECTED_FILE}")
    from hpcdl.schedulers.status import status

    print_lines(class_lines(class_verdicts(out, status(out))))
    return 0


def add_parsers(sub: Any) -> None:
    sb = sub.add_parser("submit", help="submit a job file to a scheduler: one job per node count")
    sb.add_argument("jobfile", help="TOML job file (see jobs/)")
    sb.add_argument(
        "--dry-run", action="store_true", help="print the batch script of each point; submit nothing"
    )
    sb.add_argument("--wait", action="store_true", help="wait until every point has ended, then show status")
    sb.add_argument(
        "--executor",
        default="auto",
        help="scheduler: slurm, local (submitit's local executor) or a plugin's (HPCDL_PLUGINS); "
        "auto: the first batch scheduler found here, else local",
    )
    sb.add_argument("--redo", action="store_true", help="submit points that already have a valid record")
    sb.set_defaults(func=cmd_submit)

    st = sub.add_parser("status", help="state of each submitted point: done, queued, running, failed and why")
    st.add_argument("dir", help="the job's output directory (holds hpcdl-jobs.json)")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.add_argument(
        "--baseline",
        metavar="DIR",
        help="each class job's workloads against the records in DIR (a vendor's, or the site's acceptance "
        "run) at the scale of its score; exit 1 below 95 %% of it on any workload",
    )
    st.set_defaults(func=cmd_status)

    co = sub.add_parser("collect", help="gather the valid records of a job's points into collected.json")
    co.add_argument("dir", help="the job's output directory (holds hpcdl-jobs.json)")
    co.set_defaults(func=cmd_collect)
