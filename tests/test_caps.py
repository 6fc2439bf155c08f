"""Power and clock caps: set on a fake sysfs tree (cpufreq, RAPL) and through the telemetry
tests' fake NVML, refused before anything changes, and restored on every way out: an exception,
a real SIGTERM to a real sweep, a rank killed mid-point, and a process killed with SIGKILL
(whose journal the next sweep restores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hpcdl_cli import hpcdl
from test_telemetry import FakeNvml, write_domain

from hpcdl.errors import HpcdlError, InputError
from hpcdl.measure import caps
from hpcdl.measure import journal as caps_journal
from hpcdl.measure.limits import SYSFS_ENV, cpu_limits, gpu_limits
from hpcdl.parallel import launch
from hpcdl.parallel.launch import Terminated, stop_signals_raise
from hpcdl.records.loader import read_record
from hpcdl.results.report import figures, write_report
from hpcdl.results.report.figures import CapPoint

CPUS = sorted(os.sched_getaffinity(0))
MAX_KHZ, MIN_KHZ = 3_000_000, 1_000_000


def fake_sysfs(root: Path) -> Path:
    """cpufreq for every CPU this process may run on, and two enabled RAPL packages."""
    for cpu in CPUS:
        d = root / f"devices/system/cpu/cpu{cpu}/cpufreq"
        d.mkdir(parents=True)
        (d / "cpuinfo_min_freq").write_text(f"{MIN_KHZ}\n")
        (d / "cpuinfo_max_freq").write_text(f"{MAX_KHZ}\n")
        (d / "scaling_max_freq").write_text(f"{MAX_KHZ}\n")
    for i in range(2):
        pkg = write_domain(root / "class/powercap", f"intel-rapl:{i}", f"package-{i}", 0)
        (pkg / "enabled").write_text("1\n")
        (pkg / "constraint_0_power_limit_uw").write_text("150000000\n")
        (pkg / "constraint_0_max_power_uw").write_text("200000000\n")
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def scaling_max_mhz(root: Path) -> set[int]:
    files = root.glob("devices/system/cpu/cpu*/cpufreq/scaling_max_freq")
    return {int(p.read_text()) // 1000 for p in files}


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = fake_sysfs(tmp_path / "sys")
    monkeypatch.setenv(SYSFS_ENV, str(root))
    monkeypatch.setenv(caps_journal.JOURNAL_ENV, str(tmp_path / "caps-journal.json"))
    return root


class CapNvml(FakeNvml):
    """The telemetry tests' fake NVML with the power-limit and locked-clock calls, as NVML
    documents them (milliwatts, MHz); ``permitted=False`` answers as NVML does without root,
    ``obeys=False`` takes a power limit without error and keeps the old one."""

    class NVMLError_NoPermission(FakeNvml.NVMLError):
        def __str__(self) -> str:
            return "Insufficient Permissions"

    def __init__(self, permitted: bool = True, obeys: bool = True) -> None:
        super().__init__()
        self.permitted, self.obeys = permitted, obeys
        self.limit_mw = {0: 700_000, 1: 700_000}
        self.locked: dict[int, tuple[int, int] | None] = {0: None, 1: None}
        self.calls: list[str] = []

    def nvmlDeviceGetCount(self) -> int:
        return len(self.limit_mw)

    def nvmlDeviceGetIndex(self, handle: str) -> int:
        return int(handle.removeprefix("gpu"))

    def _index(self, handle: str) -> int:
        return int(handle.removeprefix("gpu"))

    def _privileged(self, call: str) -> None:
        self.calls.append(call)
        if not self.permitted:
            raise self.NVMLError_NoPermission()

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: str) -> tuple[int, int]:
        return 200_000, 700_000

    def nvmlDeviceGetPowerManagementLimit(self, handle: str) -> int:
        return self.limit_mw[self._index(handle)]

    def nvmlDeviceSetPowerManagementLimit(self, handle: str, limit_mw: int) -> None:
        self._privileged(f"set {handle} {limit_mw}")
        if self.obeys:
            self.limit_mw[self._index(handle)] = limit_mw

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: str) -> list[int]:
        return [2619, 1593]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: str, memory_mhz: int) -> list[int]:
        assert memory_mhz == 2619
        return list(range(1980, 344, -15))

    def nvmlDeviceSetGpuLockedClocks(self, handle: str, lo: int, hi: int) -> None:
        self._privileged(f"lock {handle} {lo} {hi}")
        self.locked[self._index(handle)] = (lo, hi)

    def nvmlDeviceResetGpuLockedClocks(self, handle: str) -> None:
        self._privileged(f"reset {handle}")
        self.locked[self._index(handle)] = None


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "journal.json"
    monkeypatch.setenv(caps_journal.JOURNAL_ENV, str(path))
    return path


# --- sysfs -----------------------------------------------------------------------------------


def test_cpu_clock_cap_is_set_and_restored(sysfs: Path) -> None:
    limits = cpu_limits("clock", CPUS)
    caps.check("clock", [1500, 2000], limits)
    before = snapshot(sysfs)
    with caps.capped("clock", 1500, limits) as applied:
        assert scaling_max_mhz(sysfs) == {1500}
        assert [a.applied for a in applied] == [1500.0] * len(CPUS)
        assert {a.original for a in applied} == {MAX_KHZ / 1000}
        assert caps_journal.journal_path().exists()
    assert snapshot(sysfs) == before and not caps_journal.journal_path().exists()


def test_rapl_power_cap_is_set_and_restored_after_an_exception(sysfs: Path) -> None:
    limits = cpu_limits("power", CPUS)
    assert [lim.name for lim in limits] == [
        "intel-rapl:0 package power limit",
        "intel-rapl:1 package power limit",
    ]
    before = snapshot(sysfs)
    with pytest.raises(ZeroDivisionError), caps.capped("power", 90, limits):
        assert (sysfs / "class/powercap/intel-rapl:1/constraint_0_power_limit_uw").read_text() == "90000000\n"
        _ = 1 / 0
    assert snapshot(sysfs) == before and not caps_journal.journal_path().exists()


@pytest.mark.parametrize(
    ("kind", "values", "why"),
    [
        ("clock", [0], "> 0"),
        ("clock", [-1500], "> 0"),
        ("clock", [float("nan")], "> 0"),
        ("clock", [1500, 3500], "accepts 1000 to 3000 MHz"),
        ("clock", [999], "accepts 1000 to 3000 MHz"),
        ("power", [250], "accepts 1 to 200 W"),
    ],
)
def test_bad_caps_are_refused_and_nothing_changes(
    sysfs: Path, kind: str, values: list[float], why: str
) -> None:
    before = snapshot(sysfs)
    with pytest.raises(InputError, match=why) as e:
        caps.check(kind, values, cpu_limits(kind, CPUS))
    assert "\n" not in str(e.value) and f"{kind}-limit=" in str(e.value)
    assert snapshot(sysfs) == before and not caps_journal.journal_path().exists()


def test_missing_or_disabled_interfaces_are_refused(sysfs: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no cpufreq interface"):
        cpu_limits("clock", CPUS, tmp_path / "empty")
    with pytest.raises(InputError, match="no RAPL package domains"):
        cpu_limits("power", CPUS, tmp_path / "empty")
    (sysfs / "class/powercap/intel-rapl:1/enabled").write_text("0\n")
    with pytest.raises(InputError, match="disabled on intel-rapl:1"):
        cpu_limits("power", CPUS)


@pytest.fixture
def read_only_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake tree on a tmpfs remounted read-only: writes fail as on a sysfs without privileges
    (root ignores file modes, not a read-only mount)."""
    where = tmp_path / "ro"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], check=True)
    try:
        fake_sysfs(where)
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        monkeypatch.setenv(SYSFS_ENV, str(where))
        monkeypatch.setenv(caps_journal.JOURNAL_ENV, str(tmp_path / "journal.json"))
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_limit_that_cannot_be_written_is_refused_before_anything_changes(read_only_sysfs: Path) -> None:
    before = snapshot(read_only_sysfs)
    with pytest.raises(InputError, match="cannot be changed: .*Read-only file system"):
        caps.check("clock", [1500], cpu_limits("clock", CPUS))
    assert snapshot(read_only_sysfs) == before and not caps_journal.journal_path().exists()


