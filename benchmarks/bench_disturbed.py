"""How often the validity checks of a disturbed machine (``quiet_machine``, ``steady_steps``)
flag quiet runs, and how often runs beside a CPU hog (on-demand; not part of the test suite).

Runs the class S suite ``--repeats`` times quietly, then as often with one spinning process per
CPU beside it, each time as ``hpcdl run --class S --duration D`` in a process of its own; prints
per condition and workload: runs, flagged, the largest share of a window a rank waited for a CPU
and the largest p90/p10 of the steps. Run it on an otherwise idle machine: what it calls quiet
is only as quiet as the machine.

    .venv/bin/python benchmarks/bench_disturbed.py [--repeats 5] [--duration 6] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcdl.results.text import table

HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def suite_run(out: Path, duration: float) -> list[dict]:
    """One class S run into ``out``: its records."""
    cmd = [sys.executable, "-m", "hpcdl", "run", "--class", "S", "--duration", str(duration), "-o", str(out)]
    subprocess.run(cmd, capture_output=True, text=True, check=False)
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    return [r for r in records if r.get("schema") == "hpcdl.result"]


def figures(record: dict) -> tuple[bool, float, float]:
    """Flagged by either check; the largest waited share; the steps' p90/p10."""
    checks = {c["name"]: c for c in record["validity"]["checks"]}
    flagged = not (checks["quiet_machine"]["passed"] and checks["steady_steps"]["passed"])
    shares = [
        r["descheduled_s"] / r["timed_window_s"]
        for r in record["metrics"]["per_rank"]
        if r.get("descheduled_s")
    ]
    st = record["metrics"]["step_time_s"]
    return flagged, max(shares, default=0.0), st["p90"] / st["p10"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument(
        "--out", type=Path, default=None, help="keep the records here (default: a temporary folder)"
    )
    a = p.parse_args()
    base = a.out or Path(tempfile.mkdtemp(prefix="hpcdl-disturbed-"))
    seen: dict[tuple[str, str], list[tuple[bool, float, float]]] = {}
    for i in range(a.repeats):
        for condition in ("quiet", "beside a hog"):
            hogs = []
            if condition != "quiet":
                hogs = [
                    subprocess.Popen([sys.executable, "-c", HOG, str(c)])
                    for c in sorted(os.sched_getaffinity(0))
                ]
                time.sleep(0.5)
            try:
                for r in suite_run(base / f"{condition.replace(' ', '-')}-{i}", a.duration):
                    seen.setdefault((condition, r["name"].split("-", 2)[-1]), []).append(figures(r))
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
    rows = [
        [condition, workload, str(len(f)), str(sum(x[0] for x in f)), f"{max(x[1] for x in f):.1%}",
         f"{max(x[2] for x in f):.2f}"]
        for (condition, workload), f in sorted(seen.items())
    ]  # fmt: skip
    print(table(["condition", "workload", "runs", "flagged", "max waited share", "max p90/p10"], rows))
    print(f"records in {base}")


if __name__ == "__main__":
    main()
