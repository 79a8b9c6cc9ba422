"""Small synthetic report results in the shapes the real sources produce, for the report's tests.

Every row is labelled ``synthetic`` (source, workload) and its device ``Synthetic GPU``:
nothing here is a measurement. ``synthetic_results(paged_ratio=..., cow_ratio=...)`` lets a
test make a claim hold or fail on purpose.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagebench import defaults
from pagebench.results import Results

SYNTHETIC = "synthetic"
DEVICE = "Synthetic GPU"  # the device label every synthetic measurement carries
# block size -> paged time / contiguous time of the synthetic kernel
DEFAULT_PAGED_RATIO = {1: 2.4, 8: 1.15, 16: 1.08, 32: 1.06, 128: 1.05}


def _kernel_rows(paged_ratio: dict) -> pd.DataFrame:
    rows = []
    shape = ("llama-3-8b", 32, 8, 128)
    points = [(1, 1024), (1, 4096), (1, 16384), (8, 4096), (64, 4096)]
    for batch, context in points:
        kv_bytes = 2 * batch * context * shape[2] * shape[3] * 2
        contiguous_us = 8.0 + kv_bytes / 4.0e12 * 1e6  # 8 us launch + K/V read at 4 TB/s
        # triton's own contiguous variant times as SDPA does: paged_ratio is paging's cost
        cases = [("sdpa", "contiguous", None, contiguous_us),
                 ("triton", "contiguous", None, contiguous_us)]
        cases += [("triton", "paged", bs, contiguous_us * r) for bs, r in paged_ratio.items()]
        cases += [("torch", "paged", bs, contiguous_us * r * 2.8) for bs, r in
                  paged_ratio.items()]
        for kernel, layout, bs, t in cases:
            rows.append({"device": "cuda", "device_name": DEVICE, "torch_version": "0",
                         "triton_version": "0", "pagebench_version": "0", "commit": SYNTHETIC,
                         "dtype": "bfloat16", "model_shape": shape[0], "num_q_heads": shape[1],
                         "num_kv_heads": shape[2], "head_dim": shape[3], "batch": batch,
                         "context": context, "block_size": bs,
                         "backend": f"{kernel}-{layout}", "kernel": kernel, "layout": layout,
                         "cuda_graphs": batch == 1, "time_us": t,
                         "q20_us": t * 0.98, "q80_us": t * 1.02, "kv_bytes": kv_bytes,
                         "gbps": kv_bytes / (t * 1e-6) / 1e9, "copy_gbps": 4300.0,
                         "machine": DEVICE})
    return pd.DataFrame(rows)


def synthetic_results(*, paged_ratio: dict | None = None, cow_ratio: float = 1.3,
                      label: str = SYNTHETIC) -> Results:
    """A :class:`Results` with every dataset the report knows, filled with synthetic rows."""
    from pagebench.sim.static import static_fragmentation

    r = Results()
    src = f"{label} (tests/synthetic_report.py)"
    lengths = np.random.default_rng(0).integers(1, 1024, 400)
    static = static_fragmentation(lengths, 1024, defaults.BLOCK_SIZES)
    r.add("memory_static", pd.DataFrame(static["results"]).assign(
        workload=label, num_seqs=static["num_seqs"], max_len=static["max_len"],
        tokens_stored=static["tokens_stored"], seed=0), src)
    sweep = []
    for max_len in (1024, 4096, 32768):
        for alloc, bs, util in (("naive", None, 365 / max_len), ("oracle", None, 1.0),
                                ("paged", 16, 0.98)):
            sweep.append({"max_len": max_len, "label": alloc if bs is None else f"paged {bs}",
                          "allocator": alloc, "block_size": bs, "utilisation": util})
    r.add("memory_max_len", pd.DataFrame(sweep), src)
    r.add("block_waste", pd.DataFrame({"block_size": [1, 16], "num_seqs": [10, 10],
                                       "max_waste_slots": [0, 15], "mean_waste_slots": [0, 7.5],
                                       "bound_slots": [0, 15]}), src)
    r.add("memory_dynamic_summary", pd.DataFrame([
        {"label": "naive", "allocator": "naive", "block_size": None, "budget_tokens": 4096,
         "token_state_fraction_saturated": 0.25, "token_state_fraction": 0.2,
         "mean_concurrency": 4.0, "peak_concurrency": 5, "num_preemptions": 0,
         "article_reference": True},
        *({"label": a, "allocator": a, "block_size": None, "budget_tokens": 4096,
           "token_state_fraction_saturated": x, "token_state_fraction": x - 0.05,
           "mean_concurrency": c, "num_preemptions": 0, "article_reference": True}
          for a, x, c in (("pow2", 0.32, 6.0), ("oracle", 0.38, 7.0))),
        {"label": "paged 16", "allocator": "paged", "block_size": 16, "budget_tokens": 4096,
         "token_state_fraction_saturated": 0.97, "token_state_fraction": 0.8,
         "mean_concurrency": 12.0, "num_preemptions": 3, "article_reference": True}]), src)
    steps = np.arange(0, 50, 5)
    timeline = []
    for name, tok, res, internal in (("naive", 0.2, 0.1, 0.6), ("paged 16", 0.9, 0.0, 0.02)):
        for s in steps:
            timeline.append({"label": name, "allocator": name.split()[0],
                             "block_size": 16 if name.startswith("paged") else None,
                             "step": int(s), "budget_tokens": 1000,
                             "token_state": tok * 1000, "reserved_unused": res * 1000,
                             "internal_frag": internal * 1000, "external_frag": 0,
                             "free": (1 - tok - res - internal) * 1000})
    r.add("memory_dynamic_timeline", pd.DataFrame(timeline), src)
    r.add("kv_geometry", pd.DataFrame([{"model": "qwen2.5-0.5b", "dtype": "bfloat16",
                                        "bytes_per_token": 12288,
                                        "bytes_per_block_16": 196608}]), src)
    r.add("capacity_article", pd.DataFrame([{
        "model": "qwen2.5-0.5b", "kv_cache_bytes": 12_400_000_000, "num_blocks": 63069,
        "cacheable_tokens": 1_009_104, "max_model_len": 4096, "max_concurrency_naive": 246,
        "max_concurrency_paged": 738, "paged_vs_naive": 3.0, "block_size": 16,
        "bytes_per_token": 12288}]), src)
    r.add("capacity", pd.DataFrame([{
        "model": "qwen2.5-0.5b", "gpu_memory": "16GiB", "max_model_len": 4096,
        "max_concurrency_naive": 280, "max_concurrency_paged": 840, "block_size": 16,
        "kv_cache_bytes": 13_000_000_000, "num_blocks": 66000}]), src)
    r.add("kernels", _kernel_rows(paged_ratio or DEFAULT_PAGED_RATIO), src)
    r.add("kernels_prefill", pd.DataFrame([
        {"device": "cuda", "device_name": DEVICE, "model_shape": "llama-3-8b",
         "batch": 1, "query_len": 2048, "cached": cached, "backend": f"{kernel}-{layout}",
         "kernel": None if layout == "contiguous" else kernel, "layout": layout,
         "block_size": None if layout == "contiguous" else 16, "cuda_graphs": False,
         "time_us": t, "tflops": 2.2e12 * (cached + 1024) / t / 1e12, "machine": DEVICE}
        for cached in (0, 2048)
        for kernel, layout, t in (("sdpa", "contiguous", 90.0), ("triton", "paged", 200.0),
                                  ("torch", "paged", 4000.0))]), src)
    r.add("engine_cow", pd.DataFrame({"n": [1, 4], "variant": ["n=1", "n=4 shared"],
                                      "peak_blocks": [100, round(100 * cow_ratio)],
                                      "machine": DEVICE}), src)
    r.add("engine_prefix", pd.DataFrame({
        "enable_prefix_caching": [False, True], "prefix_cache_hit_rate": [0.0, 0.6],
        "num_computed_prompt_tokens": [4000, 1600], "peak_blocks": [300, 180],
        "machine": DEVICE}), src)
    r.add("engine_pool", pd.DataFrame({
        "num_blocks": [64, 128, 256, 512], "num_preemptions": [12, 4, 0, 0],
        "tokens_per_s": [700.0, 1100.0, 1500.0, 1510.0], "recomputed_tokens": [900, 300, 0, 0],
        "machine": DEVICE}), src)
    r.add("engine_batch", pd.DataFrame({
        "batch": [1, 4, 16] * 2, "block_size": [16] * 3 + [32] * 3,
        "tokens_per_s": [100.0, 380.0, 1400.0, 98.0, 370.0, 1350.0], "machine": DEVICE}), src)
    r.add("engine_equal_memory", pd.DataFrame({
        "method": ["padded_generate", "engine", "engine_contiguous_batch"],
        "concurrent_seqs": [8, 40, 8], "tokens_per_s": [900.0, 3100.0, 1500.0],
        "tokens_per_s_min": [880.0, 3000.0, 1450.0], "tokens_per_s_max": [950.0, 3150.0, 1550.0],
        "repeats": 3, "machine": DEVICE}), src)
    r.add("asv", pd.DataFrame([{"machine": DEVICE, "commit": "abc", "date": 1,
                                "benchmark": "attention.Decode.track_time", "params": "16",
                                "value": 12.5, "unit": "us"}]), src)
    r.add("pytest_benchmark", pd.DataFrame([{"machine": DEVICE, "commit": "abc", "date": "x",
                                             "benchmark": "test_append", "params": "",
                                             "median_us": 1.2, "iqr_us": 0.1, "rounds": 5}]), src)
    return r
