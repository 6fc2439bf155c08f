"""The memory a CPU run may use is bounded by its cgroup (issue 16, item 4): a container or a
Slurm job is killed at its cgroup's limit however much the host has free. Read on a real cgroup
v1 child where this machine lets root make one, and on cgroup files written here (v2, v1,
nested limits, a container's namespaced mount) parsed by the same function."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcdl.device import cgroup_memory_left

GiB = 1 << 30


def fake_proc(tmp: Path, cgroup: str, mounts: list[str]) -> Path:
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text("".join(f"{i} 1 0:{i} {m}\n" for i, m in enumerate(mounts, 30)))
    return proc


def level(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text + "\n")


def test_cgroup_v2_limit_minus_usage_without_inactive_cache(tmp_path: Path) -> None:
    cg = tmp_path / "cg2"
    level(cg / "job", {"memory.max": str(2 * GiB), "memory.current": str(GiB // 2)})
    (cg / "job/memory.stat").write_text(f"anon 1\ninactive_file {GiB // 4}\nactive_file 7\n")
    level(cg / "job/step", {"memory.max": "max", "memory.current": str(GiB // 2)})
    proc = fake_proc(tmp_path, "0::/job/step\n", [f"/ {cg} rw - cgroup2 cgroup2 rw"])
    assert cgroup_memory_left(proc) == 2 * GiB - (GiB // 2 - GiB // 4)


def test_cgroup_v1_takes_the_tightest_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    mem = tmp_path / "memory"
    unlimited = "9223372036854771712"
    level(mem, {"memory.limit_in_bytes": unlimited, "memory.usage_in_bytes": str(10 * GiB)})
    level(mem / "slurm", {"memory.limit_in_bytes": str(3 * GiB), "memory.usage_in_bytes": str(2 * GiB)})
    level(mem / "slurm/job", {"memory.limit_in_bytes": str(4 * GiB), "memory.usage_in_bytes": str(GiB)})
    (mem / "slurm/job/memory.stat").write_text("cache 5\ntotal_inactive_file 0\n")
    proc = fake_proc(
        tmp_path,
        "5:cpu,cpuacct:/slurm/job\n4:memory:/slurm/job\n0::/\n",
        [f"/ {tmp_path / 'cpu'} rw - cgroup cgroup rw,cpu,cpuacct", f"/ {mem} rw - cgroup cgroup rw,memory"],
    )
    assert cgroup_memory_left(proc) == GiB  # the parent's 3 GiB less its 2 GiB used binds the job


def test_a_container_s_namespaced_mount_and_no_limit(tmp_path: Path) -> None:
    cg = tmp_path / "cg2"  # the container sees its own cgroup as the mount's root
    level(cg, {"memory.max": str(GiB + 4096), "memory.current": "4096"})
    proc = fake_proc(tmp_path, "0::/\n", [f"/docker/abc {cg} rw - cgroup2 cgroup2 rw"])
    assert cgroup_memory_left(proc) == GiB
    (cg / "memory.max").write_text("max\n")
    assert cgroup_memory_left(proc) is None
    assert cgroup_memory_left(tmp_path / "no-proc") is None


def _memory_cgroup() -> Path | None:
    """This process's cgroup v1 memory folder, when root may make children in it."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        if "memory" in controllers.split(",") and os.access(folder, os.W_OK):
            return folder
    return None


@pytest.fixture
def limited_cgroup(tmp_path: Path) -> Iterator[Path]:
    parent = _memory_cgroup()
    if parent is None:
        pytest.skip("no writable cgroup v1 memory hierarchy here (cgroup v2 is read from files above)")
    child = parent / f"hpcdl-test-{os.getpid()}"
    try:
        child.mkdir()
        (child / "memory.limit_in_bytes").write_text(str(1536 << 20))
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup here: {e}")
    try:
        yield child
    finally:
        child.rmdir()  # empty again: the test moved its process back


def test_a_process_in_a_1_5_gib_cgroup_sees_at_most_1_5_gib(limited_cgroup: Path) -> None:
    """This test's own process moved into a real cgroup with a 1.5 GiB limit, and back (the
    issue's probe: --fit chose a batch for 22.7 GiB there and was killed). cgroup v1 moves no
    charge with a process unless told to, so the move itself takes nothing from the limit."""
    import torch

    from hpcdl.device import memory_capacity

    before = memory_capacity(torch.device("cpu"))
    (limited_cgroup / "cgroup.procs").write_text(str(os.getpid()))
    try:
        inside = memory_capacity(torch.device("cpu"))
    finally:
        (limited_cgroup.parent / "cgroup.procs").write_text(str(os.getpid()))
    assert 0 < inside <= 1536 << 20 < before, (inside, before)
