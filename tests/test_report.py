"""hpcdl report: the HTML page and its PNG figures, built from the real reference records."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import hpcdl
from hpcdl.errors import HpcdlError
from hpcdl.metrics import memory_estimate
from hpcdl.records.audit import DIGEST_MISMATCH, Audit
from hpcdl.records.loader import Record, SweepSummary, read_record
from hpcdl.records.store import file_sha256, load_record, read_steps, seal, write_record, write_steps
from hpcdl.records.views import read_result
from hpcdl.results.report import write_report
from hpcdl.results.report.memory import memory_points, sample_elements
from hpcdl.results.report.write import NO_POWER

REFERENCE = Path(__file__).resolve().parent.parent / "reference_results"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def reference_records() -> list[tuple[Path, dict[str, Any]]]:
    found = [(p, load_record(p)) for p in sorted(REFERENCE.rglob("*.json"))]
    return [(p, r) for p, r in found if r.get("schema") == "hpcdl.result"]


def reference_record(world_size: int) -> Path:
    """A reference record of the given rank count that has its steps file."""
    return next(p for p, r in reference_records() if r["settings"]["world_size"] == world_size)


def copy_record(src: Path, dest: Path, edit: Any = None, reseal: bool = True) -> Path:
    """The record and its steps file copied into ``dest``, changed by ``edit(record)``; sealed
    again unless ``reseal`` is false (a record edited by hand)."""
    dest.mkdir(parents=True, exist_ok=True)
    rec = load_record(src)
    shutil.copy(src.parent / rec["steps_file"], dest / rec["steps_file"])
    if edit:
        edit(rec)
    return write_record(seal(rec) if reseal else rec, dest / src.name)


def img_sources(page: str) -> list[str]:
    return re.findall(r"<img src='([^']+)'", page)


def plus_ten_percent(summary: SweepSummary) -> dict[int, float]:
    """A 'model' 10 % above every measured point, extended to twice the largest rank count."""
    points = {p.np: p.samples_per_s for p in summary.points if p.record and p.samples_per_s}
    top = max(points)
    return {**{n: 1.1 * x for n, x in points.items()}, 2 * top: 2.2 * points[top]}


@pytest.fixture(scope="module")
def reference_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[str]]:
    said: list[str] = []
    out = tmp_path_factory.mktemp("report")
    index = write_report([REFERENCE], out, predicted=plus_ten_percent, say=said.append)
    return index, index.read_text(encoding="utf-8"), said


def test_figures_exist_and_are_png(reference_report: tuple[Path, str, list[str]]) -> None:
    index, page, said = reference_report
    sources = img_sources(page)
    assert index.name == "index.html" and len(sources) >= 4
    assert sorted(sources) == sorted(p.name for p in index.parent.glob("*.png"))
    for name in sources:
        data = (index.parent / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 10_000, name
    assert f"writing {len(sources)} figures" in said[0]


def test_every_record_and_sweep_is_shown(reference_report: tuple[Path, str, list[str]]) -> None:
    _, page, said = reference_report
    records = reference_records()
    assert f"report: {len(records)} records" in said[0]
    for _, rec in records:
        assert f">{html.escape(rec['name'])}</td>" in page
    sources = img_sources(page)
    for summary in REFERENCE.rglob("*-summary.json"):
        if load_record(summary)["schema"] != "hpcdl.sweep":  # a knob sweep's: tests/test_report_browser.py
            continue
        stem = summary.stem.removesuffix("-summary")
        assert any(s.startswith("scaling-") and s.endswith(f"-{stem}.png") for s in sources), stem
    assert {"phases.png", "memory.png"} <= set(sources)
    if any(r["settings"]["world_size"] > 1 for _, r in records):
        assert "per-rank.png" in sources


def test_power_section_matches_the_steps_files(reference_report: tuple[Path, str, list[str]]) -> None:
    _, page, _ = reference_report
    traced = [p for p, r in reference_records() if "gpu_power_w" in read_steps(p.parent / r["steps_file"])]
    assert ("power.png" in img_sources(page)) == bool(traced)
    assert (NO_POWER in page) == (not traced)


def test_predicted_line_comes_with_its_error(reference_report: tuple[Path, str, list[str]]) -> None:
    _, page, _ = reference_report
    assert "predicted samples/s" in page and "the scaling model&#x27;s prediction" in page
    tables = re.findall(r"<table class='prediction'>.*?</table>", page)  # not the stragglers' excess
    errors = [e for t in tables for e in re.findall(r"<td>([+-]\d+\.\d)%</td>", t)]
    assert errors and set(errors) == {"+10.0"}


def test_report_without_a_model_draws_no_prediction(tmp_path: Path) -> None:
    records = reference_records()
    ones = {repr(r["spec"]): p for p, r in records if r["settings"]["world_size"] == 1}
    pair = next(
        (ones[repr(r["spec"])], p)
        for p, r in records
        if r["settings"]["world_size"] > 1 and repr(r["spec"]) in ones
    )
    for i, p in enumerate(pair):
        copy_record(p, tmp_path / "in" / str(i))
    index = write_report([tmp_path / "in"], tmp_path / "out", say=lambda _line: None)
    page = index.read_text(encoding="utf-8")
    assert any(s.startswith("scaling-") for s in img_sources(page))
    assert "predicted samples/s" not in page


def test_edited_record_is_marked(tmp_path: Path) -> None:
    def double(rec: dict[str, Any]) -> None:
        rec["metrics"]["samples_per_s"] *= 2

    path = copy_record(reference_record(1), tmp_path / "in", double, reseal=False)
    page = write_report([path], tmp_path / "out", say=lambda _line: None).read_text(encoding="utf-8")
    name = html.escape(load_record(path)["name"])
    assert page.count(DIGEST_MISMATCH) >= 2  # in the table and in the list of records that do not verify
    assert re.search(rf"<li><b>{re.escape(name)}</b>.*{re.escape(DIGEST_MISMATCH)}", page)


def test_record_strings_are_escaped(tmp_path: Path) -> None:
    nasty = "<script>alert('x')</script> & $\\frac{$"  # HTML, and a broken matplotlib formula

    def rename(rec: dict[str, Any]) -> None:
        rec["name"] = nasty
        rec["environment"]["host"] = "<b>host</b>"

    copy_record(reference_record(2), tmp_path / "in", rename)
    index = write_report([tmp_path / "in"], tmp_path / "out", say=lambda _line: None)
    page = index.read_text(encoding="utf-8")
    assert "<script>" not in page and "<b>host</b>" not in page
    assert html.escape(nasty) in page and "&lt;b&gt;host&lt;/b&gt;" in page
    assert "per-rank.png" in img_sources(page)  # the name is drawn as a panel title too


def test_power_trace_is_drawn(tmp_path: Path) -> None:
    def add_trace(rec: dict[str, Any]) -> None:
        steps = tmp_path / "in" / rec["steps_file"]
        columns = {k: v.tolist() for k, v in read_steps(steps).items()}
        times = [0.1 * i for i in range(50)]
        columns |= {"gpu_time_s": times, "gpu_power_w": [250 + 50 * (i % 7) for i in range(50)]}
        write_steps(columns, steps)
        rec["steps_sha256"] = file_sha256(steps)

    copy_record(reference_record(1), tmp_path / "in", add_trace)
    page = write_report([tmp_path / "in"], tmp_path / "out", say=lambda _line: None).read_text(
        encoding="utf-8"
    )
    assert "power.png" in img_sources(page) and NO_POWER not in page
    assert "none: every record matches its digest" in page


def test_no_records_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(HpcdlError, match="an existing record file or directory"):
        write_report([tmp_path / "missing"], tmp_path / "out")
    with pytest.raises(HpcdlError, match="no hpcdl records"):
        write_report([tmp_path], tmp_path / "out")
    suite = next(REFERENCE.rglob("*-suite.json"), None)
    if suite is not None:  # other JSON is skipped quietly, so this is still "no records"
        shutil.copy(suite, tmp_path / suite.name)
        said: list[str] = []
        with pytest.raises(HpcdlError, match="no hpcdl records"):
            write_report([tmp_path], tmp_path / "out", say=said.append)
        assert said == []


MLP_BATCHES = (4, 16, 64)


@pytest.fixture(scope="module")
def mlp_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real records of one tiny MLP at several batch sizes per rank, on the CPU."""
    out = tmp_path_factory.mktemp("mlp")
    config = hpcdl.RunConfig(steps=3, warmup_steps=1, min_duration_s=0.0, device="cpu")
    for batch in MLP_BATCHES:
        spec = hpcdl.MLPSpec(batch_size=batch, layers=2, width=32, input_size=48, output_size=4)
        hpcdl.run(spec, config, output_dir=out, name=f"mlp-tiny-b{batch}")
    return out


