"""The sharded data-parallel backend (FSDP2 over gloo): its units and traffic rule, real 2-rank
runs whose correctness checks hold and whose all-gathers and reduce-scatters are recorded, its
memory against DDP's, and a torch that lacks FSDP refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hpcdl_cli import hpcdl
from torch import nn

from hpcdl.parallel.backends.fsdp import FsdpBackend, units
from hpcdl.parallel.launch import mpi_env
from hpcdl.scaling.traffic import step_traffic
from hpcdl.workloads.registry import FAMILIES, spec_from_dict

MLP = ["--workload", "mlp", "layers=3", "width=64", "input_size=32", "output_size=10", "batch_size=8"]


@pytest.mark.parametrize("family", sorted(FAMILIES.names()))
def test_units_are_disjoint_blocks(family: str) -> None:
    model = spec_from_dict({"family": family}).build()
    blocks = units(model)
    owned = [id(p) for u in blocks for p in u.parameters()]
    assert len(owned) == len(set(owned))  # no parameter in two units
    assert set(owned) <= {id(p) for p in model.parameters()}


def test_transformer_blocks_are_the_units() -> None:
    model = spec_from_dict({"family": "attention", "layers": 3}).build()
    assert units(model) == list(model.blocks)  # type: ignore[attr-defined]


def test_traffic_gathers_blocks_twice_and_the_root_once() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    blocks = [4 * 8 + 8, 8 * 2 + 2]
    ag, rs = FsdpBackend.traffic(model)
    assert (ag.collective, ag.bytes, ag.calls) == ("all_gather", 4 * 2 * sum(blocks), 4)
    assert (rs.collective, rs.bytes, rs.calls) == ("reduce_scatter", 4 * sum(blocks), 2)
    rooted = spec_from_dict({"family": "attention", "layers": 2}).build()
    ag, rs = FsdpBackend.traffic(rooted)
    total = 4 * sum(p.numel() for p in rooted.parameters())
    block = 4 * sum(p.numel() for p in rooted.blocks[0].parameters())  # type: ignore[attr-defined]
    assert (ag.bytes, ag.calls) == (total + 2 * block, 3 + 2) and (rs.bytes, rs.calls) == (total, 3)


@pytest.mark.mpi
@pytest.mark.parametrize(
    "np", [2, pytest.param(4, marks=pytest.mark.slow(reason="the same sharded run with four ranks"))]
)
def test_sharded_run_checks_itself_and_records_its_collectives(np: int, tmp_path: Path) -> None:
    p = hpcdl(
        "run",
        *MLP,
        "--np",
        str(np),
        "--backend",
        "fsdp",
        "--steps",
        "6",
        "--min-duration",
        "0",
        "-o",
        str(tmp_path),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    (rec,) = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
    assert rec["settings"]["backend"] == "fsdp" and rec["settings"]["world_size"] == np
    checks = {c["name"]: c for c in rec["validity"]["checks"]}
    assert checks["one_step_equivalence"]["passed"] and checks["parameters_identical"]["passed"]
    assert rec["validity"]["passed"], rec["validity"]
    comm = rec["metrics"]["communication"]
    predicted = step_traffic(spec_from_dict(rec["spec"]), "fsdp", np, 8)
    assert [(t.collective, t.bytes, t.calls) for t in predicted] == [
        (name, c["bytes_per_step"], c["calls_per_step"]) for name, c in comm["collectives"].items()
    ]
    for name, c in comm["collectives"].items():
        assert c["seconds_per_step"] > 0 and c["busbw_bytes_per_s"] == pytest.approx(
            c["algbw_bytes_per_s"] * (np - 1) / np
        ), name
    assert "allreduce_s" not in comm and "exposed_s" not in comm
    assert comm["exposed_method"].startswith("not measured")
    assert comm["grad_bytes_per_step"] == 4 * rec["counts"]["params"]
    # FSDP gathers inside forward: no computation-alone time, said instead of a wrong rank
    straggler = rec["metrics"]["straggler"]
    assert straggler["rank"] is None and straggler["method"].startswith("not measured")


@pytest.mark.mpi
@pytest.mark.slow(reason="two sharded and two replicated ranks of a 10 M-parameter model")
def test_sharding_lowers_the_peak_memory_of_a_rank(tmp_path: Path) -> None:
    """A model whose weights and AdamW state dominate (67 M parameters, batch 2; at 25 M, FSDP's
    own buffers outweighed what sharding saved): every rank's peak below DDP's (0.60x measured
    here; the 0.6x target is benchmarks/bench_parallel.py's, at 134 M)."""
    big = ["--workload", "mlp", "layers=4", "width=4096", "input_size=4096", "output_size=10", "batch_size=2"]
    peaks = {}
    for backend in ("torch", "fsdp"):
        out = tmp_path / backend
        p = hpcdl(
            "run",
            *big,
            "--np",
            "2",
            "--backend",
            backend,
            "--steps",
            "3",
            "--min-duration",
            "0",
            "-o",
            str(out),
        )
        assert p.returncode == 0, p.stderr[-3000:]
        (rec,) = [json.loads(f.read_text()) for f in out.glob("*.json")]
        peaks[backend] = max(r["peak_memory_bytes"] for r in rec["metrics"]["per_rank"])
    assert peaks["fsdp"] < 0.85 * peaks["torch"], peaks


HIDE_FSDP = """
import sys
import torch.distributed.fsdp as fsdp
del fsdp.fully_shard  # a torch before FSDP2
import hpcdl.cli
sys.exit(hpcdl.cli.main(sys.argv[1:]))
"""


def test_a_torch_without_fsdp_is_one_line_and_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "old_torch.py"
    script.write_text(HIDE_FSDP)
    p = subprocess.run(
        [
            sys.executable,
            str(script),
            "run",
            *MLP,
            "--np",
            "2",
            "--backend",
            "fsdp",
            "-o",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=mpi_env(),
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert (
        f"run.backend='fsdp' is invalid: torch {torch.__version__} lacks torch.distributed.fsdp" in p.stderr
    )
    assert not (tmp_path / "out").exists()
