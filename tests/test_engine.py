"""LLMEngine end to end on tiny random models: equality with transformers' contiguous
``generate``, preemption, copy-on-write, prefix caching, seeded sampling, bad input.

The models are built with ``initializer_range=0.2`` so that their logits are spread out: greedy
decoding in float32 then has no near-ties, and equality token for token is a sharp test.
"""

import dataclasses

import numpy as np
import pytest
import torch
from engine_models import VOCAB, greedy, random_prompts

from pagebench.engine import CompletionOutput, LLMEngine, RequestOutput, SamplingParams
from pagebench.errors import ConfigError

transformers = pytest.importorskip("transformers")

STATS_KEYS = {"peak_blocks", "mean_blocks", "token_utilisation", "num_preemptions",
              "prefix_cache_hit_rate", "num_prompt_tokens", "num_computed_prompt_tokens",
              "num_generated_tokens", "tokens_per_s", "steps"}


def reference(model, prompts, max_tokens):
    """Greedy continuation of each prompt by transformers (contiguous cache, batch 1)."""
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])  # explicit mask: a token 0 in the prompt is not padding
            ids = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_tokens, pad_token_id=0)
            out.append(ids[0, len(p):].tolist())
    return out


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model()


LENGTHS = [1, 7, 16, 33, 120, 300]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def case(model):
    prompts = random_prompts(LENGTHS)
    return prompts, reference(model, prompts, MAX_TOKENS)


@pytest.mark.parametrize("prefix", [False, True], ids=["noprefix", "prefix"])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_greedy_equals_transformers_torch_kernel(model, case, block_size, prefix):
    prompts, expected = case
    engine = LLMEngine(model, block_size=block_size, kernel="torch", num_blocks=4096 // block_size,
                       enable_prefix_caching=prefix, max_num_batched_tokens=128,
                       check_kernel_inputs=True, fresh_prefill=not prefix)
    # fresh_prefill=False: every prompt chunk goes through the paged prefill kernel
    assert greedy(engine, prompts, MAX_TOKENS) == expected
    stats = engine.stats
    assert STATS_KEYS <= {f.name for f in dataclasses.fields(stats)}
    assert stats.num_generated_tokens == len(prompts) * MAX_TOKENS
    assert stats.num_prompt_tokens == sum(LENGTHS)
    assert engine.block_manager.num_used_blocks == 0 or prefix  # all freed (cached may stay)
    assert all(engine.block_manager.ref_count(b) == 0 for b in range(engine.num_blocks))


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_greedy_equals_transformers_triton_kernel(model, case, block_size):
    # Triton runs interpreted on the CPU: a smaller case. Decode and every prompt chunk
    # (fresh_prefill=False) go through Triton's paged kernels.
    prompts, expected = case[0][:3], [e[:5] for e in case[1][:3]]
    engine = LLMEngine(model, block_size=block_size, kernel="triton",
                       num_blocks=2048 // block_size, enable_prefix_caching=block_size == 16,
                       max_num_batched_tokens=64, fresh_prefill=False)
    assert engine.runner.decode_backend.name == "triton"
    assert engine.runner.prefill_backend.name == "triton"
    assert greedy(engine, prompts, 5) == expected


@pytest.mark.parametrize("prefix", [False, True], ids=["noprefix", "prefix"])
def test_preemption_keeps_outputs_equal(model, prefix):
    # six prompts of 2 blocks each fit a pool of 14 blocks; growing to 3 blocks each they don't
    prompts = random_prompts([30, 31, 25, 28, 32, 20], seed=11)
    expected = reference(model, prompts, MAX_TOKENS)
    engine = LLMEngine(model, block_size=16, num_blocks=14, kernel="torch",
                       enable_prefix_caching=prefix, max_num_batched_tokens=64)
    assert greedy(engine, prompts, MAX_TOKENS) == expected
    assert engine.stats.num_preemptions > 0
    assert engine.stats.peak_blocks <= 14
    assert engine.stats.num_computed_prompt_tokens > engine.stats.num_prompt_tokens


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
def test_other_families(case, family, tiny_model):
    model = tiny_model(family, seed=3)
    prompts = case[0][:4]
    expected = reference(model, prompts, 8)
    engine = LLMEngine(model, block_size=8, num_blocks=256, kernel="torch")
    assert greedy(engine, prompts, 8) == expected
    if family == "mistral":  # sliding window 256: longer sequences are refused, not mis-served
        assert engine.max_model_len == 256
        with pytest.raises(ConfigError, match="sliding window .* of 256 positions"):
            engine.generate([[1] * 250], SamplingParams(max_tokens=8))


