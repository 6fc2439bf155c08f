"""Hostile documents against every reader hpcdl has (issue 16, item 7): each document must give
one line (an ``HpcdlError`` of exit code 2), never a traceback, a hang or the memory gone.

The table is readers x documents. A new kind of document adds one row to ``READERS``: where its
file lies (``place``), how hpcdl reads it (``read``), the module that reads it (``module``), and
a document of the right form with one field of the wrong type (``wrong_field``). Every module
of hpcdl that reads a document through ``hpcdl/reader.py`` must have a row, or say in
``ELSEWHERE`` where its reading is tested: a new reader (a spec file, a class job file, the peak
store) fails ``test_every_module_that_reads_documents_has_a_row`` until it has one. Most cells
call the Python reader; a few commands are run end to end at the bottom (they are slow)."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pytest
from hpcdl_cli import hpcdl, one_line
from test_caps import fake_sysfs

from hpcdl.errors import HpcdlError
from hpcdl.measure import caps, journal
from hpcdl.measure.limits import SYSFS_ENV
from hpcdl.reader import MAX_DOCUMENT_BYTES


@dataclass(frozen=True)
class Reader:
    name: str
    module: str
    """the module of hpcdl that reads it (``hpcdl.records.loader``)"""
    place: Callable[[Path], Path]
    """where the document lies, given an empty private folder (its parents made)"""
    read: Callable[[Path], object]
    """read the document at that place as hpcdl does"""
    toml: bool = False
    wrong_field: str | None = None
    """a document of the right form with one field of the wrong type"""
    entered: bool = False
    """a directory in its place is walked into, not read (a results tree)"""


def _record(path: Path) -> object:
    from hpcdl.records.loader import read_record

    return read_record(path)


def _comm(path: Path) -> object:
    from hpcdl.records.loader import read_comm

    return read_comm(path)


def _tree(path: Path) -> object:
    """hpcdl rank and report read trees: a file that cannot be read is listed, with its reason."""
    from hpcdl.records.loader import load_tree

    tree = load_tree([path.parent])
    (unread,) = tree.unreadable
    raise HpcdlError(f"{unread.path}: {unread.reason}")


def _profile(path: Path) -> object:
    from hpcdl.proxy import as_profile

    return as_profile(path)


def _fit_record(path: Path) -> object:
    from hpcdl.proxy.document import load

    return load(path)  # the reader of hpcdl fit's positional argument, profile or fit record


def _job(path: Path) -> object:
    from hpcdl.schedulers.load import load_job

    return load_job(path)


def _journal(path: Path) -> object:
    os.environ[journal.JOURNAL_ENV] = str(path)
    try:
        return caps.recover(say=lambda _m: None)
    finally:
        del os.environ[journal.JOURNAL_ENV]


def _manifest(path: Path) -> object:
    from hpcdl.measure.hdf5 import read_manifest

    return read_manifest(path.parent)


def _state(path: Path) -> object:
    from hpcdl.schedulers.state import load_state

    return load_state(path.parent)


def _point(path: Path) -> object:
    from hpcdl.schedulers.entry import read_point

    return read_point(path)


def _system(path: Path) -> object:
    from hpcdl.scaling.system import load_system

    return load_system(str(path))


def _description(path: Path) -> object:
    from hpcdl.submission import system

    return system.load(path)


def _diagnosis(path: Path) -> object:
    from hpcdl.results.diagnosis import load_diagnosis

    return load_diagnosis(path)


def _spec_file(path: Path) -> object:
    from hpcdl.workloads.specfile import spec_file

    return spec_file(path, "spec")  # hpcdl run --spec FILE, and a job file's spec = "FILE"


def _in(folder: str, name: str) -> Callable[[Path], Path]:
    def place(root: Path) -> Path:
        (root / folder).mkdir(mode=0o700)
        return root / folder / name

    return place


RECORD_WRONG = json.dumps({"schema": "hpcdl.result", "schema_version": 1, "spec": "mlp"})
READERS = [
    Reader("record", "hpcdl.records.loader", _in("r", "rec.json"), _record, wrong_field=RECORD_WRONG),
    Reader(
        "results tree",
        "hpcdl.records.loader",
        _in("t", "rec.json"),
        _tree,
        wrong_field=RECORD_WRONG,
        entered=True,
    ),
    Reader(
        "comm sweep",
        "hpcdl.records.loader",
        _in("c", "comm.json"),
        _comm,
        wrong_field=json.dumps({"schema": "hpcdl.comm", "ranks": "two", "backend": "torch", "rows": []}),
    ),
    Reader(
        "profile",
        "hpcdl.proxy.document",
        _in("p", "profile.json"),
        _profile,
        wrong_field=json.dumps({"schema": "hpcdl.profile", "input": "images"}),
    ),
    Reader(
        "fit record", "hpcdl.proxy.document", _in("f", "x.fit.json"), _fit_record
    ),  # its fields: tests/test_proxy.py
    Reader(
        "job file",
        "hpcdl.schedulers.load",
        _in("j", "job.toml"),
        _job,
        toml=True,
        wrong_field='nodes = "many"\n[workload]\npreset = 3\n',
    ),
    Reader(
        "caps journal",
        "hpcdl.measure.journal",
        _in("cj", "caps.json"),
        _journal,
        wrong_field=json.dumps({"pid": "12", "limits": []}),
    ),
    Reader(
        "shard manifest",
        "hpcdl.measure.hdf5",
        _in("h", "hpcdl-shards.json"),
        _manifest,
        wrong_field=json.dumps({"spec": {}, "shards": ["4"], "batch_size": 8}),
    ),
    Reader(
        "job state",
        "hpcdl.schedulers.state",
        _in("s", "hpcdl-jobs.json"),
        _state,
        wrong_field=json.dumps({"schema": "hpcdl.jobs", "points": []}),
    ),
    Reader(
        "point file",
        "hpcdl.schedulers.entry",
        _in("pt", "point.json"),
        _point,
        wrong_field=json.dumps({"job": 5}),
    ),
    Reader(
        "system file",
        "hpcdl.scaling.system",
        _in("sy", "system.toml"),
        _system,
        toml=True,
        wrong_field="name = 5\n",
    ),
    Reader(
        "diagnosis",
        "hpcdl.results.diagnosis",
        _in("dg", "diag.json"),
        _diagnosis,
        wrong_field=json.dumps({"schema": "hpcdl.diagnosis", "threshold": 0.9, "links": [{"hosts": "ab"}]}),
    ),
    Reader(
        "spec file",
        "hpcdl.workloads.specfile",
        _in("sp", "proxy.toml"),
        _spec_file,
        toml=True,
        wrong_field='family = "mlp"\nwidth = "wide"\n',
    ),
    # its fields: one line per problem, tests/test_submission.py
    Reader(
        "system description", "hpcdl.submission.system", _in("sd", "system.toml"), _description, toml=True
    ),
]


def _fifo(path: Path, reader: Reader) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path, reader: Reader) -> None:
    path.symlink_to("/dev/zero")  # a link to a device: read until the memory is gone


def _directory(path: Path, reader: Reader) -> None:
    path.mkdir()


def _deep(path: Path, reader: Reader) -> None:
    path.write_text(("a = " if reader.toml else "") + "[" * 100_000 + "]" * 100_000 + "\n")


def _wrong_top(path: Path, reader: Reader) -> None:
    path.write_text("= [1, 2]\n" if reader.toml else "[1, 2]\n")  # TOML's top is always a table


def _binary(path: Path, reader: Reader) -> None:
    path.write_bytes(b"\xff\xfe\x00\x01 not text")


def _huge(path: Path, reader: Reader) -> None:
    with open(path, "wb") as f:
        f.truncate(MAX_DOCUMENT_BYTES + 1)  # sparse: no disk used


def _wrong_field(path: Path, reader: Reader) -> None:
    assert reader.wrong_field is not None
    path.write_text(reader.wrong_field)


DOCUMENTS: dict[str, Callable[[Path, Reader], None]] = {
    "fifo": _fifo,
    "link to /dev/zero": _dev_zero,
    "directory": _directory,
    "nested 100,000 deep": _deep,
    "wrong top-level type": _wrong_top,
    "not UTF-8": _binary,
    "64 MB + 1 (sparse)": _huge,
    "a field of the wrong type": _wrong_field,
}


class Hung(Exception):
    pass


@pytest.fixture
def deadline() -> Iterator[None]:
    """A reader that blocks (a FIFO opened for reading waits for a writer) fails the test in
    5 s instead of hanging it: SIGALRM interrupts the blocking call."""

    def fire(signum: int, frame: FrameType | None) -> None:
        raise Hung("the reader blocked for 5 s")

    before = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


CELLS = [
    pytest.param(reader, document, id=f"{reader.name}-{document}")
    for reader in READERS
    for document in DOCUMENTS
    if (document != "a field of the wrong type" or reader.wrong_field is not None)
    and (document != "directory" or not reader.entered)
]


@pytest.mark.parametrize(("reader", "document"), CELLS)
def test_a_hostile_document_is_one_line(
    reader: Reader, document: str, tmp_path: Path, deadline: None
) -> None:
    path = reader.place(tmp_path)
    DOCUMENTS[document](path, reader)
    with pytest.raises(HpcdlError) as e:
        reader.read(path)
    message = str(e.value)
    assert e.value.exit_code == 2 and message and "\n" not in message, message
    assert "Traceback" not in message


ELSEWHERE = {
    "hpcdl.reader": "the reader itself: every row above",
    "hpcdl.records.store": "records: the record rows (store reads a record back through loader)",
    "hpcdl.records.audit": "steps files beside records: tests/test_audit.py",
    "hpcdl.measure.environment": "HPCDL_CAP, set by hpcdl sweep for its own ranks: test_a_bad_cap_...",
    "hpcdl.measure.watchdog": "heartbeats in the launcher's private scratch: tests/test_faults.py",
    "hpcdl.submission.archive": "archives: tests/test_archive.py, a row per limit",
    "hpcdl.submission.manifest": "a submission's manifest: tests/test_submission.py",
    "hpcdl.submission.package": "results packaged: tests/test_submission.py",
    "hpcdl.schedulers.logs": "a job's logs, read from their end: test_a_job_log_is_read_from_its_end_only",
    "hpcdl.measure.peakstore": "its own store, a damaged one as none: test_a_hostile_peak_store_...",
}
"""modules that read through hpcdl/reader.py but have no row above, and where they are tested"""
READS = {"document", "read_json", "read_bytes", "parse_json", "parse_toml", "open_regular", "read_object"}
"""the bounded reader's functions (``read_object``: records.loader's, over them)"""


def reading_modules() -> set[str]:
    """Every module of hpcdl that calls a function of the bounded reader: ``reader.X(...)``, or
    ``X(...)`` imported from hpcdl.reader or hpcdl.records.loader."""
    root = Path(__file__).resolve().parent.parent / "hpcdl"
    found = set()
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module in ("hpcdl.reader", "hpcdl.records.loader")
            for alias in node.names
        }
        module = path.relative_to(root.parent).with_suffix("").as_posix().replace("/", ".")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            via_reader = (
                isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "reader"
            )
            name = f.attr if via_reader else f.id if isinstance(f, ast.Name) and f.id in imported else ""
            if name in READS or (module == "hpcdl.reader" and isinstance(f, ast.Name) and f.id in READS):
                found.add(module)
    return found


def test_every_module_that_reads_documents_has_a_row() -> None:
    covered = {r.module for r in READERS} | set(ELSEWHERE)
    assert sorted(reading_modules() - covered) == [], "a reader of documents without a row in READERS"
    assert sorted(covered - reading_modules() - {"hpcdl.reader"}) == [], (
        "a row of a module that reads nothing"
    )


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if d != "a field of the wrong type"])
def test_a_hostile_peak_store_is_read_as_none_at_once(document: str, tmp_path: Path, deadline: None) -> None:
    """The peak store is this machine's own file, not a submitter's: a damaged one is as none
    (the next run probes and stores anew), never a hang or a traceback."""
    from hpcdl.measure import peakstore

    path = tmp_path / "store" / "peaks.json"
    path.parent.mkdir(mode=0o700)
    DOCUMENTS[document](path, READERS[0])
    assert peakstore.stored("a CPU", "fp32", path) is None


def test_every_reader_has_a_wrong_field_row_or_says_where_it_is_tested() -> None:
    assert [r.name for r in READERS if r.wrong_field is None] == ["fit record", "system description"]


# --- end to end: commands, exit 2 and one line, nothing run -------------------------------------


def test_commands_refuse_hostile_documents_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hpcdl fit on a link to /dev/zero, hpcdl sweep under a journal nested 100,000 deep, through
    the command line's own error path (hpcdl submit on a FIFO, in a subprocess:
    tests/test_faults.py)."""
    zero, deep = tmp_path / "zero.json", tmp_path / "j" / "caps.json"
    zero.symlink_to("/dev/zero")
    deep.parent.mkdir(mode=0o700)
    deep.write_text("[" * 100_000 + "]" * 100_000)
    monkeypatch.setenv(journal.JOURNAL_ENV, str(deep))
    monkeypatch.setenv(SYSFS_ENV, str(fake_sysfs(tmp_path / "sys")))
    sweep = ["sweep", "--workload", "mlp", "--np", "1", "--steps", "2", "--clock-limit", "1500"]
    for argv, why in [
        (["fit", str(zero)], "a character device, not a regular file"),
        ([*sweep, "-o", str(tmp_path / "out")], "JSON nested deeper than 64 levels"),
    ]:
        assert why in one_line(hpcdl(*argv))
    assert not (tmp_path / "out").exists()


