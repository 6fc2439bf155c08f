"""On-demand benchmark of the scaling model on the emulated cluster (not part of the test suite):
predicted against measured step time, with its compute and communication shares, when the
ranks of a run sit on different hosts joined by rate-limited links.

The cluster (scripts/cluster/cluster.sh) is 4 hosts as network namespaces on this machine, each
on a link of --rate (default 200 Mbit/s, where the workloads below spend most of a step
communicating). Two layouts of 4 ranks: 2 hosts x 2 ranks (shared memory inside a host, the
link between them) and 4 hosts x 1 rank (every byte on the links). Four workloads: an MLP under
DDP, Horovod and FSDP, and a mixture-of-experts transformer (experts across the ranks, DDP).

The model is the two-level one of hpcdl/scaling (collectives.py, model.py): alpha and beta of
each collective fitted to two ``hpcdl comm`` sweeps of 2 ranks, one inside one host (the
intra-node level) and one across two hosts (the inter-node level), taken again in every round
(for both layouts of the round: one sweep's figures moved a prediction by 24 % between runs);
the allreduce as the libraries here run it (gloo: one ring over all ranks; Open MPI, Horovod's
path: the cheapest of the model's candidates, as its tuned component picks per size); gradients
reduced bucket by bucket behind backward (DDP's 25 MB buckets; Horovod's 128 MB fusion buffer
and 1 ms cycle, its 0.28.1 defaults). Gamma from concurrent 1-rank runs, as many as the layout
has ranks, one thread each (the resources a rank really has, as bench_parallel.py calibrates).

Robust against a machine others load: every point is calibrated and measured --reps times, the
rounds of all points interleaved (calibration right before its run); the table gives medians
and the per-round errors' range, and the load average is printed. Before the step table, a
check of the collective model alone: each step's collectives at 4 ranks as the two-level model
prices them, against a 4-rank sweep on the layout itself.

    .venv/bin/python benchmarks/bench_emulated.py [--rate 200mbit] [--duration 8] [--reps 3] [-o DIR]

Must run as root (it starts the emulated cluster if none runs, and stops it again).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_dist import hpcdl  # the CLI in a subprocess, exiting on failure
from bench_parallel import gamma_base, record

from hpcdl.records.loader import CommSweep, read_comm, read_record
from hpcdl.results.text import table
from hpcdl.scaling.fitting import fit_comm, fitted_hierarchy, hierarchy_comms, model_from_records
from hpcdl.scaling.model import Model, relative_error

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "scripts" / "cluster"
MLP = ["--workload", "mlp", "layers=2", "width=256", "input_size=256", "output_size=10", "batch_size=128"]
"""134 k parameters (0.5 MB of gradients a step) against ~86 MFLOP of computation a rank"""
MOE = ["--workload", "attention", "layers=2", "width=128", "heads=4", "seq_len=32", "experts=4",
       "batch_size=8"]  # fmt: skip
WORKLOADS = {
    "DDP mlp": ("torch", MLP),
    "Horovod mlp": ("horovod", MLP),
    "FSDP mlp": ("fsdp", MLP),
    "MoE attention": ("torch", MOE),
}
SWEEP_BACKEND = {"torch": "torch", "fsdp": "torch", "horovod": "horovod"}
"""whose collectives a backend's communication goes through (FSDP: torch.distributed's)"""
CALIBRATION = {"torch": "none"}
"""the backend gamma is calibrated with, where not the run's own ("none": the same computation
without a reducer). At one rank DDP still runs its reducer, a 1-rank gloo allreduce per bucket
on gloo's worker thread, which on a loaded machine waits tens of ms for a core (1-rank DDP
backward 43-55 ms against Horovod's 2 ms for the same MLP; forward + backward under no_sync
3 ms): gamma would count that wait as computation, and the model's communication term counts
it again at p ranks. FSDP keeps its own (its copies in and out of flat buffers are its
computation); Horovod's hooks at one rank only enqueue."""
COMM_SIZES = ",".join(str(4096 << (2 * k)) for k in range(6)) + f",{2 << 20}"  # 4 KiB .. 4 MiB
ALGORITHMS: dict[str, tuple[str, ...] | None] = {"torch": ("ring",), "horovod": None}
"""the allreduce algorithms each library has: gloo (torch.distributed on CPUs) one ring over all
ranks; Open MPI's tuned component (Horovod's path) chooses per message size and rank count among
recursive doubling, Rabenseifner's halving-doubling, ring and segmented ring, as the model's
cheapest candidate does (None: all of ring, tree, hierarchical)"""


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(CLUSTER / "cluster.sh"), *args], capture_output=True, text=True)