def test_memory_points_are_input_size_against_peak_memory(mlp_records: Path) -> None:
    records = [Audit(read_record(p), ()) for p in sorted(mlp_records.glob("*.json"))]
    points = sorted(memory_points(records), key=lambda p: p.input_elements)
    assert [p.input_elements for p in points] == [b * 48 for b in MLP_BATCHES]
    assert len({p.workload for p in points}) == 1  # one workload: one curve
    for p, a in zip(points, sorted(records, key=lambda a: a.result.settings.batch_per_rank), strict=True):
        d = a.record.raw
        assert p.family == "mlp" and p.measured_bytes == d["metrics"]["peak_memory_bytes"]
        assert p.estimate_bytes == d["metrics"]["memory"]["estimated"]["total"]  # the record's own split
        counts, batch = d["counts"], d["settings"]["batch_per_rank"]
        older = memory_estimate(counts["params"], counts["memory_bytes_per_sample"], batch, "adamw")
        # a version 2 record from before the split (records.migrate): recomputed from its counts
        del d["metrics"]["memory"]
        d["schema_version"] = 2
        assert memory_points([Audit(Record(a.record.path, read_result(d)), ())])[0].estimate_bytes == older
    estimates = [p.estimate_bytes for p in points]
    assert estimates == sorted(estimates) and estimates[0] < estimates[-1]


