"""`pagebench report --lengths FILE / --trace`: the Recommendation is made for that workload
and names it; without them it names the default workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagebench.analysis import analyse
from pagebench.cli import main
from pagebench.report import sections
from pagebench.results import Results
from pagebench.sim.user_workload import load
from pagebench.suite import plan, static_memory, workload_memory

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "my_requests.csv")


def section_text(results) -> str:
    return " ".join(item.text or "" for item in sections.recommendation(results).items)


def test_the_recommendation_uses_and_names_the_given_workload(tmp_path):
    # every length 100 tokens: block sizes dividing 100 waste nothing, 128 wastes 28%
    path = tmp_path / "mine.csv"
    path.write_text("request_id,prompt_tokens,output_tokens\n" + "r,60,40\n" * 50)
    results = Results()
    static_memory(results)
    workload_memory(load(str(path)))(results)
    analyse(results)
    rec = results.recommendation
    assert rec.workload == f"{path} (50 requests)"
    table = results.get("recommendation").set_index("block_size")
    assert table.loc[128, "utilisation"] == pytest.approx(100 / 128)
    assert table.loc[4, "utilisation"] == 1.0
    assert f"Workload: {path} (50 requests)" in section_text(results)


def test_without_a_workload_the_default_is_named():
    results = Results()
    static_memory(results)
    analyse(results)
    assert results.recommendation.workload.startswith("lognormal:")
    assert "Workload: lognormal:" in section_text(results)


def test_plan_adds_the_workload_step_only_when_given():
    labels = [label for label, _ in plan(False)]
    given = [label for label, _ in plan(False, load(EXAMPLE))]
    assert given == labels + [f"memory: {EXAMPLE} (500 requests)"]


def test_report_refuses_a_bad_workload_before_measuring(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,foo\n1,2\n")
    assert main(["report", "--quick", "--lengths", str(bad), "--out",
                 str(tmp_path / "r.html")]) == 2
    assert "has none of the length columns" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_each_real_trace_gets_its_own_recommendation():
    import pandas as pd

    rows = [dict(trace=t, allocator="paged", block_size=b, utilisation=u)
            for t, utils in (("short", {16: 0.99, 128: 0.60}), ("long", {16: 0.999, 128: 0.998}))
            for b, u in utils.items()]
    engine = pd.DataFrame([dict(device="cuda:0", device_name="GPU", commit="c", batch=64,
                                block_size=b, decode_tokens_per_s=tps, repeats=3,
                                decode_tokens_per_s_min=tps - 1, decode_tokens_per_s_max=tps + 1)
                           for b, tps in ((16, 90.0), (128, 100.0))])
    results = Results()
    results.add("real_traces_static", pd.DataFrame(rows), "test")
    results.add("engine_batch", engine.assign(experiment="engine_batch", model="m",
                                              dtype="bfloat16", tokens_per_s=1.0), "test")
    assert results.warnings == []
    analyse(results)
    got = results.get("recommendation_traces").set_index("trace")
    assert got.loc["short", "block_size"] == 16 and got.loc["long", "block_size"] == 128
    assert got.loc["long", "recommendation"] == "block size 128"
