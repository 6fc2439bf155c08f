"""``hpcdl generate``, ``list``, ``info`` and ``io``: workloads, this machine and its I/O path,
without training."""

from __future__ import annotations

import argparse
import json
import shutil
import textwrap
from typing import TYPE_CHECKING, Any

from hpcdl.cli.common import family_names, one_of
from hpcdl.errors import InputError, SpecError
from hpcdl.records.store import check_output
from hpcdl.results.text import NOTE_WIDTH, si, table, wrapped

if TYPE_CHECKING:  # the workloads and the device import torch: the handlers import them
    import torch

    from hpcdl.workloads.spec import Spec


def cmd_generate(args: argparse.Namespace) -> int:
    from hpcdl.workloads import recipes
    from hpcdl.workloads.registry import (
        FAMILIES,
        family_class,
        parse_assignments,
        spec_from_args,
        spec_from_dict,
    )
    from hpcdl.workloads.sampling import sample_spec

    if args.sample is not None:
        fixed = parse_assignments(family_class(args.family), args.knobs)
        spec = sample_spec(args.family, args.sample, **fixed)
    elif args.family in FAMILIES:
        spec = spec_from_args(args.family, args.knobs)
    else:
        named = recipes.named_workloads()
        if args.family not in named:
            allowed = f"a family ({', '.join(FAMILIES)}), a preset or a suite workload ({', '.join(named)})"
            raise SpecError("family", args.family, "allowed: " + allowed)
        knobs = named[args.family]
        spec = spec_from_dict({**knobs, **parse_assignments(family_class(knobs["family"]), args.knobs)})
    c = spec.count()
    act = c.activation_bytes(spec.precision)
    info: dict[str, Any] = {
        "spec": spec.to_dict(),
        "params": c.params,
        "forward_flops_per_sample": c.forward_flops,
        "train_flops_per_sample": c.train_flops,
        "activation_bytes_per_sample": act,
        "samples_per_step": spec.samples_per_step,
        "train_flops_per_step": c.train_flops * spec.samples_per_step,
        "memory_estimate_bytes": {
            opt: spec.memory_estimate(spec.batch_size, opt) for opt in ("adamw", "sgd")
        },
        "memory_parts_bytes": spec.memory_parts(spec.batch_size, "adamw"),
    }
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    if args.print_model:
        print(spec.build())
    print(table(["knob", "value"], [[k, str(v)] for k, v in spec.to_dict().items()], numeric=False))
    print()
    parts: dict[str, int] = info["memory_parts_bytes"]
    print(
        table(
            ["figure", "value"],
            [
                ["parameters", f"{c.params:,}"],
                ["forward FLOPs / sample", f"{c.forward_flops:,} ({si(c.forward_flops / 2, 'MAC')})"],
                [
                    "training FLOPs / sample",
                    f"{c.train_flops:,} ({c.train_flops / max(c.forward_flops, 1):.2f}x fwd)",
                ],
                [
                    "samples / step / rank",
                    f"{spec.samples_per_step} ({spec.accumulation_steps} x {spec.batch_size})",
                ],
                ["training FLOPs / step / rank", si(c.train_flops * spec.samples_per_step, "FLOP")],
                ["activations / sample", si(act, "B")],
                [
                    f"memory at its peak, batch {spec.batch_size} (AdamW, CPU; {_peak_moment(parts)})",
                    si(info["memory_estimate_bytes"]["adamw"], "B"),
                ],
                *[[f"  {part.replace('_', ' ')}", si(b, "B")] for part, b in parts.items()],
            ],
            numeric=False,
        )
    )
    return 0


def _peak_moment(parts: dict[str, int]) -> str:
    """Which moment of the step the estimate's peak is (``metrics.memory_parts``)."""
    if parts["activations"] == 0:
        return "the optimizer step"
    return "in forward" if parts["gradients"] == 0 else "in backward"


def cmd_info(args: argparse.Namespace) -> int:
    from hpcdl.device import memory_capacity, resolve_device
    from hpcdl.measure.environment import availability, environment

    device = resolve_device(args.device)
    env = environment(device)
    rows = [[k, str(v)] for k, v in env.items() if k not in ("gpus",)]
    rows.append(["gpus", ", ".join(env["gpus"]) or "none"])
    rows.append(["memory available", si(memory_capacity(device), "B")])
    for name, where in availability().items():
        rows.append([name, where or "not found"])
    print(table(["item", "value"], rows, numeric=False))
    print()
    print(peaks_table(device, probe=args.probe))
    return 0


