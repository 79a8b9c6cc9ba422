"""Real traces at a real KV budget (sim.real_load): the budget from the planner, the default step
cost from the committed H200 data, reservations, the memory-bound rate, the equal-memory
goodput comparison on a trace whose answer is known, and one verdict in every run mode."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from pagebench.analysis import real_traces as trace_claims
from pagebench.analysis.claims import evaluate
from pagebench.errors import ConfigError
from pagebench.results import Results
from pagebench.results.derived import HOLDS
from pagebench.sim import real_load
from pagebench.sim.capacity import capacity_plan
from pagebench.sim.real_traces import STUDY_LOAD_REQUESTS, study_traces
from pagebench.sim.step_cost import H200_ENGINE_STEP_COST, StepCostModel, fit_engine_batch
from pagebench.suite import QUICK_REQUESTS, committed_step_cost

ROOT = Path(__file__).resolve().parent.parent
FLAT_10MS = StepCostModel(base_ms=10, prefill_token_ms=0, decode_seq_ms=0, context_ktoken_ms=0)


def test_real_budget_is_the_planners_llama_3_8b_on_one_h100():
    plan = capacity_plan("llama-3-8b", gpu_memory="80GiB")
    assert plan["bytes_per_token"] == 32 * 8 * 128 * 2 * 2  # layers, KV heads, dim, K+V, bf16
    block_bytes = 16 * plan["bytes_per_token"]
    assert real_load.real_budget_tokens() == plan["kv_cache_bytes"] // block_bytes * 16
    assert real_load.real_budget_tokens(dict(model="llama-3-8b", gpu_memory="141GiB")) > \
        real_load.real_budget_tokens()


def test_default_step_cost_is_refitted_from_the_committed_h200_sweep():
    path = ROOT / "reports/data/h200/engine_throughput_vs_batch.csv"
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if r["block_size"] == "16" and r["mode"] == "graphs"]
    fitted = fit_engine_batch(rows)
    for name in ("base_ms", "prefill_token_ms", "decode_seq_ms", "context_ktoken_ms"):
        assert getattr(fitted, name) == pytest.approx(getattr(H200_ENGINE_STEP_COST, name),
                                                      rel=1e-3, abs=1e-9)


def test_engine_batch_fit_recovers_known_costs():
    # decode step = 2 + 0.01 * batch ms; prefill 0.004 ms a token; 50 decode steps
    rows = [dict(batch=b, prompt_len=100, max_tokens=50, decode_step_ms=2 + 0.01 * b,
                 time_s=(50 * (2 + 0.01 * b) + 0.004 * 100 * b) / 1e3) for b in (1, 8, 64)]
    model = fit_engine_batch(rows)
    assert (model.base_ms, model.decode_seq_ms, model.prefill_token_ms) == \
        pytest.approx((2, 0.01, 0.004))
    with pytest.raises(ConfigError, match="two batch sizes"):
        fit_engine_batch(rows[:1])


def test_no_committed_gpu_model_falls_back_to_the_h200_default(tmp_path):
    assert committed_step_cost(tmp_path)[0] == H200_ENGINE_STEP_COST
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "step_cost.csv").write_text(
        "model,block_size,kv_cache_dtype,base_ms,prefill_token_ms,decode_seq_ms,"
        "context_ktoken_ms\nm,16,auto,3,0.01,0.02,0.5\nm,128,auto,9,9,9,9\n")
    model, source = committed_step_cost(tmp_path)
    assert model == StepCostModel(3, 0.01, 0.02, 0.5) and "gpu/step_cost.csv" in source


def test_the_budgets_own_model_is_preferred_among_committed_step_costs(tmp_path):
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "step_cost.csv").write_text(
        "model,block_size,kv_cache_dtype,base_ms,prefill_token_ms,decode_seq_ms,"
        "context_ktoken_ms,prefill_step_ms,prefill_seq_ms\n"
        "qwen2.5-0.5b,16,auto,3,0.01,0.02,0.5,20,5\nllama-3-8b,16,auto,8,0.1,0.2,1,30,9\n")
    model, source = committed_step_cost(tmp_path)
    assert model == StepCostModel(8, 0.1, 0.2, 1, 30, 9) and "llama-3-8b" in source


def test_report_and_claims_simulate_serve_with_the_same_costs_and_sample(monkeypatch):
    """``pagebench report`` (quick=False) and ``claims --simulate`` (quick=True) reach the
    real-trace study through ``suite.real_traces``: the same committed step cost and the same
    load sample in both, so the same verdicts (test_every_run_mode_serves_the_same_sample)."""
    from pagebench import suite
    from pagebench.measure import trace_replay

    calls = []

    def study(num_requests, **kwargs):
        calls.append((num_requests, kwargs))
        return {}

    monkeypatch.setattr(suite, "study_traces", study)
    monkeypatch.setattr(trace_replay, "replay_trace", lambda *a, **k: {"trace": a[1]})
    for quick in (False, True):
        suite.real_traces(Results(), quick=quick)
    (full, full_kwargs), (quick_n, quick_kwargs) = calls
    assert full_kwargs == quick_kwargs  # step_cost and its source
    assert full_kwargs["step_cost"] == committed_step_cost()[0]
    assert full is None and quick_n == QUICK_REQUESTS >= STUDY_LOAD_REQUESTS


def test_reservations():
    prompt, output = np.array([3, 5, 20]), np.array([2, 1, 5])  # 4, 5 and 24 slots needed
    assert real_load.reserve_lengths("paged", prompt, output, 32) is None
    assert real_load.reserve_lengths("naive", prompt, output, 32).tolist() == [32] * 3
    assert real_load.reserve_lengths("pow2", prompt, output, 32).tolist() == [4, 8, 32]
    assert real_load.reserve_lengths("pow2", prompt, output, 24).tolist() == [4, 8, 24]
    assert real_load.reserve_lengths("oracle", prompt, output, 32).tolist() == [4, 5, 24]
    with pytest.raises(ConfigError, match="allocator"):
        real_load.reserve_lengths("buddy", prompt, output, 32)


def known_trace(n=50, interval_s=0.1):
    """Requests of 40 prompt and 4 output tokens (43 slots: 3 blocks of 16), one every
    ``interval_s``; each holds its memory for 4 flat 10 ms steps. In 144 slots paging holds
    three at once (9 blocks), a max_model_len = 144 reservation one: paging sustains 75
    requests/s within a tight TTFT SLO, reserve-max 25."""
    return np.arange(n) * interval_s, np.full(n, 40), np.full(n, 4)


def test_memory_bound_rate_is_where_paged_runs_out_of_blocks():
    arrival, prompt, output = known_trace()
    scale, runs = real_load.memory_bound_scale(arrival, prompt, output, 144, FLAT_10MS, 144)
    # at 10 requests/s x scale, three 40 ms residents fill the pool from 75 requests/s:
    # scale 8 (80/s) is the first power of two that keeps paging short of blocks
    assert scale == 8
    summary = real_load.memory_summary(runs[scale], 144)
    assert summary["saturated_step_fraction"] >= real_load.MEMORY_BOUND_SHARE
    assert summary["token_state_fraction_saturated"] == pytest.approx(
        summary["token_state_fraction_saturated"])  # not None: memory-bound time exists
    assert real_load.memory_summary(runs[4], 144)["token_state_fraction_saturated"] is None


def test_equal_memory_goodput_finds_the_known_three_fold_rate(monkeypatch):
    monkeypatch.setattr(real_load, "SLO_TTFT_S", 0.025)  # uncongested TTFT is 10-20 ms
    monkeypatch.setattr(real_load, "SLO_TPOT_S", 0.05)
    arrival, prompt, output = known_trace()
    load = real_load.study_trace(arrival, prompt, output, 144, FLAT_10MS, 144)
    rows = [r | {"trace": "known", "source": "hand-made", "num_requests": 50}
            for r in load["goodput"]]
    import pandas as pd

    frame = pd.DataFrame(rows)
    best = {a: frame[(frame["allocator"] == a) & frame["meets_slo"]]["request_rate"].max()
            for a in ("paged", "naive")}
    # the search brackets a power of two, then bisects it three times: within 2**(1/8)
    assert 75 / 1.1 <= best["paged"] <= 75 and 25 / 1.1 <= best["naive"] <= 25
    assert not frame[frame["request_rate"] > 75.01]["meets_slo"].any()
    results = Results()
    results.add("real_traces_goodput", frame, "test")
    [verdict] = evaluate(results, [c for c in trace_claims.CLAIMS
                                   if c.id == "throughput_equal_memory"])
    assert verdict.verdict == HOLDS and "known" in verdict.measured


@pytest.mark.slow
def test_every_run_mode_serves_the_same_sample():
    """The report (whole traces) and report --quick / claims --simulate (QUICK_REQUESTS
    each) serve the same first requests at the real budget: the same rows, the same
    verdicts."""
    whole = study_traces(None, names=("azure-code",))
    quick = study_traces(QUICK_REQUESTS, names=("azure-code",))
    assert whole["static"]["num_requests"].iloc[0] > quick["static"]["num_requests"].iloc[0]
    for kind in ("dynamic", "goodput"):
        assert whole[kind].equals(quick[kind])
    verdicts = []
    for frames in (whole, quick):
        results = Results()
        for kind, frame in frames.items():
            results.add(f"real_traces_{kind}", frame, "test")
        verdicts.append([(c.key, c.verdict, c.measured)
                         for c in evaluate(results, trace_claims.CLAIMS)
                         if c.key != "real_traces_static"])
    assert verdicts[0] == verdicts[1]
    assert all(f"first {STUDY_LOAD_REQUESTS:,} requests" in m for _, _, m in verdicts[0])