def on_layout(hosts: int, ppn: int) -> dict[str, str]:
    """The environment that places hpcdl's ranks on ``hosts`` emulated hosts, ``ppn`` each."""
    return {
        "HPCDL_MPIRUN": str(CLUSTER / "mpirun"),
        "HPCDL_CLUSTER_HOSTS": str(hosts),
        "HPCDL_CLUSTER_PPN": str(ppn),
        "OMP_NUM_THREADS": "1",
    }


def sweep(out: Path, backend: str, hosts: int, ppn: int, reps: str = "5", sizes: str = COMM_SIZES) -> Path:
    """An ``hpcdl comm`` sweep of ``backend`` on ``hosts`` x ``ppn`` ranks (kept in ``out``)."""
    path = out / f"comm-{hosts}x{ppn}-{backend}.json"
    if not path.exists():  # kept from an interrupted run into the same -o
        out.mkdir(parents=True, exist_ok=True)
        hpcdl("comm", "--np", str(hosts * ppn), "--backend", backend, "--sizes", sizes, "--reps", reps,
              "-o", str(path), **on_layout(hosts, ppn))  # fmt: skip
    return path


def levels(out: Path, backend: str, sizes: str = COMM_SIZES) -> tuple[CommSweep, CommSweep]:
    """(inside one host, across two hosts): the two sweeps the two-level model is fitted to
    (``sizes``: they should span the step's messages)."""
    inside, across = sweep(out, backend, 1, 2, sizes=sizes), sweep(out, backend, 2, 1, sizes=sizes)
    return read_comm(inside), read_comm(across)


def predicted(base: Path, intra: CommSweep, inter: CommSweep, backend: str, hosts: int, ppn: int) -> Model:
    """The one call into hpcdl.scaling: the two-level model of ``base``'s workload, its
    collectives fitted to the sweeps inside one host and across two, ``ppn`` ranks a host."""
    costs = fitted_hierarchy(intra, inter, ppn, ALGORITHMS[SWEEP_BACKEND[backend]])
    return model_from_records(read_record(base).result, costs, backend=backend, gamma_from="phases")


def measured_parts(rec: dict[str, Any]) -> dict[str, float | None]:
    """The median step time, and its communication as the run measured it: the exposed part of
    the gradients' reduction (the backend's rule: DDP's backward minus its backward under
    ``no_sync``, Horovod's wait in ``synchronize``) and the collectives timed inside the step
    (the experts' all-to-alls); computation is the rest. FSDP's gathers run inside forward and
    backward and cannot be timed apart: its shares are None, as where the two overlap (DDP's
    exposed part, backward with and without ``no_sync``, holds backward's all-to-alls too).

    The median, not the mean step (global batch over samples/s): on a machine others load, a
    step now and then waits for the scheduler for tens of ms; the mean carries those stalls,
    the median does not, and neither the calibration nor the model knows of them."""
    m = rec["metrics"]
    step = m["step_time_s"]["median"]
    c = m["communication"]
    if c.get("exposed_s") is None:
        return {"step_s": step, "compute_s": None, "comm_s": None, "mean_step_s": mean_step(rec)}
    in_step = sum(
        x["seconds_per_step"]
        for x in (c.get("collectives") or {}).values()
        if x["timing"].startswith("in the step")
    )
    comm = c["exposed_s"] + in_step
    if comm >= step:  # DDP's exposed part (two backward medians apart) holds backward's in-step ones too
        return {"step_s": step, "compute_s": None, "comm_s": None, "mean_step_s": mean_step(rec)}
    return {"step_s": step, "compute_s": step - comm, "comm_s": comm, "mean_step_s": mean_step(rec)}


def mean_step(rec: dict[str, Any]) -> float:
    """The global batch over the aggregate samples/s: the mean step, stalls included."""
    return float(rec["settings"]["global_batch"] / rec["metrics"]["samples_per_s"])


def collective_rows(out: Path, layouts: list[tuple[int, int]], reps: str) -> list[list[str]]:
    """The collective model alone: each step's collectives at 4 ranks priced by the two-level
    fit of the 2-rank sweeps, against a 4-rank sweep on the layout (fitted at the same size)."""
    rows = []
    for backend in sorted(set(SWEEP_BACKEND.values())):
        intra, inter = levels(out, backend)
        for hosts, ppn in layouts:
            four = read_comm(sweep(out, backend, hosts, ppn, reps))
            for name, (wl_backend, args) in WORKLOADS.items():
                if SWEEP_BACKEND[wl_backend] != backend:
                    continue
                model = from_spec(args, wl_backend)
                for t in model.traffic:
                    two_level = hierarchy_comms(intra, inter, [t], ppn, ALGORITHMS[backend])[t.collective]
                    flat = fit_comm(four.rows, four.ranks, t.collective, t.bytes / t.calls)
                    want = flat.time(t.bytes / t.calls, 4)
                    got = two_level.time(t.bytes / t.calls, 4)
                    size = f"{t.bytes / t.calls / 1e3:.0f} kB"
                    error = f"{relative_error(got, want):+.0%}"
                    rows.append([f"{hosts} x {ppn}", name, t.collective, size, f"{want * 1e3:.2f}",
                                 f"{got * 1e3:.2f}", error])  # fmt: skip
    return rows


