"""A system to predict on: nodes of devices, a link inside a node, a fabric between nodes.

A system file is TOML (the catalogue: ``hpcdl/recipes/systems/*.toml``)::

    name = "dgx-a100"
    description = "NVIDIA DGX A100: 8 x A100 SXM4 on NVSwitch, 8 x HDR 200 Gb/s InfiniBand"
    devices_per_node = 8

    [intra]                       # one device's link inside the node, one direction
    kind = "NVLink 3 / NVSwitch"
    bandwidth_GB_s = 300.0        # datasheet figure
    efficiency = 0.8              # achievable fraction of it (assumed, with its source)
    latency_us = 2.0
    source = "..."

    [inter]                       # the node's fabric
    kind = "InfiniBand HDR"
    nics = 8
    nic_Gbit_s = 200.0
    efficiency = 0.9
    latency_us = 5.0
    source = "..."

    [device]                      # one device (what one rank drives)
    name = "NVIDIA A100-SXM4-80GB"
    memory_GB = 80.0
    power_W = 400.0
    source = "..."
    # peak_TFLOPs = {fp32 = 19.5, bf16 = 312.0}   # dense; by default hpcdl's datasheet table's
                                                  # entry for the name (measure/datasheets.py)

    [node]                        # one whole node (optional): what hpcdl predict --samples
    power_W = 6500.0              # estimates a training's energy from, where no record measured it
    source = "..."

Every figure must be there, finite and in range; the reader names the first one that is not.
A file without ``[device]`` still predicts what its links do, but no figure can be carried to
its device from a record measured on another (``hpcdl predict`` says which option to give); one
without ``[node]`` gives no energy estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from hpcdl import reader
from hpcdl.errors import InputError
from hpcdl.measure.datasheets import LISTED, datasheet_entry
from hpcdl.reader import Unreadable
from hpcdl.scaling.collectives import Comm, Hierarchy

MAX_TOML_BYTES = 1 << 20
"""a system file is a page of figures; anything larger is not one"""


@dataclass(frozen=True, kw_only=True)
class Link:
    """One level's achievable latency and bandwidth (the datasheet's times ``efficiency``)."""

    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str


@dataclass(frozen=True, kw_only=True)
class Device:
    """One device of a system: its dense peak FLOP/s by precision, memory and power, sourced."""

    name: str
    peak_flops: dict[str, float]
    """by precision (``measure.datasheets.LISTED``: those it has)"""
    memory_bytes: float
    power_w: float
    source: str
    """where the memory and power figures come from, and the peaks' where given in the file"""
    peak_source: str
    """where the peaks come from: the file, or hpcdl's datasheet table"""


@dataclass(frozen=True, kw_only=True)
class System:
    """Nodes of ``devices_per_node`` devices: ``intra`` is one device's link inside a node,
    ``inter`` the node's fabric (all ``nics`` together), ``device`` one device (None where the
    file names none)."""

    name: str
    description: str
    devices_per_node: int
    intra: Link
    inter: Link
    nics: int
    device: Device | None = None
    node_power_w: float | None = None
    """one node's power, all of it (devices, CPUs, memory, NICs, fans): what an energy estimate
    multiplies the hours by; None where the file names none"""
    node_power_source: str = ""

    def cost(self, collective: str, ranks_per_node: int) -> Hierarchy:
        """The two-level cost of ``collective`` with ``ranks_per_node`` ranks on each node."""
        if not 1 <= ranks_per_node <= self.devices_per_node:
            raise InputError(
                "predict.ranks_per_node",
                ranks_per_node,
                f"1..{self.devices_per_node}, the devices per node of {self.name}",
            )
        return Hierarchy(
            intra=Comm(alpha_s=self.intra.latency_s, beta_bytes_per_s=self.intra.bandwidth_bytes_per_s),
            inter=Comm(alpha_s=self.inter.latency_s, beta_bytes_per_s=self.inter.bandwidth_bytes_per_s),
            ranks_per_node=ranks_per_node,
            collective=collective,
        )


def catalogue_dir() -> Path:
    """The installed catalogue: ``generators/systems`` (``hpcdl/recipes/systems``)."""
    return Path(str(files("hpcdl") / "recipes" / "systems"))


def catalogue() -> list[str]:
    """The names of the catalogue's systems."""
    return sorted(p.stem for p in catalogue_dir().glob("*.toml"))


def read_toml(path: Path) -> dict[str, Any]:
    """A system file read like every document hpcdl reads (hpcdl/reader.py: a regular file,
    bounded in size and depth)."""
    try:
        return reader.parse_toml(reader.read_bytes(path, MAX_TOML_BYTES))
    except Unreadable as e:
        raise InputError("predict.system", str(path), f"a readable TOML system file ({e})") from None