def test_outputs_types_and_order(model):
    prompts = random_prompts([5, 40, 3], seed=4)
    res = LLMEngine(model, num_blocks=64, kernel="torch").generate(
        prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    assert [r.prompt_token_ids for r in res] == prompts
    assert all(isinstance(r, RequestOutput) and isinstance(r.outputs[0], CompletionOutput)
               for r in res)
    assert all(r.outputs[0].finish_reason == "length" and len(r.outputs[0].token_ids) == 4
               for r in res)


def test_eos_stops_unless_ignored(model, case):
    prompts, expected = case
    eos = expected[3][2]  # the third token greedy decoding produces for prompt 3
    engine = LLMEngine(model, num_blocks=256, kernel="torch")
    engine.eos_token_ids = {eos}
    out = engine.generate([prompts[3]], SamplingParams(max_tokens=MAX_TOKENS))[0].outputs[0]
    first = expected[3].index(eos)
    assert out.token_ids == expected[3][:first + 1] and out.finish_reason == "stop"
    out = engine.generate([prompts[3]], SamplingParams(max_tokens=MAX_TOKENS,
                                                       ignore_eos=True))[0].outputs[0]
    assert out.token_ids == expected[3] and out.finish_reason == "length"


def test_end_tokens_are_the_generation_configs_as_in_generate(tiny_model):
    """model.generate stops at the generation config's end tokens only: with them set to None
    it runs on past the model config's (LlamaConfig's default 2), and so does the engine."""
    model = tiny_model("llama")
    assert model.config.eos_token_id == 2 and model.generation_config.eos_token_id is None
    assert LLMEngine(model, num_blocks=32, kernel="torch").eos_token_ids == set()
    model.generation_config.eos_token_id = [5, 7]
    assert LLMEngine(model, num_blocks=32, kernel="torch").eos_token_ids == {5, 7}
    del model.generation_config  # no generation config at all: the model config's
    assert LLMEngine(model, num_blocks=32, kernel="torch").eos_token_ids == {2}


@pytest.mark.parametrize("max_num_seqs", [4, 5, 8])
def test_requests_with_several_samples_keep_the_batch_within_max_num_seqs(model, max_num_seqs):
    """A request with n = 2 holds two places from its admission: the requests admitted in the
    same step used to be charged only for its prompt, and its siblings forked in on top
    (batches of 6 under max_num_seqs 4, 14 under 8)."""
    engine = LLMEngine(model, num_blocks=256, kernel="torch", max_num_seqs=max_num_seqs)
    res = engine.generate(random_prompts([3] * 8, seed=2),
                          SamplingParams(max_tokens=4, n=2, ignore_eos=True))
    sizes = [s.batch_size for s in engine.stats.steps]
    assert max(sizes) == max_num_seqs - max_num_seqs % 2  # full, and never over
    assert all(len(o.token_ids) == 4 for r in res for o in r.outputs)


@pytest.mark.slow
def test_seeded_sampling_is_reproducible(model):
    prompts = random_prompts([10, 50], seed=5)
    engine = LLMEngine(model, num_blocks=128, kernel="torch")
    params = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=123, ignore_eos=True)
    first = [r.outputs[0].token_ids for r in engine.generate(prompts, params)]
    again = [r.outputs[0].token_ids for r in engine.generate(prompts, params)]
    other = [r.outputs[0].token_ids for r in engine.generate(
        prompts, SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=124,
                                ignore_eos=True))]
    assert first == again
    assert first != other


