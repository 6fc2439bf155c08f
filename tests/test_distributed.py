"""Real multi-rank runs: mpirun, mpi4py, Horovod and torch.distributed (gloo) across the hosts of
the emulated cluster (tests/conftest.py: network namespaces on this machine, joined by links
limited to 200 Mbit/s), one rank per host unless a test says otherwise."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Cluster  # beside this file, on pytest's path
from hpcdl_cli import hears_signals, hpcdl

from hpcdl.parallel.launch import mpi_env, mpirun_path

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("on_cluster")]
# No skips: scripts/test.sh installs Open MPI and Horovod, and these tests are the proof they work
# (the one exception: without root no emulated cluster can be made).
BACKENDS = ["torch", "horovod"]
MLP = ["--workload", "mlp", "layers=2", "width=128", "input_size=64", "output_size=10", "batch_size=16"]


def only_record(out: Path) -> dict:
    (path,) = [p for p in out.glob("*.json") if "suite" not in p.name]
    return json.loads(path.read_text())


class DataParallel:
    """Data-parallel runs of ``MLP`` for 12 steps (4 ranks: 2 micro-batches a step), each run
    once per module and read by every test that checks what such a run records."""

    def __init__(self, cluster: Cluster, out: Path) -> None:
        self.cluster, self.out, self.records = cluster, out, {}

    def __call__(self, np: int, backend: str) -> dict:
        if (np, backend) not in self.records:
            out = self.out / f"np{np}-{backend}"
            micro = 2 if np == 4 else 1
            p = hpcdl(
                "run", *MLP, f"accumulation_steps={micro}", "--np", str(np), "--backend", backend,
                "--steps", "12", "--min-duration", "0", "-o", str(out), env=self.cluster.environ(),
            )  # fmt: skip
            assert p.returncode == 0, p.stderr[-3000:]
            self.records[np, backend] = only_record(out)
        return self.records[np, backend]


@pytest.fixture(scope="module")
def data_parallel(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> DataParallel:
    return DataParallel(cluster, tmp_path_factory.mktemp("data-parallel"))


@pytest.mark.parametrize(
    ("np", "backend"),
    [
        (2, "torch"),
        (2, "horovod"),
        (4, "torch"),
        pytest.param(4, "horovod", marks=pytest.mark.slow(reason="the same check with four Horovod ranks")),
    ],
)
def test_every_rank_measured_and_checked(backend: str, np: int, data_parallel: DataParallel) -> None:
    micro = 2 if np == 4 else 1  # 4 ranks also accumulate: 2 micro-batches per step
    rec = data_parallel(np, backend)
    assert rec["settings"]["world_size"] == np and rec["settings"]["backend"] == backend
    assert rec["settings"]["global_batch"] == 16 * micro * np
    assert rec["settings"]["accumulation_steps"] == micro
    m = rec["metrics"]
    ranks = m["per_rank"]
    assert sorted(r["rank"] for r in ranks) == list(range(np))
    hosts = data_parallel.cluster.host_names(np)
    assert [r["host"] for r in sorted(ranks, key=lambda r: r["rank"])] == hosts
    assert rec["settings"]["nodes"] == len(set(hosts)) and rec["settings"]["hosts"] == sorted(set(hosts))
    assert all(r["timed_steps"] == 12 and r["samples_per_s"] > 0 for r in ranks)
    # aggregate = all ranks' samples over the slowest window, never rank 0 x size
    assert m["samples_per_s"] == pytest.approx(16 * micro * 12 * np / max(r["timed_window_s"] for r in ranks))
    assert m["slowest_rank_samples_per_s"] == min(r["samples_per_s"] for r in ranks)
    assert m["straggler_spread"] >= 0
    comm = m["communication"]
    assert comm["grad_bytes_per_step"] == 4 * rec["counts"]["params"]
    assert comm["busbw_bytes_per_s"] == pytest.approx(comm["algbw_bytes_per_s"] * 2 * (np - 1) / np)
    assert comm["exposed_s"] >= 0
    (allreduce,) = comm["collectives"].values()  # data parallelism: one allreduce, nothing else
    assert allreduce["bytes_per_step"] == comm["grad_bytes_per_step"]
    assert allreduce["seconds_per_step"] == comm["allreduce_s"]
    # each rank's computation alone, and the slowest of them named with its host
    compute = {r["rank"]: r["compute_only_s"] for r in ranks}
    assert all(t > 0 for t in compute.values())
    straggler = m["straggler"]
    assert compute[straggler["rank"]] == max(compute.values()) == straggler["compute_only_s"]
    assert straggler["host"] == ranks[straggler["rank"]]["host"]
    checks = {c["name"]: c for c in rec["validity"]["checks"]}
    assert checks["one_step_equivalence"]["passed"] and checks["parameters_identical"]["passed"]
    assert rec["validity"]["passed"], rec["validity"]


@pytest.mark.parametrize(
    "backend",
    ["torch", pytest.param("horovod", marks=pytest.mark.slow(reason="the same window with Horovod"))],
)
def test_duration_window_ends_on_every_rank_together(backend: str, tmp_path: Path) -> None:
    """With a duration (steps=0) each rank's clock would end its window a step apart from the
    others and leave them waiting in an allreduce; the ranks agree instead, and only once every
    rank's window is long enough (min_duration = duration passes on every rank). Tiny steps
    (~1 ms) over 4 ranks make the race all but certain without the agreement: one run shows it
    (each window ends after hundreds of steps, every one a chance to end a step apart)."""
    tiny = ["--workload", "mlp", "layers=1", "width=16", "input_size=8", "output_size=2", "batch_size=4"]
    p = hpcdl(
        "run", *tiny, "--np", "4", "--backend", backend, "--duration", "1", "-o", str(tmp_path), timeout=120
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rec = only_record(tmp_path)
    steps = {r["timed_steps"] for r in rec["metrics"]["per_rank"]}
    assert len(steps) == 1 and steps.pop() > 10, rec["metrics"]["per_rank"]
    assert rec["validity"]["passed"], rec["validity"]


def test_batch_norm_model_with_ddp_buffers(tmp_path: Path) -> None:
    p = hpcdl(
        "run",
        "--workload",
        "cnn",
        "image_size=16",
        "stages=2",
        "base_width=8",
        "batch_size=4",
        "--np",
        "2",
        "--backend",
        "torch",
        "--steps",
        "4",
        "--min-duration",
        "0",
        "-o",
        str(tmp_path),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert only_record(tmp_path)["validity"]["passed"]


def _rank_pids(rank: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"hpcdl" in cmd and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            pids.append(int(d.name))
    return pids


def start_timing(*args: str) -> subprocess.Popen[str]:
    """``hpcdl ARGS`` started in the background, returned once its timed steps run."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=mpi_env(),
        preexec_fn=hears_signals,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "timed" in line and "steps in" in line:
            break
    return proc