# --- NVML --------------------------------------------------------------------------------------


def test_gpu_power_cap_through_nvml(journal: Path) -> None:
    nv = CapNvml()
    limits = gpu_limits("power", nv, [1, 0, 1])
    assert [lim.name for lim in limits] == ["GPU 0 power limit", "GPU 1 power limit"]
    caps.check("power", [300, 450], limits)
    assert nv.limit_mw == {0: 700_000, 1: 700_000}  # the probe wrote what they held
    with caps.capped("power", 300, limits) as applied:
        assert nv.limit_mw == {0: 300_000, 1: 300_000}
        assert [(a.original, a.applied) for a in applied] == [(700.0, 300.0)] * 2
    assert nv.limit_mw == {0: 700_000, 1: 700_000} and not journal.exists()
    with pytest.raises(InputError, match="GPU 0 power limit accepts 200 to 700 W"):
        caps.check("power", [150], limits)


def test_gpu_clock_cap_locks_from_the_lowest_clock_and_resets(journal: Path) -> None:
    nv = CapNvml()
    limits = gpu_limits("clock", nv, [0])
    caps.check("clock", [1200], limits)
    with caps.capped("clock", 1200, limits) as applied:
        assert nv.locked[0] == (345, 1200) and applied[0].applied is None  # NVML cannot read it back
    assert nv.locked[0] is None and nv.calls[-1] == "reset gpu0"
    with pytest.raises(InputError, match="accepts 345 to 1980 MHz"):
        caps.check("clock", [2100], limits)


