"""The one loader of results trees, and the commands that read trees (``hpcdl rank``, ``hpcdl
report``) over hostile files: real FIFOs, real symbolic-link loops, real sparse files, JSON that
is not an object or nests thousands deep, malformed sweep and allreduce summaries. Each is
rejected with its reason, quickly, and the rest of the tree still ranks."""

from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl

from hpcdl.errors import InputError
from hpcdl.records import schema
from hpcdl.records.loader import MAX_DEPTH, MAX_JSON_BYTES, Unreadable, load_tree, read_json, read_record
from hpcdl.results import ranking as rank_mod

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "reference_results" / "cpu-epyc-2core-2026-11-22"


def test_a_reference_tree_by_kind() -> None:
    tree = load_tree([REF])
    documents = sorted(REF.rglob("*.json"))
    assert tree.files == len(documents) and tree.unreadable == []
    kinds = {p.resolve(): json.loads(p.read_text()).get("schema") for p in documents}
    assert {r.path for r in tree.records} == {p for p, k in kinds.items() if k == schema.RESULT}
    assert {d.path for d in tree.sweeps} == {p for p, k in kinds.items() if k == schema.SWEEP}
    assert {d.path for d in tree.comms} == {p for p, k in kinds.items() if k == schema.COMM}
    assert {d.kind for d in tree.others} == {schema.SUITE, schema.RANKING}
    for r in tree.records:  # the view and the JSON as read, side by side
        assert r.raw == json.loads(r.path.read_text()) and r.result.name == r.raw["name"]
    assert [r.path for r in tree.records] == sorted(r.path for r in tree.records)


def test_a_path_that_does_not_exist_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="an existing record file or directory"):
        load_tree([tmp_path / "missing"])


HOSTILE_JSON = {
    "list.json": ("[1, 2]", "not a JSON object but list"),
    "text.json": ("not json", "unreadable: not JSON"),
    "latin1.json": (b'{"name": "caf\xe9"}', "unreadable: not UTF-8 text"),
    "deep.json": ("[" * 100_000 + "]" * 100_000, f"unreadable: JSON nested deeper than {MAX_DEPTH} levels"),
    "deep-but-parsed.json": ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "unreadable: JSON nested deeper"),
    "foreign.json": ('{"name": "package"}', "not an hpcdl document (schema None)"),
    "result.json": (
        json.dumps({"schema": schema.RESULT, "schema_version": 2, "metrics": {}}),
        "malformed record: record.id: missing",
    ),
    "sweep.json": (
        json.dumps({"schema": schema.SWEEP, "mode": "weak", "spec": {}, "points": [{"np": "two"}]}),
        "malformed sweep: sweep.points[0].np: expected an integer, got 'two'",
    ),
    "comm.json": (
        json.dumps({"schema": schema.COMM, "ranks": 2, "backend": "torch", "rows": "fast"}),
        "malformed comm: comm.rows: expected a list",
    ),
}
"""file name -> (content, the reason it is rejected with)"""


def hostile_files(folder: Path) -> dict[str, str]:
    """Every hostile file above, and those only the file system can make, in ``folder``:
    name -> the reason each is rejected with."""
    folder.mkdir(parents=True, exist_ok=True)
    reasons = {}
    for name, (content, reason) in HOSTILE_JSON.items():
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        reasons[name] = reason
    os.mkfifo(folder / "fifo.json")  # reading it would wait for a writer forever
    os.symlink("loop.json", folder / "loop.json")
    os.symlink("b-loop.json", folder / "a-loop.json")
    os.symlink("a-loop.json", folder / "b-loop.json")
    os.symlink("..", folder / "up.json")  # a directory, and a loop if followed
    os.symlink(".", folder / "here")  # not entered: the walk never follows a directory link
    subprocess.run(["truncate", "-s", str(4 * MAX_JSON_BYTES), str(folder / "sparse.json")], check=True)
    reasons |= {
        "fifo.json": "unreadable: a FIFO, not a regular file",
        "loop.json": "unreadable: a symbolic link loop",
        "a-loop.json": "unreadable: a symbolic link loop",
        "b-loop.json": "unreadable: a symbolic link loop",
        "up.json": "unreadable: a directory, not a regular file",
        "sparse.json": "unreadable: 268 MB, more than the 67.1 MB a document may hold",
    }
    return reasons


def test_every_hostile_file_is_unread_with_its_reason(tmp_path: Path) -> None:
    want = hostile_files(tmp_path / "bad")
    shutil.copy(REF / "scaling" / "comm-torch.json", tmp_path / "bad")
    t0 = time.monotonic()
    tree = load_tree([tmp_path])
    assert time.monotonic() - t0 < 10  # no FIFO waited for, no sparse file read
    got = {u.path.name: u.reason for u in tree.unreadable}
    assert set(got) == set(want)
    for name, reason in want.items():
        assert got[name].startswith(reason), (name, got[name])
    assert [d.path.name for d in tree.comms] == ["comm-torch.json"]  # the rest still reads