def test_a_killed_rank_ends_the_run_quickly(tmp_path: Path) -> None:
    proc = start_timing(
        "run", *MLP, "--np", "2", "--backend", "torch", "--duration", "120", "-o", str(tmp_path)
    )
    (victim,) = _rank_pids(1)
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    rest = proc.communicate(timeout=60)[0]
    assert time.monotonic() - t0 < 60
    assert proc.returncode != 0
    assert "signal 9" in rest or "Killed" in rest or "rank 1" in rest, rest[-2000:]
    assert not list(tmp_path.glob("*.json"))  # no record of a broken run


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and text.encode() in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def test_sigterm_to_the_launcher_ends_every_rank(tmp_path: Path) -> None:
    """``kill`` (or a harness's timeout) on ``hpcdl run --np 2`` must not leave mpirun and its
    ranks running in their own session."""
    proc = start_timing("run", *MLP, "--np", "2", "--steps", "10000000", "-o", str(tmp_path))
    assert len(_processes_mentioning(str(tmp_path))) >= 3  # launcher, mpirun, ranks
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=30)[0]
    assert proc.returncode == 128 + signal.SIGTERM, rest[-2000:]
    assert "terminated" in rest
    deadline = time.monotonic() + 15
    while _processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_mentioning(str(tmp_path)) == []


FAULT = """
import sys
import hpcdl.harness.runner, hpcdl.cli
real = hpcdl.harness.runner.measure_rank
def faulty(spec, cfg, device, world, *rest):
    if world.rank == 1:
        raise RuntimeError("injected fault")
    return real(spec, cfg, device, world, *rest)
hpcdl.harness.runner.measure_rank = faulty
sys.exit(hpcdl.cli.main(sys.argv[1:]))
"""