def from_spec(args: list[str], backend: str) -> Model:
    """The model of a workload's CLI knobs (for its traffic only)."""
    from hpcdl.scaling.collectives import Comm
    from hpcdl.scaling.model import model_for

    spec = {"family": args[1], **{k: _number(v) for k, _, v in (a.partition("=") for a in args[2:])}}
    flat = {c: Comm(alpha_s=0.0, beta_bytes_per_s=1.0, collective=c) for c in
            ("allreduce", "all_gather", "reduce_scatter", "all_to_all")}  # fmt: skip
    return model_for(spec, int(spec["batch_size"]), 1.0, flat, backend=backend)


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def one_round(
    out: Path, i: int, hosts: int, ppn: int, duration: str, kept: bool
) -> dict[str, dict[str, Any]]:
    """Every workload on one layout, calibrated then measured: round ``i`` (``kept``: only the
    points an earlier run into the same -o finished)."""
    env = on_layout(hosts, ppn)
    found = {}
    for name, (backend, args) in WORKLOADS.items():
        here = out / f"{hosts}x{ppn}" / name.replace(" ", "-") / f"round-{i}"
        calibrate = CALIBRATION.get(backend, backend)
        calib = here / calibrate if calibrate != backend else here
        if kept and not (kept_base(calib, hosts * ppn) and list((here / "run").glob("*.json"))):
            continue
        base = kept_base(calib, hosts * ppn) or gamma_base(
            calib, [*args, "--backend", calibrate], hosts * ppn, duration
        )
        if not list((here / "run").glob("*.json")):
            hpcdl("run", *args, "--np", str(hosts * ppn), "--backend", backend, "--duration", duration,
                  "-o", str(here / "run"), **env)  # fmt: skip
            (here / "load.txt").write_text(f"{os.getloadavg()[0]:.1f}\n")  # the load as it ran
        rec = record(here / "run")
        hosts_seen = sorted({r["host"] for r in rec["metrics"]["per_rank"]})
        assert len(hosts_seen) == hosts, f"{name}: ranks ran on {hosts_seen}, not {hosts} hosts"
        # this round's sweeps (taken at its first point that needs them); a run kept from before
        # they were taken per round has one pair for all rounds
        swept = out / f"sweeps-round-{i}"
        earlier = kept and not (swept / f"comm-2x1-{SWEEP_BACKEND[backend]}.json").exists()
        intra, inter = levels(out if earlier else swept, SWEEP_BACKEND[backend])
        model = predicted(base, intra, inter, backend, hosts, ppn)
        point = model.point(hosts * ppn)
        found[name] = {
            "measured": measured_parts(rec),
            "predicted": {k: getattr(point, k) for k in ("step_s", "compute_s", "comm_s", "exposed_comm_s")},
            "load": float((here / "load.txt").read_text()) if (here / "load.txt").exists() else math.nan,
        }
        got, want = found[name]["predicted"]["step_s"], found[name]["measured"]["step_s"]
        shown = f"({relative_error(got, want):+.1%}), load {found[name]['load']:.1f}"
        print(f"round {i} {hosts}x{ppn} {name}: measured {want * 1e3:.1f} ms, predicted {got * 1e3:.1f} ms "
              f"{shown}", file=sys.stderr, flush=True)  # fmt: skip
    return found


