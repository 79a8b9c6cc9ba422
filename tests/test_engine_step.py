"""The engine's request API: add_request / step() / has_unfinished_requests, and generate as a
loop over them."""

from __future__ import annotations

import pytest

from pagebench.measure.engine_bench import tiny_model
from pagebench.engine.engine import LLMEngine
from pagebench.engine.sampling import SamplingParams
from pagebench.errors import ConfigError


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_step_loop_equals_generate(model):
    prompts = [list(range(3, 40)), list(range(7, 20)), list(range(1, 60))]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (4, 7, 2)]
    engine = LLMEngine(model, block_size=16, num_blocks=64, max_num_batched_tokens=48)
    expected = engine.generate(prompts, params)
    ids = [engine.add_request(p, s) for p, s in zip(prompts, params)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    streamed = {rid: [] for rid in ids}
    finished = {}
    steps = 0
    while engine.has_unfinished_requests:
        out = engine.step()
        steps += 1
        for rid, tokens in out.new_tokens.items():
            streamed[rid] += tokens
        for request in out.finished:
            assert request.request_id not in finished
            finished[request.request_id] = request
    assert engine.step().new_tokens == {}  # nothing queued: no step
    for rid, want in zip(ids, expected):
        assert finished[rid].outputs[0].token_ids == want.outputs[0].token_ids
        assert streamed[rid] == want.outputs[0].token_ids  # every token streamed once, in order
    assert engine.block_manager.num_used_blocks == 0


def test_parallel_samples_finish_once_with_every_completion(model):
    engine = LLMEngine(model, block_size=16, num_blocks=64)
    params = SamplingParams(max_tokens=5, n=3, temperature=1.0, seed=11, ignore_eos=True)
    rid = engine.add_request(list(range(30)), params)
    finished, tokens = [], 0
    while engine.has_unfinished_requests:
        out = engine.step()
        tokens += len(out.new_tokens.get(rid, []))
        finished += out.finished
    [request] = finished
    assert [len(o.token_ids) for o in request.outputs] == [5, 5, 5]
    assert tokens == 15
    alone = engine.generate([list(range(30))], SamplingParams(
        max_tokens=5, temperature=1.0, seed=12, ignore_eos=True))
    assert alone[0].outputs[0].token_ids == request.outputs[1].token_ids  # seed rule: s + i


def test_bad_request_queues_nothing(model):
    engine = LLMEngine(model, block_size=16, num_blocks=8)
    for prompt, params, message in (
            ([], None, "empty prompt"), ("abc", None, "string"),
            ([1, 2], "greedy", "sampling_params"),
            ([1] * 100, SamplingParams(max_tokens=100), "num_blocks"),
            ([1, 10**9], None, "token ids")):
        with pytest.raises(ConfigError, match=message):
            engine.add_request(prompt, params)
        assert not engine.has_unfinished_requests and not engine.scheduler.has_work


def test_reset_prefix_cache_forgets_what_a_run_left(model):
    engine = LLMEngine(model, block_size=16, num_blocks=64, enable_prefix_caching=True)
    prompt = list(range(1, 50))
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    engine.generate([prompt], params)
    engine.generate([prompt], params)
    assert engine.stats.prefix_cache_hit_rate > 0
    assert engine.reset_prefix_cache() == 3  # the prompt's three full blocks
    engine.generate([prompt], params)
    assert engine.stats.prefix_cache_hit_rate == 0
    assert engine.block_manager.num_free_blocks == 64


def test_an_interrupted_generate_leaves_nothing_queued(model, monkeypatch):
    engine = LLMEngine(model, block_size=16, num_blocks=64)
    calls = []
    real_step = engine.step

    def step_then_interrupt():
        calls.append(1)
        out = real_step()
        if len(calls) == 2:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(engine, "step", step_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        engine.generate([list(range(20))] * 3, SamplingParams(max_tokens=8, ignore_eos=True))
    assert not engine.has_unfinished_requests and not engine.scheduler.has_work
    assert engine.block_manager.num_used_blocks == 0
    monkeypatch.undo()
    assert len(engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2))) == 1
