"""The one judge of the claims: no data, a failing predicate, unjudged parts, ids."""

from __future__ import annotations

import pandas as pd

from pagebench.analysis.claims import Claim, Measured, Part, evaluate, first, judge
from pagebench.analysis.pipeline import EVERY_CLAIM
from pagebench.results import Results
from pagebench.results.derived import FAILS, HOLDS, UNMEASURED


def claim(measure, holds=lambda v: v < 2, **kwargs) -> Claim:
    return Claim("k", "a claim", "value < 2", ("data",), measure, holds, **kwargs)


def two_devices(results) -> Measured:
    return Measured([Part(1.0, "A: 1.0×", "1.0×", "A"), Part(3.0, "B: 3.0×", "3.0×", "B"),
                     Part(None, "C: 9.0× (CPU; not judged)")], note=" (note)")


def test_a_measure_without_data_gives_no_data():
    v = judge(claim(lambda results: None), Results())
    assert (v.verdict, v.measured, v.device, v.headline) == (UNMEASURED, "no data", "", "")
    row = v.to_row("claims")
    assert (row["data"], row["headline"], row["section"]) == ("data", "no data", "claims")
    assert judge(claim(lambda results: Measured([])), Results()).measured == "no data"


def test_the_predicate_judges_every_judged_part():
    v = judge(claim(two_devices), Results())
    assert v.verdict == FAILS  # B's 3.0 breaks the predicate
    assert v.measured == "A: 1.0×; B: 3.0×; C: 9.0× (CPU; not judged) (note)"
    assert v.headline == "A: 1.0×; B: 3.0×" and v.device == "A, B"  # C is shown, not judged
    assert judge(claim(two_devices, holds=lambda v: v < 5), Results()).verdict == HOLDS


def test_parts_without_a_value_are_not_measured_and_parts_can_carry_their_verdict():
    unjudged = claim(lambda r: Measured([Part(None, "never memory-bound")], "sim"))
    v = judge(unjudged, Results())
    assert (v.verdict, v.measured, v.device) == (UNMEASURED, "never memory-bound", "sim")
    marked = judge(claim(two_devices, mark_parts=True), Results())
    assert marked.measured.startswith(f"A: 1.0× ({HOLDS}); B: 3.0× ({FAILS}); C: 9.0×")


def test_a_measure_that_raises_is_a_warning_and_a_row():
    results = Results()
    v, = evaluate(results, [claim(lambda r: 1 / 0)])
    assert v.verdict == UNMEASURED and v.measured == "evaluation failed; see warnings"
    assert results.warnings == ["claims: k could not be evaluated (ZeroDivisionError: "
                                "division by zero)"]


def test_every_registered_claim_has_a_unique_id():
    ids = [c.id for c in EVERY_CLAIM]
    assert len(ids) == len(set(ids)) == 27
    assert all(c.text and c.criterion and c.data for c in EVERY_CLAIM)


def test_first_matches_every_condition_and_skips_missing_block_sizes():
    frame = pd.DataFrame({"allocator": ["naive", "paged", "paged"],
                          "block_size": pd.array([None, 8, 16], dtype="Int64"),
                          "utilisation": [0.3, 0.99, 0.98]})
    assert first(frame, "utilisation", allocator="paged", block_size=16) == 0.98
    assert first(frame, "utilisation", allocator="naive") == 0.3
    assert first(frame, "utilisation", allocator="naive", block_size=16) is None
    assert first(None, "utilisation", allocator="naive") is None
