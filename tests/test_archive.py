"""A maintainer's ``hpcdl check`` on archives built to hurt it (issue 50, item 2): each is refused
in one line naming the limit (docs/rules.md, "What a submission holds"), within a bound of time,
and nothing is written outside the folder it is extracted into.

The table is ``ARCHIVES``: a row builds one archive (cheaply: a gzip bomb is one compressed
megabyte of zeros repeated as concatenated gzip members, which a gzip reader reads as one
stream) and names the line expected. A new limit adds a row."""

from __future__ import annotations

import gzip
import io
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl
from test_faults import mount  # noqa: F401  (a fixture)

from hpcdl.submission import archive
from hpcdl.submission.check import check
from hpcdl.submission.layout import MAX_DEPTH, MAX_FILES, MAX_NAME_CHARS, MAX_PART_BYTES

TOP = "sys"
BOUND_S = 60.0
"""every refusal comes well within this on a loaded 2-core machine"""


def header(
    name: str,
    size: int = 0,
    kind: bytes = tarfile.REGTYPE,
    link: str = "",
    format_: int = tarfile.PAX_FORMAT,
    **pax: str,
) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname, info.mode = size, kind, link, 0o644
    info.pax_headers = pax
    return info.tobuf(format=format_)


def padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % tarfile.BLOCKSIZE)


ZEROS_MIB = gzip.compress(b"\0" * (1 << 20), compresslevel=9)
"""one MiB of zeros as a gzip member of about a kilobyte"""
END = gzip.compress(b"\0" * (2 * tarfile.BLOCKSIZE))


def bomb(path: Path, members: int, mib_each: int) -> None:
    """``members`` files of ``mib_each`` MiB of zeros, each a megabyte's gzip member repeated."""
    with open(path, "wb") as f:
        for i in range(members):
            f.write(gzip.compress(header(f"{TOP}/results/z{i}.h5", mib_each << 20)))
            f.write(ZEROS_MIB * mib_each)
        f.write(END)


def members(path: Path, names: list[str], data: bytes = b"x", **pax: str) -> None:
    """Regular files of these names (pax headers on the first), compressed once."""
    body = io.BytesIO()
    for i, name in enumerate(names):
        body.write(header(name, len(data), **(pax if i == 0 else {})) + padded(data))
    path.write_bytes(gzip.compress(body.getvalue() + b"\0" * 1024, compresslevel=1))


def chained(path: Path, count: int) -> None:
    """``count`` pax headers, one after the other, before a single member (tarfile recurses
    into each)."""
    member = header(f"{TOP}/results/x.txt", 1, format_=tarfile.USTAR_FORMAT)
    pax = header(f"{TOP}/results/x.txt", 1, comment="c")[: -len(member)]
    path.write_bytes(gzip.compress(pax * count + member + padded(b"x") + b"\0" * 1024))


def many(path: Path, count: int) -> None:
    """``count`` tiny files of distinct names: one header and one block each."""
    block = padded(b"x")
    body = b"".join(header(f"{TOP}/results/{i}.txt", 1) + block for i in range(count))
    path.write_bytes(gzip.compress(body + b"\0" * 1024, compresslevel=1))


def link_then_write(path: Path, target: Path) -> None:
    """A symbolic link to a folder outside, then a file whose path goes through the link."""
    with tarfile.open(path, "w:gz") as tar:
        for info, data in (
            (tarfile.TarInfo(f"{TOP}/results/out"), None),
            (tarfile.TarInfo(f"{TOP}/results/out/evil.json"), b"{}"),
        ):
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, str(target)
            else:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def hard_link(path: Path, target: Path) -> None:
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(f"{TOP}/results/passwd.json")
        info.type, info.linkname = tarfile.LNKTYPE, str(target)
        tar.addfile(info)


def sparse(path: Path, work: Path) -> None:
    """GNU tar's own sparse member: 100 MiB of which the archive holds one block."""
    folder = work / TOP / "results"
    folder.mkdir(parents=True)
    with open(folder / "holes.h5", "wb") as f:
        f.truncate(100 << 20)
        f.write(b"data")
    cmd = ["tar", "--sparse", "--format=gnu", "-czf", str(path), "-C", str(work), TOP]
    subprocess.run(cmd, check=True)


@dataclass(frozen=True)
class Case:
    build: Callable[[Path, Path], None]
    """write the archive at the path given; the second path is a folder outside to aim at"""
    said: str
    """the problem line, in part"""