def peaks_table(device: torch.device, probe: bool) -> str:
    """Per precision: the theoretical peak (MFU's denominator) with its source, and with
    ``probe`` the measured GEMM ceiling and its ratio to the peak. On a CPU the peak is the
    machine's stored one (``measure.peakstore``); ``probe`` derives it again from the estimate,
    raised to the clock the ceiling implies where the ceiling beats it (``raised_to_ceiling``),
    and stores it for every later run; a ceiling above any other peak is flagged."""
    from hpcdl.device import device_name
    from hpcdl.measure import peakstore
    from hpcdl.measure.peaks import (
        INFO_PRECISIONS,
        cpu_info,
        cpu_peak,
        gemm_ceiling,
        raised_to_ceiling,
        store_entry,
        theoretical_peak,
    )
    from hpcdl.workloads.precision import PRECISIONS

    rows = []
    for prec in [*PRECISIONS, *(INFO_PRECISIONS if device.type == "cuda" else ())]:
        cpu = device.type == "cpu"
        peak = (
            cpu_peak(prec, use_store=not probe)
            if cpu
            else theoretical_peak(device, device_name(device), prec)
        )
        if peak is None and prec in INFO_PRECISIONS:
            continue  # listed only where the datasheet has it
        measured = []
        if probe:
            ceiling = gemm_ceiling(device, prec)
            if peak is not None:
                peak = raised_to_ceiling(peak, ceiling)
                entry = store_entry(peak, ceiling) if cpu else None
                if entry is not None:
                    peakstore.store(cpu_info().model_name, prec, entry, "hpcdl info --probe")
                    peak = cpu_peak(prec) or peak  # as every run on this machine now reads it
            ratio = ceiling / peak.flops if peak else float("nan")
            mark = "  (!) above the theoretical peak: its inputs are low" if ratio > 1 else ""
            measured = [si(ceiling, "FLOP/s"), f"{ratio:.1%}{mark}"]
        rows.append(
            [prec, si(peak.flops, "FLOP/s") if peak else "unknown", *measured,
             peak.source if peak else "no datasheet entry or clock; give --peak-flops"]
        )  # fmt: skip
    head = ["precision", "theoretical peak"] + (["measured GEMM ceiling", "ceiling / peak"] if probe else [])
    note = ""
    if device.type == "cpu":
        note = f"\nCPU peaks are kept per machine in {peakstore.store_path()}: every run here divides by them"
        note += " (stored now)" if probe else "; hpcdl info --probe measures and stores them again"
    return table([*head, "source of the peak"], rows, numeric=False) + note


IO_LIMITS = {"batches": (1, 1 << 20), "shards": (1, 4096), "workers": (0, 256), "epochs": (1, 1000)}


def check_io(args: argparse.Namespace, spec: Spec) -> None:
    """Refuse, before writing anything, counts out of range and shards that would not fit the
    disk (or, one shard at a time, the memory they are generated in)."""
    import torch

    from hpcdl.device import memory_capacity

    for field, (lo, hi) in IO_LIMITS.items():
        value = getattr(args, field)
        if not lo <= value <= hi:
            raise InputError(field, value, f"an integer from {lo} to {hi}")
    if args.batches < args.shards:
        raise InputError("batches", args.batches, f"at least one per shard (shards={args.shards})")
    out = check_output(args.dir)
    total = args.batches * spec.batch_size * spec.input_bytes()
    free = shutil.disk_usage(out).free
    if total > free or total / args.shards > memory_capacity(torch.device("cpu")) / 2:
        raise InputError(
            "batches", args.batches, f"{si(total, 'B')} of shards; {si(free, 'B')} free in {out}"
        )


