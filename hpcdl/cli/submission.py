"""CLI commands of submissions and lists: ``hpcdl system init|check``, ``hpcdl package``,
``hpcdl check`` and ``hpcdl list-site`` (docs/guide/submissions.md)."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from hpcdl.cli.common import Parser, err
from hpcdl.errors import InputError
from hpcdl.parallel.launch import private_folder
from hpcdl.records.loader import Unreadable, load_tree
from hpcdl.submission import system as system_mod

# check, package and list-site audit records, which counts their FLOPs with the families' code
# (torch): their modules are imported by the handlers, so that --help and system check need none


def read_description(field: str, path: Path) -> dict[str, Any]:
    """A description file's object; :class:`InputError` (exit 2) when it does not read."""
    try:
        return system_mod.read(path)
    except Unreadable as e:
        raise InputError(field, str(path), f"a readable .toml or .json system description ({e})") from None


def cmd_system_init(args: argparse.Namespace) -> int:
    from hpcdl.submission.describe import from_records

    out = Path(args.output)
    if out.exists() and not args.force:
        raise InputError("system.output", str(out), "a file that does not exist yet (or --force)")
    tree = load_tree([Path(args.results)])
    if not tree.records:
        raise InputError("system.results", args.results, "a results tree with at least one record")
    data = from_records([r.result for r in tree.records])
    text = system_mod.to_toml(data) if out.suffix != ".json" else _json(data)
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise InputError(
            "system.output", str(out), f"a file that can be written ({e.strerror or e})"
        ) from None
    left = [p for p in system_mod.problems(data) if "placeholder (FILL-IN)" in p]
    print(f"wrote {out} from {len(tree.records)} records; {len(left)} fields to fill in (FILL-IN):")
    for line in left:
        print(f"  {line}")
    return 0


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1) + "\n"


def cmd_system_check(args: argparse.Namespace) -> int:
    data = read_description("system.file", Path(args.file))
    found = system_mod.problems(data)
    for line in found:
        print(line)
    if found:
        err(f"system check: {args.file}: {len(found)} problems")
        return 2
    d = system_mod.parse(data)
    s = d.system
    print(f"{args.file}: sound: {s.name}, {s.nodes} nodes, class {d.submission.size_class}")
    return 0


def cmd_package(args: argparse.Namespace) -> int:
    from hpcdl.submission.check import summary
    from hpcdl.submission.layout import MANIFEST
    from hpcdl.submission.package import NotVerified, package

    try:
        done = package(Path(args.results), Path(args.system), Path(args.output))
    except NotVerified as e:
        for line in e.report.problems:
            print(line)
        raise
    kinds = Counter(Path(n).suffix or Path(n).name for n in done.left_out)
    if kinds:
        left = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        err(f"package: left out {left} files (figures and pages are made again from the records)")
    if done.report is not None:
        print(summary(done.report))
    print(f"wrote {done.path}: {len(done.files)} files and {MANIFEST}")
    return 0


def submission_path(field: str, text: str) -> Path:
    """A submission named on the command line: an archive or a folder that exists."""
    from hpcdl.submission.check import is_archive

    path = Path(text)
    if not (path.is_dir() or (path.is_file() and is_archive(path))):
        raise InputError(field, text, "an existing NAME.tar.gz (.tgz, .tar) or submission folder")
    return path


def cmd_check(args: argparse.Namespace) -> int:
    from hpcdl.submission.check import check, summary

    path = submission_path("check.submission", args.submission)
    with private_folder("check") as tmp:
        report = check(path, Path(tmp))
        for line in report.problems:
            print(f"{report.shown}: {line}")
        print(summary(report))
    return 0 if report.ok else 1


def cmd_list_site(args: argparse.Namespace) -> int:
    from hpcdl.submission.site import build

    paths = [submission_path("list-site.submission", p) for p in args.submissions]
    out = Path(args.output)
    site = build(paths, out, say=err)
    for r in site.refused:
        for line in r.problems:
            print(f"{r.shown}: {line}")
    lists = site.lists()
    print(
        f"wrote {out / 'index.html'}: {len(lists)} lists, {len(site.systems)} systems, "
        f"{len(site.refused)} submissions not listed"
    )
    return 0 if not site.refused else 1


def add_parsers(sub: Any) -> None:
    sy = sub.add_parser("system", help="a submission's system description: init from records, check")
    ss = sy.add_subparsers(dest="system_command", required=True, parser_class=Parser)
    init = ss.add_parser("init", help="a description filled from the records, FILL-IN where only you know")
    init.add_argument("results", help="the results tree (hpcdl run -o DIR)")
    init.add_argument(
        "-o", "--output", default="system.toml", help="the file (.toml or .json; default system.toml)"
    )
    init.add_argument("--force", action="store_true", help="overwrite the file")
    init.set_defaults(func=cmd_system_init)
    ck = ss.add_parser("check", help="check a description: one line per problem, exit 2 on any")
    ck.add_argument("file", help="the description (.toml or .json)")
    ck.set_defaults(func=cmd_system_check)

    pk = sub.add_parser("package", help="bundle results and a system description into NAME.tar.gz")
    pk.add_argument("results", help="the results tree (hpcdl run -o DIR)")
    pk.add_argument("--system", required=True, help="the system description (hpcdl system init)")
    pk.add_argument("-o", "--output", required=True, help="NAME.tar.gz; its folder is NAME/")
    pk.set_defaults(func=cmd_package)

    ch = sub.add_parser("check", help="verify a submission as a list maintainer: exit 1 on any problem")
    ch.add_argument("submission", help="NAME.tar.gz or its folder")
    ch.set_defaults(func=cmd_check)

    ls = sub.add_parser("list-site", help="publish checked submissions as a static list site")
    ls.add_argument("submissions", nargs="+", help="NAME.tar.gz files or submission folders")
    ls.add_argument("-o", "--output", default="site", help="the site's folder (default: site)")
    ls.set_defaults(func=cmd_list_site)
