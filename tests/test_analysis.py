"""pagebench.analysis.analyse: the derived tables, the recommendation and every verdict added to
a Results as data; and `pagebench claims`, which judges committed data without measuring."""

from __future__ import annotations

import pandas as pd
import pytest
from synthetic_report import synthetic_results

from pagebench.analysis import analyse, claims, pipeline, real_traces
from pagebench.cli import main
from pagebench.report import build
from pagebench.results import Results
from pagebench.results.datasets import DATASETS, DERIVED, VERDICT
from pagebench.results.derived import FAILS, HOLDS, UNMEASURED, WITHIN_NOISE


def test_analyse_adds_every_derived_table_the_recommendation_and_the_verdicts():
    results = synthetic_results()
    analyse(results)
    assert set(results.derived) == set(DERIVED)  # every derived table, empty where no data
    for name, frame in results.derived.items():
        assert not len(frame) or set(DERIVED[name].required) <= set(frame.columns), name
    verdicts = results.get("claims")
    assert list(verdicts.columns) == VERDICT.names
    assert list(verdicts["key"]) == [c.id for c in pipeline.EVERY_CLAIM]
    assert verdicts.groupby("section", sort=False).size().to_dict() == {
        "claims": len(claims.CLAIMS) + len(real_traces.CLAIMS), "fp8": 4, "parallel": 3}
    assert set(verdicts["kind"]) == {"arithmetic", "measured", "citation"}
    rec = results.recommendation
    table = results.get("recommendation")
    assert rec.speed_measured and rec.block_size == table.loc[table["score"].idxmax(),
                                                               "block_size"]
    assert results.frames.keys().isdisjoint(results.derived)  # datasets stay as read
    assert DATASETS.keys().isdisjoint(DERIVED)  # Results.get finds each under one name


def test_adding_data_clears_what_was_derived_from_the_old_data():
    results = synthetic_results()
    analyse(results)
    results.add("kernels", results.get("kernels").head(1), "more")
    assert results.derived == {} and results.recommendation is None
    with pytest.raises(ValueError, match="results: not analysed"):
        build.write_report(results, "unused.html", env={}, options={})


def test_a_table_or_claim_that_fails_is_a_warning_and_the_rest_is_kept(monkeypatch):
    def broken(results):
        raise KeyError("odd")
    monkeypatch.setitem(pipeline.TABLES, "fp8_decode", broken)
    bad_claim = claims.Claim("broken", "a claim", "criterion", ("kernels",), broken, bool)
    monkeypatch.setattr(pipeline, "SECTION_CLAIMS", pipeline.SECTION_CLAIMS
                        + (("fp8", (bad_claim,)),))
    results = synthetic_results()
    analyse(results)
    assert results.get("fp8_decode").empty
    assert "fp8_decode: could not be derived (KeyError: 'odd')" in results.warnings
    assert "claims: broken could not be evaluated (KeyError: 'odd')" in results.warnings
    row = results.get("claims").set_index("key").loc["broken"]
    assert (row["verdict"], row["section"]) == (UNMEASURED, "fp8")
    assert results.get("kernels_batch1_ratio").size  # the rest was derived


def test_add_derived_checks_the_name_and_the_schema():
    results = Results()
    with pytest.raises(ValueError, match="'nope' is not a derived table"):
        results.add_derived("nope", pd.DataFrame())
    with pytest.raises(ValueError, match="recommendation table: missing speed, .*score"):
        results.add_derived("recommendation", pd.DataFrame({
            "block_size": [16], "utilisation": [0.98], "relative_kernel_time": [1.0]}))
    assert results.derived == {}


# ---- pagebench claims ----------------------------------------------------------------------

def test_claims_command_judges_the_committed_data(tmp_path, capsys):
    out = tmp_path / "claims.csv"
    assert main(["claims", "--csv", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(pipeline.EVERY_CLAIM) + 1
    assert lines[-1].startswith(f"{len(pipeline.EVERY_CLAIM)} claims: ")
    assert "(measured " in lines[-1] and "arithmetic " in lines[-1]  # counted apart
    verdicts = pd.read_csv(out)
    assert list(verdicts.columns) == VERDICT.names
    # committed GPU data judges the kernel and tensor-parallel claims (which way is the data's:
    # at batch 1 the same kernel paged and contiguous overlap within their q20-q80 at most
    # points of the H200 sweep); the simulators, which this command does not run, leave the
    # memory claims unjudged
    by_key = verdicts.set_index("key")
    assert by_key.loc["batch1_slower", "verdict"] in (HOLDS, FAILS, WITHIN_NOISE)
    assert by_key.loc["tp_kv_capacity", "verdict"] == HOLDS
    assert by_key.loc["naive_utilisation", "verdict"] == UNMEASURED
    for line, v in zip(lines, verdicts.itertuples()):
        assert line.split()[0] == v.key and v.verdict in line and v.headline in line


def test_claims_command_reads_results_directories(tmp_path, capsys):
    data = tmp_path / "run" / "gpu"
    data.mkdir(parents=True)
    results = synthetic_results(paged_ratio={1: 0.9, 16: 0.95})
    results.get("kernels").drop(columns=["machine", "source"]).to_csv(data / "kernels.csv",
                                                                      index=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["claims", "--data-dir", str(empty), "--results", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("batch1_slower "))
    assert FAILS in line and "Synthetic GPU" in line  # paged faster than contiguous
    assert HOLDS not in line


def test_claims_command_rejects_a_missing_directory(tmp_path, capsys):
    assert main(["claims", "--results", str(tmp_path / "nope")]) == 2
    assert "--results" in capsys.readouterr().err


def test_claims_command_runs_the_report_simulators_when_asked(monkeypatch, capsys):
    from pagebench import suite

    asked = []

    def capacity_only(run_sweeps):  # the capacity planner alone: the whole plan takes ~15 s
        asked.append(run_sweeps)
        return [("capacity planner", suite.capacity)]
    monkeypatch.setattr(suite, "plan", capacity_only)
    def about_250(argv) -> str:
        assert main(argv) == 0
        return next(x for x in capsys.readouterr().out.splitlines() if x.startswith("about_250"))
    assert UNMEASURED in about_250(["claims"]) and asked == []
    line = about_250(["claims", "--simulate"])
    assert HOLDS in line and "246 requests" in line and asked == [False]
