"""Submissions end to end on the reference results: a description filled from the records,
two packages that pass ``hpcdl check``, and copies tampered with the ways a careless or hostile
submitter would (an edited record, a member escaping the root, links, a device file, a
duplicate, a manifest mismatch, a missing workload), each named in one line; nothing is ever
written outside the folder an archive is extracted into."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import tarfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hpcdl_cli import hpcdl

from hpcdl.records.loader import MAX_JSON_BYTES, load_tree
from hpcdl.records.store import seal
from hpcdl.results import ranking as rank_mod
from hpcdl.submission import system
from hpcdl.submission.check import check, check_folder, summary
from hpcdl.submission.describe import from_records
from hpcdl.submission.manifest import sum_file
from hpcdl.submission.package import NotVerified, package
from hpcdl.submission.site import Site, build, write_site

REFERENCE = Path(__file__).resolve().parent.parent / "reference_results"
SYSTEMS = {
    "epyc-a": REFERENCE / "cpu-epyc-2core-2026-11-22",
    "epyc-b": REFERENCE / "cpu-epyc-2core-2026-11-23",
}
FILLED = {
    "submitter": "hpcdl <b>tests</b> & co",  # markup that the site must show as text
    "vendor": "a cloud",
    "availability": "available",
    "count": 1,
    "memory_per_node_gib": 24,
    "storage": "local disk",
    "os": "Debian 12",
    "mpi": "Open MPI 4.1.4",
    "horovod": "0.28.1",
}


def filled(data: dict[str, Any], name: str) -> dict[str, Any]:
    """A description from ``system init`` with every FILL-IN answered as a submitter would."""
    out = json.loads(json.dumps(data))
    for table in out.values():
        for key, value in table.items():
            if isinstance(value, str) and value.startswith(system.PLACEHOLDER):
                table[key] = FILLED[key]
    out["system"]["processor"]["count"] = FILLED["count"]
    out["system"]["name"] = name
    return out


def describe(folder: Path, name: str, dest: Path) -> Path:
    data = from_records([r.result for r in load_tree([folder]).records])
    path = dest / f"{name}.toml"
    path.write_text(system.to_toml(filled(data, name)))
    return path


def suites(folder: Path, dest: Path) -> Path:
    """A reference folder's suite at 1 and 2 ranks, with its logs: a complete class S."""
    for part in ("suite-np1", "suite-np2"):
        shutil.copytree(folder / part, dest / part)
        shutil.copy(folder / f"{part}.txt", dest)
    return dest


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The suites of both reference folders packaged (the list site's tests build on these)."""
    out = tmp_path_factory.mktemp("submissions")
    made = {}
    for name, folder in SYSTEMS.items():
        results = suites(folder, out / f"{name}-results")
        made[name] = package(results, describe(results, name, out), out / f"{name}-2026-11.tar.gz").path
    return made


# --- the description --------------------------------------------------------------------------


def test_init_fills_what_the_records_know_and_marks_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "system.toml"
    p = hpcdl("system", "init", str(SYSTEMS["epyc-b"]), "-o", str(out))
    assert p.returncode == 0, p.stderr
    data = system.read(out)
    assert data["system"]["processor"]["model"] == "AMD EPYC" and data["system"]["cpus_per_node"] == 2
    assert data["software"]["torch"] == "2.13.0+cpu" and data["software"]["python"] == "3.11.7"
    assert (data["submission"]["size_class"], data["submission"]["class_version"]) == ("S", 1)
    todo = [k for t in data.values() for k, v in t.items() if isinstance(v, str) and v.startswith("FILL-IN")]
    assert set(todo) == set(FILLED) - {"count"}
    p = hpcdl("system", "check", str(out))
    assert p.returncode == 2 and len(p.stdout.splitlines()) == len(todo) + 1  # + processor.count
    assert all("placeholder (FILL-IN)" in line for line in p.stdout.splitlines())


def test_a_bad_description_gets_one_line_per_problem(tmp_path: Path) -> None:
    good = filled(from_records([r.result for r in load_tree([SYSTEMS["epyc-b"]]).records]), "x")
    assert system.problems(good) == []
    bad = json.loads(json.dumps(good))
    del bad["system"]["vendor"]
    bad["system"]["nodes"] = "two"
    bad["system"]["availability"] = "soon"
    bad["system"]["accelerators"] = [{"model": "H100", "count": 0}]
    bad["software"]["torchh"] = "2.13"
    bad["submission"]["edition"] = "November"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    p = hpcdl("system", "check", str(path))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 6, lines
    for field in (
        "system.vendor is missing",
        "system.nodes='two'",
        "system.availability='soon'",
        "system.accelerators[0].count=0",
        "software.torchh=",
        "submission.edition='November'",
    ):
        assert sum(line.startswith(field) for line in lines) == 1, (field, lines)
    (tmp_path / "broken.toml").write_text("[system\n")
    p = hpcdl("system", "check", str(tmp_path / "broken.toml"))
    assert p.returncode == 2 and "not valid TOML" in p.stderr and len(p.stderr.splitlines()) == 1


def test_every_field_is_in_the_generated_reference() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs/reference/system-description.md").read_text()
    # the accelerators' two keys are documented in the row of their list
    names = {
        re.sub(r"^system\.accelerators\..*", "system.accelerators", f) for f in system.fields_documented()
    }
    assert [f for f in sorted(names) if f"| `{f}` |" not in text] == []


# --- packages and checks ----------------------------------------------------------------------


def test_both_reference_submissions_pass(packages: dict[str, Path], tmp_path: Path) -> None:
    for name, archive in packages.items():
        work = tmp_path / name
        work.mkdir()
        report = check(archive, work)
        assert report.problems == [], report.problems
        assert report.verified.score is not None and report.verified.score.score
        text = summary(report)
        assert "verdict: PASS" in text and "score" in text and f"system {name}" in text
    p = hpcdl("check", str(packages["epyc-a"]))
    assert p.returncode == 0 and "verdict: PASS" in p.stdout, p.stdout + p.stderr


def unpacked(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    (root,) = dest.iterdir()
    return root


def add(
    tar: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x", link: str = ""
) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def test_a_tampered_submission_fails_with_one_line_per_problem(
    packages: dict[str, Path], tmp_path: Path
) -> None:
    root = unpacked(packages["epyc-b"], tmp_path / "src")
    name = root.name
    suite2 = root / "results" / "suite-np2"
    record = next(suite2.glob("*-cnn-resnet-small.json"))  # an edited figure
    doc = json.loads(record.read_text())
    doc["metrics"]["samples_per_s"] *= 1.5
    record.write_text(json.dumps(doc))
    for f in suite2.glob("*-mlp-wide*"):  # a missing workload
        f.unlink()
    log = root / "results" / "suite-np1.txt"  # a log changed after packaging
    log.write_text(log.read_text() + "one more line\n")
    archive = tmp_path / "tampered.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname=name)
        add(tar, "../escaped.txt")
        add(tar, "/tmp/absolute.txt")
        add(tar, f"{name}/results/link.json", tarfile.SYMTYPE, link="/etc/passwd")
        add(tar, f"{name}/results/hard.json", tarfile.LNKTYPE, link=f"{name}/manifest.json")
        add(tar, f"{name}/results/dev", tarfile.CHRTYPE)
        add(tar, f"{name}/results/suite-np1.txt")  # a second member of one name
        add(tar, f"{name}/results/fifo", tarfile.FIFOTYPE)
        add(tar, f"{name}/results/huge.json", data=b" " * (MAX_JSON_BYTES + 1))
    work = tmp_path / "work"
    work.mkdir()
    report = check(archive, work)
    lines = report.problems
    expect = {
        "'../escaped.txt': a path that escapes": 1,
        "'/tmp/absolute.txt': an absolute path": 1,
        "link.json': a symbolic link": 1,
        "hard.json': a hard link": 1,
        "results/dev': a device file": 1,
        "suite-np1.txt': appears twice": 1,
        "results/fifo': a FIFO": 1,
        f"huge.json': {MAX_JSON_BYTES + 1} bytes, more than the {MAX_JSON_BYTES}": 1,
        "results/suite-np1.txt: its SHA-256 or size differs from the manifest": 1,
        "cnn-resnet-small.json: its SHA-256 or size differs": 1,
        "cnn-resnet-small.json: digest mismatch": 1,
        "-mlp-wide.json: in the manifest but missing": 1,
        "at 2 ranks: workload mlp-wide missing": 1,
        "at 2 ranks: workload cnn-resnet-small missing": 1,  # its only record is refused
    }
    for text, n in expect.items():
        assert sum(text in line for line in lines) == n, (text, lines)
    assert len(lines) == len(expect) + 1, "\n".join(lines)  # + the mlp-wide steps file missing
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/absolute.txt").exists()
    assert sorted(p.name for p in work.iterdir()) == [name]  # nothing beside the submission's folder
    p = hpcdl("check", str(archive))
    assert p.returncode == 1 and "verdict: FAIL, 15 problems" in p.stdout and "Traceback" not in p.stderr


def test_a_folder_with_a_link_or_an_added_record_fails(packages: dict[str, Path], tmp_path: Path) -> None:
    root = unpacked(packages["epyc-a"], tmp_path / "src")
    (root / "results" / "passwd.json").symlink_to("/etc/passwd")
    first = next((root / "results" / "suite-np1").glob("*-mlp-wide.json"))
    steps = first.parent / json.loads(first.read_text())["steps_file"]
    shutil.copy(first, root / "results" / "again.json")  # the same record twice
    shutil.copy(steps, root / "results" / steps.name)
    link = check_folder(root, "folder").problems
    assert sum("passwd.json: a symbolic link, not a regular file" in x for x in link) == 1, link
    assert sum("not verified while 1 links" in x for x in link) == 1, link
    (root / "results" / "passwd.json").unlink()
    lines = check_folder(root, "folder").problems
    assert sum("again.json: not in the manifest" in x for x in lines) == 1, lines
    assert sum(": duplicate of" in x for x in lines) == 1, lines


def test_a_description_that_disagrees_with_the_records_fails(
    packages: dict[str, Path], tmp_path: Path
) -> None:
    root = unpacked(packages["epyc-b"], tmp_path / "src")
    text = (root / "system.toml").read_text()
    for old, new in (
        ('model = "AMD EPYC"', 'model = "Intel Xeon"'),
        ('torch = "2.13.0+cpu"', 'torch = "2.12.0"'),
        ("cpus_per_node = 2", "cpus_per_node = 64"),
    ):
        assert old in text
        text = text.replace(old, new)
    (root / "system.toml").write_text(text)
    record = next((root / "results" / "suite-np2").glob("*-mlp-wide.json"))
    doc = json.loads(record.read_text())  # rank counts that disagree, under a digest made again
    doc["settings"]["global_batch"] += 1
    doc["settings"]["nodes"] = 2
    record.write_text(json.dumps(seal(doc)))
    _reseal(root)
    lines = check_folder(root, "folder").problems
    assert lines == [
        "results/suite-np2/20261123-060445-mlp-wide.json: its SHA-256 or size differs from the manifest's "
        "(changed after packaging)",
        "results/suite-np2/20261123-060445-mlp-wide.json: settings.global_batch=257 is not batch_per_rank x "
        "world_size (128 x 2)",
        "results/suite-np2/20261123-060445-mlp-wide.json: settings.nodes=2, settings.hosts=['vm']: its ranks "
        "ran on 1 hosts (vm)",
        "system.toml: software.torch='2.12.0' is invalid: 10 records say '2.13.0+cpu' "
        "(first: results/suite-np1/20261123-060325-attention-gpt-mini.json)",
        "system.toml: system.cpus_per_node='64' is invalid: 10 records say '2' "
        "(first: results/suite-np1/20261123-060325-attention-gpt-mini.json)",
        "system.toml: system.processor.model='Intel Xeon' is invalid: 10 records say 'AMD EPYC' "
        "(first: results/suite-np1/20261123-060325-attention-gpt-mini.json)",
        "system.toml: system.nodes='1' is invalid: 1 records say '2 nodes used' "
        "(first: results/suite-np2/20261123-060445-mlp-wide.json)",
    ], "\n".join(lines)


def test_package_refuses_results_that_do_not_verify(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(SYSTEMS["epyc-b"] / "suite-np1", results / "suite-np1")
    record = next(results.glob("suite-np1/*-rnn-lstm-lm.json"))
    doc = json.loads(record.read_text())
    doc["metrics"]["ai_ops_per_s"] *= 2
    record.write_text(json.dumps(doc))
    desc = describe(SYSTEMS["epyc-b"], "epyc-b", tmp_path)
    with pytest.raises(NotVerified) as e:
        package(results, desc, tmp_path / "x.tar.gz")
    assert any("rnn-lstm-lm.json: digest mismatch" in x for x in e.value.report.problems)
    p = hpcdl("package", str(results), "--system", str(desc), "-o", str(tmp_path / "x.tar.gz"))
    assert p.returncode == 1 and p.stdout.splitlines() == e.value.report.problems
    assert p.stderr.strip().endswith("does not verify (2 problems); nothing written"), p.stderr
    assert not list(tmp_path.glob("*.tar.gz")) and not list(tmp_path.glob(".*tmp*"))


# --- the list site ----------------------------------------------------------------------------

# Loads every page of the site in a frame and writes, once every image of every page has loaded
# or failed, how many pages and images there are and which did not load, where --dump-dom
# prints it (the approach of test_report_browser.py, for several pages at once).
HARNESS = """<!doctype html><html><body>%s<pre id="verdict">pending</pre>
<script>
const frames = Array.from(document.querySelectorAll("iframe"));
const loaded = frames.map(f => new Promise(r => f.addEventListener("load", () => r(f))));
Promise.all(loaded).then(fs => {
  const images = fs.flatMap(f => Array.from(f.contentDocument.images));
  const settled = images.map(i => i.complete ? null : new Promise(r => { i.onload = r; i.onerror = r; }));
  Promise.all(settled).then(() => {
    const broken = images.filter(i => i.naturalWidth === 0).map(i => i.getAttribute("src"));
    const titles = fs.map(f => f.contentDocument.title);
    document.getElementById("verdict").textContent = JSON.stringify({images: images.length, broken, titles});
  });
});
</script></body></html>
"""


@pytest.fixture(scope="module")
def site(packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Site]:
    """The site of both submissions, a later edition of epyc-a (the same records submitted
    again) and a submission of class S version 2, which this hpcdl cannot verify."""
    work = tmp_path_factory.mktemp("site-inputs")
    later = unpacked(packages["epyc-a"], work / "later")
    text = (later / "system.toml").read_text().replace('edition = "2026-11-22"', 'edition = "2026-12"')
    (later / "system.toml").write_text(text)
    _reseal(later)
    other = unpacked(packages["epyc-b"], work / "v2")
    (other / "system.toml").write_text(
        (other / "system.toml").read_text().replace("class_version = 1", "class_version = 2")
    )
    _reseal(other)
    out = tmp_path_factory.mktemp("site") / "site"
    built = build([packages["epyc-a"], packages["epyc-b"], later, other], out, say=lambda _m: None)
    return out, built


def _reseal(root: Path) -> None:
    """The manifest made again after the description was edited, as a submitter would repackage."""
    doc = json.loads((root / "manifest.json").read_text())
    doc["files"]["system.toml"] = asdict(sum_file(root / "system.toml", "system.toml"))
    (root / "manifest.json").write_text(json.dumps(doc))


@pytest.mark.slow(reason="the site's fixture draws two reports (about 15 s)")
def test_the_site_lists_each_class_version_with_exports(
    site: tuple[Path, Site], packages: dict[str, Path]
) -> None:
    out, built = site
    (refused,) = built.refused
    assert refused.problems == [
        "submission.class_version=2 is invalid: this hpcdl has class S version 1 only; "
        "check it with an hpcdl of that version"
    ]
    rows = list(csv.DictReader(open(out / "class-S-v1.csv")))
    assert [(r["rank"], r["system"], r["edition"]) for r in rows] == [
        ("1", "epyc-b", "2026-11-23"),
        ("2", "epyc-a", "2026-12"),  # its latest edition
    ]
    for r in rows:  # the score is results.score's, the same that hpcdl rank gives these records
        folder = suites(SYSTEMS[r["system"]], out.parent / f"ranked-{r['system']}")
        (scored,) = rank_mod.rank([(r["system"], folder)]).systems
        assert float(r["score_ai_ops_per_s"]) == scored.score and float(r["efficiency"]) == scored.efficiency
    doc = json.loads((out / "class-S-v1.json").read_text())
    assert (doc["class"], doc["class_version"], len(doc["systems"])) == ("S", 1, 2)
    records = [w["record"] for score in doc["scores"] for w in score["workloads"].values()]
    assert len(records) == 10 and all(r.startswith("results/suite-np2/") for r in records), records
    index = (out / "index.html").read_text()
    assert "class-S-v1.html" in index and "submission.class_version=2" in index
    history = (out / "systems" / "epyc-a.html").read_text()
    assert history.count(">report</a>") == 2 and ">2026-11-22<" in history and ">2026-12<" in history
    assert len(list((out / "reports").iterdir())) == 2  # the same results submitted twice: one report
    assert "<script" not in index + history and "http" not in index + history  # nothing external
    assert "hpcdl &lt;b&gt;tests&lt;/b&gt; &amp; co" in history and "<b>tests" not in index + history


@pytest.mark.browser
@pytest.mark.slow(reason="shares the site's fixture, which draws two reports (about 15 s)")
def test_the_site_opens_in_chromium(site: tuple[Path, Site], tmp_path: Path) -> None:
    """Every page (the index, the class list, each system) loads with every figure and a quiet
    console; screenshots of the index and a system page are pages, not blanks."""
    from browser import browse
    from test_report_browser import PNG_SIGNATURE

    out, _ = site
    pages = ["index.html", "class-S-v1.html", "systems/epyc-a.html", "systems/epyc-b.html"]
    frames = "".join(f'<iframe src="{p}" width="1280" height="2000"></iframe>' for p in pages)
    (out / "check.html").write_text(HARNESS % frames)
    p = browse("--allow-file-access-from-files", "--dump-dom", (out / "check.html").as_uri())
    found = re.search(r'<pre id="verdict">([^<]*)</pre>', p.stdout)
    assert found, p.stdout[-2000:] + p.stderr[-2000:]
    verdict = json.loads(found.group(1))
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    assert verdict["broken"] == [] and console == [], (verdict, console)
    assert verdict["images"] >= 2 * 5 and verdict["titles"] == [
        "hpcdl lists",
        "hpcdl list: Class S, suite version 1: smoke test: CPU minutes; the default of hpcdl run",
        "hpcdl system epyc-a",
        "hpcdl system epyc-b",
    ]
    for page, least in (("index.html", 20_000), ("systems/epyc-b.html", 100_000)):
        shot = tmp_path / "shot.png"
        p = browse("--window-size=1280,2400", f"--screenshot={shot}", (out / page).as_uri())
        assert p.returncode == 0 and shot.read_bytes()[:8] == PNG_SIGNATURE and shot.stat().st_size > least


@pytest.mark.slow(reason="shares the site's fixture")
def test_a_rebuilt_site_drops_the_pages_of_withdrawn_lists_and_systems(
    site: tuple[Path, Site], tmp_path: Path
) -> None:
    """Pages an earlier build wrote for a list or a system that is gone are removed; a file that
    is not one of the site's own names stays."""
    _, built = site
    out = tmp_path / "site"
    (out / "systems").mkdir(parents=True)
    stale = [out / "class-L-v1.csv", out / "class-L-v1.html", out / "systems" / "withdrawn.html"]
    for f in [*stale, out / "notes.txt"]:
        f.write_text("from an earlier build")
    write_site(built, out)
    assert not any(f.exists() for f in stale)
    assert (out / "notes.txt").exists() and (out / "class-S-v1.csv").exists()
    assert sorted(p.name for p in (out / "systems").iterdir()) == ["epyc-a.html", "epyc-b.html"]


def test_a_rebuilt_site_drops_the_reports_of_results_no_longer_listed(
    packages: dict[str, Path], tmp_path: Path
) -> None:
    """A report folder an earlier build made (named by its results' hash) and this one does not
    is removed; the current one is made, and a folder not named like a report stays."""
    out = tmp_path / "site"
    stale, other = out / "reports" / "0123456789abcdef", out / "reports" / "notes"
    for folder in (stale, other):
        folder.mkdir(parents=True)
        (folder / "index.html").write_text("from an earlier build")
    built = build([packages["epyc-a"]], out, say=lambda _m: None)
    (entry,) = built.entries
    assert sorted(p.name for p in (out / "reports").iterdir()) == sorted(["notes", entry.report_dir[8:]])
    assert (out / entry.report_dir / "index.html").is_file()
