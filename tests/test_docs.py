"""The documentation: the site builds with warnings as errors, the generated reference is what the
code says, a browser opens the site, every record field has its entry in docs/metrics.md, the
prose keeps its limits (README a front page, table cells short), and no page points at a file
that is gone."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from browser import browse  # beside this file, on pytest's path

from hpcdl.cli import reference
from hpcdl.records import views

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MAX_CELL = 200
MAX_README_LINES = 200
GONE = ("METRICS.md", "ARCHITECTURE.md", "SUBMITTING.md")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as CI builds it: ``mkdocs build --strict``."""
    out = tmp_path_factory.mktemp("site")
    p = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # the theme's notice of its end of life
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    assert "WARNING" not in p.stderr, p.stderr[-4000:]
    return out


def test_the_reference_is_what_the_code_generates() -> None:
    stale = [str(p.relative_to(ROOT)) for p in reference.stale()]
    assert stale == [], f"{', '.join(stale)} differ from the code: run {reference.WRITE} and commit them"


def test_the_site_builds_with_warnings_as_errors(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "reference" / "cli.html").is_file() and (site / "metrics.html").is_file()


@pytest.mark.browser
def test_a_browser_opens_the_index_and_a_generated_page(site: Path) -> None:
    for page, heading, expected in (
        ("index.html", "hpcdl", "Guides"),
        ("reference/cli.html", "Command line", "hpcdl rank"),
    ):
        p = browse("--dump-dom", (site / page).as_uri())
        assert p.returncode == 0, p.stderr[-2000:]
        dom = p.stdout
        assert re.search(rf"<h1[^>]*>{re.escape(heading)}", dom), (page, dom[:2000])
        assert expected in dom, page
        errors = [line for line in p.stderr.splitlines() if ":CONSOLE" in line and "Uncaught" in line]
        assert errors == [], (page, errors)


def _fields(cls: type, seen: set[type]) -> set[str]:
    """Every field name of a view and of the views under it."""
    names: set[str] = set()
    if cls in seen:
        return names
    seen.add(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        names.add(f.name)
        for inner in [hints[f.name], *typing.get_args(hints[f.name])]:
            if dataclasses.is_dataclass(inner) and isinstance(inner, type):
                names |= _fields(inner, seen)
    return names


def test_every_figure_of_a_record_has_an_entry_in_metrics() -> None:
    """A field added to the record's metrics, counts, settings or their blocks needs its key, unit
    and formula in docs/metrics.md."""
    text = (DOCS / "metrics.md").read_text()
    listed = set(re.findall(r"`([^`]+)`", text))
    words = {w for key in listed for w in re.split(r"[.\[\], ]+", key) if w}
    fields = set()
    for view in (views.Metrics, views.Counts, views.Settings):
        fields |= _fields(view, set())
    assert sorted(fields - words) == []


def hand_written() -> list[Path]:
    """README.md, CONTRIBUTING.md and every page of docs/ but the generated reference."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]
    return [p for p in pages if reference.PAGES_DIR not in p.parents or p.name not in reference.PAGES]


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row (an escaped pipe stays inside its cell)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_table_cells_are_short() -> None:
    long = [
        f"{page.relative_to(ROOT)}:{n}: {len(cell)} characters"
        for page in hand_written()
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if line.lstrip().startswith("|")
        for cell in _cells(line)
        if len(cell) > MAX_CELL
    ]
    assert long == [], "table cells of more than 200 characters (CONTRIBUTING.md):\n" + "\n".join(long)


def test_the_readme_is_a_front_page_whose_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_no_page_or_module_points_at_a_file_that_is_gone() -> None:
    """ARCHITECTURE.md, METRICS.md and SUBMITTING.md became pages of docs/; the validation
    entries may quote them, as they stood when the entries were written, and the changelog
    says where they went."""
    assert not [name for name in GONE if (ROOT / name).exists()]
    folders = ("hpcdl", "tests", "benchmarks", "scripts", "generators", "jobs", ".ci")
    files = [p for f in folders for p in (ROOT / f).rglob("*") if p.is_file() and p.suffix != ".pyc"]
    files += [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "mkdocs.yml", ROOT / "pyproject.toml"]
    files += [p for p in DOCS.rglob("*.md") if DOCS / "validation" not in p.parents]
    files.remove(DOCS / "changelog.md")
    this = Path(__file__).resolve()
    found = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in files
        if p.resolve() != this
        for name in GONE
        if name in p.read_text(errors="replace")
    ]
    assert found == []


def test_the_rules_name_the_record_version_the_code_writes() -> None:
    from hpcdl.records import schema

    rules = (ROOT / "docs" / "rules.md").read_text()
    assert re.search(rf"`{schema.RESULT}` version {schema.RESULT_VERSION}\b", rules)