# --- forged figures: a record edited and sealed again passes its digest ----------------------------

REFERENCE = Path(__file__).parent.parent / "reference_results/cpu-epyc-2core-2026-11-23/suite-np1"
RECORD = "20261123-060325-mlp-wide"
TARGET = {"fraction": 0.5, "window_steps": 1, "loss_first": 2.0, "loss_final": 0.9, "samples_to_target": 100}
FORGED = {
    "time to target 0, not reached": ("metrics.target", {**TARGET, "reached": False, "time_to_target_s": 0}),
    "time to target -5, reached": ("metrics.target", {**TARGET, "reached": True, "time_to_target_s": -5}),
    "cap 1e308 W": ("environment.cap", {"kind": "power", "value": 1e308, "unit": "W", "limits": []}),
    "cap -1e308 W": ("environment.cap", {"kind": "power", "value": -1e308, "unit": "W", "limits": []}),
    "cap of NaN MHz": ("environment.cap", {"kind": "clock", "value": float("nan"), "unit": "MHz"}),
    "samples/s 1e308": ("metrics.samples_per_s", 1e308),
    "an infinite window": ("metrics.timed_window_s", float("inf")),
    "negative energy": ("metrics.energy.energy_to_solution_j", -1.0),
}


def forge(folder: Path, name: str, where: str, value: object) -> Path:
    """The reference record with one figure replaced, sealed again, its steps file beside it."""
    from hpcdl.records.store import seal

    doc = json.loads((REFERENCE / f"{RECORD}.json").read_text())
    *parents, key = where.split(".")
    part = doc
    for p in parents:
        part = part[p]
    part[key] = value
    folder.mkdir(exist_ok=True)
    for steps in REFERENCE.glob(f"{RECORD}.*.steps.h5"):
        (folder / steps.name).write_bytes(steps.read_bytes())
    path = folder / f"{len(list(folder.glob('*.json')))}-{re.sub(r'[^A-Za-z0-9]+', '-', name)}.json"
    path.write_text(json.dumps(seal(doc)))
    return path


