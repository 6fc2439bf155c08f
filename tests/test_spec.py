"""Spec validation and conversion, across every family."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdl import FAMILIES, SpecError, spec_from_args, spec_from_dict
from hpcdl.measure.config import RunConfig


@pytest.mark.parametrize("family", list(FAMILIES))
def test_defaults_roundtrip_through_json(family: str) -> None:
    spec = FAMILIES[family]()
    again = spec_from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert again.to_dict()["family"] == family


@pytest.mark.parametrize("family", list(FAMILIES))
def test_unknown_knob_names_the_field_and_lists_valid_ones(family: str) -> None:
    with pytest.raises(SpecError) as e:
        spec_from_dict({"family": family, "no_such_knob": 1})
    msg = str(e.value)
    assert f"{family}.no_such_knob" in msg and "batch_size" in msg and "\n" not in msg


def test_unknown_family() -> None:
    with pytest.raises(SpecError, match=r"family=.nope.*allowed: .*cnn"):
        spec_from_dict({"family": "nope"})


@pytest.mark.parametrize(
    "knobs, field",
    [
        ({"batch_size": 0}, "mlp.batch_size"),
        ({"batch_size": -3}, "mlp.batch_size"),
        ({"batch_size": 2.5}, "mlp.batch_size"),
        ({"batch_size": True}, "mlp.batch_size"),
        ({"precision": "fp8"}, "mlp.precision"),
        ({"width": "wide"}, "mlp.width"),
        ({"layers": 0}, "mlp.layers"),
        ({"seed": -1}, "mlp.seed"),
    ],
)
def test_bad_values_name_field_value_and_allowed(knobs: dict, field: str) -> None:
    with pytest.raises(SpecError) as e:
        spec_from_dict({"family": "mlp", **knobs})
    assert e.value.field == field
    assert repr(next(iter(knobs.values()))) in str(e.value)


def test_command_line_words_are_typed() -> None:
    spec = spec_from_args("mlp", ["layers=3", "width=64", "precision=bf16"])
    assert (spec.layers, spec.width, spec.precision) == (3, 64, "bf16")
    with pytest.raises(SpecError, match="mlp.width='x'"):
        spec_from_args("mlp", ["width=x"])
    with pytest.raises(SpecError, match="key=value"):
        spec_from_args("mlp", ["width"])


def test_specs_are_frozen_and_replace_validates() -> None:
    spec = spec_from_dict({"family": "mlp"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.width = 3  # type: ignore[misc]
    assert spec.replace(width=8).width == 8
    with pytest.raises(SpecError, match="mlp.width"):
        spec.replace(width=0)


def test_run_config_validation() -> None:
    with pytest.raises(SpecError, match="run.data_dir"):
        RunConfig(data="hdf5")
    with pytest.raises(SpecError, match="run.optimizer"):
        RunConfig.from_dict({"optimizer": "lamb"})


@settings(max_examples=200, deadline=None)
@given(
    family=st.sampled_from(list(FAMILIES)),
    key=st.sampled_from(["batch_size", "seed", "precision"]),
    value=st.one_of(
        st.integers(-(2**64), 2**64),
        st.floats(allow_nan=True),
        st.text(max_size=5),
        st.none(),
        st.booleans(),
        st.lists(st.integers(), max_size=2),
    ),
)
def test_any_value_is_accepted_or_refused_with_a_spec_error(family: str, key: str, value: object) -> None:
    """Whatever a user writes, the answer is a valid spec or a one-line SpecError naming the knob."""
    try:
        spec = spec_from_dict({"family": family, key: value})
    except SpecError as e:
        assert e.field == f"{family}.{key}" and "\n" not in str(e)
    else:
        assert getattr(spec, key) == value
