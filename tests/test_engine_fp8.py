"""LLMEngine with an fp8 KV cache: one byte per element (twice a bf16 pool's blocks),
calibrated scales, and greedy output close to the unquantised cache's on a tiny random model."""

import pytest
import torch
from engine_models import greedy, random_prompts

from pagebench.engine import LLMEngine
from pagebench.errors import ConfigError

pytest.importorskip("transformers")


def agreement(a, b) -> float:
    """Fraction of positions where two greedy continuations agree, up to the first difference
    of each sequence (after one difference the contexts differ)."""
    same = total = 0
    for x, y in zip(a, b):
        total += len(x)
        for s, t in zip(x, y):
            if s != t:
                break
            same += 1
    return same / total


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_cache_doubles_the_pool_and_keeps_greedy_output_close(kv_cache_dtype, tiny_model):
    model = tiny_model()
    prompts = random_prompts([5, 17, 40, 33])
    base = LLMEngine(model, block_size=8, kv_cache_memory="1MiB")
    fp8 = LLMEngine(model, block_size=8, kv_cache_memory="1MiB", kv_cache_dtype=kv_cache_dtype,
                    check_kernel_inputs=True, max_num_batched_tokens=32)
    assert fp8.runner.kv.element_size() == 1  # the model is float32: 4x the blocks
    assert fp8.num_blocks == base.num_blocks * base.runner.kv.element_size()
    expected, got = greedy(base, prompts, 12), greedy(fp8, prompts, 12)
    scales = fp8.runner.kv_scales
    assert bool(torch.isfinite(scales).all() & (scales > 0).all()) and all(fp8.runner.calibrated)
    # the tiny model's sharp random logits make greedy paths fork early on small errors
    # (measured 0.46-0.62 here); a cache read without its scales agrees on almost nothing
    assert agreement(expected, got) >= 0.3, (expected, got)


def test_unknown_kv_cache_dtype_is_a_config_error(tiny_model):
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        LLMEngine(tiny_model(), num_blocks=8, kv_cache_dtype="int3")
    # a float cache of another dtype than the model's was sized, then failed at the first
    # store with torch's RuntimeError
    for name in ("float16", torch.bfloat16):
        with pytest.raises(ConfigError, match="neither the model's dtype"):
            LLMEngine(tiny_model(), num_blocks=8, kv_cache_dtype=name)
    assert LLMEngine(tiny_model(), num_blocks=8, kv_cache_dtype="float32").num_blocks == 8


def test_fp8_cache_through_triton_equals_torch(tiny_model):
    """Both backends read the same stored fp8 values with the same scales: equal greedy tokens
    (float32 model), through decode and through a chunked prefill that reads the cache."""
    pytest.importorskip("triton")
    model = tiny_model()
    prompts = random_prompts([5, 40])
    runs = [greedy(LLMEngine(model, block_size=8, kv_cache_memory="1MiB", kernel=kernel,
                             kv_cache_dtype="fp8_e4m3", max_num_batched_tokens=32), prompts, 6)
            for kernel in ("torch", "triton")]
    assert runs[0] == runs[1]
