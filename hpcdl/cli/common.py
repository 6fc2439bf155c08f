"""What the CLI's command modules share: the one-line-error parser, stderr output and the
workload options (one family with knobs, a preset, or the default suite).

Nothing here imports torch at the top (the workloads' modules do): a parser is built without
it, and the handlers import what they run (``hpcdl --help`` answers at once)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from hpcdl.errors import HpcdlError, InputError, SpecError

if TYPE_CHECKING:
    from hpcdl.workloads.spec import Spec


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line and exit code 2, instead of argparse's usage block."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def one_of(names: Callable[[], Iterable[str]]) -> Callable[[str], str]:
    """An argparse ``type`` that takes one of ``names()``, asked only when the option is given:
    a registry of families may import torch and plugins, which ``--help`` does without (argparse's
    ``choices`` would list them in the help)."""

    def name(text: str) -> str:
        try:
            allowed = list(names())
        except InputError as e:  # a plugin that does not import: one line, not argparse's
            raise HpcdlError(str(e)) from None
        if text not in allowed:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r} (choose from {', '.join(map(repr, allowed))})"
            )
        return text

    return name


def family_names() -> list[str]:
    """Every family, plugins' too (``hpcdl list`` shows their knobs)."""
    from hpcdl.workloads.registry import FAMILIES

    return list(FAMILIES)


def check_names(args: argparse.Namespace) -> None:
    """Refuse an empty ``--class``, ``--preset`` or ``--workload`` (``--class ''`` once ran
    class S, the default for no name at all)."""
    from hpcdl.workloads import recipes

    for flag, attr, known in (
        ("spec", "spec", lambda: ["a spec file's path"]),
        ("class", "size_class", recipes.size_classes),
        ("preset", "preset", lambda: list(recipes.presets())),
        ("workload", "workload", family_names),
    ):
        value = getattr(args, attr, None)
        if value is not None and not str(value).strip():
            raise InputError(flag, value, "a name: one of " + ", ".join(known()))


def suite_class(args: argparse.Namespace) -> str:
    """The size class the command runs: ``--class``, or S when no workload is named."""
    from hpcdl.workloads import recipes

    check_names(args)
    if getattr(args, "size_class", None) is not None:
        return str(args.size_class)
    return "" if args.workload or args.preset or getattr(args, "spec", None) else recipes.DEFAULT_CLASS


def workload_specs(args: argparse.Namespace) -> dict[str, Spec]:
    """The specs named on the command line: one workload, a preset, or a class's suite."""
    from hpcdl.workloads import recipes
    from hpcdl.workloads.registry import parse_assignments, spec_from_args
    from hpcdl.workloads.spec import Spec

    check_names(args)
    if args.workload:
        return {args.workload: spec_from_args(args.workload, args.knobs)}
    if getattr(args, "spec", None) is not None:
        return {Path(args.spec).stem: saved_spec(Path(args.spec), args.knobs)}
    if args.preset:
        base = recipes.preset(args.preset)
        return {args.preset: recipes.preset(args.preset, **parse_assignments(type(base), args.knobs))}
    overrides = {}
    for word in args.knobs:
        key, sep, text = word.partition("=")
        if key not in recipes.TUNABLE or not sep:
            size_class = suite_class(args)
            allowed = f"class {size_class} fixes its workloads; it takes only " + ", ".join(
                f"{k}=" for k in recipes.TUNABLE
            )
            raise SpecError("knob", word, allowed)
        overrides[key] = Spec.parse_knob(key, text)
    return recipes.suite(suite_class(args)).specs(**overrides)


def saved_spec(path: Path, words: list[str]) -> Spec:
    """``--spec FILE``: the spec a file holds (``workloads.specfile``), ``key=value`` knobs over it."""
    from hpcdl.workloads.registry import family_class, parse_assignments
    from hpcdl.workloads.specfile import spec_file, spec_table

    table = spec_table(path, "spec")
    try:
        knobs = parse_assignments(family_class(table["family"]), words)
    except SpecError as e:  # mlp.heads -> spec.heads; family -> spec.family
        raise SpecError(f"spec.{e.field.rpartition('.')[2]}", e.value, e.allowed) from None
    return spec_file(path, "spec", knobs)


def add_workload_options(r: argparse.ArgumentParser) -> None:
    g = r.add_mutually_exclusive_group()
    g.add_argument(
        "--workload",
        type=one_of(family_names),
        metavar="FAMILY",
        help="family of one workload (hpcdl list names them, plugins' too); knobs follow as key=value",
    )
    g.add_argument(
        "--preset",
        help="a preset (resnet50, gpt2_small, ...) or a class's workload (cnn-resnet-small, ...); "
        "knobs override it",
    )
    g.add_argument(
        "--spec",
        metavar="FILE",
        help="a saved spec: hpcdl fit -o's TOML (a fitted proxy), a fit or result record; knobs override it",
    )
    g.add_argument(
        "--class",
        dest="size_class",
        metavar="CLASS",
        help="the standard suite of a size class: S (default: a smoke test), M (one node), L (multi-node)",
    )
    r.add_argument(
        "knobs",
        nargs="*",
        help="key=value knob settings (for the suite: batch_size, accumulation_steps, precision, seed)",
    )


def ranks_fit_here(np: int) -> None:
    """Refuse ``--np N`` (one line) when this host cannot hold N rank processes, before mpirun
    starts them (``hpcdl run`` says so in its preflight; a ``comm --np 1000`` once started a
    thousand)."""
    import torch

    from hpcdl.measure.fit import rank_memory
    from hpcdl.parallel.world import World

    rank_memory(torch.device("cpu"), World(size=np, local_size=np))
