"""Inside a job: running one point, on whichever scheduler started it.

How the point's ranks start (``start``) is the scheduler's choice:

- ``rank``: the scheduler started every rank (``srun --mpi=pmix``, or ``mpirun`` starting this
  module); each calls :func:`run_rank` and finds its MPI world itself.
- ``allocation``: the point runs once, in a batch allocation, and starts its ranks with
  ``mpirun``, which places them on the allocation's nodes.
- ``here``: as ``allocation``, on this machine (more ranks than cores allowed), and SIGTERM
  ends the point: ``hpcdl submit`` cancels a local job that way when it is terminated.

Command line: ``python -m hpcdl.schedulers.entry [--start MODE] POINT.json`` (the point as
:func:`hpcdl.schedulers.point.write_point_file` writes it), or ``--submitit FOLDER``: run the
job that submitit's files in FOLDER describe (what Slurm batch scripts call, so that submitit
checkpoints and requeues the point on preemption).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Literal, get_args

from hpcdl import reader
from hpcdl.errors import HpcdlError, InputError
from hpcdl.parallel.launch import (
    TERMINATED,
    Terminated,
    die_with_parent,
    end_with_launchers,
    mpirun_command,
    supervise,
)
from hpcdl.parallel.world import World, end_all_ranks, init_world
from hpcdl.parallel.worldsize import EXPECTED_ENV
from hpcdl.records import repeats
from hpcdl.records.store import load_record, write_record
from hpcdl.records.views import Result, read_result
from hpcdl.schedulers.point import Point, write_point_file

ENTRY = "hpcdl.schedulers.entry"
Start = Literal["rank", "allocation", "here"]
Say = Callable[[str], None]


class PointTask:
    """The callable a submitit job runs: one point. It has submitit's ``checkpoint`` method, so
    a preempted or timed-out point is requeued instead of failing."""

    def __init__(self, point: Point, start: Start) -> None:
        self.point = point
        self.start = start

    def __call__(self) -> dict[str, Any]:
        return run_point(self.point, self.start)

    def checkpoint(self) -> Any:
        """What submitit requeues: the same point. It starts over (a measurement cut short is
        not resumable); if the record was written in the meantime, the requeued job skips it."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(PointTask(self.point, self.start))


def run_point(point: Point, start: Start) -> dict[str, Any]:
    """Run the point as ``start`` says; a summary of how it went."""
    if start == "rank":
        return run_rank(point)
    if start == "here":
        # submitit ignores SIGTERM in its jobs (Slurm sends it before a requeue); here it is
        # how a cancelled point must end, before it writes a record. It comes also when
        # submitit's controller dies, or ``hpcdl submit`` (even by SIGKILL, which cannot cancel)
        signal.signal(signal.SIGTERM, _terminate)
        die_with_parent()
        end_with_launchers()
    try:
        return run_launched(point, oversubscribe=start == "here")
    except Terminated:
        return cancelled(point)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def say_rank0(rank: int) -> Say:
    if rank != 0:
        return lambda _m: None
    return lambda m: print(f"hpcdl: {m}", flush=True)  # into the job's log


def run_rank(point: Point) -> dict[str, Any]:
    """One rank of the point (every rank calls this): run it unless it is already done."""
    os.environ[EXPECTED_ENV] = str(point.ranks)  # init_world ends every process of a split world
    world = init_world()
    say = say_rank0(world.rank)
    if world.size != point.ranks:
        # without a working MPI launch every task would think it is alone and run its own copy
        raise HpcdlError(
            f"{point.name}: this task sees {world.size} rank(s), the point needs {point.ranks}: "
            'the MPI world was not set up (srun --mpi=pmix, or launcher = "mpirun")'
        )
    if world.bcast(point.done() if world.rank == 0 else None):
        say(f"{point.name}: valid records exist ({point.record_path}); not run again")
        return skipped(point)
    try:
        if point.instances > 1:
            return run_instances(point, world, say)
        passed = run_workloads(point, world, say)
    except HpcdlError:
        raise  # every rank meets the same bad input and stops: nothing hangs
    except Exception as e:
        end_all_ranks(e)  # said where status finds it, then every rank ends
        raise
    if world.rank != 0:
        return {"point": point.name, "rank": world.rank}
    return summary(point, read_result(load_record(point.record_path)), passed=passed)


def run_workloads(point: Point, world: World, say: Say) -> bool:
    """Every workload of the point, its repeats one after another (a class point: each
    workload as its class trains it, ``harness.classes``; one whose records stand already, as
    after a requeue, is not run again); True when every record passed its checks."""
    from hpcdl.device import resolve_device
    from hpcdl.harness import classes
    from hpcdl.harness.runner import run  # the whole measurement stack: only inside a job
    from hpcdl.scaling.knobsweep import unfit

    cfg, wanted = point.config(), point.named_specs()
    named, note = classes.on_device(wanted, resolve_device(cfg.device)) if cfg.suite_class else (wanted, "")
    if note:  # a class's bf16 workloads on a device without bf16: fp32, as hpcdl run --class
        say(f"{point.name}: {note}")
    passed = True
    for workload, spec in named.items():
        records = point.workload_records(workload, wanted[workload])
        if point.workloads and world.bcast(
            all(point.stands(*r) for r in records) if world.rank == 0 else None
        ):
            say(f"{records[0][0].stem}: valid records exist; not run again")
            continue
        given = {"lr_given": "lr" in point.run, "mode_given": "mode" in point.run}  # the job's [run]
        settings = classes.workload_settings(cfg, workload, world, **given)
        reason = (
            None
            if cfg.suite_class
            else world.bcast(unfit(spec, settings, world) if world.rank == 0 else None)
        )
        if reason is not None:  # a knob sweep's value that does not fit: the values before it are kept
            if workload == next(iter(named)):
                raise HpcdlError(f"{records[0][0].stem}: does not fit ({reason}); nothing ran")
            say(f"{records[0][0].stem}: does not fit ({reason}); the point's sweep stops here")
            return passed
        views = []
        for path, _, _ in records:
            result = run(
                spec,
                settings,
                output_dir=point.output,
                name=path.stem,
                progress=partial(prefixed, say, path.stem),
                world=world,
            )
            views.append(result.result)
            view = views[-1]
            say(f"{path.stem}: {view.metrics.samples_per_s:.1f} samples/s, valid: {view.validity.passed}")
        passed = passed and all(v.validity.passed for v in views)
        if point.repeat > 1 and world.rank == 0:
            stem = point.record_stem(workload)
            write_record(repeats.summarize(stem, views), Path(point.output) / f"{stem}-repeats.json")
    return passed


