"""Verification, score and ranking on real records: the reference results measured on this
project's CPU machine, copies of them edited the ways a hand (or a buggy tool) would, and
short real runs that the ranking's gate must refuse."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from typing import Any

import hpcdl_cli  # beside this file, on pytest's path
import pytest

import hpcdl
from hpcdl.records.audit import RANK_MIN_WINDOW_S
from hpcdl.records.store import load_record, seal, write_record
from hpcdl.results import ranking as rank_mod
from hpcdl.results.score import loss_reduction, quality_factor, suite_workload
from hpcdl.workloads.recipes import suite

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "reference_results" / "cpu-epyc-2core-2026-11-22"


def suite_records(folder: Path) -> dict[int, dict[str, Path]]:
    """world size -> suite workload -> path of its fastest record, read straight from the files."""
    found: dict[int, dict[str, Path]] = {}
    best: dict[tuple[int, str], float] = {}
    for path in sorted(folder.rglob("*.json")):
        rec = json.loads(path.read_text())
        name = suite_workload(rec["spec"]) if rec.get("schema") == "hpcdl.result" else None
        n = rec["settings"]["world_size"] if name else 0
        if name and rec["metrics"]["ai_ops_per_s"] > best.get((n, name), 0.0):
            best[(n, name)] = rec["metrics"]["ai_ops_per_s"]
            found.setdefault(n, {})[name] = path
    return found


@pytest.fixture
def ref_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "sys"
    shutil.copytree(REF, dest)
    return dest


def rank_one(folder: Path, name: str = "sys") -> rank_mod.Ranking:
    return rank_mod.rank([(name, folder)])


def reasons(r: rank_mod.Ranking, path: Path) -> str:
    return "; ".join(x.reason for x in r.rejected if Path(x.path).resolve() == path.resolve())


def test_reference_results_rank_with_the_score_recomputed_by_hand(tmp_path: Path) -> None:
    r = rank_mod.rank([("cpu-ref", REF)])
    assert r.rejected == []
    (s,) = r.systems
    by_size = suite_records(REF)
    complete = sorted(n for n, w in by_size.items() if len(w) == len(suite().workloads))
    top = complete[-1]
    ai_ops = [load_record(by_size[top][w])["metrics"]["ai_ops_per_s"] for w in suite().workloads]
    assert s.world_size == top
    assert s.score == pytest.approx(math.prod(ai_ops) ** (1 / len(ai_ops)), rel=1e-12)
    assert s.regulated is not None and 0 < s.regulated <= s.score
    if len(complete) > 1:
        base = [load_record(by_size[complete[0]][w])["metrics"]["ai_ops_per_s"] for w in suite().workloads]
        e = [a / (top / complete[0] * b) for a, b in zip(ai_ops, base, strict=True)]
        assert s.efficiency == pytest.approx(math.prod(e) ** (1 / len(e)), rel=1e-12)
    summaries = {f.name.removesuffix("-summary.json"): load_record(f) for f in REF.rglob("*-summary.json")}
    assert {w["sweep"] for w in r.sweeps["cpu-ref"]} == set(summaries)
    for w in r.sweeps["cpu-ref"]:  # recomputed from the point records, equal to what sweep wrote
        wrote = {p["np"]: p["efficiency"] for p in summaries[w["sweep"]]["points"]}
        assert {p["np"]: p["efficiency"] for p in w["points"]} == pytest.approx(wrote, rel=1e-12)
    paths = rank_mod.write(r, tmp_path / "out")
    assert {p.name for p in paths} == {"ranking.md", "ranking.html", "ranking.csv", "ranking.json"}
    rows = list(csv.DictReader(open(tmp_path / "out" / "ranking.csv")))
    assert rows[0]["rank"] == "1" and rows[0]["system"] == "cpu-ref"
    assert float(rows[0]["score_ai_ops_per_s"]) == pytest.approx(s.score)
    md = (tmp_path / "out" / "ranking.md").read_text()
    assert "| 1 | cpu-ref |" in md and all(w in md for w in suite().workloads)


def test_a_record_edited_by_hand_is_rejected(ref_copy: Path) -> None:
    path = next(iter(suite_records(ref_copy)[1].values()))
    rec = load_record(path)
    rec["metrics"]["samples_per_s"] *= 1.5
    path.write_text(json.dumps(rec))
    assert "digest mismatch" in reasons(rank_one(ref_copy), path)


def test_edited_figures_fail_even_when_the_digest_is_recomputed(ref_copy: Path) -> None:
    paths = list(suite_records(ref_copy)[1].values())
    faster, more_flops = load_record(paths[0]), load_record(paths[1])
    faster["metrics"]["samples_per_s"] *= 1.5
    faster["metrics"]["ai_ops_per_s"] *= 1.5  # consistent with samples/s, not with the windows
    write_record(seal(faster), paths[0])
    for block in (more_flops["counts"], more_flops["metrics"]):
        block["train_flops_per_sample"] *= 2
    more_flops["metrics"]["ai_ops_per_s"] *= 2
    write_record(seal(more_flops), paths[1])
    r = rank_one(ref_copy)
    assert "all ranks' samples / window" in reasons(r, paths[0])
    assert "recomputed from the spec" in reasons(r, paths[1])


def test_a_changed_steps_file_and_a_duplicate_are_rejected(ref_copy: Path) -> None:
    paths = list(suite_records(ref_copy)[1].values())
    steps = paths[0].parent / load_record(paths[0])["steps_file"]
    steps.write_bytes(steps.read_bytes() + b"\0")
    copy = paths[1].with_name("copy-" + paths[1].name)
    shutil.copy(paths[1], copy)
    r = rank_one(ref_copy)
    assert "steps file" in reasons(r, paths[0]) and "changed" in reasons(r, paths[0])
    dup = [x for x in r.rejected if "duplicate of" in x.reason]
    named = {Path(dup[0].path).resolve(), Path(dup[0].reason.split("duplicate of ")[1]).resolve()}
    assert len(dup) == 1 and named == {paths[1].resolve(), copy.resolve()}


def test_failed_validity_is_gated_out(ref_copy: Path) -> None:
    path = next(iter(suite_records(ref_copy)[1].values()))
    rec = load_record(path)
    rec["validity"]["checks"][0]["passed"] = False
    rec["validity"]["passed"] = False
    write_record(seal(rec), path)
    assert "validity checks failed: loss_finite" in reasons(rank_one(ref_copy), path)


def short_run(out: Path, **cfg: Any) -> Path:
    spec = hpcdl.spec_from_dict({"family": "mlp", "layers": 1, "width": 16, "input_size": 8, "batch_size": 4})
    return hpcdl.run(spec, hpcdl.RunConfig(warmup_steps=1, min_duration_s=0.0, **cfg), output_dir=out).path


def test_short_windows_and_random_data_do_not_rank(tmp_path: Path) -> None:
    """Real runs whose own validity passed (min_duration 0) but that the ranking refuses."""
    short = short_run(tmp_path, steps=20)
    noise = short_run(tmp_path / "random", steps=20, data="random")
    r = rank_one(tmp_path)
    assert f"< {RANK_MIN_WINDOW_S:g} s" in reasons(r, short)
    assert "no loss_falls check" in reasons(r, noise)
    (s,) = r.systems
    assert s.score is None and "suite incomplete" in s.reason


def test_an_incomplete_suite_is_listed_without_a_rank(ref_copy: Path) -> None:
    for sizes in suite_records(ref_copy).values():
        sizes["rnn-lstm-lm"].unlink()
    r = rank_mod.rank([("full", REF), ("partial", ref_copy)])
    assert [s.system for s in r.systems] == ["full", "partial"]
    assert r.systems[1].score is None and "rnn-lstm-lm" in r.systems[1].reason
    assert rank_mod.rows(r, "S")[1][0] == "-"


def test_records_of_another_class_are_never_ranked_with_class_s(ref_copy: Path) -> None:
    """A record that says it ran class M (sealed again, so it stays intact) does not count for
    class S, and class M's list appears with the system unranked in it; a record of no class
    is reported as such."""
    relabelled = {"M": 0, "": 0}
    for path in sorted(ref_copy.rglob("*.json")):
        rec = load_record(path)
        if rec.get("schema") != "hpcdl.result" or suite_workload(rec["spec"]) != "mlp-wide":
            continue
        size_class = "M" if rec["settings"]["world_size"] == 1 else ""
        relabelled[size_class] += 1
        rec["run"] = {**rec["run"], "suite_class": size_class, "suite_version": 1}
        write_record(seal({k: v for k, v in rec.items() if k != "digest"}), path)
    r = rank_one(ref_copy)
    assert list(r.lists) == ["S", "M"]
    (s,) = r.lists["S"]
    assert s.score is None and "mlp-wide" in s.reason
    (m,) = r.lists["M"]
    assert m.size_class == "M" and m.score is None
    assert relabelled["M"] and r.unclassed == relabelled[""] > 0
    md = (rank_mod.write(r, ref_copy.parent / "out")[0]).read_text()
    assert "## Class S (suite version 1" in md and "## Class M (suite version 1" in md
    assert "workloads of no size class: reported, not ranked" in md


def test_predictions_and_malformed_records_never_rank(tmp_path: Path) -> None:
    write_record({"schema": "hpcdl.prediction", "points": []}, tmp_path / "p.json")
    write_record({"schema": "hpcdl.result", "schema_version": 2, "metrics": {}}, tmp_path / "junk.json")
    (tmp_path / "text.json").write_text("not json")
    r = rank_one(tmp_path)
    assert "a prediction, not a measurement" in reasons(r, tmp_path / "p.json")
    assert "malformed record" in reasons(r, tmp_path / "junk.json")
    assert "unreadable" in reasons(r, tmp_path / "text.json")


def test_quality_factor() -> None:
    assert loss_reduction([4.0, 3.0, 2.0, 1.0]) == pytest.approx(0.75)
    assert quality_factor(0.75) == 1.0 and quality_factor(0.25) == pytest.approx(0.5)
    assert quality_factor(-0.1) == 0.0  # a loss that rose


def test_rank_cli(tmp_path: Path) -> None:
    p = hpcdl_cli.hpcdl("rank", f"cpu={REF}", "-o", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "cpu" in p.stdout and "0 rejected" in p.stdout
    assert "<td>cpu</td>" in (tmp_path / "ranking.html").read_text()
    for bad in (["rank", str(tmp_path / "missing")], ["rank", f"a={REF}", f"a={REF}"]):
        p = hpcdl_cli.hpcdl(*bad)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
