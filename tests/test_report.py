"""pagebench report: data collection, claims, sections, escaping, atomic writes, the CLI."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest
from synthetic_report import synthetic_results

from pagebench.cli import main
from pagebench import suite
from pagebench.analysis import advice, analyse, claims, derive
from pagebench.report import build, render, sections
from pagebench.results import DataError, Results, classify, load_data_dir, read_table
from pagebench.results.collect import guarded
from pagebench.results.datasets import KERNELS
from pagebench.results.derived import FAILS, HOLDS, UNMEASURED, WITHIN_NOISE
from pagebench.results.history import load_benchmark_json


def by_key(results: Results) -> dict:
    return {c.key: c for c in claims.evaluate(results)}


def analysed(results: Results) -> Results:
    analyse(results)
    return results


def write_page(results: Results, tmp_path: Path) -> str:
    analyse(results)
    out = build.write_report(results, tmp_path / "index.html", env={"device": "cpu"},
                             options={})
    return out.read_text(encoding="utf-8")


# ---- collection ----------------------------------------------------------------------------

def test_read_table_names_missing_and_malformed_files(tmp_path):
    with pytest.raises(DataError, match="nope.csv: file not found"):
        read_table(tmp_path / "nope.csv")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="bad.json: cannot parse"):
        read_table(bad)
    cols = tmp_path / "kernels.csv"
    cols.write_text("device,batch\ncpu,1\n")
    with pytest.raises(DataError, match="missing column.*time_us"):
        read_table(cols, KERNELS.required)
    with pytest.raises(DataError, match="unsupported format"):
        read_table(_touch(tmp_path / "x.pkl"))


def _touch(path: Path) -> Path:
    path.write_text("x")
    return path


def test_read_table_json_forms(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"n": 1}, {"n": 4}]))
    (tmp_path / "b.json").write_text(json.dumps({"results": [{"n": 1}]}))
    (tmp_path / "c.jsonl").write_text('{"n": 1}\n{"n": 2}\n')
    assert read_table(tmp_path / "a.json")["n"].tolist() == [1, 4]
    assert read_table(tmp_path / "b.json")["n"].tolist() == [1]
    assert read_table(tmp_path / "c.jsonl")["n"].tolist() == [1, 2]


def test_data_dir_classifies_files_and_warns_on_bad_ones(tmp_path):
    gpu = tmp_path / "h200"
    gpu.mkdir()
    kernels = synthetic_results().get("kernels").drop(columns=["machine", "source"])
    kernels.to_csv(gpu / "kernels.csv", index=False)
    pd.DataFrame({"n": [1, 4], "variant": ["n=1", "n=4 shared"], "peak_blocks": [10, 13]}).to_csv(gpu / "engine_cow.csv",
                                                                index=False)
    (gpu / "engine_pool.csv").write_text("")  # empty: malformed
    (gpu / "notes.csv").write_text("a\n1\n")  # not a known kind: ignored
    results = Results()
    load_data_dir(results, tmp_path)
    assert set(results.frames) == {"kernels", "engine_cow"}
    assert (results.get("kernels")["machine"] == "Synthetic GPU").all()  # the device label
    assert any("engine_pool" in w and "engine_pool.csv" in w for w in results.warnings)


def test_asv_and_pytest_benchmark_json_become_tidy_rows(tmp_path):
    machine = tmp_path / "asv" / "box"
    machine.mkdir(parents=True)
    (tmp_path / "asv" / "benchmarks.json").write_text(json.dumps(
        {"attention.T.time_decode": {"unit": "seconds"}}))
    (machine / "machine.json").write_text("{}")
    (machine / "abc-env.json").write_text(json.dumps({
        "commit_hash": "abcdef123456", "date": 1, "params": {"machine": "box"},
        "result_columns": ["result", "params"], "version": 2,
        "results": {"attention.T.time_decode": [[1e-5, None, 3e-5, 4e-5],
                                                [["1", "16"], ["'a'", "'b'"]]]}}))
    (tmp_path / "pb.json").write_text(json.dumps({
        "machine_info": {"node": "n"}, "commit_info": {"id": "ffff"}, "datetime": "d",
        "benchmarks": [{"name": "test_x", "fullname": "t::test_x",
                        "stats": {"median": 2e-6, "iqr": 1e-7, "rounds": 9}}]}))
    results = Results()
    load_benchmark_json(results, [tmp_path])
    asv = results.get("asv")
    assert len(asv) == 3  # the None (failed) combination is dropped
    assert asv["params"].tolist() == ["1, 'a'", "16, 'a'", "16, 'b'"]
    assert asv["unit"].unique().tolist() == ["seconds"] and asv["commit"][0] == "abcdef1234"
    assert results.get("pytest_benchmark")["median_us"].tolist() == pytest.approx([2.0])


def test_a_failing_source_becomes_a_named_warning():
    results = Results()
    guarded(results, "kernels: quick sweep", lambda: 1 / 0)
    guarded(results, "engine", lambda: __import__("pagebench.nonexistent_module"))
    assert results.warnings[0].startswith("kernels: quick sweep: failed (ZeroDivisionError")
    assert results.warnings[1].startswith("engine: not available")


def test_static_sweep_reproduces_the_article():
    results = Results()
    suite.static_memory(results)
    c = by_key(results)
    for key in ("naive_utilisation", "paged_near_oracle", "block_size_sweep"):
        assert c[key].verdict == HOLDS, c[key]
    assert "8.9%" in c["naive_utilisation"].measured and "1.1%" in c["naive_utilisation"].measured


def test_block_manager_waste_stays_within_the_bound():
    results = Results()
    suite.block_waste(results, quick=True)
    waste = results.get("block_waste")
    assert (waste["max_waste_slots"] <= waste["block_size"] - 1).all()
    assert by_key(results)["worst_case_waste"].verdict == HOLDS


# ---- claims --------------------------------------------------------------------------------

def test_claims_on_synthetic_data():
    c = by_key(synthetic_results())
    assert c["batch1_slower"].verdict == HOLDS
    assert c["batching_beats_gather"].verdict == HOLDS
    assert c["block16_sweet_spot"].verdict == HOLDS
    assert c["cow_n4"].verdict == HOLDS and "1.30×" in c["cow_n4"].measured
    assert c["prefix_caching"].verdict == HOLDS
    assert c["preemption_signal"].verdict == HOLDS
    assert c["prior_systems"].verdict == HOLDS and c["paging_96"].verdict == HOLDS
    assert c["capacity_2_4x"].verdict == HOLDS
    assert c["memory_buys_throughput"].verdict == HOLDS
    assert "engine / padded generate 3.4×" in c["memory_buys_throughput"].measured
    assert "the batch's share" in c["memory_buys_throughput"].measured
    assert c["about_250"].verdict == HOLDS
    assert all(c[k].device for k in c if c[k].verdict != UNMEASURED)


def test_contradicted_claims_say_so_plainly():
    # paged faster than contiguous at batch 1; n = 4 takes 4.5x the blocks of n = 1
    results = synthetic_results(paged_ratio={1: 0.9, 16: 0.95}, cow_ratio=4.5)
    c = by_key(results)
    assert c["batch1_slower"].verdict == FAILS
    assert "0.95–0.95× over 3 points" in c["batch1_slower"].measured
    assert c["cow_n4"].verdict == FAILS and "4.50×" in c["cow_n4"].measured
    analyse(results)
    table = sections.claims_section(results).items[-1].table
    verdicts = [row[4] for row in table.rows]  # claim, kind, measured, device, verdict
    assert FAILS in verdicts


def test_equal_memory_pairs_the_engine_with_generate_in_one_kv_budget():
    """In a small budget the engine runs fewer sequences, in a large one no more tokens/s than
    its control: each budget fails; the best sequences of one with the best tokens/s of the
    other must not."""
    results = synthetic_results()
    results.frames["engine_equal_memory"] = pd.DataFrame({
        "method": ["engine", "padded_generate", "engine_contiguous_batch"] * 2,
        "kv_bytes": [2**27] * 3 + [2**30] * 3, "concurrent_seqs": [10, 20, 20, 500, 100, 100],
        "tokens_per_s": [5000.0, 100.0, 200.0, 100.0, 4000.0, 4500.0],
        "tokens_per_s_min": [4900.0, 90.0, 190.0, 95.0, 3900.0, 4400.0],
        "tokens_per_s_max": [5100.0, 110.0, 210.0, 105.0, 4100.0, 4600.0],
        "machine": "Synthetic GPU"})
    c = by_key(results)["memory_buys_throughput"]
    assert c.verdict == FAILS and c.device == "Synthetic GPU"
    assert "10 vs 20 sequences at once in 128 MiB" in c.measured
    assert "500 vs 100 sequences at once in 1,024 MiB" in c.measured


def test_equal_memory_is_within_noise_or_unjudged_without_a_clear_control():
    """Overlapping min–max of the engine and its control: within noise; no control rows (an
    older run): shown, not judged."""
    results = synthetic_results()
    frame = results.get("engine_equal_memory")
    control = frame["method"] == "engine_contiguous_batch"
    frame.loc[control, ["tokens_per_s", "tokens_per_s_min", "tokens_per_s_max"]] = \
        [3050.0, 2950.0, 3120.0]
    c = by_key(results)["memory_buys_throughput"]
    assert c.verdict == WITHIN_NOISE and "1.02× (0.96–1.07)" in c.measured
    results.frames["engine_equal_memory"] = frame[~control].drop(
        columns=["tokens_per_s_min", "tokens_per_s_max"])
    c = by_key(results)["memory_buys_throughput"]
    assert c.verdict == UNMEASURED and "no equal-concurrency control" in c.measured
    assert "±5% assumed" in c.measured


def test_cow_compares_n4_with_n1_of_the_same_block_size():
    """Block 128, where n = 4 takes 4.67× the blocks, is not averaged away by block 16."""
    results = synthetic_results()
    results.frames["engine_cow"] = pd.DataFrame({
        "variant": ["n=1", "n=4 shared"] * 2, "n": [1, 4] * 2, "block_size": [16, 16, 128, 128],
        "peak_blocks": [34, 40, 3, 14], "machine": "Synthetic GPU"})
    c = by_key(results)["cow_n4"]
    assert c.verdict == FAILS and c.device == "Synthetic GPU"
    assert "(block size 16): peak blocks n=4 / n=1 = 1.18× (40 vs 34) (holds)" in c.measured
    assert "(block size 128): peak blocks n=4 / n=1 = 4.67× (14 vs 3) (does not hold)" \
        in c.measured


def test_engine_claims_judge_each_run_of_a_machine():
    """Two runs on one machine, one of which fails each claim: pooled, the other run's rows
    made them hold (a pool sweep that never preempts beside one that does; a block size
    whose prefix cache never hits beside one where it does; the batch-1 rate of one run
    under the largest batch's rate of another)."""
    results = synthetic_results()
    results.frames["engine_pool"] = pd.DataFrame({
        "num_blocks": [10, 50, 20, 40], "num_preemptions": [5, 0, 0, 0],
        "recomputed_tokens": [100, 0, 0, 0], "tokens_per_s": 1.0,
        "commit": ["aaaaaaa"] * 2 + ["bbbbbbb"] * 2, "machine": "Synthetic GPU"})
    results.frames["engine_prefix"] = pd.DataFrame({
        "enable_prefix_caching": [True, False] * 2, "prefix_cache_hit_rate": [0.5, 0, 0, 0],
        "num_computed_prompt_tokens": [100, 400, 400, 400], "block_size": [16, 16, 128, 128],
        "machine": "Synthetic GPU"})
    results.frames["engine_batch"] = pd.DataFrame({
        "batch": [1, 16] * 2, "tokens_per_s": [10.0, 15.0, 5.0, 200.0], "block_size": 16,
        "model": ["small", "small", "large", "large"], "machine": "Synthetic GPU"})
    c = by_key(results)
    for key in ("preemption_signal", "prefix_caching", "batching_beats_gather"):
        assert c[key].verdict == FAILS and c[key].device == "Synthetic GPU", key
    assert "0 preemptions at 20 blocks, 0 at 40" in c["preemption_signal"].measured
    assert "batch 1→16 gives 1.5× (1.4–1.7, ±5% assumed) tokens/s" in \
        c["batching_beats_gather"].measured


def test_block16_sweet_spot_fails_when_block_16_is_slow():
    results = synthetic_results(paged_ratio={1: 1.1, 16: 2.0, 128: 1.0})
    assert by_key(results)["block16_sweet_spot"].verdict == FAILS


def test_prior_systems_judges_the_three_baselines_from_data():
    results = synthetic_results()
    c = by_key(results)["prior_systems"]
    assert c.verdict == HOLDS and c.headline == "article workload: max/pow2/oracle 25.0/32.0/38.0%"
    summary = results.get("memory_dynamic_summary")
    summary.loc[summary["allocator"] == "oracle", "token_state_fraction_saturated"] = 0.558
    c = by_key(results)["prior_systems"]
    assert c.verdict == FAILS and "oracle 55.8% (oracle outside 20–40%)" in c.measured


def test_prior_systems_judges_each_real_trace_and_names_its_sample():
    results = synthetic_results()
    results.add("real_traces_dynamic", pd.DataFrame([
        {"trace": "azure-code", "label": a, "allocator": a, "block_size": None,
         "token_state_fraction": x, "token_state_fraction_saturated": x, "num_preemptions": 0,
         "num_requests": 2000, "source": "azure-code (first 2,000 requests)"}
        for a, x in (("naive", 0.197), ("pow2", 0.487), ("oracle", 0.66))]), "synthetic")
    c = by_key(results)["prior_systems"]
    assert c.verdict == FAILS
    assert "azure-code (first 2,000 requests): reserve-max 19.7%, pow2 48.7%, oracle 66.0% " \
        "(reserve-max, pow2, oracle outside 20–40%) (does not hold)" in c.measured
    assert "article workload: reserve-max 25.0%, pow2 32.0%, oracle 38.0% (holds)" in c.measured


def test_prior_systems_leaves_out_a_workload_whose_baseline_never_waited_for_memory():
    results = synthetic_results()
    summary = results.get("memory_dynamic_summary")
    summary.loc[summary["allocator"] == "pow2", "token_state_fraction_saturated"] = float("nan")
    c = by_key(results)["prior_systems"]
    assert c.verdict == UNMEASURED and "nan" not in c.measured
    assert "not every baseline became memory-bound" in c.measured


def test_handles_sixty_is_judged_against_the_simulated_naive_concurrency():
    results = synthetic_results()
    c = by_key(results)["handles_sixty"]
    assert c.verdict == FAILS and c.kind == "citation" and "4 mean / 5 peak" in c.headline
    summary = results.get("memory_dynamic_summary")
    summary.loc[summary["allocator"] == "naive", "mean_concurrency"] = 58.0
    assert by_key(results)["handles_sixty"].verdict == HOLDS


def test_dynamic_claims_read_the_article_reference_run_only():
    """A time-stepped run of another workload or budget (``pagebench simulate --dynamic
    --trace ...``) is neither judged as the article's nor printed beside it."""
    other = pd.DataFrame([{"label": a, "allocator": a, "block_size": bs, "budget_tokens": 16384,
                           "token_state_fraction_saturated": x, "token_state_fraction": x,
                           "mean_concurrency": c, "num_preemptions": 0}
                          for a, bs, x, c in (("naive", None, 0.05, 2.0), ("pow2", None, 0.45, 3.0),
                                              ("paged", 16, 0.5, 30.0))])
    alone = Results()
    alone.add("memory_dynamic_summary", other, "my_runs/dynamic_small.csv")
    assert not alone.warnings
    c = by_key(alone)
    assert {c[k].verdict for k in ("prior_systems", "paging_96", "capacity_2_4x")} == {UNMEASURED}
    both = synthetic_results()
    both.add("memory_dynamic_summary", other, "my_runs/dynamic_small.csv")
    c = by_key(both)
    assert c["prior_systems"].verdict == HOLDS and c["paging_96"].verdict == HOLDS
    assert "reserve-max 25.0%, pow2 32.0%" in c["prior_systems"].measured  # not the other's
    assert "3.0×" in c["capacity_2_4x"].measured  # 12 / 4, not 30 / 2


def test_every_claim_is_unmeasured_without_data():
    c = claims.evaluate(Results())
    assert len(c) >= 15
    data_free = {"qwen_kv_bytes"}  # none: even geometry comes from a dataset
    assert all(x.verdict == UNMEASURED for x in c if x.key not in data_free)
    assert all(x.measured == "no data" for x in c)


# ---- derived curves and the recommendation -------------------------------------------------

def test_batch1_ratio_pairs_paged_with_contiguous():
    ratio = derive.batch1_ratio(synthetic_results().get("kernels"))
    r16 = ratio[(ratio["block_size"] == 16) & (ratio["context"] == 4096)]
    assert r16["ratio"].iloc[0] == pytest.approx(1.08)
    assert r16["paged_backend"].iloc[0] == "triton-paged"


def test_batch1_ratio_pairs_rows_of_one_run_and_one_cache_dtype():
    """Two rounds of the sweep (two commits) each fail batch1_slower: paired across rounds
    (one round's fast contiguous over the other's fast paged) they must not hold; nor does an
    fp8-cache round's paged time over a bf16 baseline count as paging's cost."""
    def kernel_rows(ratio: float) -> pd.DataFrame:
        return synthetic_results(paged_ratio={16: ratio}).get("kernels")
    a = kernel_rows(1.4).assign(commit="aaaaaaa")
    b = kernel_rows(0.95).assign(commit="bbbbbbb")
    b["time_us"] *= 1.2  # pooled: b's paged (1.14× a's baseline) over a's baseline "holds"
    ratio = derive.batch1_ratio(pd.concat([a, b], ignore_index=True))
    assert sorted(ratio["ratio"].round(2).unique()) == [0.95, 1.4]
    results = Results()
    results.add("kernels", pd.concat([a, b], ignore_index=True), "two rounds")
    assert by_key(results)["batch1_slower"].verdict == FAILS
    fp8 = kernel_rows(0.6).assign(commit="ccccccc")
    fp8.loc[fp8["layout"] == "paged", "kv_dtype"] = "float8_e4m3fn"
    ratio = derive.batch1_ratio(pd.concat([kernel_rows(1.1), fp8], ignore_index=True))
    assert set(ratio["ratio"].round(2)) == {1.1}


def two_commits(older_speedup: float = 2.0) -> pd.DataFrame:
    """The synthetic sweep at two commits of known dates: the older one ``older_speedup``×
    faster, as before a regression."""
    kernels = synthetic_results().get("kernels")
    old = kernels.assign(commit="aaaaaaa", time_us=kernels["time_us"] / older_speedup,
                         gbps=kernels["gbps"] * older_speedup, timestamp=utc_seconds(1))
    return pd.concat([old, kernels.assign(commit="bbbbbbb", timestamp=utc_seconds(2))],
                     ignore_index=True)


def utc_seconds(n: int) -> str:
    return f"1970-01-01T00:00:{n:02d}+00:00"


def test_throughput_and_bandwidth_show_the_newest_commit_not_the_fastest():
    kernels = two_commits()
    def fastest(rows: pd.DataFrame) -> pd.Series:
        return rows.fillna({"block_size": 0}).groupby(["backend", "block_size", "batch"])[
            "time_us"].min()

    newer = fastest(derive.kernel_rows(kernels).query("commit == 'bbbbbbb' and context == 4096"))
    for table in (derive.throughput(kernels), derive.bandwidth(kernels)):
        assert set(table["commit"]) == {"bbbbbbb"} and len(table) > 0
        shown = fastest(table)
        pd.testing.assert_series_equal(shown, newer.reindex(shown.index))
    tput = derive.throughput(kernels)
    assert (tput["tokens_per_s"] == tput["batch"] / tput["time_us"] * 1e6).all()
    # with the dates the other way round the other commit is shown
    kernels.loc[kernels["commit"] == "aaaaaaa", "timestamp"] = utc_seconds(3)
    assert set(derive.throughput(kernels)["commit"]) == {"aaaaaaa"}


def test_throughput_takes_the_newest_commit_that_swept_batch():
    """A newer commit that re-timed batch 1 alone leaves the curve to the older sweep, and
    the older sweep is shown whole, not patched with the newer batch-1 rows."""
    kernels = two_commits(older_speedup=0.5)  # the newer is the faster here
    kernels = kernels[(kernels["commit"] == "aaaaaaa") | (kernels["batch"] == 1)]
    tput = derive.throughput(kernels)
    assert set(tput["commit"]) == {"aaaaaaa"} and set(tput["batch"]) == {1, 8, 64}


def test_block_cost_and_prefill_summary_read_the_newest_commit():
    """A block-size cost or a prefill point summarised over two commits would blend an older
    kernel's times with the newer one's: each comes from the newest commit alone."""
    kernels = two_commits()
    slow_16 = kernels["block_size"].eq(16) & kernels["commit"].eq("aaaaaaa")
    kernels.loc[slow_16, "time_us"] *= 3  # only the older commit's block 16 is slow
    cost = derive.kernel_cost_per_block(kernels)
    newer = derive.kernel_cost_per_block(kernels[kernels["commit"] == "bbbbbbb"])
    assert set(cost["commit"]) == {"bbbbbbb"}
    pd.testing.assert_frame_equal(cost, newer)
    results = Results()
    results.add("kernels", kernels, "two rounds")
    results.add("memory_static", synthetic_results().get("memory_static"), "synthetic")
    assert by_key(results)["block16_sweet_spot"].verdict == HOLDS  # not the older 3x
    point = {"device": "cuda", "device_name": "GPU", "model_shape": "m", "batch": 1,
             "query_len": 512, "cached": 0, "cuda_graphs": True, "machine": "gpu"}
    prefill = pd.DataFrame([
        dict(point, backend=b, commit=c, time_us=t)
        for b, c, t in (("sdpa-contiguous", "aaaaaaa", 10.0), ("triton-paged", "aaaaaaa", 30.0),
                        ("sdpa-contiguous", "bbbbbbb", 10.0), ("triton-paged", "bbbbbbb", 12.0))])
    summary = derive.prefill_summary(prefill)
    assert summary["commit"].tolist() == ["bbbbbbb"]
    assert summary["triton / sdpa (graph)"].tolist() == pytest.approx([1.2])  # not the median 2.1


def test_batch1_slower_judges_each_run_and_names_it():
    def run(ratio: float, commit: str) -> pd.DataFrame:
        return synthetic_results(paged_ratio={16: ratio}).get("kernels").assign(commit=commit)
    results = Results()
    results.add("kernels", pd.concat([run(1.05, "aaaaaaa"), run(1.2, "bbbbbbb")]), "two rounds")
    c = by_key(results)["batch1_slower"]
    assert c.verdict == HOLDS and "(aaaaaaa)" in c.measured and "(bbbbbbb)" in c.measured


def test_throughput_keeps_one_commits_dtypes_apart():
    bf16 = synthetic_results().get("kernels")
    fp16 = bf16.assign(dtype="float16", kv_dtype="float16", time_us=bf16["time_us"] / 2)
    tput = derive.throughput(pd.concat([bf16, fp16], ignore_index=True))
    sdpa = tput[tput["backend"] == "sdpa-contiguous"].set_index(["series", "batch"])
    assert set(sdpa.index.get_level_values("series")) == {"sdpa-contiguous bfloat16",
                                                          "sdpa-contiguous float16"}
    assert (sdpa.loc["sdpa-contiguous bfloat16", "time_us"]
            == 2 * sdpa.loc["sdpa-contiguous float16", "time_us"]).all()
    bw = derive.bandwidth(pd.concat([bf16, fp16], ignore_index=True))
    assert bw.groupby("series")["dtype"].nunique().eq(1).all() and bw["series"].nunique() == 8
    assert set(derive.throughput(bf16)["series"]) >= {"sdpa-contiguous", "triton-paged bs=16"}


def test_kernel_tables_are_computed_once_per_results_until_data_is_added():
    results = synthetic_results()
    ratio = derive.table(results, "kernels_batch1_ratio")
    assert derive.table(results, "kernels_batch1_ratio") is ratio
    pd.testing.assert_frame_equal(ratio, derive.batch1_ratio(results.get("kernels")))
    results.add("kernels", results.get("kernels").head(1), "more")
    assert derive.table(results, "kernels_batch1_ratio") is not ratio


def test_a_kernel_table_that_fails_is_empty_and_named_in_a_warning(monkeypatch):
    def broken(kernels):
        raise KeyError("odd")
    monkeypatch.setitem(derive.KERNEL_TABLES, "kernels_throughput", broken)
    results = synthetic_results()
    assert derive.table(results, "kernels_throughput").empty
    assert any(w.startswith("kernels_throughput: could not be derived (KeyError")
               for w in results.warnings)


def paged_utilisation(results) -> dict[int, float]:
    static = results.get("memory_static").dropna(subset=["block_size"])
    return dict(zip(static["block_size"].astype(int), static["utilisation"]))


def test_recommendation_follows_the_measured_curves():
    results = synthetic_results()
    rec, table = advice.choose_block_size(paged_utilisation(results), "w",
                                          kernels=results.get("kernels"))
    assert rec.speed_measured and rec.block_size in (8, 16, 32)
    assert table.loc[table["score"].idxmax(), "block_size"] == rec.block_size
    # if small blocks cost nothing in the kernel, memory wins: block 1
    flat = synthetic_results(paged_ratio={1: 1.0, 16: 1.0, 128: 1.0})
    assert advice.choose_block_size(paged_utilisation(flat), "w",
                                    kernels=flat.get("kernels"))[0].block_size == 1
    # without speed data the recommendation says it is memory-only
    assert not advice.choose_block_size(paged_utilisation(flat), "w")[0].speed_measured


def engine_rows(tps: dict[int, tuple[float, float, float]], batch=256) -> pd.DataFrame:
    """engine_batch rows on a GPU: block size -> (median, min, max) decode tokens/s."""
    return pd.DataFrame([dict(device="cuda:0", device_name="NVIDIA H200", commit="abc1234",
                              block_size=b, batch=batch, mode="graphs", repeats=3,
                              decode_tokens_per_s=m, decode_tokens_per_s_min=lo,
                              decode_tokens_per_s_max=hi) for b, (m, lo, hi) in tps.items()])


def test_engine_speed_decides_and_its_spread_makes_ties():
    util = {1: 1.0, 16: 0.99, 128: 0.90}
    clear = engine_rows({1: (50, 49, 51), 16: (100, 99, 101), 128: (101, 100, 102)})
    rec, table = advice.choose_block_size(util, "mine.csv", engine=clear)
    assert (rec.block_size, rec.tied, rec.no_winner) == (16, (16,), False)
    assert "batch 256" in rec.basis and "abc1234" in rec.basis and "H200" in rec.basis
    assert rec.words() == "block size 16"
    noisy = engine_rows({1: (50, 49, 51), 16: (100, 90, 110), 128: (101, 95, 115)})
    rec = advice.choose_block_size(util, "mine.csv", engine=noisy)[0]
    assert rec.tied == (16, 128) and rec.no_winner
    assert rec.words().startswith("no winner within noise: blocks 16–128")
    # a CPU's engine rows never decide a GPU question: the kernels' (absent here) then memory
    cpu = clear.assign(device="cpu")
    assert not advice.choose_block_size(util, "w", engine=cpu)[0].speed_measured


def test_the_engine_batch_follows_the_sequences_a_workload_runs():
    """Speed is read at the largest measured batch not above the sequences that fit: a
    workload of ~100 sequences is not judged at batch 256, where other blocks win."""
    util = {16: 1.0, 128: 1.0}
    rows = pd.concat([engine_rows({16: (100, 99, 101), 128: (80, 79, 81)}, batch=64),
                      engine_rows({16: (80, 79, 81), 128: (100, 99, 101)}, batch=256)])
    assert advice.choose_block_size(util, "w", engine=rows)[0].block_size == 128
    rec = advice.choose_block_size(util, "w", engine=rows, batch=100)[0]
    assert rec.block_size == 16 and "batch 64, the measured batch nearest the 100" in rec.basis
    # fewer sequences than any batch measured: the smallest batch
    assert "batch 64" in advice.choose_block_size(util, "w", engine=rows, batch=8)[0].basis


def test_a_backend_constraint_rules_block_sizes_out():
    util = {1: 1.0, 8: 0.995, 16: 0.99, 128: 0.90}
    engine = engine_rows({1: (100, 99, 101), 8: (100, 99, 101), 16: (99, 98, 100),
                          128: (90, 89, 91)})
    free = advice.choose_block_size(util, "w", engine=engine)[0]
    assert free.block_size in (1, 8)
    rec = advice.choose_block_size(util, "w", engine=engine, allowed=lambda b: b % 16 == 0,
                                   constraint="multiples of 16")[0]
    assert rec.block_size == 16 and rec.excluded == (1, 8) and rec.constraint == "multiples of 16"


# ---- sections, page, escaping, atomic write ------------------------------------------------

def test_every_section_renders_no_data_on_empty_results(tmp_path):
    html = write_page(Results(), tmp_path)
    for sid in ("recommendation", "claims", "environment", "memory", "capacity", "kernels",
                "engine", "benchmarks"):
        assert f'id="{sid}"' in html
    assert html.count('class="nodata"') >= 8
    assert "<img" not in html


@pytest.mark.slow
def test_full_synthetic_page_has_every_plot_and_links_its_data(tmp_path):
    results = synthetic_results()
    analyse(results)
    page = build.build_sections(results, {"device": "cpu"}, {})
    expected_plots = sum(len(s.plots) for s in page)
    html = write_page(results, tmp_path)
    assert expected_plots >= 10
    assert html.count('<img src="data:image/png;base64,') == expected_plots
    assert not re.search(r'(src|href)="(https?:)?//', html)  # nothing fetched from a network
    links = re.findall(r'href="(index_data/[^"]+\.csv)"', html)
    assert links and all((tmp_path / link).is_file() for link in links)
    claims_csv = pd.read_csv(tmp_path / "index_data" / "claims.csv")
    assert len(claims_csv) >= 15 and set(claims_csv["verdict"]) <= {HOLDS, FAILS, UNMEASURED}


@pytest.mark.slow
def test_text_from_data_is_escaped(tmp_path):
    results = synthetic_results()
    evil = "<script>alert('x')</script>"
    kernels = results.get("kernels")
    kernels.loc[kernels["backend"] == "torch-paged", "backend"] = evil
    results.frames["engine_cow"]["machine"] = evil
    results.warn(f"file {evil}.csv: broken")
    html = write_page(results, tmp_path)
    assert "<script" not in html
    assert "&lt;script&gt;" in html


def test_atomic_write_keeps_the_old_page_when_interrupted(tmp_path, monkeypatch):
    out = tmp_path / "index.html"
    render.atomic_write_text(out, "good page")

    def boom(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        render.atomic_write_text(out, "half a page")
    assert out.read_text() == "good page"
    assert os.listdir(tmp_path) == ["index.html"]  # no temporary file left behind


@pytest.mark.slow
def test_a_failed_render_leaves_the_previous_report(tmp_path, monkeypatch):
    write_page(synthetic_results(), tmp_path)
    before = (tmp_path / "index.html").read_text()

    def fail(**kwargs):
        raise RuntimeError("render failed")

    monkeypatch.setattr(render, "render_html", fail)
    with pytest.raises(RuntimeError):
        write_page(Results(), tmp_path)
    assert (tmp_path / "index.html").read_text() == before


def test_fmt_formats_numbers_for_tables():
    assert sections.fmt(0.9801, "utilisation") == "98.0%"
    assert sections.fmt(12288) == "12,288"
    assert sections.fmt(1234.6) == "1,235"
    assert sections.fmt(1.23456) == "1.23"
    assert sections.fmt(float("nan")) == ""


# ---- the command ---------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_quick_report_with_committed_data(tmp_path, capsys):
    data = tmp_path / "data" / "h200"
    data.mkdir(parents=True)
    synthetic_results().get("kernels").drop(columns=["machine", "source"]).to_csv(
        data / "kernels.csv", index=False)
    (data / "engine_cow.json").write_text("[{broken")
    out = tmp_path / "site" / "index.html"
    code = main(["report", "--quick", "--out", str(out), "--data-dir", str(tmp_path / "data"),
                 "--no-progress"])
    assert code == 0
    err = capsys.readouterr().err
    assert err.count("engine_cow.json: cannot parse") == 1  # as a dataset, not again as history
    html = out.read_text()
    assert "Synthetic GPU" in html  # the committed kernel data made it in
    c = pd.read_csv(out.parent / "index_data" / "claims.csv").set_index("key")
    assert c.loc["naive_utilisation", "verdict"] == HOLDS
    assert c.loc["batch1_slower", "verdict"] == HOLDS
    assert (out.parent / "index_data" / "kernels_batch1_ratio.csv").is_file()


def test_cli_rejects_a_bad_device(capsys):
    assert main(["report", "--device", "tpu"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and len(err.strip().splitlines()) == 1


def test_unexpected_columns_degrade_to_a_warning_not_a_crash(tmp_path):
    demo = synthetic_results()
    results = Results()
    results.add("kernels", demo.get("kernels").drop(columns=["layout"]), "no layout")
    results.add("engine_pool", pd.DataFrame({"num_blocks": ["many", "few"],
                                             "num_preemptions": [1, 0],
                                             "tokens_per_s": [1.0, 2.0],
                                             "recomputed_tokens": [1, 0]}), "pool.csv")
    assert results.get("kernels") is None and results.get("engine_pool") is None
    assert results.warnings == [
        "kernels: no layout: missing column(s) layout; not used",
        "engine_pool: pool.csv: column num_blocks: 'many' is not a number; not used"]
    html = write_page(results, tmp_path)
    assert 'id="kernels"' in html and 'id="claims-table"' in html
    assert "No data: kernel sweep" in html


def test_a_frame_without_required_columns_is_refused_with_a_warning():
    results = Results()
    results.add("kernels", pd.DataFrame({"device": ["cpu"], "time_us": [1.0]}), "sweep")
    assert results.get("kernels") is None
    assert "missing column(s) dtype, model_shape, batch, context, block_size, backend" in \
        results.warnings[0]


def test_batching_claim_fails_when_batching_buys_little():
    results = synthetic_results()
    results.frames["engine_batch"]["tokens_per_s"] = [100.0, 150.0, 200.0] * 2
    c = by_key(results)["batching_beats_gather"]
    assert c.verdict == FAILS and "2.0×" in c.measured


def test_kernel_claims_are_judged_on_the_gpu_when_one_measured_them():
    results = synthetic_results()
    cpu = results.get("kernels").assign(device="cpu", device_name="x86_64", machine="here")
    times = ["time_us", "q20_us", "q80_us"]
    slow = cpu["layout"] == "paged"
    cpu.loc[slow, times] = cpu.loc[slow, times] * 5  # a CPU gather: 5x slower
    compiled = cpu.assign(kernel=cpu["kernel"].replace("triton", "flex"))  # not interpreted
    results.add("kernels", compiled, "cpu sweep")
    c = by_key(results)["batch1_slower"]
    assert c.verdict == HOLDS and c.device == "Synthetic GPU"
    assert "CPU; not judged" in c.measured
    # CPU data alone is judged as it is, except Triton interpreted there (no kernel timing)
    alone = Results()
    alone.add("kernels", cpu, "cpu sweep")
    assert by_key(alone)["batch1_slower"].verdict == UNMEASURED
    alone.add("kernels", compiled, "compiled")
    assert by_key(alone)["batch1_slower"].verdict == FAILS


def test_engine_rows_are_read_by_file_name(tmp_path):
    """Rows as pagebench.measure.engine_bench writes them, one file per dataset."""
    files = {
        "engine_cow": [{"variant": "n=1", "n": 1, "peak_blocks": 17},
                       {"variant": "n=4 shared", "n": 4, "peak_blocks": 20},
                       {"variant": "4 separate requests", "n": None, "peak_blocks": 68}],
        "engine_prefix_cache": [
            {"enable_prefix_caching": False, "prefix_cache_hit_rate": 0.0,
             "num_computed_prompt_tokens": 2360, "peak_blocks": 160},
            {"enable_prefix_caching": True, "prefix_cache_hit_rate": 0.65,
             "num_computed_prompt_tokens": 824, "peak_blocks": 70}],
        "engine_pool_size": [
            {"num_blocks": 34, "num_preemptions": 6, "recomputed_tokens": 500,
             "tokens_per_s": 100.0},
            {"num_blocks": 113, "num_preemptions": 0, "recomputed_tokens": 0,
             "tokens_per_s": 70.0}],
        "engine_throughput_vs_batch": [{"batch": 1, "block_size": 16, "tokens_per_s": 10.0},
                                       {"batch": 16, "block_size": 16, "tokens_per_s": 260.0}],
    }
    (tmp_path / "cpu").mkdir()
    for stem, rows in files.items():
        pd.DataFrame(rows).to_csv(tmp_path / "cpu" / f"{stem}.csv", index=False)
    results = Results()
    load_data_dir(results, tmp_path)
    assert not results.warnings
    assert {"engine_cow", "engine_prefix", "engine_pool", "engine_batch"} <= set(results.frames)
    assert results.get("engine_batch")["batch"].tolist() == [1, 16]
    c = by_key(results)
    assert c["cow_n4"].verdict == HOLDS and "1.18×" in c["cow_n4"].measured
    assert "4 unshared requests: 68" in c["cow_n4"].measured
    assert c["prefix_caching"].verdict == HOLDS and "65.0%" in c["prefix_caching"].measured
    assert c["preemption_signal"].verdict == HOLDS and "500 tokens recomputed" in \
        c["preemption_signal"].measured
    html = write_page(results, tmp_path)
    assert html.count("<img") >= 4  # cow, prefix, pool, batch plots


@pytest.mark.slow
def test_rewriting_the_report_drops_stale_csvs(tmp_path):
    write_page(synthetic_results(), tmp_path)
    assert (tmp_path / "index_data" / "engine_cow.csv").exists()
    write_page(Results(), tmp_path)
    assert not (tmp_path / "index_data" / "engine_cow.csv").exists()
    assert (tmp_path / "index_data" / "claims.csv").exists()


def test_a_json_twin_of_a_csv_and_smoke_runs_are_not_read_twice(tmp_path):
    (tmp_path / "h200").mkdir()
    kernels = synthetic_results().get("kernels").drop(columns=["machine", "source"])
    kernels.to_csv(tmp_path / "h200" / "kernels.csv", index=False)
    (tmp_path / "h200" / "kernels.json").write_text(json.dumps(
        {"meta": {}, "rows": kernels.to_dict("records")}))
    kernels.to_csv(tmp_path / "h200" / "kernels_smoke.csv", index=False)
    results = Results()
    load_data_dir(results, tmp_path)
    assert len(results.get("kernels")) == len(kernels)


SECTIONS = {  # section -> (builder, plots expected on the synthetic results)
    "memory": (sections.memory, 3), "capacity": (sections.capacity, 1),
    "kernels": (sections.kernels, 4), "engine": (sections.engine, 5),
    "benchmarks": (sections.benchmarks, 0),
}


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_each_section_on_synthetic_and_on_no_data(name):
    builder, num_plots = SECTIONS[name]
    full = builder(analysed(synthetic_results()))
    assert len(full.plots) >= num_plots
    assert any(i.kind == "table" for i in full.items)
    assert not [i.text for i in full.items if i.kind == "nodata"]
    empty = builder(analysed(Results()))
    assert empty.plots == [] and any(i.kind == "nodata" for i in empty.items)


def test_out_may_name_a_directory(tmp_path):
    out = build.write_report(analysed(Results()), tmp_path, env={}, options={})
    assert out == tmp_path / "index.html" and out.is_file()


def test_prefill_data_is_read_summarised_and_shown(tmp_path):
    """kernels_prefill*.csv are their own datasets (not decode sweeps); the kernels section
    shows each point's times and ratios."""
    assert classify("kernels_prefill") == "kernels_prefill"
    assert classify("kernels_prefill_equivalence") == \
        "kernels_prefill_equivalence"
    assert classify("kernels_prefill_tuning") is None
    base = {"device": "cuda", "device_name": "GPU", "model_shape": "m", "batch": 1,
            "query_len": 512, "cached": 0}
    sdpa = dict(base, backend="sdpa-contiguous", kernel=None, layout="contiguous",
                block_size=None)
    triton = dict(base, backend="triton-paged", kernel="triton", layout="paged", block_size=16)
    rows = [dict(sdpa, cuda_graphs=False, time_us=10.0),
            dict(sdpa, cuda_graphs=True, time_us=8.0),
            dict(triton, cuda_graphs=False, time_us=30.0, tflops=1.0),
            dict(triton, cuda_graphs=True, time_us=20.0, tflops=1.5),
            dict(triton, backend="torch-paged", kernel="torch", cuda_graphs=False,
                 time_us=300.0)]
    summary = derive.prefill_summary(pd.DataFrame(rows))
    assert len(summary) == 1
    r = summary.iloc[0]
    assert r["triton / sdpa"] == pytest.approx(3.0)
    assert r["triton / sdpa (graph)"] == pytest.approx(2.5)
    assert r["torch / triton"] == pytest.approx(10.0)
    assert r["triton TFLOP/s (best)"] == pytest.approx(1.5)
    results = Results()
    results.add("kernels_prefill", pd.DataFrame(rows).assign(machine="gpu"), "test")
    section = sections.Section("kernels", "Kernels").show(analysed(results), sections.PREFILL)
    tables = [i.table for i in section.items if i.kind == "table"]
    assert tables and tables[0].data == "kernels_prefill_summary"
    empty = sections.Section("kernels", "Kernels").show(analysed(Results()), sections.PREFILL)
    assert [i.kind for i in empty.items] == ["nodata"]


def test_cpu_triton_rows_are_labelled_interpreted_and_keep_their_spread():
    cpu = synthetic_results().get("kernels").assign(device="cpu", device_name="x86_64",
                                                    machine="here")
    cpu["cuda_graphs"] = cpu["kernel"] == "sdpa"
    rows = derive.kernel_rows(cpu)
    assert set(rows.loc[rows["kernel"] == "triton", "timed_as"]) == {derive.INTERPRETED}
    assert set(rows.loc[rows["kernel"] == "sdpa", "timed_as"]) == {derive.CPU_GRAPH}
    assert set(rows.loc[rows["kernel"] == "torch", "timed_as"]) == {""}
    tput = derive.throughput(cpu)
    assert tput.loc[tput["kernel"] == "triton", "series"].str.endswith("(interpreted)").all()
    assert {"q20_us", "q80_us"} <= set(tput.columns)
    gpu = derive.kernel_rows(synthetic_results().get("kernels"))
    assert (gpu["timed_as"] == "").all()


def test_equal_memory_is_judged_on_the_gpu_when_one_measured_it():
    results = synthetic_results()
    gpu = results.get("engine_equal_memory").assign(device="cuda:0")
    cpu = gpu.assign(device="cpu", device_name="x86_64", machine="CPU (2-core x86_64)")
    cpu.loc[cpu["method"] == "engine_contiguous_batch", "tokens_per_s_max"] = 3200.0
    results.frames["engine_equal_memory"] = pd.concat([gpu, cpu], ignore_index=True)
    c = by_key(results)["memory_buys_throughput"]
    assert c.verdict == HOLDS and c.device == "Synthetic GPU"
    assert "(CPU; not judged: a GPU measured it)" in c.measured
    results.frames["engine_equal_memory"] = cpu
    assert by_key(results)["memory_buys_throughput"].verdict == WITHIN_NOISE


def test_batching_gain_is_within_noise_when_its_band_straddles_the_bound():
    results = synthetic_results()
    results.frames["engine_batch"] = pd.DataFrame({
        "batch": [1, 16], "tokens_per_s": [10.0, 44.0], "tokens_per_s_min": [9.0, 40.0],
        "tokens_per_s_max": [11.0, 48.0], "block_size": 16, "machine": "Synthetic GPU"})
    c = by_key(results)["batching_beats_gather"]  # 4.4x (3.6-5.3) against 4 x 1.08
    assert c.verdict == WITHIN_NOISE and "4.4× (3.6–5.3)" in c.measured
    results.frames["engine_batch"]["tokens_per_s_min"] = [9.9, 43.9]
    results.frames["engine_batch"]["tokens_per_s_max"] = [10.1, 44.1]
    assert by_key(results)["batching_beats_gather"].verdict == HOLDS
