import json

import pytest

from pagebench.config import KVGeometry
from pagebench.errors import ConfigError
from pagebench.sim.capacity import (ARTICLE_CASE, article_budget_tokens, article_capacity,
                                    capacity_plan, estimate_num_parameters, format_capacity)


def test_qwen_geometry_and_article_arithmetic():
    plan = article_capacity()
    assert plan["bytes_per_token"] == 12_288
    assert plan["bytes_per_block"] == 196_608
    assert plan["kv_cache_bytes"] == 12_400_000_000  # 16 GB x 0.9 - 1 GB - 1 GB
    assert plan["num_blocks"] == 12_400_000_000 // 196_608 == 63_069
    assert plan["cacheable_tokens"] == 63_069 * 16 == article_budget_tokens()
    assert plan["max_concurrency_naive"] == 1_009_104 // 4096 == 246  # "about 250"
    # paged holds the sampled sequences at ~98% token utilisation
    assert plan["token_utilisation_paged"] == pytest.approx(0.980, abs=5e-4)
    assert plan["max_concurrency_paged"] > 10 * plan["max_concurrency_naive"]
    assert (plan["max_concurrency_naive"] < plan["max_concurrency_pow2"]
            < plan["max_concurrency_paged"] <= plan["max_concurrency_oracle"])


@pytest.mark.parametrize("model, params", [
    ("qwen2.5-0.5b", 494_032_768), ("qwen2.5-7b", 7_615_616_512),
    ("llama-3-8b", 8_030_261_248), ("llama-3-70b", 70_553_706_496),
    ("mistral-7b", 7_248_023_552),
])
def test_parameter_estimates_match_published_counts(model, params):
    assert estimate_num_parameters(model) == params


def test_default_weights_are_estimated_and_said_so():
    plan = capacity_plan("qwen2.5-0.5b", gpu_memory="16GiB", gpu_memory_utilization=0.9)
    assert plan["weights_bytes"] == 494_032_768 * 2
    assert "estimated" in plan["weights_source"]
    assert plan["kv_cache_bytes"] == int(16 * 2**30 * 0.9) - 988_065_536
    assert plan["num_blocks"] == plan["kv_cache_bytes"] // 196_608
    text = format_capacity(plan)
    assert "estimated: 494,032,768 parameters" in text and "overhead_bytes is 0" in text


def test_block_size_and_dtype_change_the_geometry():
    plan = capacity_plan("llama-3-8b", kv_cache_bytes="10GiB", block_size=32, dtype="fp8",
                         max_model_len=8192)
    assert plan["bytes_per_token"] == 2 * 32 * 8 * 128 * 1
    assert plan["bytes_per_block"] == 32 * plan["bytes_per_token"]
    assert plan["cacheable_tokens"] == (10 * 2**30 // plan["bytes_per_block"]) * 32
    assert plan["gpu_memory_bytes"] is None


def test_config_path_and_geometry_inputs(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
           "vocab_size": 100, "tie_word_embeddings": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    plan = capacity_plan(str(tmp_path), gpu_memory="1GB", overhead_bytes=0)
    assert plan["bytes_per_token"] == 2 * 2 * 2 * 16 * 2
    assert plan["num_parameters"] == estimate_num_parameters(cfg)
    geometry = KVGeometry(2, 2, 16, 4)
    with pytest.raises(ConfigError, match="weights_bytes"):
        capacity_plan(geometry)
    assert capacity_plan(geometry, weights_bytes=0)["bytes_per_token"] == 256


@pytest.mark.parametrize("kwargs, message", [
    (dict(model="gpt-9"), "model"),
    (dict(gpu_memory="lots"), "gpu_memory"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(gpu_memory="1GB"), "no room"),
    (dict(block_size=0), "block_size"),
    (dict(max_model_len=-1), "max_model_len"),
    (dict(overhead_bytes="-1GB"), "overhead_bytes"),
    (dict(kv_cache_bytes="1KB"), "holds no block"),
    (dict(lengths="zipf:1"), "lengths"),
])
def test_bad_input_names_the_argument(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        capacity_plan(**(dict(ARTICLE_CASE) | kwargs))


def test_fp8_kv_dtype_doubles_the_cache_and_keeps_the_weights():
    bf16 = capacity_plan("llama-3-8b", gpu_memory="141GiB", max_model_len=8192)
    fp8 = capacity_plan("llama-3-8b", gpu_memory="141GiB", max_model_len=8192,
                        kv_dtype="fp8_e4m3")
    assert fp8["weights_bytes"] == bf16["weights_bytes"] and fp8["weights_dtype"] == "bfloat16"
    assert fp8["bytes_per_token"] * 2 == bf16["bytes_per_token"]
    assert fp8["num_blocks"] in (2 * bf16["num_blocks"], 2 * bf16["num_blocks"] + 1)
    assert fp8["dtype"] == "fp8_e4m3" and "KV cache fp8_e4m3" in format_capacity(fp8)


def test_tensor_parallel_halves_bytes_per_gpu_and_weights():
    one = capacity_plan("llama-3-8b", gpu_memory="141GB", kv_cache_bytes=None,
                        overhead_bytes="4GiB")
    two = capacity_plan("llama-3-8b", gpu_memory="141GB", overhead_bytes="4GiB",
                        tensor_parallel_size=2)
    assert two["bytes_per_token"] == one["bytes_per_token"] == 131_072  # the model's
    assert two["bytes_per_token_per_rank"] == 65_536 and two["kv_heads_per_rank"] == 4
    assert two["weights_bytes_per_rank"] == one["weights_bytes"] // 2
    assert two["kv_cache_bytes"] == one["kv_cache_bytes"] + one["weights_bytes"] // 2
    assert two["num_blocks"] == two["kv_cache_bytes"] // 2**20  # 16 tokens x 64 KiB
    assert two["num_blocks_tp1"] == one["num_blocks"]
    assert two["blocks_vs_tp1"] == pytest.approx(two["num_blocks"] / one["num_blocks"])
    assert two["blocks_vs_tp1"] > 2  # half the KV bytes, and room freed by half the weights
    assert two["max_concurrency_paged_per_gpu"] == two["max_concurrency_paged"] / 2
    assert "tensor parallel over 2 GPUs" in format_capacity(two)


def test_tensor_parallel_past_the_kv_heads_replicates_them():
    # equal cache per GPU: 8 KV heads over 16 GPUs hold one head each, like 8 GPUs
    eight = capacity_plan("llama-3-8b", kv_cache_bytes="1GiB", tensor_parallel_size=8)
    sixteen = capacity_plan("llama-3-8b", kv_cache_bytes="1GiB", tensor_parallel_size=16)
    assert sixteen["kv_replication"] == 2 and eight["kv_replication"] == 1
    assert sixteen["kv_heads_per_rank"] == eight["kv_heads_per_rank"] == 1
    assert sixteen["num_blocks"] == eight["num_blocks"] == 8 * eight["num_blocks_tp1"]
    assert "each head on 2 GPUs" in format_capacity(sixteen)


def test_tensor_parallel_size_must_divide_the_heads():
    with pytest.raises(ConfigError, match="tensor_parallel_size: 3"):
        capacity_plan("llama-3-8b", tensor_parallel_size=3)
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        capacity_plan("llama-3-8b", tensor_parallel_size=0)
    plan = capacity_plan("llama-3-70b", gpu_memory="80GB", tensor_parallel_size=4)
    assert plan["blocks_vs_tp1"] is None and "one GPU alone holds no KV cache" in \
        format_capacity(plan)