@pytest.mark.slow
def test_n4_shares_prompt_blocks_and_matches_unshared_runs(model):
    prompt = random_prompts([400], seed=6)[0]
    engine = LLMEngine(model, block_size=16, num_blocks=256, kernel="torch")
    params = dict(max_tokens=24, temperature=1.0, ignore_eos=True)
    res = engine.generate([prompt], SamplingParams(n=4, seed=77, **params))[0]
    peak4 = engine.stats.peak_blocks
    assert engine.stats.num_generated_tokens == 4 * 24
    singles = []
    for i in range(4):
        out = engine.generate([prompt], SamplingParams(n=1, seed=77 + i, **params))
        singles.append(out[0].outputs[0].token_ids)
    peak1 = engine.stats.peak_blocks
    assert [o.index for o in res.outputs] == [0, 1, 2, 3]
    assert [o.token_ids for o in res.outputs] == singles  # the seeding rule
    assert len({tuple(s) for s in singles}) > 1  # the completions do diverge
    assert peak4 < 1.5 * peak1, (peak4, peak1)


@pytest.mark.slow
def test_n4_with_preemption_matches(model):
    prompt = random_prompts([60], seed=7)[0]
    params = dict(max_tokens=40, temperature=0.8, seed=5, ignore_eos=True)
    roomy = LLMEngine(model, block_size=8, num_blocks=256, kernel="torch")
    tight = LLMEngine(model, block_size=8, num_blocks=20, kernel="torch")
    expected = [o.token_ids for o in roomy.generate([prompt], SamplingParams(n=4, **params))[0].outputs]
    got = [o.token_ids for o in tight.generate([prompt], SamplingParams(n=4, **params))[0].outputs]
    assert tight.stats.num_preemptions > 0
    assert got == expected


def test_prefix_caching_shares_a_system_prompt(model):
    system = random_prompts([96], seed=8)[0]
    prompts = [system + p for p in random_prompts([5, 9, 14, 20, 3, 11], seed=9)]
    runs = {}
    for on in (False, True):
        engine = LLMEngine(model, block_size=16, num_blocks=256, kernel="torch",
                           enable_prefix_caching=on, max_num_batched_tokens=100)
        runs[on] = (greedy(engine, prompts, 10), engine.stats)
    (out_off, off), (out_on, on) = runs[False], runs[True]
    assert out_on == out_off
    assert off.prefix_cache_hit_rate == 0 and on.prefix_cache_hit_rate > 0
    assert on.num_computed_prompt_tokens < off.num_computed_prompt_tokens
    assert off.num_computed_prompt_tokens == off.num_prompt_tokens
    assert on.peak_blocks < off.peak_blocks


def test_models_the_kernels_cannot_run_are_refused_when_built():
    # Gemma 2 soft-caps its scores, which the paged kernels would silently skip; GPT-2 has no
    # `.layers` and failed at the first step
    gemma = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16))
    with pytest.raises(ConfigError, match="attn_logit_softcapping"):
        LLMEngine(gemma, num_blocks=8, kernel="torch")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128))
    with pytest.raises(ConfigError, match="no list of decoder layers"):
        LLMEngine(gpt2, num_blocks=8, kernel="torch")


def engine_is_usable(engine, model):
    prompts = random_prompts([9, 4], seed=10)
    assert greedy(engine, prompts, 3) == reference(model, prompts, 3)
    assert all(engine.block_manager.ref_count(b) == 0 for b in range(engine.num_blocks))


