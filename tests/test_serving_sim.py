"""The serving simulator with a given step-cost model: a hand-computed trace, preemption, the
prefix cache, and the engine's own schedule reproduced step by step."""

from __future__ import annotations

import pytest

from pagebench.errors import ConfigError
from pagebench.sim.latency import serving_metrics
from pagebench.sim.serving import simulate_serving
from pagebench.sim.step_cost import StepCostModel

PREFILL_ONLY = StepCostModel(base_ms=10, prefill_token_ms=1, decode_seq_ms=0, context_ktoken_ms=0)


def test_hand_computed_trace():
    # r0 (t=0, 4 prompt tokens, 2 out) runs alone: 10 + 4 ms, first token at 14 ms; r1
    # (t=5 ms, 3 prompt, 1 out) joins at 14 ms beside r0's decode: 10 + 3 ms, both end at 27
    run = simulate_serving([0.0, 0.005], [4, 3], [2, 1], PREFILL_ONLY, block_size=4,
                           num_blocks=10)
    r0, r1 = run.requests
    assert r0.token_s == pytest.approx([0.014, 0.027]) and r1.token_s == pytest.approx([0.027])
    assert r1.first_scheduled_s == pytest.approx(0.014)
    assert [(s.num_prefill_tokens, s.num_decode_seqs, s.num_context_tokens)
            for s in run.steps] == [(4, 0, 4), (3, 1, 5 + 3)]
    assert run.steps[1].blocks_used == 2 + 1  # r0 grew into a second block of 4
    m = serving_metrics(run.requests, run.duration_s, slo_ttft_s=0.02)
    assert m["ttft_mean_ms"] == pytest.approx((14 + 22) / 2)
    assert m["tpot_mean_ms"] == pytest.approx(13)
    assert m["queue_p50_ms"] == pytest.approx(4.5)  # 0 and 9 ms
    assert m["num_good_requests"] == 1  # r1's 22 ms misses the 20 ms TTFT SLO


def test_idle_time_passes_until_the_next_arrival():
    run = simulate_serving([0.0, 1.0], [2, 2], [1, 1], PREFILL_ONLY, block_size=4,
                           num_blocks=4)
    assert [t.token_s for t in run.requests] == [pytest.approx([0.012]),
                                                 pytest.approx([1.012])]


def test_chunked_prefill_and_preemption_by_recompute():
    cost = StepCostModel(1, 0, 0, 0)  # every step 1 ms
    # budget 4: a 10-token prompt takes steps of 4, 4, 2 tokens
    run = simulate_serving([0.0], [10], [1], cost, block_size=4, num_blocks=4,
                           max_num_batched_tokens=4)
    assert [s.num_prefill_tokens for s in run.steps] == [4, 4, 2]
    assert run.requests[0].token_s == pytest.approx([0.003])
    # two requests of 3 + 4 tokens in a pool of 3 blocks of 2: the later one is preempted
    # when the earlier needs its third block, then recomputed (prompt and output)
    run = simulate_serving([0.0, 0.0], [3, 3], [4, 4], cost, block_size=2, num_blocks=4)
    assert run.num_preemptions >= 1
    assert [t.num_output for t in run.requests] == [4, 4]
    times = [x for t in run.requests for x in [t.arrival_s, *t.token_s]]
    assert all(t.finish_s == t.token_s[-1] for t in run.requests) and min(times) == 0


def test_prefix_cache_hits_skip_the_shared_blocks():
    ids = [[7, 8], [7, 9]]  # share their first 512-token span
    kwargs = dict(block_size=16, num_blocks=200, hash_ids=ids)
    on = simulate_serving([0.0, 0.5], [700, 700], [1, 1], PREFILL_ONLY, prefix_caching=True,
                          **kwargs)
    off = simulate_serving([0.0, 0.5], [700, 700], [1, 1], PREFILL_ONLY, **kwargs)
    assert on.num_cached_prompt_tokens == 512 and off.num_cached_prompt_tokens == 0
    assert on.steps[-1].num_prefill_tokens == 700 - 512
    assert on.requests[1].ttft_s < off.requests[1].ttft_s


