"""``hpcdl run``: measure the default suite, a size class, one workload or a preset, here or as
MPI ranks (with repeats, a time to target and MLPerf-style logs)."""

from __future__ import annotations

import argparse
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcdl.cli.common import add_workload_options, err, suite_class, workload_specs
from hpcdl.cli.run_options import add_run_options, run_config
from hpcdl.errors import InputError
from hpcdl.parallel.launch import launch
from hpcdl.parallel.world import World, init_world, under_mpi
from hpcdl.records import mllog, repeats, schema
from hpcdl.records.store import read_steps, write_record
from hpcdl.records.views import FitFigures, Result, Target
from hpcdl.results.text import mfu_text, notes_once, si, table, wrapped

if TYPE_CHECKING:  # what runs a workload imports torch: the handlers import it (--help needs none)
    from hpcdl.harness.runner import RunResult
    from hpcdl.measure.config import RunConfig
    from hpcdl.results.verdict import Verdict
    from hpcdl.workloads.spec import Spec

MAX_REPEAT = 1000
"""the most runs of each workload --repeat takes: an olympic mean needs 3, a spread a few dozen"""


def gpus_for(local: World, cfg: RunConfig) -> None:
    """Ranks started here share this host's GPUs: one each, or a one-line refusal."""
    import torch

    from hpcdl.device import resolve_device

    device = resolve_device(cfg.device)
    if device.type != "cuda" or local.local_size == 1:
        return
    if device.index is not None:
        raise InputError("device", cfg.device, "several ranks cannot share one GPU; use auto or cuda")
    if local.local_size > torch.cuda.device_count():
        visible = torch.cuda.device_count()
        raise InputError("np", local.local_size, f"{visible} GPU(s) visible here: at most one rank per GPU")


def class_run(
    args: argparse.Namespace, specs: dict[str, Spec], cfg: RunConfig
) -> tuple[dict[str, Spec], RunConfig, str]:
    """For a size class's suite: the class and version in the run settings, and the precision
    this device trains (``harness.classes.on_device``), with the note that says so, or ''."""
    from hpcdl.device import resolve_device
    from hpcdl.harness import classes

    size_class = suite_class(args)
    if not size_class:
        return specs, cfg, ""
    specs, note = classes.on_device(specs, resolve_device(cfg.device))
    return specs, classes.stamped(cfg, size_class), f"class {size_class}: {note}" if note else ""


def summary_rows(results: dict[str, RunResult]) -> list[list[str]]:
    rows = []
    for name, res in results.items():
        view = res.result
        m, st = view.metrics, view.metrics.step_time_s
        rows.append(
            [
                name,
                si(view.counts.params),
                si(m.train_flops_per_sample, "FLOP"),
                f"{m.samples_per_s:.1f}",
                si(m.ai_ops_per_s, "FLOP/s"),
                f"{st.median * 1e3:.1f} ({st.p10 * 1e3:.1f}-{st.p90 * 1e3:.1f})",
                mfu_text(m.mfu, m.flags),
                "yes" if view.validity.passed else "NO",
            ]
        )
    return rows


def peak_lines(results: dict[str, RunResult]) -> list[str]:
    """What MFU is against, once per precision (the peak belongs to the machine, not the run)."""
    peaks: dict[str, str] = {}
    for res in results.values():
        m = res.result.metrics
        peaks.setdefault(res.result.settings.precision, f"{si(m.peak_flops, 'FLOP/s')} ({m.peak_source})")
    return [f"MFU in {prec} is against {text}" for prec, text in peaks.items()]