@pytest.mark.parametrize("name", FORGED)
def test_a_forged_figure_is_refused_before_arithmetic(tmp_path: Path, name: str) -> None:
    from hpcdl.records.audit import audit, out_of_range
    from hpcdl.records.loader import read_record

    where, value = FORGED[name]
    record = read_record(forge(tmp_path, name, where, value))
    found = out_of_range(record.result)
    assert found and where.split(".")[-1] in found[0] and all("\n" not in x for x in found), found
    assert audit(record).problems[-len(found) :] == tuple(found)


def test_rank_and_report_reject_forged_figures_in_one_line(tmp_path: Path) -> None:
    """The issue's probes: rank died of a math domain error on a time to target of 0 or -5,
    report in matplotlib on caps of +-1e308."""
    records = tmp_path / "records"
    for name, (where, value) in FORGED.items():
        forge(records, name, where, value)
    p = hpcdl("rank", str(records), "-o", str(tmp_path / "rank"))
    out, err = p.stdout, p.stderr
    assert p.returncode == 0 and (out + err).count("rejected:") == len(FORGED) and "Traceback" not in err, (
        out + err
    )
    p = hpcdl("report", str(records), "-o", str(tmp_path / "report"))
    err = p.stderr
    assert p.returncode == 2
    assert err.count("figures out of range") == len(FORGED) and "no hpcdl records" in err, err


