"""Shared test settings, the tiers' rules, and the clusters that multi-node tests run on.

Tiers (markers, pyproject.toml): ``mpi`` starts real MPI ranks; ``slurm`` runs jobs on the local
Slurm cluster; ``browser`` opens pages in headless Chromium; ``slow`` is left out of the README's
test command and needs a reason (``@pytest.mark.slow(reason=...)``); ``gpu`` needs a GPU and never
runs in CI (``scripts/gpu_reference.sh`` runs it, or ``pytest -m gpu`` by hand on a GPU)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from hpcdl.parallel import mpiflavour

# One intra-op thread: the test models are tiny, and on a busy 2-core machine OpenMP's
# spinning threads made them up to 20x slower. Subprocesses (CLI, MPI ranks) set their own.
torch.set_num_threads(1)

# Runs keep this machine's CPU peak in a store (hpcdl.measure.peakstore): the tests' store is
# their own, never the user's (children inherit it); each test starts with an empty one.
os.environ["HPCDL_PEAK_STORE"] = str(Path(tempfile.mkdtemp(prefix="hpcdl-test-peaks-")) / "peaks.json")


@pytest.fixture(autouse=True)
def own_peak_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty peak store for this test: what one test's run stores, no other test reads."""
    path = tmp_path_factory.mktemp("peaks") / "peaks.json"
    monkeypatch.setenv("HPCDL_PEAK_STORE", str(path))
    return path


ROOT = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = ROOT / "scripts" / "cluster" / "cluster.sh"
CLUSTER_HOSTS = 4
CLUSTER_RATE_MBIT = 200
"""each emulated host's link: low enough that a test can see it, high enough that the
multi-rank tests' small gradients (~100 kB) cost a few ms a step"""


@dataclass(frozen=True)
class Cluster:
    """Where multi-rank tests place their ranks: the running emulated cluster (``hosts`` hosts
    h1 ... hN, each on a link of ``rate_mbit``), or, where it cannot be made (not root), this
    host alone through Open MPI's own mpirun (``mpirun`` None, no link limit)."""

    hosts: int
    rate_mbit: int | None
    mpirun: str | None
    """scripts/cluster/mpirun: set it as HPCDL_MPIRUN to place hpcdl's ranks on the hosts"""

    def exec_cmd(self, host: str, *cmd: str) -> list[str]:
        """The command line that runs ``cmd`` on ``host`` (its name, network and hosts file)."""
        return ["bash", str(CLUSTER_SCRIPT), "exec", host, *cmd]

    def environ(self) -> dict[str, str]:
        """This process's environment with hpcdl's mpirun placing ranks one per host."""
        env = {k: v for k, v in os.environ.items() if k not in ("HPCDL_CLUSTER_PPN", "HPCDL_CLUSTER_HOSTS")}
        return env | ({"HPCDL_MPIRUN": self.mpirun} if self.mpirun else {})

    def host_names(self, ranks: int) -> list[str]:
        """The host of each of ``ranks`` ranks placed one per host (all on this one, alone)."""
        if self.mpirun is None:
            return [socket.gethostname()] * ranks
        return [f"h{i + 1}" for i in range(ranks)]


LOCALHOST = Cluster(1, None, None)
NOT_ROOT = "the emulated cluster needs root (network namespaces, tc): multi-rank tests run on this host"
_MPIRUN = shutil.which("mpirun")
MPI_FLAVOUR = mpiflavour.flavour(_MPIRUN) if _MPIRUN else None
"""the MPI of the mpirun on PATH: the MPICH lane's (scripts/lane.sh mpich) runs its ranks on this
host, the emulated cluster's mpirun being Open MPI's"""
OTHER_MPI = f"the emulated cluster runs Open MPI; this mpirun is {MPI_FLAVOUR}'s: its ranks run on this host"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test moves to the slow tier only with a reason; a GPU test skips where there is none."""
    cuda = None
    for item in items:
        for mark in item.iter_markers("slow"):
            if not mark.kwargs.get("reason"):
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.slow needs reason=...: why not fast")
        if item.get_closest_marker("gpu") is not None:
            if cuda is None:
                cuda = torch.cuda.is_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a GPU (torch.cuda.is_available() is False)"))


def _cluster_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(CLUSTER_SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def emulated_cluster() -> Iterator[Cluster]:
    """4 hosts as network namespaces on 200 Mbit/s links (scripts/cluster/cluster.sh), for the
    whole session; stopped at its end, pass or fail, unless it already ran before the session
    (or HPCDL_CLUSTER_KEEP=1). Skipped only where namespaces cannot be made (not root); a
    start that fails as root fails the tests that need it."""
    if os.geteuid() != 0:
        pytest.skip(NOT_ROOT)
    if MPI_FLAVOUR != "openmpi":
        pytest.skip(OTHER_MPI)
    was_running = _cluster_script("status").returncode == 0
    start = _cluster_script("start", str(CLUSTER_HOSTS), f"{CLUSTER_RATE_MBIT}mbit")
    if start.returncode != 0:  # as root it must start: a broken script is a failure, not a skip
        pytest.fail(f"the emulated cluster could not start: {start.stderr.strip()[-500:]}")
    try:
        yield Cluster(CLUSTER_HOSTS, CLUSTER_RATE_MBIT, str(ROOT / "scripts" / "cluster" / "mpirun"))
    finally:
        if not (was_running or os.environ.get("HPCDL_CLUSTER_KEEP")):
            _cluster_script("stop")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Cluster:
    """Where multi-rank tests place their ranks: the emulated hosts as root; without root this
    host (``LOCALHOST``: the MPI tests still run, with localhost's mpirun)."""
    if os.geteuid() != 0 or MPI_FLAVOUR != "openmpi":
        return LOCALHOST
    emulated: Cluster = request.getfixturevalue("emulated_cluster")
    return emulated


@pytest.fixture
def on_cluster(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """hpcdl's mpirun (and every ``mpi_env()``) places ranks on ``cluster``'s hosts, one per
    host, for this test only."""
    if cluster.mpirun is not None:
        monkeypatch.setenv("HPCDL_MPIRUN", cluster.mpirun)
    monkeypatch.delenv("HPCDL_CLUSTER_PPN", raising=False)
    monkeypatch.delenv("HPCDL_CLUSTER_HOSTS", raising=False)
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster(emulated_cluster: Cluster) -> Iterator[None]:
    """The local Slurm test cluster (scripts/slurm/start-cluster.sh): 4 slurmd nodes on the
    emulated hosts, up for the whole session, shared by every module that needs it; stopped at
    its end, pass or fail (HPCDL_SLURM_KEEP=1 leaves it running)."""
    if os.geteuid() != 0:
        pytest.skip("the local Slurm test cluster needs root (its daemons, /etc/hosts, namespaces)")
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{ROOT / 'scripts/slurm/client'}{os.pathsep}{path}"
    start = subprocess.run(
        ["bash", str(ROOT / "scripts/slurm/start-cluster.sh"), "4"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "HPCDL_SLURM_NETWORK": "emulated"},
    )
    try:
        if start.returncode != 0:
            pytest.fail(f"start-cluster.sh failed:\n{start.stdout[-3000:]}\n{start.stderr[-3000:]}")
        yield
    finally:
        if not os.environ.get("HPCDL_SLURM_KEEP"):
            subprocess.run(
                ["bash", str(ROOT / "scripts/slurm/stop-cluster.sh")], capture_output=True, timeout=300
            )
        os.environ["PATH"] = path
