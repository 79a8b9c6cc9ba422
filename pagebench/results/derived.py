"""What :func:`pagebench.analysis.analyse` adds to a :class:`~pagebench.results.Results` beside
its tables (schemas in :data:`pagebench.results.datasets.DERIVED`): the words a verdict is
written in, their tally, and the recommended block size.

The analysis writes these and the report reads them; neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

HOLDS, FAILS, UNMEASURED = "holds", "does not hold", "not measured here"
VERDICTS = (HOLDS, FAILS, UNMEASURED)
# the section whose verdict table shows a claim (the ``section`` column of dataset ``claims``)
ARTICLE = "claims"


def tally(verdicts: Iterable[str]) -> str:
    """``'16 claims: 14 hold, 1 do not hold, 1 not measured here'`` of the ``verdict`` cells."""
    verdicts = list(verdicts)
    n = {v: sum(c == v for c in verdicts) for v in VERDICTS}
    return (f"{len(verdicts)} claims: {n[HOLDS]} hold, {n[FAILS]} do not hold, "
            f"{n[UNMEASURED]} not measured here")


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The block size that maximises utilisation / relative kernel time (its score table is the
    derived dataset ``recommendation``)."""

    block_size: int
    utilisation: float
    relative_kernel_time: float
    score: float
    within_2pct: tuple[int, ...]  # block sizes whose score is within 2% of the best
    kernel_device: str | None  # the device whose kernel curve was used; None: no kernel data
    kernel_measured: bool