# --- a point file's fields, each of the wrong type --------------------------------------------

POINT = {
    "job": "j", "name": "j-n1", "nodes": 1, "tasks_per_node": 2, "spec": {"family": "mlp"}, "run": {},
    "output": "out", "launcher": "mpirun", "cluster": "local", "repeat": 1, "instances": 1, "per_device": 1,
}  # fmt: skip
WRONG = {
    "job": "../x", "name": "a/b", "nodes": "two", "tasks_per_node": True, "spec": [1], "run": "fast",
    "output": 7, "launcher": None, "cluster": ["slurm"], "repeat": 0, "instances": 10**12, "per_device": 1.5,
}  # fmt: skip


@pytest.mark.parametrize("field", WRONG)
def test_a_point_file_names_its_wrong_field_in_one_line(tmp_path: Path, field: str) -> None:
    from hpcdl.schedulers.entry import read_point
    from hpcdl.schedulers.point import Point

    assert Point.from_dict(POINT).nodes == 1  # the point is sound but for the field below
    path = tmp_path / "point.json"
    path.write_text(json.dumps({**POINT, field: WRONG[field]}))
    with pytest.raises(HpcdlError) as e:
        read_point(path)
    assert f"point field {field}=" in str(e.value) and "\n" not in str(e.value), e.value


