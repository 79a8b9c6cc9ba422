"""The step-cost model's two engine paths, its fit on measured steps (per step kind, one-off
stalls dropped), and the replay of a run's own measured step times through the simulator."""

from __future__ import annotations

import gc
import math

import numpy as np
import pandas as pd
import pytest

from pagebench.measure.serving import GCTimer
from pagebench.measure.step_cost import (MeasuredSteps, fit_step_cost, inter_step_gap_ms,
                                         prefill_seqs, step_kinds)
from pagebench.sim.serving import simulate_serving
from pagebench.sim.step_cost import StepCostModel

EAGER = StepCostModel(base_ms=3, prefill_token_ms=0.01, decode_seq_ms=0.02,
                      context_ktoken_ms=0.5, prefill_step_ms=20, prefill_seq_ms=5)


def test_a_step_with_prompt_tokens_pays_the_eager_path_and_per_prefilling_sequence():
    assert EAGER.step_ms(0, 10, 2000) == pytest.approx(3 + 0.2 + 1.0)  # a graph decode step
    # 2 prompts (1,000 tokens) beside 10 decodes: 3 + 10 + 0.2 + 1.5 + 20 + 2 x 5
    assert EAGER.step_ms(1000, 10, 3000, prefill_seqs=2) == pytest.approx(44.7)
    assert EAGER.step_ms(1000, 0, 1000) == pytest.approx(3 + 10 + 0.5 + 20 + 5)  # one prompt
    old = StepCostModel(3, 0.01, 0.02, 0.5)  # a model fitted before the eager terms
    assert old.step_ms(1000, 0, 1000) == pytest.approx(13.5)


def test_the_simulator_counts_prefilling_sequences_per_step():
    # two 4-token prompts at t=0 share one step: 20 + 2 x 5 ms; then one decode step of both
    cost = StepCostModel(0, 0, 0, 0, prefill_step_ms=20, prefill_seq_ms=5)
    run = simulate_serving([0.0, 0.0], [4, 4], [2, 2], cost, block_size=4, num_blocks=8)
    assert [s.end_s - s.start_s for s in run.steps] == pytest.approx([0.030, 0.0])


