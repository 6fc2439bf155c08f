"""The I/O path: synthetic samples written to HDF5 shards, read back through a DataLoader.

Each shard holds ``inputs`` and ``targets`` datasets chunked by batch, so one read fetches one
contiguous batch. Files are opened lazily inside each worker process (an h5py handle must not
cross a fork).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from hpcdl import reader
from hpcdl.errors import HpcdlError, InputError, RunFailed
from hpcdl.measure.data import make_batch
from hpcdl.parallel.launch import die_with_parent
from hpcdl.workloads.registry import canonical
from hpcdl.workloads.spec import Spec

MANIFEST = "hpcdl-shards.json"


@dataclass(frozen=True)
class Manifest:
    """What a shard directory's manifest says: the spec its samples are of, the batches in each
    shard and the batch size."""

    spec: dict[str, Any]
    shards: list[int]
    batch_size: int


def read_manifest(directory: Path) -> Manifest:
    """The manifest of a shard directory, read by the bounded reader and checked field by field;
    a one-line InputError of ``run.data_dir`` otherwise."""
    field = "run.data_dir"
    try:
        doc = reader.read_json(directory / MANIFEST)
    except reader.Unreadable as e:
        raise InputError(field, str(directory), f"its {MANIFEST} cannot be read: {e}") from None

    def bad(why: str) -> InputError:
        return InputError(field, str(directory), f"its {MANIFEST} is not an hpcdl shard manifest ({why})")

    if not isinstance(doc, dict):
        raise bad("not a JSON object")
    shards, batch, spec = doc.get("shards"), doc.get("batch_size"), doc.get("spec")
    if not isinstance(shards, list) or not shards or not all(_count(n) for n in shards):
        raise bad("shards: a list of batch counts >= 1")
    if not isinstance(batch, int) or not _count(batch):
        raise bad("batch_size: an integer >= 1")
    if not isinstance(spec, dict):
        raise bad("spec: an object")
    return Manifest(spec, shards, batch)


def _count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1


@dataclass(frozen=True)
class IOStats:
    """Bytes and samples moved in a measured time."""

    samples: int
    bytes: int
    seconds: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {
            "samples": self.samples,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "samples_per_s": self.samples_per_s,
            "bytes_per_s": self.bytes_per_s,
        }


def write_shards(spec: Spec, directory: str | Path, batches: int, shards: int = 2) -> IOStats:
    """Write ``batches`` batches of teacher-labelled samples of ``spec`` into ``shards`` files,
    timing generation separately from the writes (only the writes and fsync count)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if shards < 1 or batches < shards:
        raise HpcdlError(f"hdf5: batches={batches} must be >= shards={shards} >= 1")
    per_shard = [batches // shards + (1 if i < batches % shards else 0) for i in range(shards)]
    nbytes, seconds = 0, 0.0
    for i, n_batches in enumerate(per_shard):
        x, y = make_batch(spec, n_batches * spec.batch_size, "cpu", learnable=True, stream=10_000 + i)
        xa, ya = x.numpy(), y.numpy()
        path = out / f"shard-{i:05d}.h5"
        t0 = time.perf_counter()
        with h5py.File(path, "w") as f:
            f.create_dataset("inputs", data=xa, chunks=(spec.batch_size, *xa.shape[1:]))
            f.create_dataset("targets", data=ya, chunks=(spec.batch_size, *ya.shape[1:]))
            f.flush()
            os.fsync(f.id.get_vfd_handle())
        seconds += time.perf_counter() - t0
        nbytes += xa.nbytes + ya.nbytes
    manifest = {"spec": spec.to_dict(), "shards": per_shard, "batch_size": spec.batch_size}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return IOStats(batches * spec.batch_size, nbytes, seconds)


def has_shards(spec: Spec, directory: str | Path) -> bool:
    """True when ``directory`` holds readable shards written for exactly this spec, False when
    it holds none yet (they are to be written); a one-line error naming the directory or the
    shard when it holds anything else: a regular file, a damaged manifest, shards of another
    workload, a shard missing, truncated or of the wrong shape. Never overwrites."""
    d = Path(directory)
    field = "run.data_dir"
    if d.exists() and not d.is_dir():
        raise InputError(field, str(d), "a directory for HDF5 shards, not a file")
    if not os.path.lexists(d / MANIFEST):
        if d.exists() and any(d.glob("shard-*.h5")):
            raise InputError(
                field, str(d), f"holds shards without their {MANIFEST}: remove them or use another directory"
            )
        return False
    manifest = read_manifest(d)
    per_shard, batch = manifest.shards, manifest.batch_size
    if canonical(manifest.spec) != spec.to_dict():
        raise InputError(
            field, str(d), "holds shards of another workload: use another --data-dir or remove them"
        )
    sample = spec.sample_inputs(1, torch.Generator(), torch.device("meta")).shape[1:]
    for i, n in enumerate(per_shard):
        _check_shard(d / f"shard-{i:05d}.h5", (n * batch, *sample))
    return True


def _check_shard(path: Path, shape: tuple[int, ...]) -> None:
    try:
        with h5py.File(path, "r") as f:
            inputs, targets = f["inputs"], f["targets"]
            if inputs.shape != shape or targets.shape[:1] != shape[:1]:
                raise ValueError(f"inputs of shape {inputs.shape}, {shape} expected")
            inputs[-1:], targets[-1:]  # the last sample reads: the file is whole
    except (OSError, KeyError, ValueError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError("run.data_dir", str(path.parent), f"shard {path.name} is damaged ({why})") from None


class ShardBatches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Item ``i`` is the i-th whole batch across the shards, read as one contiguous slice.
    Rank ``rank`` of ``ranks`` sees every ``ranks``-th batch: disjoint parts for data parallelism."""

    def __init__(self, directory: str | Path, rank: int = 0, ranks: int = 1) -> None:
        self.directory = Path(directory)
        manifest = read_manifest(self.directory)
        self.batch = manifest.batch_size
        every = [(s, b) for s, n in enumerate(manifest.shards) for b in range(n)]
        self.index = every[rank::ranks]
        if not self.index:
            raise HpcdlError(f"hdf5: {len(every)} batches in {directory} cannot feed {ranks} ranks")
        self._files: dict[int, h5py.File] = {}

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        shard, b = self.index[i]
        if shard not in self._files:
            self._files[shard] = h5py.File(self.directory / f"shard-{shard:05d}.h5", "r")
        f = self._files[shard]
        sl = slice(b * self.batch, (b + 1) * self.batch)
        return torch.from_numpy(np.asarray(f["inputs"][sl])), torch.from_numpy(np.asarray(f["targets"][sl]))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": {}}  # workers open their own handles


def loader(
    directory: str | Path, workers: int, *, pin: bool = False, rank: int = 0, ranks: int = 1
) -> DataLoader[Any]:
    """A DataLoader over whole batches (the dataset already batches), ``workers`` processes."""
    return DataLoader(
        ShardBatches(directory, rank, ranks),
        batch_size=None,
        shuffle=True,
        num_workers=workers,
        pin_memory=pin,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(0),
        worker_init_fn=partial(_dies_with, os.getpid()),
    )


def _dies_with(parent: int, worker: int) -> None:
    """A DataLoader worker gets the parent-death signal: killed, a run takes its workers along
    at once (torch's own check of the parent comes every few seconds)."""
    die_with_parent(parent)


def read_throughput(
    directory: str | Path, workers: int, epochs: int = 1, rank: int = 0, ranks: int = 1
) -> IOStats:
    """Time full passes over (this rank's part of) the shards through the DataLoader,
    worker start-up excluded."""
    dl = loader(directory, workers, rank=rank, ranks=ranks)
    it = iter(dl)
    x, y = next(it)  # starts the workers; not timed
    samples, nbytes = 0, 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for x, y in it:
            samples += len(x)
            nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
        it = iter(dl)
    return IOStats(samples, nbytes, time.perf_counter() - t0)


class HDF5Source:
    """Batches for the training loop from the shards, moved to the device on each step:
    the data phase of a step then measures the real I/O path."""

    def __init__(
        self, directory: str | Path, device: torch.device, workers: int, rank: int = 0, ranks: int = 1
    ) -> None:
        self.device = device
        self.directory = Path(directory)
        self.loader = loader(directory, workers, pin=device.type == "cuda", rank=rank, ranks=ranks)
        self._it: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(self.loader)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            try:
                x, y = next(self._it)
            except StopIteration:
                self._it = iter(self.loader)
                x, y = next(self._it)
        except (OSError, KeyError, ValueError, RuntimeError) as e:  # a worker's error comes back here
            why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise RunFailed(f"hdf5: reading the shards in {self.directory} failed mid-run ({why})") from None
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
