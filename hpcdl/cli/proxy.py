"""``hpcdl profile`` and ``hpcdl fit``: measure a real model, fit an hpcdl workload to it, and
verify the two side by side."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from hpcdl.cli.common import err
from hpcdl.errors import InputError
from hpcdl.escape import printable, shell_word
from hpcdl.measure.kernels import CLASSES
from hpcdl.proxy import as_profile, document
from hpcdl.proxy.measure import STEPS, measure
from hpcdl.proxy.objective import PROFILE_FIGURE, Weights, describe_errors
from hpcdl.proxy.reference import RealModel, load_model, resolve_syntax, user_code
from hpcdl.proxy.result import TOLERANCE, FitResult
from hpcdl.proxy.search import FINALISTS, describe_spec, fit
from hpcdl.proxy.training import Trainee
from hpcdl.proxy.verify import ROUNDS, verify
from hpcdl.records.schema import FIT
from hpcdl.results.text import si, table
from hpcdl.workloads.precision import PRECISIONS
from hpcdl.workloads.registry import spec_from_dict, spec_to_args
from hpcdl.workloads.spec import Spec

UNITS = {
    "params": "",
    "forward_flops_per_sample": "FLOP",
    "train_flops_per_sample": "FLOP",
    "activation_bytes_per_sample": "B",
    "arithmetic_intensity": "FLOP/B",
    "step_time_s": "s",
}


def _value(key: str, value: float) -> str:
    return f"{value:,.0f}" if key == "params" else si(value, UNITS[key])


def profile_table(p: document.Profile) -> str:
    rows = [[key, _value(key, v)] for key, v in p.figures.items()]
    rows += [[f"time share: {c}", f"{p.time_mix[c]:.1%}"] for c in CLASSES if p.time_mix.get(c)]
    rows += [[f"FLOP share: {c}", f"{p.flop_mix[c]:.1%}"] for c in CLASSES if p.flop_mix.get(c)]
    rows += [[f"hint: {k}", str(v)] for k, v in p.hints.items()]
    shape = f"{p.input_kind} {list(p.input_shape)} x batch {p.batch_size} -> {list(p.output_shape)}"
    return table(["figure", "value"], [["data", shape], *rows], numeric=False)


def _check_writable(*paths: Path | None) -> None:
    """Refuse an output path in a folder that cannot be written, before any work is done."""
    for path in paths:
        if path is not None and not (path.parent.is_dir() and os.access(path.parent, os.W_OK)):
            raise InputError("output", str(path), "cannot be written (no such folder, or not writable)")


def cmd_profile(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise InputError("--steps", args.steps, "at least 1")
    _check_writable(args.output)
    real = load_model(args.model)  # the command's own argument: what the user typed
    trainee = Trainee(real.module, real.batch, real.loss_fn, precision=args.precision, device=args.device)
    name = args.name or args.model.rpartition(":")[2]
    with user_code(args.model, "profiling it"):  # its forward, loss and backward run in there
        p = measure(trainee, name=name, source={"ref": args.model}, steps=args.steps, progress=_progress)
    print(profile_table(p))
    if args.output:
        document.save(p.to_dict(), args.output)
        print(f"profile written to {args.output}")
    return 0


def _progress(message: str) -> None:
    err(f"hpcdl: {message}")


def spec_toml(spec: Spec, header: list[str]) -> str:
    """The spec as a TOML table of knobs (``family`` first), with comment lines above it (a
    profile's name, a stranger's, in one of them: made printable, a newline ends no comment)."""
    lines = [f"# {printable(h)}" for h in header]
    for key, value in spec.to_dict().items():
        lines.append(f"{key} = {json.dumps(value)}")  # JSON scalars and lists are valid TOML
    return "\n".join(lines) + "\n"


def fit_table(result: FitResult) -> str:
    p = result.profile
    measured = result.best.measured["figures"] if result.best.measured else {}
    count = result.spec.count()
    fitted = {"params": count.params, "train_flops_per_sample": count.train_flops, **measured}
    rows = []
    errors = result.best.errors
    for name, key in PROFILE_FIGURE.items():
        if key in p.figures and name != "time":  # time: one figure, the one --verify checks (time_line)
            value = fitted.get(key)
            got = _value(key, value) if value is not None else "not measured"
            error = f"{errors[name]:+.1%}" if name in errors else ""
            rows.append([name, _value(key, p.figures[key]), got, error])
    if "mix" in result.best.errors:
        rows.append(["kernel mix", "", "", f"{result.best.errors['mix']:.3f} apart"])
    return table(["figure", "profile", "fitted", "error"], rows, numeric=False)


def time_line(result: FitResult) -> str | None:
    """The fit's step time as ``--verify`` states it, proxy / real model, here from the profile:
    each side's step in units of the reference work timed beside it (docs/metrics.md, Profiles);
    None where the profile has no step time."""
    error = result.best.errors.get("time")
    if error is None:
        return None
    return (
        f"step time, proxy / real model: {1 + error:.3f} (from the profile: each step in units of the "
        "reference work timed beside it; --verify times the two side by side)"
    )


def _check_fit_options(args: argparse.Namespace) -> None:
    for name, value, ok, allowed in (
        ("--budget", args.budget, args.budget > 0, "seconds > 0"),
        ("--finalists", args.finalists, args.finalists >= 1, "at least 1"),
        ("--rounds", args.rounds, args.rounds >= 1, "at least 1"),
        ("--tolerance", args.tolerance, 0 < args.tolerance < 1, "a fraction in (0, 1)"),
    ):
        if not ok:  # NaN fails every comparison, so it lands here too
            raise InputError(name, value, allowed)


def _named_model(args: argparse.Namespace, named: Any) -> str | None:
    """The real model to verify against: only ever ``--model`` from the command line.

    A profile or fit record is data that anyone may hand over; the reference it names
    (``source.ref``) is shown for the user to pass, never imported, since importing a module or
    a ``FILE.py`` runs its code (issue 16)."""
    if not args.verify:
        return None
    if args.model:
        return str(args.model)
    hint = f"; it names {named!r}: pass --model {shell_word(named)} if you trust that code" if named else ""
    allowed = f"needs the real model on the command line: --model MODULE:CALLABLE{hint}"
    raise InputError("--verify", str(args.profile), allowed)


def _show_and_load(ref: str) -> RealModel:
    """Say which code is about to run, then import and call it."""
    _progress(f"loading the real model {ref} (this runs its code)")
    return load_model(ref)


def cmd_fit(args: argparse.Namespace) -> int:
    _check_fit_options(args)
    _check_writable(args.output, args.record)
    weights = Weights.parse(args.weights)  # every option checked before anything is read
    doc = document.load(args.profile)
    if doc.get("schema") == FIT:
        return _reverify(args, doc)
    profile = as_profile(doc)
    ref = _named_model(args, profile.source.get("ref"))
    if ref:
        resolve_syntax(ref)  # a malformed reference is refused before the search
    result = fit(
        profile,
        args.family,
        weights=weights,
        seed=args.seed,
        budget_s=args.budget,
        finalists=args.finalists,
        tolerance=args.tolerance,
        device=args.device,
        progress=_progress,
    )
    verdict = "fitted" if result.reached else "closest (misses the tolerance)"
    print(f"{verdict} {result.spec.family}: {describe_spec(result.spec)}")
    print(fit_table(result))
    if ref:  # the one time figure: measured side by side
        result.verifications.append(_verify(args, result.spec, ref))
    elif line := time_line(result):
        print(line)
    record = result.to_record()
    if args.output:
        header = [f"fitted by hpcdl fit to {args.profile} ({profile.name})"]
        header.append(f"errors: {describe_errors(result.best.errors)}")
        document.save_text(spec_toml(result.spec, header), args.output)
        print(f"spec written to {args.output}; run it: hpcdl run --spec {args.output}")
    else:
        print("run it: hpcdl run " + " ".join(spec_to_args(result.spec)))
    record_path = args.record or (args.output.with_suffix(".fit.json") if args.output else None)
    if record_path:
        document.save(record, record_path)
        print(f"fit record written to {record_path}")
    if result.miss:  # the closest spec and its errors are above; the exit code says it is no fit
        print(f"hpcdl: {result.miss}")
        return 1
    return 0


def _verify(args: argparse.Namespace, spec: Spec, ref: str) -> dict[str, Any]:
    real = _show_and_load(ref)
    _progress(f"timing the proxy and {ref} interleaved, {args.rounds} rounds")
    with user_code(ref, "timing it"):
        comparison, entry = verify(spec, real, device=args.device, rounds=args.rounds)
    print(f"step time, proxy / real model: {comparison.describe()}")
    return {"model": ref, **entry}


def _reverify(args: argparse.Namespace, fitted: dict[str, Any]) -> int:
    """A fit record given again: time its spec against the real model here, and say how far the
    ratio moved from its first verification (``fitted``: the fit record, schema hpcdl.fit)."""
    if not args.verify:
        raise InputError(
            "profile", str(args.profile), "is a fit record: add --verify to verify its spec again"
        )
    profile = fitted.get("profile")
    source = profile.get("source") if isinstance(profile, dict) else None
    named = source.get("ref") if isinstance(source, dict) else None
    ref = _named_model(args, named if isinstance(named, str) else None)
    assert ref is not None  # --verify is set
    spec = spec_from_dict(fitted.get("spec", {}))
    entry = _verify(args, spec, ref)
    verifications = fitted.get("verifications")
    if not isinstance(verifications, list):
        verifications = fitted["verifications"] = []
    earlier = [(v, m) for v in verifications if (m := _first_median(v)) is not None]
    if earlier:
        then, median = earlier[0]
        drift = entry["ratio"]["median"] / median - 1
        print(f"drift against {then.get('host')} ({then.get('device')}, {then.get('when')}): {drift:+.1%}")
        entry["drift"] = drift
    verifications.append(entry)
    document.save(fitted, args.record or args.profile)
    print(f"fit record updated: {args.record or args.profile}")
    return 0


def _first_median(entry: Any) -> float | None:
    """A verification entry's median ratio when it is a finite positive number (a record is
    data from anyone: a forged figure is skipped, not divided by)."""
    ratio = entry.get("ratio") if isinstance(entry, dict) else None
    median = ratio.get("median") if isinstance(ratio, dict) else None
    if isinstance(median, int | float) and not isinstance(median, bool) and 0 < median < float("inf"):
        return float(median)
    return None


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("profile", help="measure what one training step of a real model costs")
    p.add_argument("model", help="MODULE:CALLABLE (or FILE.py:CALLABLE) returning (module, batch[, loss_fn])")
    p.add_argument("-o", "--output", type=Path, help="write the profile (JSON) here")
    p.add_argument("--name", help="the profile's name (default: the callable's)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=STEPS, help=f"timed steps (default {STEPS})")
    p.set_defaults(func=cmd_profile)

    f = sub.add_parser("fit", help="fit an hpcdl workload to a profile; --verify times it against the model")
    f.add_argument("profile", type=Path, help="a profile (JSON), or a fit record to verify again")
    f.add_argument("--family", help="search this family only (default: every family that takes the data)")
    f.add_argument("-o", "--output", type=Path, help="write the fitted spec (TOML) here")
    f.add_argument("--record", type=Path, help="write the fit record here (default: beside -o, .fit.json)")
    f.add_argument("--budget", type=float, default=300.0, help="seconds for the whole search (default 300)")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument(
        "--weights", default="", help="objective weights, e.g. params=1,flops=1,memory=0.5,mix=1,time=1"
    )
    f.add_argument("--finalists", type=int, default=FINALISTS, help="candidates timed (default 3)")
    f.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest params/FLOPs error (0.02)")
    f.add_argument("--device", default="cpu")
    f.add_argument("--verify", action="store_true", help="time the fit and the real model interleaved")
    f.add_argument(
        "--model",
        help="the real model for --verify, MODULE:CALLABLE or FILE.py:CALLABLE (its code runs; a "
        "profile's or record's own reference is only shown, never followed)",
    )
    f.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds of --verify ({ROUNDS})")
    f.set_defaults(func=cmd_fit)
