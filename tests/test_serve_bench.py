"""`pagebench serve-bench`: rows per rate x configuration, the max-rate search, bad input."""

from __future__ import annotations

import csv
import json

import pytest

from pagebench.cli import main
from pagebench.measure.serve_bench import search_max_rate
from pagebench.results.datasets import SERVE_BENCH, SERVE_STEPS


@pytest.mark.slow
def test_serve_bench_rows_per_rate_and_configuration(capsys, tmp_path):
    steps = tmp_path / "steps.csv"
    argv = ["serve-bench", "--trace", "mooncake-conv", "--rates", "4,inf", "--num-requests",
            "6", "--max-output-len", "4", "--max-model-len", "512", "--prefix-caching",
            "on,off", "--slo-ttft", "1e6", "--steps-out", str(steps), "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["prefix_caching"], r["request_rate"]) for r in rows] == [
        (True, 4.0), (True, None), (False, 4.0), (False, None)]  # inf is null in JSON
    for row in rows:
        assert set(SERVE_BENCH.required) <= row.keys()
        assert row["num_requests"] == 6 and row["num_good_requests"] == 6  # a 1000 s SLO
        assert row["ttft_p50_ms"] <= row["ttft_p99_ms"] <= row["e2el_p99_ms"]
        assert row["num_output_tokens"] == rows[0]["num_output_tokens"] > 0  # same requests
    assert rows[1]["prefix_cache_hit_rate"] == rows[0]["prefix_cache_hit_rate"]  # reset between
    assert rows[2]["prefix_cache_hit_rate"] == 0
    with open(steps) as f:
        step_rows = list(csv.DictReader(f))
    assert set(SERVE_STEPS.required) <= step_rows[0].keys()
    assert sum(int(r["num_decode_seqs"]) for r in step_rows) > 0


@pytest.mark.parametrize("argv, message", [
    (["--find-max-rate", "--rates", "1"], "--find-max-rate: give --slo-ttft"),
    (["--find-max-rate", "--slo-ttft", "100"], "--find-max-rate: give a finite"),
    (["--arrival", "poisson"], "--arrival poisson: give --rates"),
    (["--rates", "0,1"], "positive request rates"),
    (["--prefix-caching", "maybe"], "on, off or on,off"),
    (["--kv-cache-dtype", "int4"], "distinct names"),
    (["--model", "no-such-model"], "no-such-model"),
])
def test_bad_input_is_one_line_and_status_2(capsys, argv, message):
    try:
        status = main(["serve-bench", "--num-requests", "2"] + argv)
    except SystemExit as e:  # refused by the parser
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_search_doubles_then_bisects_to_the_largest_rate_meeting_the_slo():
    capacity = 5.3  # a server meeting the SLO up to 5.3 requests/s
    asked = []

    def measure(rate):
        asked.append(rate)
        return dict(num_requests=10, num_good_requests=10 if rate <= capacity else 3)

    best = search_max_rate(measure, 1.0, 0.9, max_runs=20)
    assert asked[:4] == [1.0, 2.0, 4.0, 8.0]  # doubling until 8 misses
    assert asked[4:] == [6.0, 5.0, 5.5, 5.25]  # then bisecting between 4 and 8
    assert best == 5.25
    assert search_max_rate(lambda rate: dict(num_requests=1, num_good_requests=0), 1.0, 0.9,
                           max_runs=5) is None


def test_step_cost_predicts_a_grid_on_the_cpu(capsys, tmp_path):
    cost = tmp_path / "step_cost.csv"
    cost.write_text("model,block_size,kv_cache_dtype,base_ms,prefill_token_ms,decode_seq_ms,"
                    "context_ktoken_ms\n"
                    "tiny,16,auto,10,0,0,0\ntiny,16,fp8_e4m3,5,0,0,0\n")
    argv = ["serve-bench", "--step-cost", str(cost), "--trace", "azure-conv", "--rates", "inf",
            "--num-requests", "3", "--max-output-len", "2", "--max-model-len", "4096",
            "--kv-cache-dtype", "auto,fp8_e4m3", "--json"]
    assert main(argv) == 0
    auto, fp8 = json.loads(capsys.readouterr().out)
    assert auto["predicted"] and fp8["num_blocks"] == 4 * auto["num_blocks"]  # 1 byte vs fp32
    # every step costs its base alone: all three arrive at 0 and share every step
    steps = auto["num_steps"]
    assert auto["duration_s"] == pytest.approx(steps * 0.010)
    assert fp8["duration_s"] == pytest.approx(fp8["num_steps"] * 0.005)
    assert auto["tpot_p50_ms"] == pytest.approx(10.0)
    argv[argv.index("auto,fp8_e4m3")] = "fp8_e5m2"
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    assert status == 2 and "no model for block 16, fp8_e5m2" in capsys.readouterr().err


def test_measured_steps_replayed_through_the_simulator_schedule_as_the_engine_did(tmp_path):
    import pandas as pd

    from pagebench.measure.step_cost import MeasuredSteps, predict_serve_bench, run_steps
    from pagebench.sim.step_cost import StepCostModel

    out, steps = tmp_path / "bench.csv", tmp_path / "steps.csv"
    assert main(["serve-bench", "--trace", "azure-conv", "--rates", "inf", "--num-requests",
                 "5", "--max-output-len", "3", "--max-model-len", "512", "--out", str(out),
                 "--steps-out", str(steps), "--warmup-passes", "0"]) == 0
    (row,), measured = pd.read_csv(out).to_dict("records"), pd.read_csv(steps)
    assert (measured["gc_ms"] >= 0).all()
    replay = MeasuredSteps(run_steps(measured, row), StepCostModel(1e6, 0, 0, 0))
    predicted = predict_serve_bench(row, replay)
    assert replay.matched == len(measured) == row["num_steps"]
    # the replay is the steps back to back; the measured run adds the host's time between them
    assert predicted["duration_s"] == pytest.approx(measured["step_time_ms"].sum() / 1e3)
    assert predicted["duration_s"] <= row["duration_s"]


def test_repeats_are_rows_of_their_own_with_their_own_steps(capsys, tmp_path):
    import pandas as pd

    out, steps = tmp_path / "bench.csv", tmp_path / "steps.csv"
    assert main(["serve-bench", "--trace", "azure-conv", "--rates", "inf", "--num-requests",
                 "3", "--max-output-len", "2", "--max-model-len", "512", "--repeats", "2",
                 "--warmup-passes", "0", "--out", str(out), "--steps-out", str(steps)]) == 0
    bench, measured = pd.read_csv(out), pd.read_csv(steps)
    assert bench["repeat"].tolist() == [0, 1]
    assert measured.groupby("repeat").size().tolist() == bench["num_steps"].tolist()
    # --append keeps the earlier rows
    assert main(["serve-bench", "--trace", "azure-conv", "--rates", "inf", "--num-requests",
                 "3", "--max-output-len", "2", "--max-model-len", "512", "--block-sizes", "32",
                 "--warmup-passes", "0", "--append", "--out", str(out)]) == 0
    assert pd.read_csv(out)["block_size"].tolist() == [16, 16, 32]
    argv = ["serve-bench", "--find-max-rate", "--rates", "1", "--slo-ttft", "100",
            "--repeats", "2"]
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    assert status == 2 and "--repeats" in capsys.readouterr().err