@pytest.mark.parametrize("text", ["{", "[1, 2]", "[" * 1000 + "]" * 1000, '"\\udcff"', "\x1b[2J"])
def test_a_bad_cap_in_the_environment_is_one_line(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcdl.measure.caps import CAP_ENV
    from hpcdl.measure.environment import cap_in_force

    monkeypatch.setenv(CAP_ENV, text)
    with pytest.raises(HpcdlError) as e:
        cap_in_force()
    assert e.value.exit_code == 2 and "\n" not in str(e.value) and CAP_ENV in str(e.value)


def test_a_job_log_is_read_from_its_end_only(tmp_path: Path, deadline: None) -> None:
    """hpcdl status reads why a job failed from the end of its logs: a FIFO or a link to a device
    in a log's place is passed over at once, a log of 64 GB (sparse) costs its last 20 kB."""
    from hpcdl.schedulers.logs import TAIL_BYTES, log_error, tail

    os.mkfifo(tmp_path / "0_0_log.err")
    (tmp_path / "0_1_log.err").symlink_to("/dev/zero")
    assert log_error(tmp_path) == ""
    big = tmp_path / "big" / "0_0_log.err"
    big.parent.mkdir()
    with open(big, "wb") as f:
        f.truncate(64 << 30)
        f.write(b"hpcdl: error: the first line, long gone\n")
    with open(big, "ab") as f:
        f.write(b"\nhpcdl: rank 1 on n2 failed: RuntimeError: the last word\n")
    assert len(tail(big)) == TAIL_BYTES
    assert log_error(big.parent) == "hpcdl: rank 1 on n2 failed: RuntimeError: the last word"


def test_a_refused_value_of_a_megabyte_is_shown_in_a_line_of_a_few_hundred_characters(tmp_path: Path) -> None:
    p = hpcdl("run", "--class", "x" * (1 << 20), "-o", str(tmp_path / "out"))
    line = one_line(p)
    assert "class='xxx" in line and "xxx... is invalid: " in line and len(line) < 600, len(line)