def load_system(name: str) -> System:
    """A catalogue system by name, or a system file by path."""
    path = Path(name)
    if not (name.endswith(".toml") or path.exists()):
        if name not in catalogue():
            raise InputError(
                "predict.system", name, f"a catalogue system ({', '.join(catalogue())}) or a .toml file"
            )
        path = catalogue_dir() / f"{name}.toml"
    return parse_system(read_toml(path), str(path))


def _shown(value: Any) -> Any:
    """A value short enough for a one-line error (a TOML integer may have 400 digits)."""
    text = repr(value)
    return value if len(text) <= 40 else text[:37] + "..."


def _number(doc: dict[str, Any], key: str, where: str, low: float, high: float = math.inf) -> float:
    value = doc.get(key)
    field = f"system.{where}{key}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(field, _shown(value), f"a number in [{low:g}, {high:g}]")
    if not (math.isfinite(value) and low <= value <= high):
        raise InputError(field, _shown(value), f"a finite number in [{low:g}, {high:g}]")
    return float(value)


def _count(doc: dict[str, Any], key: str, where: str, high: int) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InputError(f"system.{where}{key}", _shown(value), f"an integer in 1..{high}")
    return value


def _text(doc: dict[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"system.{where}{key}", _shown(value), "a non-empty string")
    return value


def _section(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise InputError(f"system.{key}", _shown(value), f"a [{key}] table")
    return value


def parse_system(doc: dict[str, Any], where: str = "") -> System:
    """A :class:`System` from a system file's document; :class:`InputError` names the field."""
    intra, inter = _section(doc, "intra"), _section(doc, "inter")
    nics = _count(inter, "nics", "inter.", 4096)
    # a link of zero bandwidth is refused here: a bandwidth must be > 0 (1e-9 GB/s at least)
    intra_bw = _number(intra, "bandwidth_GB_s", "intra.", 1e-9) * 1e9
    nic_bw = _number(inter, "nic_Gbit_s", "inter.", 1e-9) * 1e9 / 8
    return System(
        name=_text(doc, "name", ""),
        description=_text(doc, "description", ""),
        devices_per_node=_count(doc, "devices_per_node", "", 4096),
        intra=Link(
            kind=_text(intra, "kind", "intra."),
            bandwidth_bytes_per_s=intra_bw * _number(intra, "efficiency", "intra.", 1e-3, 1.0),
            latency_s=_number(intra, "latency_us", "intra.", 0.0, 1e6) * 1e-6,
            source=_text(intra, "source", "intra."),
        ),
        inter=Link(
            kind=_text(inter, "kind", "inter."),
            bandwidth_bytes_per_s=nics * nic_bw * _number(inter, "efficiency", "inter.", 1e-3, 1.0),
            latency_s=_number(inter, "latency_us", "inter.", 0.0, 1e6) * 1e-6,
            source=_text(inter, "source", "inter."),
        ),
        nics=nics,
        device=parse_device(doc["device"]) if "device" in doc else None,
        **parse_node(doc["node"]) if "node" in doc else {},
    )


def parse_node(doc: Any) -> dict[str, Any]:
    """The ``[node]`` table: one node's power and where the figure comes from."""
    if not isinstance(doc, dict):
        raise InputError("system.node", _shown(doc), "a [node] table")
    return {
        "node_power_w": _number(doc, "power_W", "node.", 1.0, 1e7),
        "node_power_source": _text(doc, "source", "node."),
    }


def parse_device(doc: Any) -> Device:
    """The ``[device]`` table: its peaks given (``peak_TFLOPs``) or, by default, the datasheet
    table's entry for its name (one place per fact: ``measure.datasheets``)."""
    if not isinstance(doc, dict):
        raise InputError("system.device", _shown(doc), "a [device] table")
    name = _text(doc, "name", "device.")
    given = doc.get("peak_TFLOPs")
    if given is not None:
        if not isinstance(given, dict) or not given or set(given) - set(LISTED):
            raise InputError(
                "system.device.peak_TFLOPs", _shown(given), f"a table of {', '.join(LISTED)} = TFLOP/s"
            )
        peaks = {p: _number(given, p, "device.peak_TFLOPs.", 1e-6, 1e6) * 1e12 for p in given}
        peak_source = _text(doc, "source", "device.")
    else:
        found = datasheet_entry(name)
        if found is None:
            raise InputError(
                "system.device.peak_TFLOPs", None, f"required: hpcdl's datasheet table has no device {name!r}"
            )
        peaks = dict(found[0])
        peak_source = f"datasheet: {found[1]}"
    return Device(
        name=name,
        peak_flops=peaks,
        memory_bytes=_number(doc, "memory_GB", "device.", 1e-3, 1e6) * 1e9,
        power_w=_number(doc, "power_W", "device.", 1e-3, 1e6),
        source=_text(doc, "source", "device."),
        peak_source=peak_source,
    )
