"""The HDF5 I/O path: real files, real DataLoader workers."""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest
import torch

import hpcdl
from hpcdl.errors import InputError
from hpcdl.measure import hdf5 as h5data
from hpcdl.measure.config import RunConfig
from hpcdl.measure.data import teacher_targets

SPEC = {"family": "mlp", "layers": 1, "width": 32, "input_size": 16, "output_size": 5, "batch_size": 8}


def test_shards_round_trip_through_workers(tmp_path: Path) -> None:
    spec = hpcdl.spec_from_dict(SPEC)
    w = h5data.write_shards(spec, tmp_path, batches=6, shards=3)
    assert w.samples == 48 and w.bytes == 48 * (16 * 4 + 8) and w.seconds > 0
    assert sorted(p.name for p in tmp_path.glob("shard-*.h5")) == [f"shard-0000{i}.h5" for i in range(3)]
    with h5py.File(tmp_path / "shard-00000.h5") as f:
        assert f["inputs"].shape == (16, 16) and f["targets"].shape == (16,)
    batches = list(h5data.loader(tmp_path, workers=2))
    assert len(batches) == 6 and all(x.shape == (8, 16) and y.shape == (8,) for x, y in batches)
    # every written sample comes back exactly once, each with the teacher's label for it
    got_x, got_y = torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
    want = torch.cat(
        [torch.from_numpy(h5py.File(p)["inputs"][:]) for p in sorted(tmp_path.glob("shard-*.h5"))]
    )
    order = lambda x: sorted(range(len(x)), key=lambda i: x[i].tolist())  # noqa: E731
    assert torch.equal(got_x[order(got_x)], want[order(want)])
    assert torch.equal(got_y, teacher_targets(spec, got_x))
    assert len(set(got_y.tolist())) > 1  # labels that say something: not one class for all
    r = h5data.read_throughput(tmp_path, workers=2)
    assert r.samples == 40 and r.bytes_per_s > 0  # the first batch starts the workers, untimed


def test_training_from_hdf5_records_io_and_trains(tmp_path: Path) -> None:
    spec = hpcdl.spec_from_dict(SPEC)
    cfg = RunConfig(
        data="hdf5", data_dir=str(tmp_path / "d"), data_workers=1, pool_batches=4, steps=24, min_duration_s=0
    )
    res = hpcdl.run(spec, cfg, output_dir=None)
    io = res.result.metrics.io
    assert io.write is not None and io.read is not None  # the typed view of metrics.io
    assert io.write.samples == 32 and io.read.samples_per_s > 0
    assert res.passed, res.record["validity"]
    assert h5data.has_shards(spec, tmp_path / "d")
    with pytest.raises(InputError, match="shards of another workload"):
        h5data.has_shards(spec.replace(seed=3), tmp_path / "d")