def test_memory_figure_of_one_family_at_several_batch_sizes(mlp_records: Path, tmp_path: Path) -> None:
    index = write_report([mlp_records], tmp_path / "out", say=lambda _line: None)
    page = index.read_text(encoding="utf-8")
    assert "memory.png" in img_sources(page)
    data = (index.parent / "memory.png").read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 10_000
    assert "against the input size of one step" in page


@pytest.mark.parametrize("family", sorted(hpcdl.FAMILIES))
def test_sample_elements_is_the_numel_of_one_sample(family: str) -> None:
    spec = hpcdl.FAMILIES[family]()
    one = spec.sample_inputs(1, torch.Generator(), torch.device("cpu"))
    assert sample_elements(spec.to_dict()) == one.numel() > 0


def test_records_without_a_valid_spec_have_no_memory_point() -> None:
    _, rec = reference_records()[0]
    assert memory_points([Audit(Record(Path("x.json"), read_result(rec)), ())])
    broken = {**rec, "spec": {**rec["spec"], "family": "no-such-family"}}
    assert memory_points([Audit(Record(Path("x.json"), read_result(broken)), ())]) == []


def test_two_machines_stay_apart_and_no_label_repeats(tmp_path: Path) -> None:
    """issue 45: ``report results/ reference/`` merged two machines (both hosts named ``vm``)
    into one system and ``phases.png`` repeated its labels; ``NAME=DIR``, as ``rank`` takes
    them, keeps them apart, and a figure's labels are distinct in any case."""
    from hpcdl.results.report.data import labels, load
    from hpcdl.results.report.plots import phase_plots

    suite = REFERENCE / "cpu-epyc-2core-2026-11-23" / "suite-np1"
    for name in ("mine", "theirs"):
        for src in sorted(suite.glob("*.json"))[:2]:
            if load_record(src).get("schema") == "hpcdl.result":
                copy_record(src, tmp_path / name)
    data = load([("mine", tmp_path / "mine"), ("theirs", tmp_path / "theirs")], say=lambda _m: None)
    names = labels(data.records)
    assert len(set(names.values())) == len(data.records) == 4
    assert {n.split(": ")[0] for n in names.values()} == {"mine", "theirs"}
    (plot,) = phase_plots(data.records)
    assert len({row for row, _ in plot.draw.keywords["rows"]}) == 4  # each bar its own label
    merged = load([("", tmp_path)], say=lambda _m: None)  # one system: the same records twice
    assert len(set(labels(merged.records).values())) == 4  # told apart by their files
    index = write_report([("mine", tmp_path / "mine"), ("theirs", tmp_path / "theirs")], tmp_path / "out",
                         say=lambda _m: None)  # fmt: skip
    page = index.read_text()
    systems = page.split("<h2>Systems</h2>")[1].split("</table>")[0]
    assert "<td>mine</td>" in systems and "<td>theirs</td>" in systems