def test_bad_input_is_a_clear_error_and_engine_stays_usable(model):
    engine = LLMEngine(model, block_size=16, num_blocks=8, kernel="torch")
    params = SamplingParams(max_tokens=3)
    with pytest.raises(ConfigError, match=r"prompts\[1\]: empty prompt"):
        engine.generate([[1, 2], []], params)
    with pytest.raises(ConfigError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ConfigError, match="max_tokens"):
        SamplingParams(max_tokens=2.5)
    with pytest.raises(ConfigError, match="temperature"):
        SamplingParams(temperature=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.max_tokens = 0  # checked once: a built SamplingParams cannot turn invalid
    # NumPy numbers are numbers, as token ids are
    assert SamplingParams(max_tokens=np.int64(3), temperature=np.float32(0.5)) == \
        SamplingParams(max_tokens=3, temperature=0.5)
    with pytest.raises(ConfigError, match="sampling_params"):
        engine.generate([[1, 2]], {"max_tokens": 3})
    with pytest.raises(ConfigError, match=r"prompts\[0\].*maximum of 512 positions"):
        engine.generate([[1] * 600], params)
    with pytest.raises(ConfigError, match=r"num_blocks: prompts\[0\] needs 9 blocks"):
        engine.generate([[1] * 140], params)  # fits the model, not the pool of 8 blocks
    with pytest.raises(ConfigError, match=r"prompts\[0\]: token ids"):
        engine.generate([[VOCAB]], params)
    with pytest.raises(ConfigError, match=r"prompts\[0\]: token ids"):
        engine.generate([[True, False]], params)  # bools are not token ids
    with pytest.raises(ConfigError, match=r"prompts\[0\]: expected a list of token ids, got int"):
        engine.generate([1, 2, 3], params)  # one prompt, not wrapped in a list
    # token ids as NumPy integers (an array, or a list of its elements) are token ids
    ids = np.array([5, 6, 7])
    first = engine.generate([ids, list(ids)], params)
    assert first[0].outputs[0].token_ids == first[1].outputs[0].token_ids
    assert first[0].prompt_token_ids == [5, 6, 7]
    engine_is_usable(engine, model)


def test_bad_engine_arguments(model):
    with pytest.raises(ConfigError, match="kernel"):
        LLMEngine(model, kernel="no-such-kernel", num_blocks=8)
    with pytest.raises(ConfigError, match="block_size"):
        LLMEngine(model, block_size=0, num_blocks=8)
    with pytest.raises(ConfigError, match="num_blocks"):
        LLMEngine(model, num_blocks=0)
    with pytest.raises(ConfigError, match="kv_cache_memory"):
        LLMEngine(model, kv_cache_memory=100)
    with pytest.raises(ConfigError, match="max_num_seqs"):
        LLMEngine(model, num_blocks=8, max_num_seqs=0)
    with pytest.raises(ConfigError, match="max_model_len: must be a positive integer"):
        LLMEngine(model, num_blocks=8, max_model_len=0)  # was taken as "not given"
    with pytest.raises(ConfigError, match="n: 5 completions exceed max_num_seqs"):
        LLMEngine(model, num_blocks=64, max_num_seqs=4).generate([[1]], SamplingParams(n=5))


def test_pool_sized_from_memory_budget(model):
    engine = LLMEngine(model, block_size=16, kv_cache_memory="1MiB", kernel="torch")
    # 2 layers x K,V x 2 kv heads x head_dim 16 x 4 bytes = 512 bytes per token
    assert engine.num_blocks == 2**20 // (512 * 16)
    assert engine.runner.kv_cache_bytes == engine.num_blocks * 512 * 16


def test_error_during_a_step_leaves_engine_usable(model, monkeypatch):
    engine = LLMEngine(model, block_size=16, num_blocks=64, kernel="torch")

    def boom(*args, **kwargs):
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(engine.runner, "execute", boom)
    with pytest.raises(RuntimeError, match="kernel failed"):
        engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    monkeypatch.undo()
    assert engine.block_manager.num_used_blocks == 0
    engine_is_usable(engine, model)


def test_weights_load_from_a_local_directory(model, case, tmp_path):
    model.save_pretrained(tmp_path / "tiny")
    prompts, expected = case
    engine = LLMEngine(str(tmp_path / "tiny"), block_size=16, num_blocks=256, kernel="torch")
    assert greedy(engine, prompts[:3], MAX_TOKENS) == expected[:3]
    with pytest.raises(ConfigError, match="not a local model directory"):
        LLMEngine(str(tmp_path / "missing"))


@pytest.mark.parametrize("fresh_prefill", [True, False], ids=["fresh", "paged"])
def test_prompts_sharing_a_prefix_share_it_within_one_step(model, fresh_prefill):
    # issue 13: the four prompts are admitted in one step; the first one's prefix blocks are
    # findable as soon as it is scheduled, and the others read them after that step writes them
    # (the first prompt attends to its own K/V, fresh or through the cache; the others through
    # the cache, in a paged-prefill group)
    system = random_prompts([64], seed=12)[0]
    prompts = [system + p for p in random_prompts([3, 9, 16, 21], seed=13)]
    runs = {}
    for on in (False, True):
        engine = LLMEngine(model, block_size=16, num_blocks=64, kernel="torch",
                           enable_prefix_caching=on, fresh_prefill=fresh_prefill)
        runs[on] = (greedy(engine, prompts, 8), engine.stats)
        assert engine.block_manager.unwritten_blocks == set()
        assert engine.block_manager.num_free_blocks == 64
    (out_off, off), (out_on, on) = runs[False], runs[True]
    assert on.steps[0].batch_size == 4  # one step admitted them all
    assert out_on == out_off == reference(model, prompts, 8)
    assert on.prefix_cache_hit_rate == 3 * 64 / on.num_prompt_tokens
    assert on.num_computed_prompt_tokens == off.num_computed_prompt_tokens - 3 * 64
    assert on.peak_blocks < off.peak_blocks


def test_a_failed_step_leaves_no_unwritten_block_findable(model, monkeypatch):
    engine = LLMEngine(model, block_size=4, num_blocks=64, kernel="torch",
                       enable_prefix_caching=True)
    prompts = random_prompts([13], seed=14)

    def boom(*args, **kwargs):
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(engine.runner, "execute", boom)
    with pytest.raises(RuntimeError, match="kernel failed"):
        engine.generate(prompts, SamplingParams(max_tokens=2))
    monkeypatch.undo()
    assert engine.block_manager.prefix_cache_entries() == []  # their KV was never written
    assert greedy(engine, prompts, 4) == reference(model, prompts, 4)
    assert engine.stats.prefix_cache_hit_rate == 0


def test_n3_under_memory_pressure_does_not_crash():
    # issue 12 item 3, as reported: a block freed by a preemption was reused as a
    # copy-on-write destination while its own pending copy still had to read it
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    prompts = [[112, 102, 252], [217, 231]]
    params = SamplingParams(max_tokens=4, n=3, temperature=1.0, seed=0, ignore_eos=True)
    engine = LLMEngine(model, block_size=4, num_blocks=4, kernel="torch")
    got = [[o.token_ids for o in r.outputs] for r in engine.generate(prompts, params)]
    assert engine.stats.num_preemptions > 0
    assert engine.block_manager.num_free_blocks == 4
    roomy = LLMEngine(model, block_size=4, num_blocks=64, kernel="torch")
    assert got == [[o.token_ids for o in r.outputs] for r in roomy.generate(prompts, params)]


def test_a_tiny_temperature_acts_as_greedy(model):
    # issue 12 item 5: logits / 1e-45 overflowed to inf, softmax gave NaN, argmax token 0
    prompts = random_prompts([5, 17], seed=15)
    engine = LLMEngine(model, block_size=16, num_blocks=64, kernel="torch")
    expected = greedy(engine, prompts, 6)
    for temperature in (1e-45, 1e-300, 1e-30):
        res = engine.generate(prompts, SamplingParams(max_tokens=6, temperature=temperature,
                                                      seed=0, ignore_eos=True))
        assert [r.outputs[0].token_ids for r in res] == expected, temperature
