"""Noise bands: a measured value with the spread its repeats showed, and the three-way test
every comparison criterion applies to it.

A :class:`Band` is a value and the interval its repeats span: the min–max of interleaved
repeats (``tokens_per_s_min`` / ``_max``), or the quantiles a timing row carries (``q20_us`` /
``q80_us``). A ratio of two bands spans the extremes (numerator low over denominator high, and
the reverse). :func:`against` places a band against a bound: the whole band on the claimed
side is ``holds``, the whole band on the other side ``does not hold``, a band across the bound
``within noise``. A row with no recorded spread gets ±:data:`NO_SPREAD` around its value, and
the details say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagebench.results.derived import FAILS, HOLDS, WITHIN_NOISE

# the relative half-width given a value whose rows record no spread (one run): the 90th
# percentile of the committed H200 kernel rows' (q80 - q20) / median at batch >= 4 is ~5-9%
NO_SPREAD = 0.05


@dataclass(frozen=True, slots=True)
class Band:
    value: float
    lo: float
    hi: float
    recorded: bool = True  # False: ±NO_SPREAD assumed, the rows had no spread

    @classmethod
    def point(cls, value: float) -> Band:
        """A value measured once: ±:data:`NO_SPREAD` around it."""
        value = float(value)
        return cls(value, value * (1 - NO_SPREAD), value * (1 + NO_SPREAD), recorded=False)

    @classmethod
    def of(cls, value, lo=None, hi=None) -> Band:
        """``value`` within ``lo``–``hi`` where both are numbers, else :meth:`point`."""
        if lo is None or hi is None or lo != lo or hi != hi:
            return cls.point(value)
        lo, hi = float(lo), float(hi)
        return cls(float(value), min(lo, hi, float(value)), max(lo, hi, float(value)))

    def __truediv__(self, other: Band) -> Band:
        return Band(self.value / other.value, self.lo / other.hi, self.hi / other.lo,
                    self.recorded and other.recorded)

    def scaled(self, factor: float) -> Band:
        return Band(self.value * factor, self.lo * factor, self.hi * factor, self.recorded)

    def text(self, digits: int = 2, unit: str = "×") -> str:
        """``1.02× (0.98–1.05)``; ``(±5% assumed)`` where no spread was recorded."""
        f = f"{{:.{digits}f}}"
        return (f"{f.format(self.value)}{unit} ({f.format(self.lo)}–{f.format(self.hi)}"
                + ("" if self.recorded else f", ±{100 * NO_SPREAD:.0f}% assumed") + ")")


def against(band: Band, bound: float, above: bool) -> str:
    """``band`` against "value > bound" (``above``) or "value < bound": holds when the whole
    band is on that side, does not hold when the whole band is on the other, else within
    noise."""
    lo, hi = (band.lo, band.hi) if above else (-band.hi, -band.lo)
    bound = bound if above else -bound
    if lo > bound:
        return HOLDS
    if hi <= bound:
        return FAILS
    return WITHIN_NOISE


def inside(band: Band, low: float, high: float) -> str:
    """``band`` against "low < value <= high": holds when the whole band is inside, does not
    hold when the whole band is outside on one side, else within noise."""
    return combine([against(band, low, above=True), against(band, high, above=False)
                    if band.hi > high else HOLDS])


def combine(outcomes) -> str:
    """One verdict from several: does not hold if any does not, else within noise if any is,
    else holds."""
    outcomes = list(outcomes)
    if FAILS in outcomes:
        return FAILS
    return WITHIN_NOISE if WITHIN_NOISE in outcomes else HOLDS