def synthetic_steps(model: StepCostModel, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = 400
    prefill = np.where(rng.random(n) < 0.3, rng.integers(1, 2048, n), 0)
    decode = rng.integers(0, 64, n)
    decode[(prefill == 0) & (decode == 0)] = 1
    seqs = np.where(prefill > 0, rng.integers(1, 4, n), 0)
    context = prefill + decode * rng.integers(100, 4000, n)
    time = [model.step_ms(p, d, c, s) for p, d, c, s in zip(prefill, decode, context, seqs)]
    return pd.DataFrame(dict(model="m", block_size=16, kv_cache_dtype="auto",
                             num_prefill_tokens=prefill, num_decode_seqs=decode,
                             num_context_tokens=context, batch_size=decode + seqs,
                             step_time_ms=time))


def test_fit_recovers_both_paths_and_drops_a_compile_stall_not_prefill_steps():
    steps = synthetic_steps(EAGER)
    steps.loc[0, "step_time_ms"] = 600.0  # a one-off compile
    (row,) = fit_step_cost(steps)
    for name in ("base_ms", "prefill_token_ms", "decode_seq_ms", "context_ktoken_ms",
                 "prefill_step_ms", "prefill_seq_ms"):
        assert row[name] == pytest.approx(getattr(EAGER, name), rel=1e-6, abs=1e-9)
    assert row["num_steps"] == len(steps) - 1  # every prefill step kept, the stall dropped
    assert row["rel_err_median_mixed"] == pytest.approx(0, abs=1e-9)


def test_step_kinds_and_prefilling_sequences():
    frame = pd.DataFrame(dict(num_prefill_tokens=[0, 100, 100], num_decode_seqs=[3, 0, 2],
                              batch_size=[3, 2, 3]))
    assert step_kinds(frame).tolist() == ["decode", "prefill", "mixed"]
    assert prefill_seqs(frame).tolist() == [0, 2, 1]
    assert prefill_seqs(frame.drop(columns="batch_size")).tolist() == [0, 1, 1]


def test_replaying_measured_steps_reproduces_their_times_when_the_schedule_matches():
    cost = StepCostModel(1, 0, 0, 0)
    run = simulate_serving([0.0, 0.0], [4, 4], [3, 3], cost, block_size=4, num_blocks=8)
    measured = pd.DataFrame([dict(num_prefill_tokens=s.num_prefill_tokens,
                                  num_decode_seqs=s.num_decode_seqs,
                                  num_context_tokens=s.num_context_tokens,
                                  step_time_ms=7.0 * (k + 1)) for k, s in enumerate(run.steps)])
    replay = MeasuredSteps(measured, cost)
    again = simulate_serving([0.0, 0.0], [4, 4], [3, 3], replay, block_size=4, num_blocks=8)
    assert replay.matched == len(run.steps) == 3
    assert again.duration_s == pytest.approx((7 + 14 + 21) / 1e3)
    other = MeasuredSteps(measured.assign(num_decode_seqs=9), cost)  # another schedule's steps
    simulate_serving([0.0, 0.0], [4, 4], [3, 3], other, block_size=4, num_blocks=8)
    assert other.matched == 0  # every step falls back to the model


def test_replay_keeps_the_engines_clock_only_with_the_host_time_between_steps():
    # the engine: 1 ms steps, 0.5 ms of host time after each (not in step_time_ms); the
    # second request arrives at 2.6 ms, after the third step's start on the engine's clock
    # (3.0 ms) but not on a clock of steps back to back (2.0 ms)
    engine = simulate_serving([0.0, 0.0026], [4, 4], [3, 3], StepCostModel(1.5, 0, 0, 0),
                              block_size=4, num_blocks=8)
    measured = pd.DataFrame([dict(num_prefill_tokens=s.num_prefill_tokens,
                                  num_decode_seqs=s.num_decode_seqs,
                                  num_context_tokens=s.num_context_tokens, step_time_ms=1.0)
                             for s in engine.steps])
    fallback = StepCostModel(100, 0, 0, 0)
    back_to_back = MeasuredSteps(measured, fallback)
    simulate_serving([0.0, 0.0026], [4, 4], [3, 3], back_to_back, block_size=4, num_blocks=8)
    assert back_to_back.matched < len(engine.steps)
    replay = MeasuredSteps(measured, fallback, gap_ms=0.5)
    again = simulate_serving([0.0, 0.0026], [4, 4], [3, 3], replay, block_size=4,
                             num_blocks=8)
    assert replay.matched == len(engine.steps)
    assert again.duration_s == pytest.approx(engine.duration_s)


def test_inter_step_gap_is_the_median_over_runs_with_every_request_at_once():
    steps = pd.DataFrame(dict(trace="t", request_rate=[math.inf] * 3 + [math.inf] * 2 + [4.0],
                              repeat=[0, 0, 0, 1, 1, 0], step_time_ms=[1.0, 2, 3, 4, 4, 1]))
    rows = [dict(trace="t", request_rate=math.inf, repeat=0, duration_s=0.0066),  # 0.2 ms
            dict(trace="t", request_rate=math.inf, repeat=1, duration_s=0.0090),  # 0.5 ms
            dict(trace="t", request_rate=4.0, repeat=0, duration_s=9.0)]  # idle: not counted
    assert inter_step_gap_ms(steps, rows) == pytest.approx(0.35)
    assert inter_step_gap_ms(steps, rows[2:]) == 0.0


def test_gc_timer_sees_collections_while_installed():
    with GCTimer() as timer:
        gc.collect()
    gc.collect()
    assert timer.collections == 1 and timer.total_s >= 0
    assert timer not in gc.callbacks


def test_the_heap_is_frozen_only_while_the_timed_runs_last():
    from pagebench.measure.serving import frozen_heap

    before = gc.get_freeze_count()
    with frozen_heap():
        assert gc.get_freeze_count() > before
    assert gc.get_freeze_count() == 0