EXPANDS = "its files expand to more than"
ARCHIVES = {
    "a gzip bomb: one member of 900 MiB in 1 MB": Case(lambda p, _: bomb(p, 1, 900), EXPANDS),
    "a gzip bomb of many members": Case(lambda p, _: bomb(p, 300, 1), EXPANDS),
    "200,000 tiny members": Case(lambda p, _: many(p, 200_000), f"more than {MAX_FILES} members"),
    "a name of 10,000 characters": Case(
        lambda p, _: members(p, [f"{TOP}/results/" + "n/" * 4_990 + "x.txt"]),
        f"more than {MAX_NAME_CHARS}",
    ),
    "a file name of 300 bytes": Case(
        lambda p, _: members(p, [f"{TOP}/results/{'a' * 300}.txt"]), f"more than {MAX_PART_BYTES} bytes"
    ),
    "folders 40 deep": Case(
        lambda p, _: members(p, [f"{TOP}/" + "d/" * 40 + "x.txt"]), f"more than {MAX_DEPTH}"
    ),
    "a pax header of 2 MiB": Case(
        lambda p, _: members(p, [f"{TOP}/results/x.txt"], comment="c" * (2 << 20)), "a header of more than"
    ),
    "5,000 pax headers chained": Case(lambda p, _: chained(p, 5_000), "extended headers chained too deep"),
    "a hard link": Case(lambda p, out: hard_link(p, out / "secret"), "a hard link"),
    "a write through a symbolic link": Case(link_then_write, "a symbolic link"),
    "a sparse member": Case(lambda p, out: sparse(p, p.parent / "sparse-src"), "a sparse file"),
}


def outside(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (to compare before and after)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", ARCHIVES)
def test_a_hostile_archive_is_refused_in_one_line_within_the_limits(tmp_path: Path, name: str) -> None:
    case = ARCHIVES[name]
    target = tmp_path / "outside"
    target.mkdir()
    (target / "secret").write_text("the maintainer's own file")
    path = tmp_path / f"{TOP}.tar.gz"
    case.build(path, target)
    before = outside(target)
    work = tmp_path / "work"
    work.mkdir()
    t0 = time.monotonic()
    report = check(path, work)
    took = time.monotonic() - t0
    said = [line for line in report.problems if case.said in line]
    assert len(said) == 1 and all("\n" not in line for line in report.problems), report.problems
    assert took < BOUND_S, f"{took:.0f} s"
    assert outside(target) == before and sorted(p.name for p in work.iterdir()) in ([], [TOP])
    extracted = [p for p in work.rglob("*") if p.is_symlink() or (p.is_file() and p.stat().st_nlink > 1)]
    assert extracted == [] and not (target / "evil.json").exists()
    p = hpcdl("check", str(path))
    assert p.returncode == 1 and "verdict: FAIL" in p.stdout and case.said in p.stdout, p.stdout + p.stderr
    assert "Traceback" not in p.stderr


def test_an_archive_that_outlasts_the_time_limit_stops_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline holds in every read and skip: with no time at all, nothing is read."""
    monkeypatch.setattr(archive, "MAX_SECONDS", 0.0)
    path = tmp_path / f"{TOP}.tar.gz"
    bomb(path, 1, 10)
    work = tmp_path / "work"
    work.mkdir()
    root, found = archive.extract(path, work)
    assert root is None and any("not read and extracted within 0 s" in x for x in found.problems), found
    assert list(work.iterdir()) == []


def test_an_archive_larger_than_the_free_space_is_not_extracted(tmp_path: Path, mount) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Its members fit every limit, not the disk of the extraction folder: nothing is extracted."""
    small = mount("small", "size=4m")
    path = tmp_path / f"{TOP}.tar.gz"
    bomb(path, 1, 8)  # 8 MiB: under the ratio's floor
    root, found = archive.extract(path, small)
    assert root is None and any("free: none extracted" in x for x in found.problems), found.problems
    assert list(small.iterdir()) == []


def test_member_problems_beyond_fifty_are_counted_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / f"{TOP}.tar.gz"
    members(path, [f"/abs/{i}.txt" for i in range(500)])
    work = tmp_path / "work"
    work.mkdir()
    _, found = archive.extract(path, work)
    assert sum("an absolute path" in x for x in found.problems) == archive.MAX_LISTED
    assert f"{500 - archive.MAX_LISTED} more members refused (not listed)" in found.problems


def test_the_limits_are_in_the_rules() -> None:
    """docs/rules.md states every limit with its value (a changed limit changes the rules)."""
    from hpcdl.submission import layout

    rules = (Path(__file__).resolve().parent.parent / "docs" / "rules.md").read_text()
    stated = {
        "MAX_FILES": f"{layout.MAX_FILES:,}",
        "MAX_TOTAL_BYTES": f"{layout.MAX_TOTAL_BYTES >> 30} GiB",
        "MAX_RATIO": f"{layout.MAX_RATIO} times the archive's size, above {layout.RATIO_FLOOR >> 20} MiB",
        "MAX_NAME_CHARS": f"{layout.MAX_NAME_CHARS:,}",
        "MAX_PART_BYTES": f"{layout.MAX_PART_BYTES}",
        "MAX_DEPTH": f"{layout.MAX_DEPTH}",
        "MAX_HEADER_BYTES": f"{layout.MAX_HEADER_BYTES >> 20} MiB",
        "MAX_SECONDS": f"{layout.MAX_SECONDS:g}",
    }
    rows = {name: [x for x in rules.splitlines() if f"`{name}`" in x] for name in stated}
    assert {n: len(r) for n, r in rows.items()} == dict.fromkeys(stated, 1), rows
    assert [n for n, value in stated.items() if f"| {value}" not in rows[n][0]] == []
    assert f"{archive.MAX_LISTED} refused members are listed" in " ".join(rules.split())