def remember_peaks(results: dict[str, RunResult]) -> list[str]:
    """A run's first probe stores the machine's peak where none is stored (one per precision,
    from a one-rank CPU run: ``measure.peakstore``), so that every later run divides by the same
    figure; what was stored, in words."""
    from hpcdl.measure import peakstore
    from hpcdl.measure.peaks import Peak, cpu_info, store_entry

    said = []
    for res in results.values():
        view = res.result
        m, precision = view.metrics, view.settings.precision
        if view.world_size != 1 or not view.settings.device.startswith("cpu"):
            continue
        model = cpu_info().model_name
        peak = Peak(m.peak_flops, m.peak_source, m.peak_kind, dict(m.peak_inputs))
        entry = store_entry(peak, m.measured_matmul_flops)
        if entry is None or peakstore.stored(model, precision) is not None:
            continue
        path = peakstore.store(model, precision, entry, "hpcdl run (its first probe)")
        said.append(
            f"hpcdl: stored this machine's {precision} peak, {si(m.peak_flops, 'FLOP/s')}, in {path}: "
            "later runs divide by it (hpcdl info --probe measures it again)"
        )
    return said


def cmd_run(args: argparse.Namespace) -> int:
    import torch

    from hpcdl.cli.progress import LiveLine
    from hpcdl.harness.classes import workload_settings
    from hpcdl.harness.runner import preflight, run

    if not 1 <= args.repeat <= MAX_REPEAT:  # before anything is built: 10^9 runs listed up front
        raise InputError("repeat", args.repeat, f"runs of each workload, 1 to {MAX_REPEAT}")
    specs, cfg, note = class_run(args, workload_specs(args), run_config(args))
    baseline = None
    if args.baseline is not None:  # read before anything runs: a bad folder is refused up front
        from hpcdl.results.baseline import load_baseline

        if not cfg.suite_class:
            raise InputError("baseline", args.baseline, "compares a class run: hpcdl run --class NAME")
        baseline = load_baseline(args.baseline, cfg.suite_class)
    if len(specs) > 1 and args.duration is None and args.steps is None:
        cfg = cfg.replace(duration_s=12.0)  # the default suite: ~2 minutes on a 2-core CPU
    local = World(size=args.np, local_size=1 if under_mpi() else args.np)  # --np: all ranks here
    given = {"lr_given": args.lr is not None, "mode_given": args.execution_mode is not None}
    for name, spec in specs.items():
        preflight(spec, workload_settings(cfg, name, local, **given), local)  # bad input refused up front
    if args.mllog:
        mllog.check(Path(args.mllog))
    if not under_mpi():
        gpus_for(local, cfg)
    if args.np > 1 and not under_mpi():
        return launch(args.np, args.argv, timeout_s=args.timeout)
    world = init_world()
    say = err if world.rank == 0 else (lambda _m: None)
    if note:  # after the input is found good: a refusal stays the one line printed
        say(note)
    out = Path(args.output)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stamp = world.bcast(stamp)
    results: dict[str, RunResult] = {}
    failed: list[str] = []
    log_failed = 0
    runs = [(name, spec, r) for name, spec in specs.items() for r in range(1, args.repeat + 1)]
    if len(runs) > 1 and world.rank == 0:
        say(estimate_line(runs, cfg, world, cfg.suite_class))
    for i, (name, spec, r) in enumerate(runs, 1):
        label = repeats.repeat_name(name, r, args.repeat)
        prefix = f"[{i}/{len(runs)}] {label}"
        params = si(spec.count().params)
        micro = f" x {spec.accumulation_steps} micro-batches" if spec.accumulation_steps > 1 else ""
        batch = f"batch {spec.batch_size}/rank{micro}"
        if cfg.fit_fraction > 0:  # the spec's batch is only where the fit starts
            batch = f"batch per rank: fitting to {cfg.fit_fraction:g} of its memory first{micro}"
        say(f"{prefix}: {spec.family}, {params} params, {spec.precision}, {batch} x {world.size} ranks")
        base = args.name if args.name and len(specs) == 1 else f"{stamp}-{name}"
        started = time.time()
        try:
            with LiveLine(prefix, cfg.steps, cfg.duration_s) as line:
                res = run(
                    spec,
                    workload_settings(cfg, name, world, **given),
                    output_dir=out,
                    name=repeats.repeat_name(base, r, args.repeat),
                    progress=line.say,
                    world=world,
                    ticks=line.timed,
                )
        except torch.OutOfMemoryError:
            raise  # the CLI's one line: lower batch_size
        except RuntimeError as e:  # a kernel this machine cannot run: the other workloads go on
            if world.size > 1:
                raise  # the other ranks wait in a collective: the CLI ends them all
            failed.append(label)
            say(f"{prefix}: failed: {failure_line(e, out / f'{base}-failed.txt')}")
            continue
        results[label] = res
        say(f"{prefix}: {res.result.metrics.samples_per_s:.1f} samples/s -> {res.path}")
        if args.mllog and world.rank == 0 and res.steps_path is not None:
            log_failed += log_run(Path(args.mllog), res, started, say)
    if world.rank != 0:
        return 0  # rank 0 reports, and its exit code is the run's
    if failed:
        kept = "; the others' records are kept" if results else ""
        err(f"hpcdl: {len(failed)} of {len(runs)} run(s) failed ({', '.join(failed)}){kept}")
    if not results:
        return 1
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
    for note in notes_once({name: res.result.metrics.flags for name, res in results.items()}):
        print(wrapped(f"(!) {note}"))
    for name, res in results.items():
        if (target := res.result.metrics.target) is not None:
            print(wrapped(f"{name}: {target_text(target)}"))
        if (fit := res.result.metrics.fit) is not None:
            print(wrapped(f"{name}: {fit_text(fit)}"))
        if res.result.settings.layout:
            print(wrapped(f"{name}: {layout_text(res.result)}"))
    for stored in remember_peaks(results):
        err(wrapped(stored))
    print("\n".join(wrapped(line) for line in peak_lines(results)) + f"\nRecords in {out}/")
    if args.repeat > 1:
        print(repeat_table(specs, results, args.repeat, out, stamp))
    ended, verdict = result_lines(results, cfg.suite_class)
    for said in ended:
        print(said)
    below = False
    if baseline is not None and verdict is not None:
        from hpcdl.results.baseline import compare

        check = compare(verdict.accepted, baseline, cfg.suite_class, args.baseline, verdict.score.world_size)
        print("\n".join(check.lines()))
        below = not check.passed
    if len(results) > 1:
        summary = {
            "schema": schema.SUITE,
            "created": stamp,
            "records": {n: r.path.name if r.path else None for n, r in results.items()},
        }
        write_record(summary, out / f"{stamp}-suite.json")
    if log_failed:
        err(f"hpcdl: --mllog {args.mllog}: the lines of {log_failed} run(s) were not written (said above)")
    return 0 if all(r.passed for r in results.values()) and not (log_failed or failed or below) else 1


