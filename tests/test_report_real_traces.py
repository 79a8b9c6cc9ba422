"""The report's Real traces part: frames from the shipped traces, section, claims rows."""

from __future__ import annotations

import pytest

from pagebench.analysis import real_traces as trace_claims
from pagebench.analysis.claims import evaluate
from pagebench.report import real_traces, serving
from pagebench.results import Results
from pagebench.results.derived import FAILS, HOLDS, UNMEASURED
from pagebench.sim.real_load import real_budget_tokens
from pagebench.sim.real_traces import STUDY_TRACES, study_traces


@pytest.mark.slow
def test_quick_sweep_section_and_claims():
    results = Results()
    for kind, frame in study_traces(300, prefix_budget_multiples=(1.0, 0.25)).items():
        results.add(f"real_traces_{kind}", frame, "test")
    static = results.get("real_traces_static")
    assert set(static["trace"]) == set(STUDY_TRACES)
    assert (static[static["allocator"] == "oracle"]["utilisation"] == 1.0).all()
    dynamic = results.get("real_traces_dynamic")
    assert set(dynamic["label"]) == {"naive", "pow2", "oracle", "paged-16", "paged-128"}
    assert (dynamic["num_requests"] == 300).all()
    assert (dynamic["budget_tokens"] == real_budget_tokens()).all()
    goodput = results.get("real_traces_goodput")
    assert set(goodput["allocator"]) == {"paged", "naive"}
    assert set(goodput["trace"]) == set(STUDY_TRACES)
    prefix = results.get("real_traces_prefix")
    assert set(prefix["trace"]) == {"mooncake-conv"} and prefix["unlimited"].sum() == 1
    unlimited = prefix[prefix["unlimited"]]["prefix_cache_hit_rate"].iloc[0]
    assert (prefix["prefix_cache_hit_rate"] <= unlimited + 1e-12).all() and unlimited > 0.05
    section = real_traces.section(results)
    assert len(section.plots) == 5  # utilisation bars, 3 memory timelines, hit rate
    tables = [i.table for i in serving.section(results).items if i.kind == "table"]
    [table] = [t for t in tables if "Goodput at equal KV memory" in t.caption]
    assert len(table.rows) == len(goodput)
    rows = evaluate(results, trace_claims.CLAIMS)
    assert [c.key for c in rows] == ["real_traces_static", "real_traces_dynamic",
                                     "throughput_equal_memory"]
    assert all(c.verdict in (HOLDS, FAILS) and "mooncake-conv" in c.measured for c in rows)
    assert "SLOs: TTFT ≤ 1000 ms" in rows[-1].measured


def test_section_and_claims_without_data():
    results = Results()
    section = real_traces.section(results)
    assert [i.kind for i in section.items] == ["nodata"]
    assert all(c.verdict == UNMEASURED for c in evaluate(results, trace_claims.CLAIMS))
