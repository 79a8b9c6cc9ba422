"""LLMEngine on random tiny models, block sizes 1-8, pools of 3-10 blocks, n 1-4, prefix caching
on and off, chunked prefill, and prompts that share prefixes.

For every example: ``generate`` completes, or, when a prompt can never fit the pool, refuses the
whole call up front with a ``ConfigError`` starting "num_blocks:" (LLMEngine's documented check)
and then serves the prompts that fit. Afterwards every block is back in the pool (free, or free
and still findable in the prefix cache), with no pending copy and no unwritten block. Greedy
outputs equal transformers' ``generate`` for each prompt (float32 models with spread-out logits;
a divergence is accepted only where the reference's top two logits are a near-tie). Sampled
outputs equal those of the same engine with a pool large enough never to preempt (the seeding
rule: a completion's tokens depend only on its seed, whatever else shares the pool).
"""

from __future__ import annotations

import functools

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, note

from pagebench.engine import LLMEngine, SamplingParams
from pagebench.measure import engine_bench
from pagebench.errors import ConfigError

transformers = pytest.importorskip("transformers")

VOCAB = 64
MAX_POSITIONS = 128
NEAR_TIE = 1e-3  # logit gap below which float32 rounding may pick either token
# (hidden size, attention heads, KV heads): head dims 8 and 16, MHA, GQA and MQA
SHAPES = [(32, 2, 2), (32, 4, 1), (64, 4, 2), (64, 4, 4)]
TOKEN = st.integers(0, VOCAB - 1)


@functools.cache
def tiny_model(family: str, shape: tuple, layers: int, seed: int):
    """The drawn model, built once per draw by the package's builder."""
    hidden, heads, kv_heads = shape
    return engine_bench.tiny_model(seed, family=family, vocab_size=VOCAB, hidden_size=hidden,
                            intermediate_size=2 * hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=kv_heads,
                            max_position_embeddings=MAX_POSITIONS)


@functools.cache
def reference(model_key: tuple, prompt: tuple, max_tokens: int) -> tuple:
    """transformers' greedy continuation (contiguous cache, batch 1)."""
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        out = tiny_model(*model_key).generate(ids, attention_mask=torch.ones_like(ids),
                                              do_sample=False, max_new_tokens=max_tokens,
                                              pad_token_id=0)
    return tuple(out[0, len(prompt):].tolist())


def logit_gap(model_key, context, expected: int, got: int) -> float:
    with torch.inference_mode():
        logits = tiny_model(*model_key)(torch.tensor([context])).logits[0, -1]
    return float(logits[expected] - logits[got])


def assert_greedy_matches(model_key, prompt, tokens, max_tokens):
    expected = reference(model_key, tuple(prompt), max_tokens)
    for j, (want, got) in enumerate(zip(expected, tokens)):
        if want != got:
            gap = logit_gap(model_key, list(prompt) + list(expected[:j]), want, got)
            assert gap < NEAR_TIE, (f"token {j}: engine {got}, transformers {want} (logit gap "
                                    f"{gap:.2e}); engine {tokens}, transformers {list(expected)}")
            return  # past a near-tie the two continuations are different texts


@st.composite
def cases(draw):
    block_size = draw(st.integers(1, 8))
    num_blocks = draw(st.integers(3, 10))
    capacity = block_size * num_blocks
    max_tokens = draw(st.integers(1, min(6, capacity)))
    fits = capacity - max_tokens + 1  # longest prompt the pool can ever hold
    stem = draw(st.lists(TOKEN, min_size=1, max_size=fits))  # shared by some prompts
    prompts = []
    for _ in range(draw(st.integers(1, 4))):
        prompt = stem[:draw(st.integers(0, len(stem)))] + draw(st.lists(TOKEN, max_size=5))
        prompt = prompt or [draw(TOKEN)]
        limit = fits + 1 if draw(st.integers(0, 9)) == 0 else fits  # now and then one too long
        prompts.append(prompt[:limit])
    n = draw(st.integers(1, 4))
    return dict(
        model_key=(draw(st.sampled_from(["llama", "qwen2"])), draw(st.sampled_from(SHAPES)),
                   draw(st.integers(1, 2)), draw(st.integers(0, 2))),
        engine=dict(block_size=block_size, num_blocks=num_blocks,
                    enable_prefix_caching=draw(st.booleans()),
                    max_num_seqs=draw(st.integers(n, 8)),
                    max_num_batched_tokens=draw(st.sampled_from([1, 3, 8, 64])),
                    fresh_prefill=draw(st.booleans()),
                    check_kernel_inputs=draw(st.booleans())),
        params=dict(max_tokens=max_tokens, n=n, ignore_eos=True,
                    temperature=draw(st.sampled_from([0.0, 0.0, 0.7, 1.5])),
                    top_p=draw(st.sampled_from([1.0, 0.8])), seed=draw(st.integers(0, 99))),
        prompts=prompts,
    )


def assert_pool_whole(engine):
    bm = engine.block_manager
    assert bm.seq_ids == [] and bm.num_free_blocks == bm.num_blocks
    assert bm.pending_copies == [] and bm.unwritten_blocks == set()
    if not bm.enable_prefix_caching:
        assert bm.prefix_cache_entries() == []


def completions(outputs):
    return [[o.token_ids for o in r.outputs] for r in outputs]


@pytest.mark.slow  # about 10 s under the ci profile on 2 cores; 15-25 min under long
@given(case=cases())
def test_engine_serves_any_small_configuration(case):
    note(case)
    model_key, prompts = case["model_key"], case["prompts"]
    engine = LLMEngine(tiny_model(*model_key), kernel="torch", **case["engine"])
    params = SamplingParams(**case["params"])
    capacity = engine.block_size * engine.num_blocks
    fitting = [p for p in prompts if len(p) + params.max_tokens - 1 <= capacity]
    if len(fitting) < len(prompts):
        with pytest.raises(ConfigError, match=r"^num_blocks: prompts\[\d+\] needs \d+ blocks"):
            engine.generate(prompts, params)
        assert_pool_whole(engine)
        prompts = fitting
        if not prompts:
            return
    outputs = engine.generate(prompts, params)
    assert_pool_whole(engine)
    assert max(s.batch_size for s in engine.stats.steps) <= case["engine"]["max_num_seqs"]
    assert [len(r.outputs) for r in outputs] == [params.n] * len(prompts)
    for r in outputs:
        for o in r.outputs:
            assert len(o.token_ids) == params.max_tokens and o.finish_reason == "length"
            assert all(0 <= t < VOCAB for t in o.token_ids)
    if params.greedy:
        for prompt, r in zip(prompts, outputs):
            for o in r.outputs:
                assert_greedy_matches(model_key, prompt, o.token_ids, params.max_tokens)
    else:
        roomy = dict(case["engine"], num_blocks=len(prompts) * params.n
                     * (capacity // engine.block_size + 1))
        expected = LLMEngine(tiny_model(*model_key), kernel="torch", **roomy).generate(prompts,
                                                                                       params)
        assert completions(outputs) == completions(expected)