def estimate_line(runs: list[tuple[str, Spec, int]], cfg: RunConfig, world: World, size_class: str) -> str:
    """Before several runs start: the least time they take here, said as an estimate
    (``harness.duration``: counted FLOPs at the peak)."""
    from hpcdl.device import resolve_device
    from hpcdl.harness.duration import duration_text, floor

    what = f"class {size_class}" if size_class else f"{len(runs)} runs"
    device = resolve_device(cfg.device)
    floors = [floor(spec, cfg, device, world.local_size) for _, spec, _ in runs]
    if any(f is None for f in floors):
        why = (
            "--fit chooses the batches first" if cfg.fit_fraction > 0 else "no peak is known for this device"
        )
        return f"{what}: no time estimate ({why})"
    total = sum(f.seconds for f in floors if f is not None)
    window = f"{cfg.steps} timed steps" if cfg.steps else f"{cfg.duration_s:g} s window"
    slowest = max((f for f in floors if f is not None), key=lambda f: f.step_s)
    rates = ", ".join(sorted({f"{f.basis} {si(f.rate_flops, 'FLOP/s')}" for f in floors if f is not None}))
    return (
        f"{what} here: at least {duration_text(total)} (an estimate: the counted FLOPs of each workload's "
        f"{cfg.warmup_steps} warm-up steps and {window} at this machine's {rates}; its slowest step at "
        f"least {duration_text(slowest.step_s)}; real steps are slower)"
    )