def test_a_rank_that_raises_names_itself_and_ends_all(tmp_path: Path) -> None:
    script = tmp_path / "fault.py"
    script.write_text(FAULT)
    cmd = [
        mpirun_path(),
        "-np",
        "2",
        "--oversubscribe",
        sys.executable,
        str(script),
        "run",
        *MLP,
        "--backend",
        "torch",
        "--steps",
        "5",
        "-o",
        str(tmp_path),
    ]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=mpi_env())
    assert time.monotonic() - t0 < 60
    assert p.returncode != 0
    assert "rank 1 on" in p.stderr and "RuntimeError: injected fault" in p.stderr, p.stderr[-2000:]


def test_energy_is_unavailable_not_zero_without_meters(data_parallel: DataParallel) -> None:
    energy = data_parallel(2, "horovod")["metrics"]["energy"]
    assert energy["measured"] == "unavailable" and energy["energy_to_solution_j"] is None
    assert [r["gpu"]["available"] for r in energy["per_rank"]] == [False, False]
    assert all(r["gpu"]["reason"] for r in energy["per_rank"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_comm_benchmark_checks_every_collective(backend: str) -> None:
    p = hpcdl("comm", "--np", "2", "--backend", backend, "--sizes", "4096,1048576", "--reps", "3", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(p.stdout)["rows"]
    assert [(r["collective"], r["bytes"]) for r in rows] == [
        (c, s) for c in ("allreduce", "all_gather", "reduce_scatter", "all_to_all") for s in (4096, 1048576)
    ]
    assert all(r["wrong"] == 0 and r["backend_s"] > 0 and r["mpi_s"] > 0 for r in rows)
    factor = {"allreduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5}  # 2 ranks
    assert all(
        r["backend_busbw"] == pytest.approx(r["backend_algbw"] * factor[r["collective"]]) for r in rows
    )


def test_comm_benchmark_refuses_an_unknown_collective() -> None:
    p = hpcdl("comm", "--collective", "allreduce,broadcast")
    assert p.returncode == 2 and "comm.collective='broadcast' is invalid: allowed: all, allreduce" in p.stderr


@pytest.mark.parametrize(
    "backend, slow",
    [
        ("torch", 1),
        pytest.param("horovod", 0, marks=pytest.mark.slow(reason="the straggler with Horovod")),
        pytest.param("torch", 3, marks=pytest.mark.slow(reason="the straggler among four ranks")),
    ],
)
def test_a_slowed_rank_is_named_the_straggler(backend: str, slow: int, tmp_path: Path) -> None:
    """One rank sleeps 40 ms before every forward pass. Under DDP the others wait for it inside
    backward, so every rank's forward + backward lasts alike; its computation alone names it."""
    np = 4 if slow == 3 else 2
    p = hpcdl(
        "run", *MLP, "--np", str(np), "--backend", backend, "--steps", "8", "--min-duration", "0",
        "-o", str(tmp_path), env={**os.environ, "HPCDL_TEST_SLOW_RANK": f"{slow}:0.04"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    m = only_record(tmp_path)["metrics"]
    straggler, rows = m["straggler"], m["per_rank"]
    assert straggler["rank"] == slow and straggler["host"] == rows[slow]["host"]
    alone = {r["rank"]: r["compute_only_s"] for r in rows}
    excess = alone[slow] - max(t for r, t in alone.items() if r != slow)
    assert excess > 0.03 and straggler["compute_only_s"] == alone[slow]
    assert any("HPCDL_TEST_SLOW_RANK" in f for f in m["flags"])  # the record says it was made slow
    if backend == "torch":  # the phases hide it: every rank's forward + backward waits alike
        fb = [r["compute_median_s"] for r in rows]
        assert max(fb) - min(fb) < 0.5 * excess
    report = hpcdl("report", str(tmp_path), "-o", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "report" / "index.html").read_text()
    assert "slowest rank" in html and f"<td>{slow}</td><td>{rows[slow]['host']}</td>" in html


def test_weak_sweep_writes_points_and_skips_valid_ones(tmp_path: Path) -> None:
    args = [
        "sweep",
        *MLP,
        "--np",
        "1,2",
        "--mode",
        "weak",
        "--steps",
        "6",
        "--min-duration",
        "0",
        "-o",
        str(tmp_path),
    ]
    p = hpcdl(*args)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((tmp_path / "sweep-weak-summary.json").read_text())
    x = {pt["np"]: pt["samples_per_s"] for pt in summary["points"]}
    eff = {pt["np"]: pt["efficiency"] for pt in summary["points"]}
    assert eff[1] == 1.0 and eff[2] == pytest.approx(x[2] / (2 * x[1]))
    assert json.loads((tmp_path / "sweep-weak-np2.json").read_text())["settings"]["world_size"] == 2
    mtime = (tmp_path / "sweep-weak-np2.json").stat().st_mtime
    again = hpcdl(*args)
    assert again.returncode == 0 and again.stderr.count("skipped") == 2
    assert (tmp_path / "sweep-weak-np2.json").stat().st_mtime == mtime


def test_strong_sweep_refuses_an_indivisible_batch_before_running(tmp_path: Path) -> None:
    p = hpcdl("sweep", *MLP[:-1], "batch_size=6", "--np", "1,4", "--mode", "strong", "-o", str(tmp_path))
    assert p.returncode == 2 and "divisible by np=4" in p.stderr
    assert not list(tmp_path.iterdir())


def test_hdf5_data_path_with_ranks_reading_disjoint_batches(tmp_path: Path) -> None:
    p = hpcdl(
        "run",
        *MLP,
        "--np",
        "2",
        "--backend",
        "torch",
        "--data",
        "hdf5",
        "--data-dir",
        str(tmp_path / "shards"),
        "--workers",
        "1",
        "--steps",
        "8",
        "--min-duration",
        "0",
        "-o",
        str(tmp_path / "out"),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rec = only_record(tmp_path / "out")
    assert rec["metrics"]["io"]["write"]["samples"] == 2 * 4 * 16  # pool_batches x ranks batches
    assert rec["metrics"]["io"]["read"]["samples"] == 3 * 16  # this rank's 4 batches, first untimed
    assert rec["validity"]["passed"], rec["validity"]


def test_rendezvous_address_is_never_loopback_across_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcdl.parallel.backends import torch_ddp

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setattr(torch_ddp.socket, "gethostbyname", lambda name: "127.0.1.1")  # stock Debian
    monkeypatch.setattr(torch_ddp, "_routable_address", lambda: "10.1.2.3")
    assert torch_ddp.rendezvous_host(nodes=1) == "127.0.1.1"  # one node: loopback reaches every rank
    assert torch_ddp.rendezvous_host(nodes=4) == "10.1.2.3"
    monkeypatch.setenv("MASTER_ADDR", "192.168.0.7")
    assert torch_ddp.rendezvous_host(nodes=4) == "192.168.0.7"  # the user's choice wins


SEND = """
import json
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
buf, ack = np.arange(1 << 20, dtype=np.float32), np.zeros(1, dtype=np.float32)  # 4 MiB
rates = {}
for peer in (1, 2):  # rank 1 shares rank 0's host, rank 2 is on the other host
    best = 0.0
    for _ in range(4):  # the best of 4: a rank the busy machine left waiting for a core is no link
        comm.Barrier()
        t0 = MPI.Wtime()
        if comm.rank == 0:
            comm.Send(buf, dest=peer)
            comm.Recv(ack, source=peer)
            best = max(best, buf.nbytes * 8 / (MPI.Wtime() - t0) / 1e6)
        elif comm.rank == peer:
            got = np.empty_like(buf)
            comm.Recv(got, source=0)
            assert np.array_equal(got, buf)
            comm.Send(ack, dest=0)
    rates[peer] = best
names = comm.gather(MPI.Get_processor_name())
if comm.rank == 0:
    print(json.dumps({"hosts": names, "intra": rates[1], "inter": rates[2]}))
"""


def test_traffic_between_hosts_crosses_the_limited_link(emulated_cluster: Cluster, tmp_path: Path) -> None:
    """Ranks 0 and 1 on h1, rank 2 on h2: 4 MiB from 0 to 2 cross two veths limited to the link's
    rate (tbf counts Ethernet frames: TCP/IP headers leave ~95 % of it to the payload), while
    0 -> 1 goes through shared memory, far faster."""
    script = tmp_path / "send.py"
    script.write_text(SEND)
    env = {**mpi_env(), "HPCDL_CLUSTER_HOSTS": "2", "HPCDL_CLUSTER_PPN": "2"}
    p = subprocess.run(
        [mpirun_path(), "-np", "3", "--oversubscribe", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout)
    intra, inter = got["intra"], got["inter"]
    assert got["hosts"] == ["h1", "h1", "h2"]
    assert emulated_cluster.rate_mbit is not None
    assert inter == pytest.approx(0.95 * emulated_cluster.rate_mbit, rel=0.2), (intra, inter)
    assert intra > 5 * inter, (intra, inter)
