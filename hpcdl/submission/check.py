"""``hpcdl check``: a submission (a ``.tar.gz`` or its folder) verified as a list maintainer
would: the archive's members (``archive``), the files against the manifest (``manifest``), the
description (``system``), and the results against the description (``verify``). One line per
problem, and a summary a reviewer reads."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from hpcdl.reader import size_text
from hpcdl.records.loader import Unreadable
from hpcdl.results.text import si, table
from hpcdl.submission import manifest, system
from hpcdl.submission.archive import extract
from hpcdl.submission.layout import DESCRIPTIONS, MAX_FILES, MAX_TOTAL_BYTES, RESULTS, walk
from hpcdl.submission.system import Description
from hpcdl.submission.verify import Verified, score_line, summary_rows, verify


@dataclass
class Report:
    """What checking one submission found."""

    shown: str
    """the submission as named on the command line"""
    root: Path | None = None
    """its folder (extracted from an archive into the caller's folder)"""
    description: Description | None = None
    verified: Verified = field(default_factory=Verified)
    problems: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    manifest: manifest.Manifest | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def is_archive(path: Path) -> bool:
    return path.name.endswith((".tar.gz", ".tgz", ".tar"))


def check(path: Path, workdir: Path) -> Report:
    """Check the submission at ``path``: an archive is inspected and what is safe of it
    extracted into the empty folder ``workdir`` first."""
    if not is_archive(path):
        return check_folder(path, str(path))
    root, found = extract(path, workdir)
    report = check_folder(root, str(path)) if root is not None else Report(str(path))
    report.problems = found.problems + report.problems
    return report


def check_folder(root: Path, shown: str) -> Report:
    """Check a submission's folder (see ``layout``)."""
    report = Report(shown, root)
    problems = report.problems
    if root.is_symlink() or not root.is_dir():
        problems.append(f"{shown}: not a submission folder or a .tar.gz, .tgz or .tar archive")
        return report
    walked = list(itertools.islice(walk(root), MAX_FILES + 1))  # a folder is bounded as an archive is
    entries = [e for e in walked if e.kind != "dir"]
    report.files, report.bytes = len(entries), sum(e.size for e in entries)
    if len(walked) > MAX_FILES or report.bytes > MAX_TOTAL_BYTES:
        problems.append(
            f"{shown}: more than {MAX_FILES} files and folders, or {size_text(MAX_TOTAL_BYTES)}: not read"
        )
        return report
    odd = [e for e in entries if e.kind != "file"]  # each named by the manifest's check
    try:
        report.manifest = manifest.read(root)
        problems += manifest.verify(root, report.manifest)
    except Unreadable as e:
        problems.append(f"{manifest.MANIFEST}: {e}")
    report.description, described = _description(root, problems)
    results = root / RESULTS
    if results.is_symlink() or not results.is_dir():
        problems.append(f"{RESULTS}/: missing (a submission's records live there)")
    elif odd:  # records are read only from a folder of regular files: a link is never followed
        problems.append(f"{RESULTS}/: not verified while {len(odd)} links or special files are present")
    elif report.description is not None:
        report.verified = verify(root, results, report.description, described)
        problems += report.verified.problems
    return report


def _description(root: Path, problems: list[str]) -> tuple[Description | None, str]:
    """The submission's description and its file's name (None, with the problems, if unsound)."""
    present = [n for n in DESCRIPTIONS if (root / n).exists() or (root / n).is_symlink()]
    if len(present) != 1:
        problems.append(f"the submission holds {len(present)} of {' or '.join(DESCRIPTIONS)}, not one")
        return None, ""
    try:
        data = system.read(root / present[0])
    except Unreadable as e:
        problems.append(f"{present[0]}: {e}")
        return None, present[0]
    found = system.problems(data)
    problems += [f"{present[0]}: {line}" for line in found]
    return (None if found else system.parse(data)), present[0]


def summary(r: Report) -> str:
    """A few lines a reviewer reads: the system, its software, the records, the class, the
    score and the verdict."""
    lines = [f"submission {r.shown}: {r.files} files, {si(r.bytes, 'B')}"]
    d = r.description
    if d is not None:
        s, sw = d.system, d.software
        accel = ", ".join(f"{a.count} x {a.model}" for a in s.accelerators) or "no accelerators"
        lines += [
            f"system {s.name} ({s.vendor}, {s.availability}) by {d.submission.submitter}, "
            f"edition {d.submission.edition}",
            f"  nodes: {s.nodes}, each {s.processor.count} x {s.processor.model} ({s.cpus_per_node} CPUs), "
            f"{s.memory_per_node_gib:g} GiB, {accel}; interconnect {s.interconnect}; storage {s.storage}",
            f"  {sw.os}; Python {sw.python}, torch {sw.torch}, hpcdl {sw.hpcdl}, MPI {sw.mpi}, "
            f"Horovod {sw.horovod}" + (f", CUDA {sw.cuda}, driver {sw.driver}" if sw.cuda else ""),
        ]
        v = r.verified
        lines.append(f"records: {len(v.accepted)} verified")
        if v.runs:
            lines.append(
                f"class {d.submission.size_class} version {d.submission.class_version}, "
                f"repeats stated: {d.submission.repeats} (samples/s: the olympic mean of the repeats):"
            )
            head = ["workload", "ranks", "records", "samples/s", "spread"]
            lines += ["  " + x for x in table(head, summary_rows(v)).splitlines()]
        lines.append(score_line(v.score))
    lines.append(f"verdict: {'PASS' if r.ok else f'FAIL, {len(r.problems)} problems'}")
    return "\n".join(lines)