def test_nvml_without_privileges_is_refused_before_anything_changes(journal: Path) -> None:
    nv = CapNvml(permitted=False)
    for kind in ("power", "clock"):
        with pytest.raises(InputError, match="needs privileges to change .*Insufficient Permissions"):
            caps.check(kind, [400], gpu_limits(kind, nv, [0]))
    assert nv.limit_mw == {0: 700_000, 1: 700_000} and nv.locked[0] is None and not journal.exists()


def test_a_cap_the_device_ignores_is_an_error_not_a_silent_no_op(journal: Path) -> None:
    nv = CapNvml(obeys=False)
    limits = gpu_limits("power", nv, [0])
    caps.check("power", [300], limits)
    with pytest.raises(InputError, match="holds 700 W after it was set: the device refused"):
        with caps.capped("power", 300, limits):
            pytest.fail("the run must not start under a cap the device did not take")
    assert not journal.exists()


def test_sigterm_inside_the_cap_restores_it(journal: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real SIGTERM to this process while capped: Terminated unwinds through the restore. (The
    signal is noted in ``launch._received``: kept to this test, or every later launch here would
    take it for its own.)"""
    monkeypatch.setattr(launch, "_received", [])
    nv = CapNvml()
    limits = gpu_limits("power", nv, [0, 1])
    with pytest.raises(Terminated), stop_signals_raise(), caps.capped("power", 250, limits):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises at the next bytecode, long before this ends
    assert nv.limit_mw == {0: 700_000, 1: 700_000} and not journal.exists()


def test_a_failed_restore_keeps_the_journal_and_names_the_limit(journal: Path) -> None:
    nv = CapNvml()
    limits = gpu_limits("power", nv, [0])
    with pytest.raises(HpcdlError, match="could not restore GPU 0 power limit"):
        with caps.capped("power", 250, limits):
            nv.permitted = False  # e.g. the driver was reloaded under us
    assert json.loads(journal.read_text())["limits"][0]["original"] == 700.0


# --- the journal: a holder killed with SIGKILL ----------------------------------------------------

HOLDER = """
import sys, time
from hpcdl.measure import caps
from hpcdl.measure.limits import cpu_limits
limits = cpu_limits("clock", [int(c) for c in sys.argv[1].split(",")])
with caps.capped("clock", 1200, limits):
    print("capped", flush=True)
    time.sleep(60)
"""


def holder(env: dict[str, str]) -> subprocess.Popen[str]:
    cpus = ",".join(map(str, CPUS))
    p = subprocess.Popen([sys.executable, "-c", HOLDER, cpus], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "capped\n"
    return p


def test_a_killed_holder_s_journal_is_restored_by_the_next_sweep(sysfs: Path) -> None:
    before = snapshot(sysfs)
    p = holder(dict(os.environ))
    try:
        assert scaling_max_mhz(sysfs) == {1200}
        with pytest.raises(InputError, match=f"process {p.pid} holds caps on this host"):
            caps.check("clock", [1500], cpu_limits("clock", CPUS))  # a live holder is a lock
    finally:
        p.kill()
        p.wait()
    assert scaling_max_mhz(sysfs) == {1200} and caps_journal.journal_path().exists()  # SIGKILL: no finally
    caps.check("clock", [1500], cpu_limits("clock", CPUS))
    assert snapshot(sysfs) == before and not caps_journal.journal_path().exists()


# --- the journal is private and names only limits hpcdl knows -------------------------------------


def plant(path: Path, *entries: dict[str, Any], pid: int = 2**22 + 1) -> None:
    """A journal as a dead sweep would leave it (the pid is above Linux's pid_max default)."""
    path.write_text(json.dumps({"pid": pid, "kind": "clock", "value": 1200, "limits": list(entries)}))


def cpufreq_entry(root: Path, mhz: float, cpu: int = CPUS[0]) -> dict[str, Any]:
    path = root / f"devices/system/cpu/cpu{cpu}/cpufreq/scaling_max_freq"
    return {"sysfs": str(path), "scale": 1000.0, "name": f"cpu{cpu}", "original": mhz}


def test_the_default_journal_is_in_a_folder_only_root_can_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(caps_journal.JOURNAL_ENV, raising=False)
    if os.geteuid() == 0:
        assert caps_journal.journal_path() == Path("/run/hpcdl/caps.json")
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
        assert caps_journal.journal_path() == Path("/run/user/1000/hpcdl/caps.json")


def test_a_planted_journal_writes_only_to_known_limits_within_their_range(
    sysfs: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    fake_cpufreq = tmp_path / "sys-elsewhere/scaling_max_freq"
    fake_cpufreq.parent.mkdir()
    fake_cpufreq.write_text("3000000\n")
    plant(
        caps_journal.journal_path(),
        {"sysfs": str(victim), "scale": 1.0, "name": "x", "original": 7},
        {"sysfs": str(fake_cpufreq), "scale": 1000.0, "name": "y", "original": 1500},
        cpufreq_entry(sysfs, 99_999),  # a known file, a value outside cpuinfo_min..max
        cpufreq_entry(sysfs, 1_700),  # the one entry that is restored
        {"nvml": "power", "index": 0, "original": 300},  # no NVML here: not a device present
        "not a table",
    )
    said: list[str] = []
    assert caps.recover(said.append) == [f"cpu{CPUS[0]} scaling_max_freq"]
    assert victim.read_text() == "precious\n" and fake_cpufreq.read_text() == "3000000\n"
    assert (sysfs / f"devices/system/cpu/cpu{CPUS[0]}/cpufreq/scaling_max_freq").read_text() == "1700000\n"
    assert len(said) == 1 and "ignored 5 entries" in said[0] and str(victim) in said[0], said
    assert "outside 1000 to 3000" in said[0] and "NVML unavailable" in said[0]
    assert not caps_journal.journal_path().exists()


def test_a_journal_names_only_nvml_devices_present_within_their_range(journal: Path) -> None:
    nv = CapNvml()
    nv.limit_mw[1] = 250_000  # left capped by a sweep killed with SIGKILL
    plant(
        journal,
        {"nvml": "power", "index": 1, "original": 700},
        {"nvml": "power", "index": 0, "original": 5000},  # outside 200..700 W
        {"nvml": "power", "index": 7, "original": 300},  # no GPU 7 here
        {"nvml": "clock", "index": True},
    )
    said: list[str] = []
    assert caps.recover(said.append, lib=lambda: nv) == ["GPU 1 power limit"]
    assert nv.limit_mw == {0: 700_000, 1: 700_000} and nv.calls == ["set gpu1 700000"]
    assert "ignored 3 entries" in said[0] and "no such device (2 present)" in said[0]


@pytest.mark.parametrize(
    "text",
    ["{", "[]", '{"pid": "12", "limits": []}', '{"pid": 0, "limits": []}', '{"pid": 5}', "[" * 100_000],
)
def test_a_malformed_journal_is_one_line(journal: Path, text: str) -> None:
    journal.write_text(text)
    with pytest.raises(InputError, match="caps journal=.*restore the limits by hand") as e:
        caps.recover()
    assert "\n" not in str(e.value) and journal.exists()  # kept for the operator


def test_a_journal_that_is_a_link_or_in_a_folder_others_can_write_is_refused(
    sysfs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim.json"
    plant(victim, cpufreq_entry(sysfs, 1_700))
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "caps.json").symlink_to(victim)
    linked = tmp_path / "linked"
    linked.symlink_to(private)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    others = tmp_path / "others"
    others.mkdir(mode=0o700)
    os.chown(others, 65534, 65534)  # nobody's (the tests run as root, which may give it away)
    before = snapshot(sysfs)
    for journal, why in [
        (private / "caps.json", "a symbolic link, not a regular file"),
        (linked / "caps.json", "a symbolic link: a folder only you can write"),
        (shared / "caps.json", "mode 1777 lets others write"),
        (others / "caps.json", "owned by uid 65534, not you"),
    ]:
        monkeypatch.setenv(caps_journal.JOURNAL_ENV, str(journal))
        with pytest.raises(InputError, match=why):
            caps.recover()
        assert snapshot(sysfs) == before and victim.read_text().startswith('{"pid"')
        if journal.parent != private:  # a sweep writes no journal there either
            with pytest.raises(InputError, match=why):
                with caps.capped("clock", 1500, cpu_limits("clock", CPUS)):
                    pytest.fail("no cap without a private journal")
    monkeypatch.setenv(caps_journal.JOURNAL_ENV, str(private / "caps.json"))
    with caps.capped("clock", 1500, cpu_limits("clock", CPUS)):  # replaces the link, not its target
        assert not (private / "caps.json").is_symlink()
    assert snapshot(sysfs) == before and victim.read_text().startswith('{"pid"')


def test_sweep_ignores_a_planted_journal_entry_in_one_line(sysfs: Path, tmp_path: Path) -> None:
    """The probe of issue 16: an ordinary file named in a journal is not written by hpcdl sweep
    (in this process: the sweep refuses the cap after the journal is read, before any run)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    plant(caps_journal.journal_path(), {"sysfs": str(victim), "scale": 1.0, "name": "x", "original": 7})
    p = hpcdl(*sweep(tmp_path / "out", "--np", "1", "--steps", "5", "--clock-limit", "5000"))
    err = p.stderr
    assert p.returncode == 2 and "accepts 1000 to 3000 MHz" in err, err
    assert f"ignored 1 entries: {str(victim)!r} is not a cpufreq or RAPL limit" in err
    assert "Traceback" not in err and victim.read_text() == "precious\n"


# --- hpcdl sweep --clock-limit: real processes, real signals ----------------------------------------

TINY = ["--workload", "mlp", "layers=1", "width=16", "input_size=8", "output_size=2", "batch_size=4"]


def sweep(out: Path, *extra: str) -> list[str]:
    """The arguments of ``hpcdl sweep`` of the tiny workload into ``out``."""
    return [
        "sweep",
        *TINY,
        "--device",
        "cpu",
        "--min-duration",
        "0",
        "-o",
        str(out),
        *extra,
    ]


@pytest.fixture(autouse=True)
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """One torch thread in the runs these tests start: on a busy 2-core machine two spinning
    threads made a 1 ms step take 36 ms."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def wait_for(predicate: Any, what: str, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.1)


def process(args: list[str]) -> list[str]:
    """The command line that runs ``hpcdl ARGS`` as a process (signals reach it, not pytest)."""
    return [sys.executable, "-m", "hpcdl", *args]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--clock-limit", "-5"], "clock-limit='-5' is invalid: caps in MHz > 0"),
        (["--power-limit", "0,100"], "power-limit='0,100' is invalid: caps in W > 0"),
        (["--power-limit", "inf"], "caps in W > 0"),
        (["--power-limit", "x"], "caps in W > 0"),
        (["--clock-limit", "5000"], "accepts 1000 to 3000 MHz"),
        (["--clock-limit", "1500", "--power-limit", "100"], "one of --power-limit and --clock-limit"),
        (["--clock-limit", "1500", "--np", "1,2"], "a cap sweep runs at one rank count"),
    ],
)
def test_sweep_refuses_bad_caps_in_one_line(sysfs: Path, tmp_path: Path, args: list[str], why: str) -> None:
    steps = [] if "--np" in args else ["--np", "1"]
    before = snapshot(sysfs)
    p = hpcdl(*sweep(tmp_path / "out", "--steps", "5", *steps, *args))
    errors = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(errors) == 1 and why in errors[0], p.stderr
    assert snapshot(sysfs) == before and not (tmp_path / "out").exists()


def test_cap_sweep_needs_steps_and_a_cappable_device(tmp_path: Path) -> None:
    for steps in ([], ["--steps", "0"]):  # 0 would be a timed window: different work per cap
        p = hpcdl("sweep", *TINY, "--np", "1", *steps, "--clock-limit", "1500", "-o", str(tmp_path / "o"))
        assert p.returncode == 2 and "give --steps N >= 1" in p.stderr, p.stderr
    env = {**os.environ, SYSFS_ENV: str(tmp_path / "nothing")}
    p = hpcdl(*sweep(tmp_path / "o", "--np", "1", "--steps", "3", "--power-limit", "100"), env=env)
    assert p.returncode == 2 and "no RAPL package domains" in p.stderr, p.stderr


@pytest.mark.slow(reason="a three-cap sweep in a process, stopped and rerun")
def test_sigterm_mid_sweep_restores_the_limits_and_keeps_finished_points(sysfs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    before = snapshot(sysfs)
    args = sweep(out, "--np", "1", "--steps", "30", "--data", "random", "--clock-limit", "1500,2000,2500")
    cmd = process(args)
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    first = out / "sweep-clock-1500MHz-np1.json"
    wait_for(lambda: first.exists(), "the first record")
    wait_for(lambda: scaling_max_mhz(sysfs) == {2000}, "the second cap")
    p.send_signal(signal.SIGTERM)
    _, stderr = p.communicate(timeout=60)
    assert p.returncode == 143, stderr
    assert "limits are restored" in stderr
    assert snapshot(sysfs) == before and not caps_journal.journal_path().exists()
    cap = read_record(first).result.environment.cap
    assert cap is not None and (cap["kind"], cap["value"], cap["unit"]) == ("clock", 1500.0, "MHz")
    assert {lim["applied"] for lim in cap["limits"]} == {1500.0}
    assert not (out / "sweep-clock-2000MHz-np1.json").exists()
    summary = json.loads((out / "sweep-clock-np1-summary.json").read_text())
    assert [p["record"] is not None for p in summary["points"]] == [True, False, False]
    # a rerun skips the finished cap and measures the others
    p2 = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p2.returncode == 0, p2.stderr
    assert "1500 MHz: valid record" in p2.stderr and snapshot(sysfs) == before
    # the report plots time, ETS and EDP against the cap (no energy meter here: said in the panels)
    index = write_report([out], tmp_path / "report", say=lambda _m: None)
    (figure,) = (tmp_path / "report").glob("caps-1-mlp*.png")
    assert figure.stat().st_size > 10_000 and figure.name in index.read_text()
    assert "the same work under each clock cap (MHz)" in index.read_text()


def test_the_cap_figure_draws_measured_and_unmeasured_energy(tmp_path: Path) -> None:
    measured = {100.0: CapPoint(10.0, 2000.0, 20000.0), 150.0: CapPoint(8.0, 2100.0, 16800.0)}
    unmeasured = {100.0: CapPoint(10.0, None, None), 150.0: CapPoint(8.0, None, None)}
    for name, points in (("m.png", measured), ("u.png", unmeasured)):
        assert figures.caps(tmp_path / name, "mlp", "power", "W", points).stat().st_size > 10_000


def rank_pids(name: str) -> list[int]:
    """The pids of the MPI ranks running the record ``name`` (their command line names it)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes()
        except OSError:
            continue
        if name.encode() in cmd and b"OMPI_COMM_WORLD_RANK=1" in env:
            found.append(int(proc.name))
    return found


@pytest.mark.slow(reason="a two-rank sweep over two caps with a rank killed")
@pytest.mark.mpi
def test_a_rank_killed_mid_point_fails_the_point_and_the_limits_come_back(
    sysfs: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    before = snapshot(sysfs)
    cmd = process(
        sweep(
            out,
            "--np",
            "2",
            "--steps",
            "50",
            "--data",
            "random",
            "--backend",
            "torch",
            "--clock-limit",
            "1500,2000",
        )
    )
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: rank_pids("sweep-clock-1500MHz-np2") != [], "rank 1")
    wait_for(lambda: scaling_max_mhz(sysfs) == {1500}, "the first cap")
    for pid in rank_pids("sweep-clock-1500MHz-np2"):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: scaling_max_mhz(sysfs) == {2000}, "the next cap")
    _, stderr = p.communicate(timeout=300)
    assert p.returncode == 1, stderr  # a point failed
    assert "1500 MHz: failed with exit code" in stderr
    assert snapshot(sysfs) == before and not caps_journal.journal_path().exists()
    assert not (out / "sweep-clock-1500MHz-np2.json").exists()
    assert (out / "sweep-clock-2000MHz-np2.json").exists()