def prefixed(say: Say, name: str, message: str) -> None:
    say(f"{name}: {message}")


def run_instances(point: Point, world: World, say: Say) -> dict[str, Any]:
    """The point's concurrent instances (capacity) on the ranks of its allocation."""
    from hpcdl.harness.capacity import Layout, run_capacity

    layout = Layout(point.instances, point.ranks // point.instances, point.per_device)
    out = run_capacity(point.workload(), point.config(), layout, Path(point.output), point.name, say, world)
    if out is None:
        return {"point": point.name, "rank": world.rank}
    say(f"{point.name}: {point.instances} instances, {out['samples_per_s']:.1f} samples/s together")
    return {"point": point.name, "record": str(point.record_path), "passed": out["passed"], **out}


def run_launched(point: Point, *, oversubscribe: bool) -> dict[str, Any]:
    """The point from a single process: alone for one rank, else through ``mpirun``."""
    if point.done():
        return skipped(point)
    if point.ranks == 1:
        return run_rank(point)
    cmd = launch_command(point, write_point_file(point), oversubscribe=oversubscribe)
    code = supervise(cmd, f"{point.ranks}-rank point {point.name}", timeout_s=None)
    if code == TERMINATED:
        return cancelled(point)
    if code != 0:
        raise HpcdlError(f"{point.name}: mpirun of {point.ranks} ranks exited with code {code}")
    return summary(point, read_result(load_record(point.record_path)), passed=records_passed(point))


def records_passed(point: Point) -> bool:
    """Whether every record the point wrote passed its checks (a missing one did not)."""
    try:
        return all(read_result(load_record(path)).validity.passed for path, _, _ in point.records())
    except (OSError, ValueError):
        return False


def launch_command(point: Point, path: Path, *, oversubscribe: bool) -> list[str]:
    """How a single process starts the point's ranks: ``mpirun`` (inside an allocation Open MPI
    places them on its nodes), or this module alone for one rank."""
    args = [ENTRY, str(path)]
    if point.ranks == 1:
        return [sys.executable, "-m", *args]
    return mpirun_command(point.ranks, args, oversubscribe=oversubscribe)


def summary(point: Point, view: Result, passed: bool | None = None) -> dict[str, Any]:
    """What a job returns for a point it measured (submitit keeps it in its result file); its
    first record's figures, and whether all its records passed."""
    return {
        "point": point.name,
        "record": str(point.record_path),
        "passed": view.validity.passed if passed is None else passed,
        "samples_per_s": view.metrics.samples_per_s,
        "world_size": view.settings.world_size,
        "hosts": view.settings.hosts,
    }


def skipped(point: Point) -> dict[str, Any]:
    return {"point": point.name, "skipped": True, "record": str(point.record_path)}


def cancelled(point: Point) -> dict[str, Any]:
    print(f"hpcdl: {point.name}: terminated; no record written", file=sys.stderr, flush=True)
    return {"point": point.name, "cancelled": True}


def read_point(path: Path) -> Point:
    """The point file ``hpcdl submit`` wrote, read by the bounded reader; one line when it is
    not one (a key missing or unknown)."""
    doc = reader.document(path, "point")
    try:
        return Point.from_dict(doc)
    except (KeyError, TypeError) as e:
        raise InputError("point", str(path), f"not a point file hpcdl submit wrote ({e})") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpcdl.schedulers.entry [--start MODE] POINT.json | --submitit FOLDER``."""
    p = argparse.ArgumentParser(prog=f"python -m {ENTRY}", description="Run one point of a job file.")
    p.add_argument("point", nargs="?", type=Path, help="the point, as JSON")
    p.add_argument("--start", choices=get_args(Start), default="rank", help="how its ranks start")
    p.add_argument("--submitit", metavar="FOLDER", help="run the submitit job whose files are in FOLDER")
    args = p.parse_args(argv)
    if args.submitit:
        from submitit.core.submission import process_job

        process_job(args.submitit)
        return 0
    if args.point is None:
        p.error("POINT.json or --submitit FOLDER is required")
    try:
        out = run_point(read_point(args.point), args.start)
    except HpcdlError as e:
        print(f"hpcdl: error: {e}", file=sys.stderr, flush=True)
        return 2
    if out.get("cancelled"):
        return TERMINATED
    return 0 if out.get("passed", True) else 1


if __name__ == "__main__":
    sys.exit(main())
