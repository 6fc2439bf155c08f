"""scripts/cluster/cluster.sh, the emulated cluster: what it says and refuses. (Its network is
tested by the multi-node tests that run on it, tests/test_distributed.py and tests/test_slurm.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import CLUSTER_SCRIPT, Cluster  # beside this file, on pytest's path
from hpcdl_cli import hpcdl


def cluster_sh(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **env},
    )


def test_starting_again_is_a_no_op(emulated_cluster: Cluster) -> None:
    p = cluster_sh("start", str(emulated_cluster.hosts), f"{emulated_cluster.rate_mbit}mbit")
    assert p.returncode == 0 and "already running" in p.stdout, p.stdout + p.stderr
    status = cluster_sh("status")
    assert status.returncode == 0 and f"{emulated_cluster.hosts} hosts at" in status.stdout


def test_each_host_has_its_name_and_address(emulated_cluster: Cluster) -> None:
    p = subprocess.run(emulated_cluster.exec_cmd("h2", "sh", "-c", "hostname; getent hosts h3"),
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    name, h3 = p.stdout.splitlines()
    assert name == "h2" and h3.split() == ["10.231.0.3", "h3"]


@pytest.mark.parametrize(
    "args, env, says",
    [
        (["start", "0"], {}, "HOSTS='0' is invalid: an integer 1..200"),
        (["start", "2", "fast"], {}, "RATE='fast' is invalid"),
        (["start", "2"], {"HPCDL_CLUSTER_NET": "8.8.8"}, "HPCDL_CLUSTER_NET='8.8.8' is invalid"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(
    emulated_cluster: Cluster, args: list[str], env: dict[str, str], says: str
) -> None:
    p = cluster_sh(*args, **env)
    assert p.returncode == 2 and says in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    status = cluster_sh("status")  # the running cluster is untouched
    shape = f"{emulated_cluster.hosts} hosts at {emulated_cluster.rate_mbit}mbit"
    assert status.returncode == 0 and shape in status.stdout


def test_an_mpirun_that_is_no_executable_is_refused_before_anything_runs(tmp_path: Path) -> None:
    env = {**os.environ, "HPCDL_MPIRUN": str(tmp_path / "nothing")}
    p = hpcdl("run", "--workload", "mlp", "--np", "2", "-o", str(tmp_path), env=env)
    assert p.returncode == 2, p.stderr
    assert f"HPCDL_MPIRUN='{tmp_path / 'nothing'}' is invalid: an executable file" in p.stderr
    assert "Traceback" not in p.stderr and not list(tmp_path.glob("*.json"))
