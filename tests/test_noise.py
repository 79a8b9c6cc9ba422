"""Noise bands: a ratio's band, and the three outcomes against a bound."""

from __future__ import annotations

import pytest

from pagebench.analysis.noise import NO_SPREAD, Band, against, combine, inside
from pagebench.results.derived import FAILS, HOLDS, WITHIN_NOISE


def test_a_ratio_spans_the_extremes_of_its_two_bands():
    r = Band(110.0, 105.0, 120.0) / Band(100.0, 95.0, 105.0)
    assert r.value == pytest.approx(1.1)
    assert (r.lo, r.hi) == (pytest.approx(105 / 105), pytest.approx(120 / 95))
    assert r.recorded


def test_a_value_without_a_spread_gets_the_assumed_band_and_says_so():
    b = Band.of(100.0, None, float("nan"))
    assert (b.lo, b.hi, b.recorded) == (100 * (1 - NO_SPREAD), 100 * (1 + NO_SPREAD), False)
    assert "assumed" in b.text() and not (b / Band.of(1.0, 0.9, 1.1)).recorded
    assert Band.of(2.0, 2.5, 1.5) == Band(2.0, 1.5, 2.5)  # quantiles in either order


@pytest.mark.parametrize("band, above, outcome", [
    (Band(1.1, 1.05, 1.2), True, HOLDS), (Band(0.9, 0.8, 0.95), True, FAILS),
    (Band(1.0, 0.98, 1.03), True, WITHIN_NOISE), (Band(0.9, 0.8, 0.95), False, HOLDS),
    (Band(1.1, 1.05, 1.2), False, FAILS), (Band(1.0, 0.98, 1.03), False, WITHIN_NOISE)])
def test_against_gives_three_outcomes(band, above, outcome):
    assert against(band, 1.0, above) == outcome


def test_inside_a_range_and_combining_outcomes():
    assert inside(Band(1.1, 1.05, 1.2), 1.0, 1.3) == HOLDS
    assert inside(Band(1.5, 1.4, 1.6), 1.0, 1.3) == FAILS
    assert inside(Band(1.3, 1.25, 1.35), 1.0, 1.3) == WITHIN_NOISE
    assert inside(Band(1.0, 0.97, 1.02), 1.0, 1.3) == WITHIN_NOISE
    assert combine([HOLDS, WITHIN_NOISE]) == WITHIN_NOISE
    assert combine([WITHIN_NOISE, FAILS, HOLDS]) == FAILS
    assert combine([HOLDS, HOLDS]) == HOLDS
