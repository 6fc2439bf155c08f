"""``hpcdl package``: a results tree and its system description bundled into one ``.tar.gz``
with a manifest of SHA-256 checksums (``layout``), after the same verification ``hpcdl check``
runs; results that do not verify are never packaged."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpcdl.errors import HpcdlError, InputError
from hpcdl.parallel.launch import private_folder
from hpcdl.records.loader import Unreadable, open_regular
from hpcdl.submission import manifest, system
from hpcdl.submission.check import Report, check_folder
from hpcdl.submission.layout import KINDS, MANIFEST, MAX_FILES, RESULTS, limit_of, walk

ARCHIVE_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]{0,99})\.tar\.gz$")


class NotVerified(HpcdlError):
    """Results that do not verify: nothing was packaged (exit code 1, like ``hpcdl check``)."""

    exit_code = 1

    def __init__(self, results: Path, report: Report) -> None:
        self.report = report
        super().__init__(
            f"package: {results} does not verify ({len(report.problems)} problems); nothing written"
        )


@dataclass
class Packaged:
    path: Path
    files: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    """files of the results tree that are not of a kind a submission holds (figures, pages)"""
    report: Report | None = None


def package(results: Path, description: Path, out: Path) -> Packaged:
    """Write ``out`` (``NAME.tar.gz``, whose folder is ``NAME/``); :class:`InputError` for a bad
    path or description, :class:`NotVerified` (with ``report``) when the results do not verify."""
    match = ARCHIVE_NAME.match(out.name)
    if not match:
        raise InputError("package.output", str(out), "NAME.tar.gz, NAME of letters, digits, . _ -")
    if not results.is_dir() or results.is_symlink():
        raise InputError("package.results", str(results), "a results directory (hpcdl run -o DIR)")
    try:
        data = system.read(description)
    except Unreadable as e:
        raise InputError("package.system", str(description), f"a readable system description ({e})") from None
    found = system.problems(data)
    if found:
        raise InputError("package.system", str(description), "a sound description: " + "; ".join(found))
    if not out.parent.is_dir():
        raise InputError("package.output", str(out), "a file in an existing directory")
    name = match.group(1)
    done = Packaged(out)
    with contextlib.ExitStack() as staging:
        try:  # beside the archive, hidden; it goes however package ends (or at the next one)
            tmp = staging.enter_context(private_folder("package", out.parent, hidden=True))
        except OSError as e:
            raise InputError(
                "package.output", str(out), f"a folder that can be written ({e.strerror or e})"
            ) from None
        # Staged as the folder the archive will hold, so that it is checked exactly as a list
        # maintainer will check it, before the archive exists.
        stage = Path(tmp) / name
        _stage(results, description, stage, done)
        report = check_folder(stage, str(results))
        done.report = report
        if not report.ok:
            raise NotVerified(results, report)
        try:
            _write(stage, name, out)
        except OSError as e:
            out.with_name(f".{out.name}.tmp").unlink(missing_ok=True)
            raise InputError(
                "package.output", str(out), f"a file that can be written ({e.strerror or e})"
            ) from None
    return done


def _stage(results: Path, description: Path, stage: Path, done: Packaged) -> None:
    """Copy what a submission holds into ``stage`` (links and special files refused)."""
    try:
        entries = list(walk(results))
    except OSError as e:
        raise InputError("package.results", str(results), f"a directory that can be read ({e})") from None
    refused = [f"{e.name}: {e.kind}, not a regular file" for e in entries if e.kind not in ("file", "dir")]
    if refused:
        raise InputError("package.results", str(results), "regular files only: " + "; ".join(refused[:5]))
    # hidden files (a writer's lock, a half-written temporary file) are not results
    visible = [
        e.name for e in entries if e.kind == "file" and not any(p.startswith(".") for p in e.name.split("/"))
    ]
    kept = [n for n in visible if n.endswith(KINDS)]
    done.left_out = [n for n in visible if not n.endswith(KINDS)]
    if len(kept) > MAX_FILES:
        raise InputError("package.results", str(results), f"at most {MAX_FILES} files")
    sums = {}
    for rel, src in [(f"{RESULTS}/{n}", results / n) for n in kept] + [
        (f"system{description.suffix}", description)
    ]:
        dest = stage / rel
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open_regular(src, limit_of(rel), "a file of this kind may hold in a submission") as f:
                with open(dest, "wb") as w:
                    while chunk := f.read(1 << 20):
                        w.write(chunk)
        except Unreadable as e:
            raise InputError("package.results", str(src), f"a file a submission may hold ({e})") from None
        except OSError as e:  # staging beside the output: a full disk
            raise InputError(
                "package.output", str(stage.parent.parent), f"room to stage ({e.strerror or e})"
            ) from None
        sums[rel] = manifest.sum_file(dest, rel)
        done.files.append(rel)
    (stage / MANIFEST).write_text(json.dumps(manifest.document(sums), indent=1) + "\n")


def _write(stage: Path, name: str, out: Path) -> None:
    """The staged folder as ``out``, written beside it and renamed into place: members are
    regular files and folders only, owned by nobody in particular."""
    tmp = out.with_name(f".{out.name}.tmp")
    now = int(time.time())
    with tarfile.open(tmp, "w:gz") as tar:
        for entry in [None, *walk(stage)]:
            rel = name if entry is None else f"{name}/{entry.name}"
            info = tarfile.TarInfo(rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = now, 0, 0, "", ""
            if entry is None or entry.kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            with open(stage / entry.name, "rb") as f:  # staged here: copied within bounds
                info.size, info.mode = os.fstat(f.fileno()).st_size, 0o644
                tar.addfile(info, f)
    os.replace(tmp, out)