def test_read_json_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(Unreadable, match="a FIFO"):
        read_json(tmp_path / "fifo.json")
    with pytest.raises(Unreadable, match="unreadable: missing"):
        read_json(tmp_path / "missing.json")
    (tmp_path / "sweep.json").write_text(json.dumps({"schema": schema.SWEEP}))
    with pytest.raises(Unreadable, match="schema 'hpcdl.sweep', not hpcdl.result"):
        read_record(tmp_path / "sweep.json")


# --- the commands over a hostile tree --------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[Path, str]]:
    """The reference results with every hostile file among them; summaries that parse but hold
    figures no one measured (the report must draw around them); and a copy of a record whose
    steps file is a sparse file of 20 GB. Returns the tree and, for each hostile file, the
    reason it is rejected with."""
    root = tmp_path_factory.mktemp("tree") / "sys"
    shutil.copytree(REF, root, symlinks=True)
    want = {root / "hostile" / name: why for name, why in hostile_files(root / "hostile").items()}
    odd = {
        "sweep-odd-summary.json": {
            "schema": schema.SWEEP,
            "mode": "sideways",
            "spec": {"family": ["mlp"]},
            "points": [
                {"np": 0, "record": "x\u0000.json", "samples_per_s": float("nan")},
                {
                    "np": 1,
                    "record": "a.json",
                    "samples_per_s": 10.0,
                    "ai_ops_per_s": 1e9,
                    "batch_per_rank": 0,
                },
                {"np": 2, "record": "b.json", "samples_per_s": -5.0, "backend": "torch"},
            ],
        },
        "comm-one-size.json": {
            "schema": schema.COMM,
            "ranks": 2,
            "backend": "torch",
            "rows": [{"bytes": 1024, "backend_s": 0.0}],
        },
    }
    (root / "odd").mkdir()
    for name, doc in odd.items():
        (root / "odd" / name).write_text(json.dumps(doc))
    record = root / "scaling" / "mlp-torch-weak-np1.json"
    shutil.copy(record, root / "hostile" / record.name)
    steps = root / "hostile" / json.loads(record.read_text())["steps_file"]
    subprocess.run(["truncate", "-s", "20G", str(steps)], check=True)
    want[root / "hostile" / record.name] = (
        f"steps file '{steps.name}' beside {record.name}: 21.5 GB, more than"
    )
    return root, want


def test_rank_survives_a_hostile_tree(hostile_tree: tuple[Path, dict[Path, str]], tmp_path: Path) -> None:
    root, want = hostile_tree
    t0 = time.monotonic()
    p = hpcdl("rank", f"cpu={root}", "-o", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 120  # the sparse steps file is refused unhashed
    lines = [
        ln.removeprefix("rejected: ").split(": ", 1)
        for ln in p.stdout.splitlines()
        if ln.startswith("rejected: ")
    ]
    rejected = {Path(os.path.abspath(path)): why for path, why in (x for x in lines if len(x) == 2)}
    assert set(rejected) == set(want)
    for path, why in want.items():
        assert why in rejected[path], (path, rejected[path])
    clean = rank_mod.rank([("cpu", REF)])
    (row,) = csv.DictReader(open(tmp_path / "ranking.csv"))
    assert row["rank"] == "1" and float(row["score_ai_ops_per_s"]) == pytest.approx(clean.systems[0].score)


def test_report_survives_a_hostile_tree(hostile_tree: tuple[Path, dict[Path, str]], tmp_path: Path) -> None:
    root, want = hostile_tree
    p = hpcdl("report", str(root), "-o", str(tmp_path))
    assert p.returncode == 0, p.stderr
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    skipped = {**want, root / "odd" / "comm-one-size.json": "allreduce sweep not fitted"}
    record = root / "hostile" / "mlp-torch-weak-np1.json"  # a record: shown, as one that does not verify
    for path, why in skipped.items():
        if path != record:
            assert f"report: skipped {path}: {why}" in p.stderr
    assert "Files skipped, not shown above" in page and html.escape(skipped[record]) in page
    assert re.search(r"<img src='scaling-\d+-sweep-odd.png'", page)  # its one plausible point


@contextmanager
def read_only_dir(path: Path) -> Iterator[Path]:
    """A directory nobody may write in: by permissions, and for root (whom permissions do not
    stop) by the immutable attribute."""
    path.mkdir()
    path.chmod(0o555)
    immutable = os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(path)]).returncode == 0
    try:
        if os.geteuid() == 0 and not immutable:
            pytest.skip("root writes through permissions and chattr +i is unavailable")
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755)


@pytest.mark.parametrize(
    "command",
    [
        "rank",
        pytest.param(
            "report", marks=pytest.mark.slow(reason="the report over the hostile tree draws every figure")
        ),
    ],
)
def test_output_that_cannot_be_written_is_one_line(command: str, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a regular file")
    source = str(REF / "scaling")
    with read_only_dir(tmp_path / "ro") as ro:
        for out in (tmp_path / "file" / "out", ro / "out", ro):
            p = hpcdl(command, source, "-o", str(out))
            assert p.returncode == 2, p.stderr
            assert p.stderr.strip().splitlines()[-1].startswith(f"hpcdl: error: {command}.output="), p.stderr
            assert "Traceback" not in p.stderr
