"""The report's "Serving" section: max rate at the SLO, latency plots, the simulator's error."""

import math

import pandas as pd
import pytest

from pagebench.analysis import analyse
from pagebench.report import serving
from pagebench.results import Results, load_data_dir

GPU = dict(device="cuda:0", device_name="NVIDIA H100 80GB HBM3", model="qwen2.5-0.5b",
           trace="azure-conv", arrival="trace", num_requests=32, seed=0, kv_cache_dtype="auto",
           prefix_caching=True, slo_ttft_ms=500.0, slo_tpot_ms=25.0, slo_attainment=0.9,
           duration_s=4.0, request_throughput=8.0, output_throughput=800.0,
           num_good_requests=32) | {f"{m}_{s}_ms": 10.0 for m in ("ttft", "tpot", "itl",
                                                                  "e2el", "queue")
                                    for s in ("mean", "p50", "p90", "p99")}


def rows(block, passes_up_to, predicted=False, scale=1.0):
    out = []
    for rate in (8.0, 32.0, 128.0, math.inf):
        ok = rate <= passes_up_to
        out.append(GPU | dict(block_size=block, request_rate=rate, goodput=rate if ok else 1.0,
                              meets_slo=ok, predicted=predicted,
                              ttft_p99_ms=(50.0 if ok else 900.0) * scale,
                              tpot_p50_ms=5.0 * scale))
    return out


def loaded(tmp_path, data) -> Results:
    d = tmp_path / "h100"
    d.mkdir()
    pd.DataFrame(data).to_csv(d / "serve_bench.csv", index=False)
    results = Results()
    load_data_dir(results, tmp_path)
    analyse(results)
    return results


def test_max_rate_and_prediction_error_per_configuration(tmp_path):
    results = loaded(tmp_path, rows(16, 32.0) + rows(128, 128.0)
                     + rows(16, 32.0, predicted=True, scale=1.1))
    best = results.get("serving_max_rate").set_index("block_size")["max_rate_at_slo"]
    assert best.to_dict() == {16: 32.0, 128: 128.0}  # inf is never a rate "met"
    assert results.get("serving_max_rate")["rates_missed_below"].tolist() == [0, 0]
    pred = results.get("serving_prediction")
    assert set(pred["block_size"]) == {16}  # block 128 has no prediction
    ttft = pred[pred["metric"] == "ttft_p99_ms"]
    assert len(ttft) == 4 and ttft["rel_err"].to_numpy() == pytest.approx([0.1] * 4)
    errors = results.get("serving_prediction_error").set_index("metric")
    assert errors.loc["ttft_p99_ms", "median_abs_err"] == pytest.approx(0.1)
    assert errors.loc["tpot_p50_ms", "max_abs_err"] == pytest.approx(0.1)
    assert errors["points"].tolist() == [4] * 4
    section = serving.section(results)
    assert len(section.plots) == 2
    captions = [i.table.caption for i in section.items if i.kind == "table"]
    assert any("Largest measured request rate" in c for c in captions)
    assert any("Simulator against engine" in c for c in captions)
    assert any("median and largest |error|" in c for c in captions)


def test_lower_rates_that_missed_are_counted_beside_the_largest_met(tmp_path):
    data = [r | dict(meets_slo=r["request_rate"] == 32.0) for r in rows(16, 128.0)]
    best = loaded(tmp_path, data).get("serving_max_rate")
    assert best["max_rate_at_slo"].tolist() == [32.0]
    assert best["rates_missed_below"].tolist() == [1]  # 8 requests/s missed


def test_no_data_says_what_is_missing(tmp_path):
    (tmp_path / "h100").mkdir()
    results = Results()
    analyse(results)
    section = serving.section(results)
    assert [i.kind for i in section.items] == ["text", "nodata"]
    assert "serve-bench" in section.items[-1].text


def test_a_rate_meets_the_slo_only_if_every_repeat_does(tmp_path):
    first = [r | dict(repeat=0) for r in rows(16, 128.0)]
    second = [r | dict(repeat=1, meets_slo=r["meets_slo"] and r["request_rate"] <= 8.0)
              for r in rows(16, 128.0)]
    predicted = [r | dict(repeat=k) for k in (0, 1) for r in rows(16, 128.0, predicted=True)]
    results = loaded(tmp_path, first + second + predicted)
    best = results.get("serving_max_rate")
    assert best["max_rate_at_slo"].tolist() == [8.0]  # 32 and 128 met once, missed once
    pred = results.get("serving_prediction")
    assert len(pred) == 2 * 4 * 4  # each repeat paired with its own prediction, no cross pairs
