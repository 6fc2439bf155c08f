"""The HTML report in a real browser: Debian's headless Chromium opens index.html, takes a
screenshot, and a harness page beside it checks that every figure loaded; any console message
of the report (an error, an uncaught exception) fails the test. scripts/setup.sh --test
installs chromium."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from browser import browse  # beside this file, on pytest's path

from hpcdl.results.report import write_report

REFERENCE = Path(__file__).resolve().parent.parent / "reference_results"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Loads the report in a frame of the same directory (file:// pages may read each other with
# --allow-file-access-from-files) and writes, once every image has loaded or failed, how many
# images there are and which did not load, where --dump-dom prints it.
HARNESS = """<!doctype html><html><body>
<iframe id="report" src="index.html" width="1280" height="2000"></iframe><pre id="verdict">pending</pre>
<script>
const frame = document.getElementById("report");
frame.addEventListener("load", () => {
  const images = Array.from(frame.contentDocument.images);
  const settled = images.map(i => i.complete ? null : new Promise(r => { i.onload = r; i.onerror = r; }));
  Promise.all(settled).then(() => {
    const broken = images.filter(i => i.naturalWidth === 0).map(i => i.getAttribute("src"));
    const sources = images.map(i => i.getAttribute("src"));
    document.getElementById("verdict").textContent = JSON.stringify({images: images.length, broken, sources});
  });
});
</script></body></html>
"""
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow(reason="draws a full report of the reference results and opens every page in Chromium"),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    write_report([REFERENCE], out, say=lambda _line: None)
    return out


def verdict(report: Path) -> tuple[dict, list[str]]:
    """(the harness's verdict, the report's console messages)."""
    (report / "check.html").write_text(HARNESS)
    p = browse("--allow-file-access-from-files", "--dump-dom", (report / "check.html").as_uri())
    found = re.search(r'<pre id="verdict">([^<]*)</pre>', p.stdout)
    assert found, p.stdout[-2000:] + p.stderr[-2000:]
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line and "index.html" in line]
    return json.loads(found.group(1)), console


def test_every_figure_loads_and_the_console_stays_quiet(report: Path) -> None:
    result, console = verdict(report)
    assert result["images"] == len(list(report.glob("*.png"))) >= 5
    assert result["broken"] == [] and console == [], (result, console)


def test_the_knob_curves_and_operator_mixes_render(report: Path) -> None:
    """The reference's knob sweeps (hpcdl sweep --knob: seq_len, and batch_size with --fit) draw a
    figure each, and its profiled runs (--profile) the operator mix; the browser loads them."""
    result, _ = verdict(report)
    knobs = [src for src in result["sources"] if src.startswith("knob-")]
    assert any("along-seq-len" in src for src in knobs) and any("along-batch-size" in src for src in knobs)
    assert "operators.png" in result["sources"]
    assert not set(knobs + ["operators.png"]) & set(result["broken"])
    page = (report / "index.html").read_text()
    assert "Along a knob" in page and "Operator classes" in page


def test_a_missing_figure_is_caught(report: Path, tmp_path: Path) -> None:
    """The check can fail: with one figure gone, the browser reports it."""
    copy = tmp_path / "copy"
    shutil.copytree(report, copy)
    (copy / "phases.png").unlink()
    result, _ = verdict(copy)
    assert result["broken"] == ["phases.png"]


def test_screenshot(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    p = browse("--window-size=1280,3000", f"--screenshot={shot}", (report / "index.html").as_uri())
    assert p.returncode == 0, p.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 50_000  # a page of tables and figures, not a blank one