def test_refuses_what_cannot_run():
    with pytest.raises(ConfigError, match="num_blocks"):
        simulate_serving([0.0], [100], [1], PREFILL_ONLY, block_size=4, num_blocks=2)
    with pytest.raises(ConfigError, match="one value per request"):
        simulate_serving([0.0], [1, 2], [1], PREFILL_ONLY, block_size=4, num_blocks=2)
    with pytest.raises(ConfigError, match="base_ms"):
        StepCostModel(-1, 0, 0, 0)


def test_schedule_matches_the_engine_step_for_step():
    from pagebench.measure.engine_bench import random_prompts, tiny_model
    from pagebench.engine.engine import LLMEngine
    from pagebench.engine.sampling import SamplingParams

    prompts = random_prompts(6, 5, 90, 1000, seed=2)
    outputs = [30, 40, 10, 36, 24, 42]  # a pool of 18 blocks preempts three times
    engine = LLMEngine(tiny_model(), block_size=8, num_blocks=18, max_num_seqs=4,
                       max_num_batched_tokens=64)
    engine.generate(prompts, [SamplingParams(max_tokens=o, ignore_eos=True) for o in outputs])
    run = simulate_serving([0.0] * 6, [len(p) for p in prompts], outputs, PREFILL_ONLY,
                           block_size=8, num_blocks=18, max_num_seqs=4,
                           max_num_batched_tokens=64)
    assert engine.stats.num_preemptions == run.num_preemptions > 0
    assert [(s.num_prefill_tokens, s.num_decode_seqs, s.num_context_tokens)
            for s in engine.stats.steps] == \
        [(s.num_prefill_tokens, s.num_decode_seqs, s.num_context_tokens) for s in run.steps]


FLAT_10MS = StepCostModel(base_ms=10, prefill_token_ms=0, decode_seq_ms=0, context_ktoken_ms=0)


def test_contiguous_reservation_admits_one_at_a_time_where_paging_admits_both():
    # two requests at t=0 (2 prompt tokens, 3 out: 4 slots each) in 8 slots of 1. Reserving
    # max_model_len = 8 each, r1 waits until r0 finishes at 30 ms (steps of 10 ms: prefill,
    # two decodes), then runs 30-60 ms; paged, both run 0-30 ms.
    kwargs = dict(block_size=1, num_blocks=8)
    reserved = simulate_serving([0.0, 0.0], [2, 2], [3, 3], FLAT_10MS, reserve_len=[8, 8],
                                **kwargs)
    paged = simulate_serving([0.0, 0.0], [2, 2], [3, 3], FLAT_10MS, **kwargs)
    assert [t.token_s for t in reserved.requests] == [pytest.approx([0.01, 0.02, 0.03]),
                                                      pytest.approx([0.04, 0.05, 0.06])]
    assert [t.token_s for t in paged.requests] == [pytest.approx([0.01, 0.02, 0.03])] * 2
    # KV entries held at each step's end (a finishing request's included): prompt, +1, +1
    assert [s.tokens_held for s in reserved.steps] == [2, 3, 4, 2, 3, 4]
    assert [s.blocks_used for s in reserved.steps] == [8] * 6  # held until the step ends
    assert [s.memory_bound for s in reserved.steps] == [True] * 3 + [False] * 3
    assert [s.tokens_held for s in paged.steps] == [4, 6, 8]
    assert not any(s.memory_bound for s in paged.steps)
    good = [serving_metrics(r.requests, r.duration_s, slo_ttft_s=0.02)["num_good_requests"]
            for r in (reserved, paged)]
    assert good == [1, 2]


def test_reservation_inputs_are_refused():
    with pytest.raises(ConfigError, match="reserve_len"):
        simulate_serving([0.0], [4], [4], FLAT_10MS, block_size=1, num_blocks=64,
                         reserve_len=[6])  # 7 slots needed
    with pytest.raises(ConfigError, match="prefix_caching"):
        simulate_serving([0.0], [4], [4], FLAT_10MS, block_size=1, num_blocks=64,
                         reserve_len=[8], prefix_caching=True)
    with pytest.raises(ConfigError, match="num_blocks"):  # one reservation exceeds the pool
        simulate_serving([0.0], [4], [4], FLAT_10MS, block_size=1, num_blocks=7,
                         reserve_len=[8])
