"""pagebench.defaults: shapes derived from the presets, and one block-size list that the kernel
sweep measures, the simulator simulates and the recommendation ranges over."""

from __future__ import annotations

import pytest

from pagebench import defaults
from pagebench.config import KVGeometry


def test_kernel_shapes_are_the_presets_attention_shapes():
    assert defaults.SHAPES == {"llama-3-8b": (32, 8, 128), "qwen2.5-0.5b": (14, 2, 64)}
    for name, (q_heads, kv_heads, head_dim) in defaults.SHAPES.items():
        geometry = KVGeometry.from_name(name)
        assert (geometry.num_q_heads, geometry.num_kv_heads, geometry.head_dim) == \
            (q_heads, kv_heads, head_dim)
    with pytest.raises(ValueError, match="model"):
        defaults.attention_shape("gpt-17")


def test_block_size_lists_are_derived_from_one():
    assert defaults.BLOCK_SIZE in defaults.BLOCK_SIZES
    assert set(defaults.SHORT_BLOCK_SIZES) <= set(defaults.BLOCK_SIZES)
    assert set(defaults.ENGINE_BLOCK_SIZES) == set(defaults.BLOCK_SIZES) - {1}
    assert set(defaults.BLOCK_SIZES) <= set(defaults.CURVE_BLOCK_SIZES)


def test_cpu_recommendation_ranges_over_every_swept_block_size():
    """The report's CPU kernel sweep and its static simulation both cover BLOCK_SIZES, so the
    recommendation made from them weighs every one (not an intersection of two lists)."""
    from pagebench.measure.kernel_sweep import run_sweep
    from pagebench.analysis import advice
    from pagebench.results import Results
    from pagebench.suite import here, static_memory

    results = Results()
    static_memory(results)
    kernels = run_sweep("cpu", shapes={"t": (4, 2, 16)}, points=[(1, 64)], include=["torch"],
                        repeat=1)
    kernels["machine"] = here("cpu")
    assert sorted(kernels.block_size.dropna().astype(int)) == sorted(defaults.BLOCK_SIZES)
    static = results.get("memory_static").dropna(subset=["block_size"])
    rec, table = advice.choose_block_size(dict(zip(static["block_size"].astype(int),
                                                   static["utilisation"])), "w", kernels=kernels)
    assert rec.speed_measured
    assert list(table["block_size"]) == sorted(defaults.BLOCK_SIZES)
