"""Records of older schema versions (hpcdl/records/migrate.py): every reference record is version 2
and reads as the current version's view, with what version 2's readers assumed where a field was
absent, its digest still over the JSON as written; the migrations form one chain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcdl.records import schema
from hpcdl.records.loader import load_tree, read_record
from hpcdl.records.migrate import MIGRATIONS, OLDEST, upgrade
from hpcdl.records.store import digest_ok
from hpcdl.records.typed import MalformedRecord
from hpcdl.records.views import EAGER, Memory, read_result
from hpcdl.results import ranking
from hpcdl.workloads.recipes import DEFAULT_CLASS

REFERENCE = Path(__file__).resolve().parent.parent / "reference_results"
OLD_CPU = REFERENCE / "cpu-epyc-2core-2026-11-22"
"""the oldest records: before size classes, memory figures, peak kinds and stragglers"""
H200 = REFERENCE / "h200-2026-11-27"
"""records with an estimate of six parts (inputs and heap came the day after) and fits"""


def test_the_migrations_are_one_chain_from_the_oldest_version_read() -> None:
    assert schema.RESULT_VERSION == 3
    assert sorted(MIGRATIONS) == list(range(OLDEST, schema.RESULT_VERSION))


def test_every_reference_record_is_version_2_and_reads_as_the_current_version() -> None:
    records = load_tree([REFERENCE]).records
    assert len(records) >= 50
    for r in records:
        view = r.result
        assert (view.written_version, view.schema_version) == (2, schema.RESULT_VERSION), r.path
        assert digest_ok(r.raw) and r.raw["schema_version"] == 2  # the record as written


def test_a_version_2_record_reads_with_what_version_2_assumed() -> None:
    record = read_record(next(OLD_CPU.rglob("*-mlp-wide.json")))
    raw, view = record.raw, record.result
    absent = ("execution", "accumulation_steps")
    assert not any(k in raw["settings"] for k in absent) and "memory" not in raw["metrics"]
    assert view.settings.execution == EAGER and view.settings.accumulation_steps == 1
    assert view.metrics.memory == Memory(estimated=None, measured=None)
    assert view.metrics.peak_kind == "unknown" and view.metrics.flags == []
    # written before size classes: the default suite's first version, as scoring took it
    assert (view.run.suite_class, view.run.suite_version) == (DEFAULT_CLASS, 1)
    assert all(row.compute_only_s is None and row.on_cpu_s is None for row in view.metrics.per_rank)
    assert view.metrics.window_start_unix is None and view.metrics.time_to_first_step_s is None


def test_an_estimate_of_version_2_counts_its_later_parts_as_zero() -> None:
    found = [r for r in load_tree([H200]).records if r.raw["metrics"].get("memory")]
    assert found
    for r in found:
        written = r.raw["metrics"]["memory"]["estimated"]
        estimate = r.result.metrics.memory.estimated
        assert estimate is not None and "inputs" not in written
        assert (estimate.inputs, estimate.heap, estimate.total) == (0, 0, written["total"])
    fitted = [r for r in found if r.raw["metrics"].get("fit")]
    assert fitted
    for r in fitted:
        fit = r.result.metrics.fit
        assert fit is not None and fit.trials and fit.trials[0].peak_bytes is not None
        assert fit.kept_grads is False and fit.run_peak_bytes is None and fit.shard is None


def test_the_reference_records_still_rank() -> None:
    r = ranking.rank([("cpu-ref", OLD_CPU)])
    assert r.rejected == [] and len(r.systems) == 1


def test_upgrade_copies_and_refuses_versions_it_cannot_read() -> None:
    raw = json.loads(next(OLD_CPU.rglob("*-mlp-wide.json")).read_text())
    before = json.dumps(raw, sort_keys=True)
    upgraded = upgrade(raw)
    assert upgraded["schema_version"] == schema.RESULT_VERSION
    assert json.dumps(raw, sort_keys=True) == before  # the record as written is left alone
    for version in (1, schema.RESULT_VERSION + 1, "2", None):
        with pytest.raises(MalformedRecord, match="record.schema_version"):
            read_result({**raw, "schema_version": version})
