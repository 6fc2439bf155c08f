"""The validation set (``hpcdl/scaling/validation.py``): its size, its fixed split, and the bands
``hpcdl.scaling.band`` keeps, recomputed from it (analytic: nothing runs)."""

from __future__ import annotations

import pytest

from hpcdl.scaling import band, validation


def test_the_set_has_thirty_sourced_points_and_a_split_by_rule() -> None:
    points = validation.judged()
    assert len(points) >= 30
    assert all(j.point.source and j.point.assumed for j in points)
    judged = [j for j in points if j.point.split == validation.JUDGE]
    for regime in validation.REGIMES:
        assert sum(j.point.regime == regime for j in judged) >= 4, regime


def test_the_bands_kept_are_the_sets_and_cover_the_judged_points() -> None:
    points = validation.judged()
    bands = validation.bands(points)
    assert bands == pytest.approx(band.BANDS, abs=0.0006)
    assert validation.largest_ranks(points) == band.LARGEST_RANKS
    judged = [j for j in points if j.point.split == validation.JUDGE]
    covered = sum(abs(j.error) <= bands[j.point.regime] for j in judged)
    assert covered >= 0.9 * len(judged)


def test_a_band_widens_beyond_the_validated_scale() -> None:
    inside, beyond = band.band_of(512, 8, False), band.band_of(4096, 8, False)
    assert not inside.extrapolated and beyond.extrapolated
    assert beyond.half_width == pytest.approx(2 * inside.half_width)
    assert band.band_of(1, 8, False).half_width == 0.0