def cmd_io(args: argparse.Namespace) -> int:
    from hpcdl.measure import hdf5 as h5data
    from hpcdl.workloads.registry import spec_from_args

    spec = spec_from_args(args.family, args.knobs)
    check_io(args, spec)
    w = h5data.write_shards(spec, args.dir, batches=args.batches, shards=args.shards)
    r = h5data.read_throughput(args.dir, args.workers, epochs=args.epochs)
    print(
        table(
            ["path", "samples", "bytes", "seconds", "samples/s", "bytes/s"],
            [
                [
                    p,
                    str(s.samples),
                    si(s.bytes, "B"),
                    f"{s.seconds:.3f}",
                    f"{s.samples_per_s:.1f}",
                    si(s.bytes_per_s, "B/s"),
                ]
                for p, s in (("write", w), ("read", r))
            ],
        )
    )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from hpcdl.workloads import recipes
    from hpcdl.workloads.registry import FAMILIES

    for family, cls in FAMILIES.items():
        print(wrapped(f"{family}: {first_paragraph(cls.__doc__ or '')}"))
        print(knob_lines(cls.knobs()))
    print("\npresets: " + ", ".join(recipes.presets()))
    for size_class in recipes.size_classes():
        print()
        print(class_table(size_class))
    return 0


def first_paragraph(doc: str) -> str:
    """A docstring's first paragraph as one line: a description whole, not its first line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def knob_lines(knobs: dict[str, Any]) -> str:
    """One knob a line, ``name = default  doc``, aligned; a long doc wrapped under its column."""
    width = max(len(name) for name in knobs)
    out = []
    for name, f in knobs.items():
        head = f"  {name:<{width}} = {f.default!r:<10} "
        out.append(
            textwrap.fill(
                f.metadata["doc"],
                NOTE_WIDTH,
                initial_indent=head,
                subsequent_indent=" " * len(head),
                break_long_words=False,
            )  # fmt: skip
        )
    return "\n".join(out)


def class_table(size_class: str) -> str:
    """A size class's standard suite: each workload's size, work and memory per sample."""
    from hpcdl.workloads import recipes

    s = recipes.suite(size_class)
    rows = []
    for name, spec in s.specs().items():
        c = spec.count()
        rows.append(
            [
                name,
                spec.family,
                spec.precision,
                str(spec.batch_size),
                si(c.params),
                si(c.train_flops, "FLOP"),
                si(spec.memory_per_sample(), "B"),
            ]
        )
    head = ["workload", "family", "precision", "batch", "params", "train/sample", "memory/sample"]
    if s.layouts:  # the default layouts of a class that names them (L)
        head += [f"layout: node of {recipes.NODE_DEVICES}", "layout: multi-node"]
        for row in rows:
            named = s.layouts.get(row[0], {})
            row += [named.get("node", "dp"), named.get("multi_node", "dp")]
    return f"class {size_class} (v{s.version}: {s.description}), hpcdl run --class {size_class}\n" + table(
        head, rows
    )


def add_parsers(sub: Any) -> None:
    gen = sub.add_parser("generate", help="print a workload's size, FLOPs and memory without running it")
    gen.add_argument(
        "family", help="a family (cnn, rnn, attention, mlp, speech), a preset or a suite workload (see list)"
    )
    gen.add_argument("knobs", nargs="*", help="key=value knob settings")
    gen.add_argument(
        "--sample", type=int, metavar="SEED", help="draw the architecture from the family's ranges"
    )
    gen.add_argument("--json", action="store_true", help="print JSON")
    gen.add_argument("--print-model", action="store_true", help="also print the torch module")
    gen.set_defaults(func=cmd_generate)

    i = sub.add_parser("info", help="devices, peaks, and which optional parts are installed")
    i.add_argument("--device", default="auto")
    i.add_argument("--probe", action="store_true", help="also measure matmul FLOP/s in each precision")
    i.set_defaults(func=cmd_info)

    io = sub.add_parser("io", help="HDF5 write and read throughput of a workload's samples")
    io.add_argument("--dir", required=True, help="directory for the shards")
    io.add_argument("--batches", type=int, default=32)
    io.add_argument("--shards", type=int, default=4)
    io.add_argument("--workers", type=int, default=2)
    io.add_argument("--epochs", type=int, default=1)
    io.add_argument("family", nargs="?", default="cnn", type=one_of(family_names), help="a family (cnn)")
    io.add_argument("knobs", nargs="*")
    io.set_defaults(func=cmd_io)
    lst = sub.add_parser("list", help="families and their knobs, presets, the default suite")
    lst.set_defaults(func=cmd_list)
