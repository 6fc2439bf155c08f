"""``hpcdl submit``, ``status`` and ``collect``: job files on a batch scheduler."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcdl.results.text import table


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


def add_parsers(sub: Any) -> None:
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
