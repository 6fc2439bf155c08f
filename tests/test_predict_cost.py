"""``hpcdl predict --samples N --epochs E`` (or ``--tokens``): the hours and the energy to train a
data set at each node count (``scaling.cost``), from a record's measured joules per sample on
its own device, else a system file's node power (estimated); the published rate a preset starts
from when no rate is given (``generators/rates.toml``). Analytic: nothing runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hpcdl_cli import hpcdl, one_line

from hpcdl.records.loader import read_record
from hpcdl.scaling.system import catalogue, load_system
from hpcdl.workloads import recipes
from hpcdl.workloads.registry import spec_from_dict

ROOT = Path(__file__).resolve().parent.parent
RESNET_H200 = (
    ROOT / "reference_results" / "h200-2026-11-27" / "suite-M-bf16" / "20261127-013853-resnet50.json"
)
COOKBOOK = [
    "predict",
    "--preset",
    "vgg16",
    "--system",
    "dgx1-v100",
    "--samples",
    "100000000",
    "--epochs",
    "10",
]


def predicted(*argv: str) -> dict:
    p = hpcdl(*argv, "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def test_the_cookbooks_question_is_one_command_with_hours_and_kwh() -> None:
    p = hpcdl(*COOKBOOK, "--nodes", "1")
    assert p.returncode == 0, p.stderr[-2000:]
    head = next(line for line in p.stdout.splitlines() if line.startswith("nodes"))
    assert head.split()[-3:] == ["hours", "energy", "kWh"]
    assert "to train: 100,000,000 samples x 10 epochs" in p.stdout
    assert "published: 154 samples/s" in p.stdout and "(est.)" in p.stdout
    doc = predicted(*COOKBOOK, "--nodes", "1,2")
    for pt in doc["points"]:  # hours = S·E / X / 3600; kWh = nodes · P_node · hours (estimated)
        assert pt["train_hours"] == pytest.approx(1e9 / pt["samples_per_s"] / 3600)
        assert pt["train_energy_kwh"] == pytest.approx(pt["nodes"] * 3.5 * pt["train_hours"])
        assert pt["energy_estimated"] is True
    assert doc["work"] == {"samples": 1e8, "epochs": 10.0, "total_samples": 1e9}
    assert "3500 W per node" in doc["energy"]["dgx1-v100"]


def test_the_published_rate_is_carried_to_the_systems_device_at_the_same_mfu() -> None:
    rate = recipes.rates()["vgg16"]
    flops = spec_from_dict(dict(recipes.presets()["vgg16"])).count().train_flops
    (model,) = predicted(*COOKBOOK, "--nodes", "1")["models"]
    # the same MFU on a V100 (15.7 TFLOP/s fp32) as on the P100 it was published on (10.6)
    assert model["gamma_flops_per_s"] == pytest.approx(flops * rate["samples_per_s"] * 15.7 / 10.6)


def test_a_records_joules_per_sample_on_its_own_device_is_measured_energy() -> None:
    record = read_record(RESNET_H200).result
    e = record.metrics.energy.energy_per_sample_j
    assert e and record.world_size == 1
    doc = predicted("predict", "--base", str(RESNET_H200), "--alpha", "1e-6", "--beta", "1e10",
                    "--samples", "1281167", "--epochs", "90", "--nodes", "1,8")  # fmt: skip
    for pt in doc["points"]:  # S · e₁ / E(p)
        assert pt["train_energy_kwh"] == pytest.approx(1281167 * 90 * e / pt["efficiency"] / 3.6e6)
        assert pt["energy_estimated"] is False
    assert doc["energy"]["given alpha, beta"].startswith("measured: record")


def test_a_record_from_another_device_gives_way_to_the_node_power() -> None:
    doc = predicted(
        "predict", "--base", str(RESNET_H200), "--system", "dgx-h100", "--samples", "1e6", "--nodes", "1"
    )
    assert doc["points"][0]["energy_estimated"] is True  # measured on an H200, predicted on H100s
    assert doc["energy"]["dgx-h100"].startswith("estimated: 10200 W per node")


def test_tokens_are_counted_in_sequences_of_the_workloads_length() -> None:
    seq = recipes.presets()["gpt2_small"]["seq_len"]
    argv = [
        "predict",
        "--preset",
        "gpt2_small",
        "--throughput",
        "400",
        "--system",
        "dgx-a100",
        "--nodes",
        "1",
    ]
    tokens, samples = predicted(*argv, "--tokens", "9e9"), predicted(*argv, "--samples", str(9e9 / seq))
    assert tokens["work"]["samples"] == pytest.approx(9e9 / seq)
    assert tokens["points"][0]["train_hours"] == pytest.approx(samples["points"][0]["train_hours"])


def test_every_catalogue_system_has_a_node_power_with_its_source() -> None:
    for name in catalogue():
        system = load_system(name)
        assert system.node_power_w is not None and system.node_power_w >= 100, name
        assert len(system.node_power_source) > 20, name


@pytest.mark.parametrize(
    ("extra", "named", "allowed"),
    [
        (["--samples", "0"], "predict.samples='0'", ">= 1"),
        (["--samples", "nan"], "predict.samples='nan'", "finite"),
        (["--samples", "inf"], "predict.samples='inf'", "finite"),
        (["--samples", "1e19"], "predict.samples='1e19'", "at most 1e+18"),
        (["--samples", "lots"], "predict.samples='lots'", "finite"),
        (["--samples", "5", "--epochs", "-1"], "predict.epochs='-1'", "> 0"),
        (["--samples", "5", "--epochs", "0"], "predict.epochs='0'", "> 0"),
        (["--samples", "5", "--epochs", "inf"], "predict.epochs='inf'", "finite"),
        (["--epochs", "3"], "predict.epochs='3'", "goes with --samples"),
        (["--samples", "5", "--tokens", "5"], "predict.tokens='5'", "either --samples or --tokens"),
        (["--tokens", "5"], "predict.tokens='5'", "seq_len"),
    ],
)
def test_bad_training_sizes_are_one_line(extra: list[str], named: str, allowed: str) -> None:
    line = one_line(hpcdl("predict", "--preset", "vgg16", "--system", "dgx1-v100", "--nodes", "1", *extra))
    assert named in line and allowed in line, line


@pytest.mark.parametrize("knobs", [["image_size=112"], ["precision=bf16"]])
def test_a_preset_changed_from_what_was_published_needs_a_rate(knobs: list[str]) -> None:
    line = one_line(hpcdl("predict", "--preset", "vgg16", *knobs, "--system", "dgx1-v100", "--samples", "5"))
    assert "a rank's speed is needed" in line
