"""What :func:`pagebench.analysis.analyse` adds to a :class:`~pagebench.results.Results` beside
its tables (schemas in :data:`pagebench.results.datasets.DERIVED`): the words a verdict is
written in, their tally, and the recommended block size.

The analysis writes these and the report reads them; neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

HOLDS, FAILS, WITHIN_NOISE = "holds", "does not hold", "within noise"
UNMEASURED = "not measured here"
VERDICTS = (HOLDS, FAILS, WITHIN_NOISE, UNMEASURED)
# what a claim is (the ``kind`` column of dataset ``claims``): a check of a formula or of the
# article's own script, a timing or a run, or a paper's number against a measurement of it
ARITHMETIC_KIND, MEASURED_KIND, CITATION_KIND = "arithmetic", "measured", "citation"
KINDS = (MEASURED_KIND, CITATION_KIND, ARITHMETIC_KIND)
# the section whose verdict table shows a claim (the ``section`` column of dataset ``claims``)
ARTICLE = "claims"


def tally(verdicts: Iterable[str], kinds: Iterable[str] | None = None) -> str:
    """``'23 claims: 14 hold, 1 does not hold, 2 within noise, 1 not measured here'``, then
    per kind where ``kinds`` (the ``kind`` cells, in the same order) are given: ``'measured:
    7 hold, 2 within noise; arithmetic: 8 hold'`` (measured verdicts counted apart from
    arithmetic ones)."""
    verdicts = list(verdicts)
    out = f"{len(verdicts)} claims: {counts(verdicts)}"
    if kinds is None:
        return out
    kinds = list(kinds)
    per_kind = [f"{k} {counts([v for v, c in zip(verdicts, kinds) if c == k])}"
                for k in KINDS if k in kinds]
    return out + " (" + "; ".join(per_kind) + ")" if per_kind else out


def counts(verdicts: list[str]) -> str:
    """``'3 hold, 1 does not hold'``: the verdicts that occur, in :data:`VERDICTS` order."""
    words = {HOLDS: "hold", FAILS: "do not hold", WITHIN_NOISE: "within noise",
             UNMEASURED: "not measured here"}
    n = {v: sum(c == v for c in verdicts) for v in VERDICTS}
    return ", ".join(f"{n[v]} {words[v]}" for v in VERDICTS if n[v]) or "none"


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
