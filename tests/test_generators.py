"""Recipes and sampling: the size-class suites and presets read from generators/, seeded
sampling of every family; and the analytic counts of sampled specs against PyTorch's FLOP
counter, for every family."""

from __future__ import annotations

import pytest

from hpcdl import FAMILIES, SpecError
from hpcdl.errors import InputError
from hpcdl.workloads import recipes
from hpcdl.workloads.crosscheck import counted_flops
from hpcdl.workloads.sampling import ranges, sample_spec

# FlopCounterMode over-counts grouped-conv weight gradients (see tests/test_cnn.py, which checks
# separable blocks with that excess accounted for); the sampled cross-check leaves them out.
COUNTER_SAFE = {"cnn": {"block": ["plain", "basic", "bottleneck"]}}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_has_ranges_of_its_own_knobs(family: str) -> None:
    cls = FAMILIES[family]
    derived = {"cnn": {"blocks_per_stage"}, "attention": {"head_dim"}}.get(family, set())
    assert ranges(family) and set(ranges(family)) - derived <= set(cls.knobs())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_same_seed_same_spec_and_weights(family: str) -> None:
    a, b = sample_spec(family, 11), sample_spec(family, 11)
    assert a == b
    assert len({sample_spec(family, s) for s in range(8)}) > 1
    fixed = sample_spec(family, 3, batch_size=4)
    assert fixed.batch_size == 4 and fixed.seed == 3


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("seed", range(3))
def test_sampled_specs_count_what_pytorch_counts(family: str, seed: int) -> None:
    spec = sample_spec(family, seed, COUNTER_SAFE.get(family), batch_size=2)
    c = spec.count()
    fwd, total = counted_flops(spec, batch=1)
    assert c.forward_flops == pytest.approx(fwd, rel=0.01)
    assert c.train_flops == pytest.approx(total, rel=0.01)
    assert c.params == sum(p.numel() for p in spec.build().parameters())


def test_ranges_override_and_bad_ranges() -> None:
    spec = sample_spec("attention", 5, {"heads": [2], "head_dim": [8]})
    assert (spec.heads, spec.width) == (2, 16)
    assert sample_spec("attention", 5, width=64, heads=4).width == 64
    assert sample_spec("cnn", 2, stages=2).stages == 2
    with pytest.raises(SpecError, match="ranges.layers"):
        sample_spec("mlp", 0, {"layers": []})
    with pytest.raises(SpecError, match="family='tree'"):
        sample_spec("tree", 0)


def test_class_s_suite_has_one_workload_per_family() -> None:
    s = recipes.suite("S")
    assert s.size_class == "S" and s.version >= 1
    specs = s.specs()
    assert sorted(spec.family for spec in specs.values()) == sorted(FAMILIES)
    assert {spec.precision for spec in s.specs(precision="bf16").values()} == {"bf16"}
    assert recipes.size_classes()[0] == "S"
    with pytest.raises(InputError, match="class='XL'"):
        recipes.suite("XL")


@pytest.mark.parametrize("name", list(recipes.presets()))
def test_presets_are_valid_and_overridable(name: str) -> None:
    spec = recipes.preset(name, batch_size=3)
    assert spec.batch_size == 3 and spec.count().params > 1e6
    with pytest.raises(SpecError, match="preset"):
        recipes.preset("alexnet")