def result_lines(results: dict[str, RunResult], size_class: str) -> tuple[list[str], Verdict | None]:
    """What the run comes to: for a class, its score as ``hpcdl rank`` computes it, whether it
    is rankable and why each record that does not count does not (``results.verdict``, also
    returned); for other runs, why each invalid record is invalid."""
    if size_class:
        from hpcdl.results.verdict import judge

        verdict = judge([r.path for r in results.values() if r.path is not None], size_class)
        return [wrapped(line) for line in verdict.lines()], verdict
    invalid = [
        wrapped(f"invalid: {name}: {'; '.join(res.result.validity.reasons)}")
        for name, res in results.items()
        if not res.result.validity.passed
    ]
    return invalid, None


def failure_line(e: RuntimeError, path: Path) -> str:
    """A run's error in one line: its first line, and where its traceback was written (for a
    bug report), or that it could not be."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    try:
        path.write_text("".join(traceback.format_exception(e)))
        return f"{first} (traceback in {path})"
    except OSError as why:
        return f"{first} (its traceback could not be written to {path}: {why.strerror})"


def log_run(path: Path, res: RunResult, started: float, say: Any) -> int:
    """Append a run's MLLOG lines; a failed write (a full disk) is said in one line and the
    remaining runs go on (the record is written already). 1 when it failed."""
    assert res.steps_path is not None
    try:
        mllog.append(path, mllog.run_lines(res.result, read_steps(res.steps_path), started))
    except (OSError, InputError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        say(f"hpcdl: --mllog {path}: the lines of {res.result.name} were not written ({why}); its record was")
        return 1
    return 0


def layout_text(result: Result) -> str:
    """Where a layout run's step goes per parallel dimension: the median step, each
    dimension's collectives per step (timed after training on their groups) and a pipeline's
    bubble and point-to-point bytes."""
    m = result.metrics
    step = m.step_time_s.median
    parts = [
        f"{name} {c.seconds_per_step * 1e3:.3g} ms ({c.seconds_per_step / step:.0%}; "
        f"{c.calls_per_step} calls, {si(c.bytes_per_step, 'B')} among {c.ranks} ranks)"
        for name, c in m.communication.collectives.items()
    ]
    if m.pipeline is not None:  # the stages' idle share, and what they send each other
        pipe = m.pipeline
        parts.append(
            f"pp bubble {pipe.bubble_measured:.0%} measured, {pipe.bubble_theoretical:.0%} in theory "
            f"({pipe.schedule}, {pipe.microbatches} micro-batches), "
            f"{si(pipe.p2p_bytes_per_step, 'B')} point-to-point per pipeline"
        )
        if m.communication.exposed_s:  # the dp replicas' allreduce after the schedule
            parts.append(f"dp allreduce {m.communication.exposed_s * 1e3:.3g} ms")
    crossing = "; tp groups span nodes" if result.settings.tp_crosses_nodes else ""
    return f"layout {result.settings.layout}: step {step * 1e3:.3g} ms: " + ", ".join(parts) + crossing


def fit_text(fit: FitFigures) -> str:
    """How --fit chose the batch, in words, for the run's summary: the chosen batch's trial and
    the run's own peak against the target, marked (!) when the run passed it by more than a
    trial's ``WINDOW``, with what its one-process trials cannot hold: a distributed backend's
    buffers (DDP's gradient buckets) and, under glibc, a heap that keeps growing over the steps,
    which jemalloc at 1 MiB does not; the ``malloc`` they ran with where it is not glibc's."""
    from hpcdl.device import JEMALLOC_CONF, MMAP_THRESHOLD_BYTES
    from hpcdl.measure.fit import WINDOW

    peak, target = fit.measured_peak_bytes, fit.target_bytes
    measured = f", its trial's peak {si(peak, 'B')} = {peak / target:.1%} of it" if peak and target else ""
    ran = fit.run_peak_bytes
    if ran is not None and target:
        over = ""
        if ran > (1 + WINDOW) * target:  # glibc: docs/validation/2026-11-26-memory-estimate.md, speech
            preload = f"LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF={JEMALLOC_CONF}"
            heap = f", or glibc's heap over the steps ({preload})" if fit.allocator == "glibc" else ""
            over = f" (!: past its one-process trials: a backend's buffers{heap})"
        measured += f", the run's own peak {si(ran, 'B')} = {ran / target:.1%}{over}"
    if fit.allocator not in (None, "glibc"):
        measured += f"; malloc: {fit.allocator}"
    oversize = fit.oversize_threshold_bytes
    if oversize is not None:  # jemalloc's: at its default, 8 MiB, it keeps more resident than glibc
        measured += f", freed blocks given back from {oversize / 2**20:g} MiB"
        if oversize > MMAP_THRESHOLD_BYTES:
            measured += f" (MALLOC_CONF={JEMALLOC_CONF}: from {MMAP_THRESHOLD_BYTES >> 20} MiB, as glibc)"
    return (
        f"--fit {fit.fraction:g}: batch {fit.batch}/rank (the estimate chose {fit.estimated_batch}) "
        f"after {len(fit.trials)} trials; target {si(target, 'B')}{measured}"
    )


def target_text(target: Target) -> str:
    """Time to target in words, for the run's summary."""
    fall = f"loss {target.loss_first:.4g} -> {target.loss_final:.4g}"
    if target.time_to_target_s is None or target.samples_to_target is None:
        return f"target {target.fraction:g} of the first loss not reached within the limit ({fall})"
    return (
        f"reached {target.fraction:g} of the first loss in {target.time_to_target_s:.3g} s, "
        f"{target.samples_to_target} samples ({fall})"
    )


def repeat_table(specs: dict[str, Spec], results: dict[str, RunResult], n: int, out: Path, stamp: str) -> str:
    """Write each workload's repeats summary (records/repeats.py) and return them as a table."""
    rows = []
    for name in specs:
        views = [results[repeats.repeat_name(name, r, n)].result for r in range(1, n + 1)]
        summary = repeats.summarize(name, views)
        write_record(summary, out / f"{stamp}-{name}-repeats.json")
        x = summary["samples_per_s"]
        row = [name, str(n), f"{x['olympic_mean']:.1f}", f"{x['median']:.1f}", f"{x['spread']:.1%}"]
        t = summary.get("time_to_target_s")
        row.append(f"{t['olympic_mean']:.3g} s ({summary['targets_reached']}/{n})" if t else "")
        rows.append(row)
    head = ["workload", "runs", "olympic mean samples/s", "median", "spread", "time to target (reached)"]
    return table(head, rows)


VALIDITY_RULES = (
    "A record is valid (the table's last column) when its loss stays finite and falls, which "
    "needs at least 4 timed steps (loss_falls), its timed window lasts --min-duration seconds "
    "(default 1), and several ranks step like one process. hpcdl rank counts a valid record of "
    "learnable or hdf5 data whose window lasts 5 s or more on every rank "  # audit.RANK_MIN_WINDOW_S
    "(docs/rules.md, the gate). A class run ends with its score as hpcdl rank computes it."
)


def add_parsers(sub: Any) -> None:
    r = sub.add_parser(
        "run", help="measure the default suite, one workload, or a preset", epilog=VALIDITY_RULES
    )
    add_workload_options(r)
    add_run_options(r)
    r.add_argument("--np", type=int, default=1, help="ranks to start on this machine with mpirun (default 1)")
    r.add_argument("--name", help="record file stem (one workload only)")
    r.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help=f"run each workload N times, 1 to {MAX_REPEAT} (NAME-r1 ...): olympic mean, median, spread",
    )
    r.add_argument("--mllog", metavar="FILE", help="append MLPerf-style :::MLLOG lines of every run to FILE")
    r.add_argument(
        "--baseline",
        metavar="DIR",
        help="a class run: each workload's AI-ops/s against the records in DIR (a vendor's, or the site's "
        "acceptance run) at the same scale; exit 1 below 95 %% of it on any workload",
    )
    r.set_defaults(func=cmd_run)
