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
    """The block size with the best KV utilisation x relative decode speed on a workload, the
    block sizes it does not beat outside the noise, and the data behind both (its score table
    is the derived dataset ``recommendation``; :mod:`pagebench.analysis.advice`)."""

    block_size: int
    utilisation: float  # on ``workload``
    tied: tuple[int, ...]  # block sizes whose score interval reaches the best's (it included)
    basis: str  # the speed data: device, commit, batch, repeats; or why there is none
    workload: str  # the lengths the utilisation was computed on
    speed_measured: bool
    excluded: tuple[int, ...] = ()  # block sizes a backend constraint ruled out
    constraint: str | None = None  # that constraint in words

    @property
    def no_winner(self) -> bool:
        return len(self.tied) > 1

    def words(self) -> str:
        """``block size 16``, or ``no winner within noise: blocks 16–128 (these tie: 16, 128;
        best median 16)``."""
        if not self.no_winner:
            return f"block size {self.block_size}"
        return (f"no winner within noise: blocks {self.tied[0]}–{self.tied[-1]} "
                f"(these tie: {', '.join(map(str, self.tied))}; best median {self.block_size})")