def kept_base(here: Path, ranks: int) -> Path | None:
    """The calibration of an interrupted run into the same -o, as gamma_base chooses it."""
    dirs = [here / f"gamma-{i}" for i in range(ranks)]
    if not all(list(d.glob("*.json")) for d in dirs):
        return None
    by_rate = sorted(dirs, key=lambda d: record(d)["metrics"]["ai_ops_per_s"])
    return next(by_rate[len(by_rate) // 2].glob("*.json"))


def step_rows(rounds: dict[tuple[int, int], list[dict[str, dict[str, Any]]]]) -> list[list[str]]:
    def ms(parts: list[dict[str, Any]], key: str) -> float | None:
        values = [p[key] for p in parts if p[key] is not None]
        return statistics.median(values) * 1e3 if values else None

    def share(value: float | None, whole: float) -> str:
        return "-" if value is None else f"{value:.1f} ({value / whole:.0%})"

    rows = []
    for (hosts, ppn), every in rounds.items():
        for name in WORKLOADS:
            found = [f for f in every if name in f]
            if not found:
                continue
            got = [f[name]["measured"] for f in found]
            want = [f[name]["predicted"] for f in found]
            errors = [relative_error(w["step_s"], g["step_s"]) for g, w in zip(got, want, strict=True)]
            step, pstep, mean = ms(got, "step_s") or 0.0, ms(want, "step_s") or 0.0, ms(got, "mean_step_s")
            error = relative_error(pstep, step)
            rows.append([
                f"{hosts} x {ppn}", name + f" ({len(found)})", f"{step:.1f}", f"{mean or 0.0:.1f}",
                share(ms(got, "compute_s"), step), share(ms(got, "comm_s"), step),
                f"{pstep:.1f}", share(ms(want, "compute_s"), pstep), share(ms(want, "exposed_comm_s"), pstep),
                f"{error:+.1%}", f"{min(errors):+.0%}..{max(errors):+.0%}",
                "yes" if abs(error) <= 0.10 else "NO",
                f"{statistics.median(f[name]['load'] for f in found):.1f}",
            ])  # fmt: skip
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="200mbit", help="each host's link, in tc's units (default 200mbit)")
    ap.add_argument("--duration", default="8", help="timed seconds of every run (default 8)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds of every point (default 3)")
    ap.add_argument(
        "--layouts",
        default="2x2,4x1",
        help="HOSTSxRANKS, comma-separated (default 2x2,4x1; 2x1: a core for each rank on 2 cores)",
    )
    ap.add_argument("--only", default="collectives,steps", help="sections (default collectives,steps)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="a comma list of the workloads' names")
    ap.add_argument("--kept", action="store_true", help="measure nothing: tabulate the points kept in -o")
    ap.add_argument("-o", "--output", help="keep the records here and reuse them (default: a temporary dir)")
    args = ap.parse_args()
    chosen = args.workloads.split(",")
    if unknown := set(chosen) - set(WORKLOADS):
        sys.exit(f"--workloads: unknown {sorted(unknown)}; allowed: {', '.join(WORKLOADS)}")
    for name in set(WORKLOADS) - set(chosen):  # this process's run only
        del WORKLOADS[name]
    out = Path(args.output or tempfile.mkdtemp(prefix="hpcdl-emulated-"))
    layouts = [(int(h), int(r)) for h, r in (lay.split("x") for lay in args.layouts.split(","))]
    was_running = cluster("status").returncode == 0
    started = cluster("start", "4", args.rate)
    if started.returncode != 0:
        sys.exit(f"the emulated cluster did not start:\n{started.stderr}")
    print(f"emulated cluster, links at {args.rate}; load average at start {os.getloadavg()[0]:.1f}")
    try:
        if "collectives" in args.only:
            head = ["hosts x ranks", "workload", "collective", "message", "4-rank sweep ms",
                    "two-level model ms", "error"]  # fmt: skip
            print("the collectives alone: one message at 4 ranks, measured (4-rank sweep) vs two-level model")
            print(table(head, collective_rows(out, layouts, "5")))
        rounds: dict[tuple[int, int], list[dict[str, dict[str, Any]]]] = {lay: [] for lay in layouts}
        if "steps" in args.only:
            for i in range(args.reps):
                for hosts, ppn in layouts:
                    rounds[(hosts, ppn)].append(one_round(out, i, hosts, ppn, args.duration, args.kept))
    finally:
        if not was_running:
            cluster("stop")
    if "steps" not in args.only:
        return 0
    head = ["hosts x ranks", "workload", "step ms", "mean step ms", "compute ms", "comm ms", "predicted ms",
            "compute ms", "comm ms", "error", "rounds' errors", "within 10%", "load"]  # fmt: skip
    print(f"{args.reps} interleaved rounds, medians; predicted: the two-level model of hpcdl/scaling")
    rows = step_rows(rounds)
    print(table(head, rows))
    errors = [float(r[9].rstrip("%")) / 100 for r in rows]
    print(f"median |error| {statistics.median(abs(e) for e in errors):.1%}; records in {out}")
    print(
        "step: the median step time (mean step: global batch over samples/s, the scheduler's stalls in it)."
    )
    print("comm measured: the exposed reduction (the backend's rule) + the all-to-alls timed in the step;")
    print("compute: the rest (FSDP: not separable). Predicted: compute = training FLOPs over gamma of the")
    print("concurrent 1-rank runs; comm = what the model leaves unhidden.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
