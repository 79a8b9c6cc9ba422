"""The report's "fp8 KV cache and block-table layout" section, with its verdicts
(:mod:`pagebench.analysis.fp8` judges them).

Datasets (``scripts/h200_fp8.sh``, committed under ``reports/data/h200/``): ``kernels_fp8``
(Triton decode and prefill, bf16 vs fp8 caches: time, bytes, fraction of the copy bandwidth,
error against the bf16 cache), ``kernels_layout`` (Triton bf16 decode over contiguous,
shuffled and aged block tables: time, unique K/V footprint, L2 flag) and ``fp8_engine`` (the
engine's pool and greedy agreement, bf16 vs fp8 cache), beside the capacity planner's bf16 vs
fp8 arithmetic (``capacity_fp8``: :func:`pagebench.sim.capacity.fp8_rows`, any machine).
"""

from __future__ import annotations

from pagebench.report.sections import Section, View, claims_table, derived, verdicts
from pagebench.results import Results

SOURCE = "reports/data/h200/ (scripts/h200_fp8.sh)"
PLANNER = View("capacity_fp8", "Capacity planner, bf16 vs fp8 (e4m3) KV cache: bf16 weights, 0.9 "
               "of the GPU, 4 GiB overhead, block 16; concurrency at max_model_len (naive "
               "reservation)", missing="capacity planner, bf16 vs fp8 "
               "(pagebench.sim.capacity.fp8_rows)")
VIEWS = (
    View("kernels_fp8", "Paged decode, Triton bf16 vs each e4m3 kernel (backend: Triton's, and "
         "the CUDA one, cuda-fp8; Llama-3-8B shape 32/8 × 128, CUDA graphs): copy fraction = "
         "bytes read (fp8 counted in fp8 bytes) / time / measured copy bandwidth; error = "
         "relative error of the output against the bf16 cache's (standard-normal K/V, scale = "
         "per-head max / 448) and against float32 on the dequantised cache",
         frame=derived("fp8_decode")),
    View("kernels_fp8", "Triton paged prefill, bf16 vs e4m3 cache (block 16)",
         ("cache_dtype", "batch", "query_len", "cached", "time_us", "err_vs_bf16_cache",
          "err_vs_dequantised"), table=lambda fp8: fp8[fp8["op"] == "prefill"]),
    View("kernels_fp8", "Decode with an e5m2 cache (block 16)",
         ("batch", "context", "backend", "time_us", "copy_fraction", "err_vs_bf16_cache",
          "err_vs_dequantised"),
         table=lambda fp8: fp8[(fp8["op"] == "decode") & (fp8["cache_dtype"] == "float8_e5m2")]),
    View("kv_accuracy", "Accuracy on a trained model: the shipped byte-level Llama "
         "(pagebench.engine.trained_model, trained on the Python standard library's sources) "
         "on held-out files, every attention read back from the paged cache: perplexity of the "
         "next byte and top-1 agreement, bf16 against fp32 and each fp8 format against bf16, "
         "per block size (`pagebench kv-accuracy`)",
         ("machine", "kv_dtype", "reference_dtype", "block_size", "perplexity",
          "perplexity_reference", "top1_agreement", "tokens"),
         missing="accuracy on the trained model (pagebench kv-accuracy --out "
         "reports/data/cpu/kv_accuracy.csv)"),
    View("fp8_engine", "Engine, random-weight Qwen2.5-0.5B, bf16 vs fp8_e4m3 cache at equal KV "
         "memory: pool, greedy agreement (tokens up to each sequence's first difference / all), "
         "logit error over the first steps. Random weights give near-ties, so these agreement "
         "figures measure ties, not quality: the trained model's table above does"),
    View("kernels_layout", "Triton bf16 decode by block-table layout (Llama-3-8B shape, CUDA "
         "graphs); fits_l2: the unique K/V footprint fits in the GPU's L2, so the point "
         "measures the cache, not the layout, and is not judged",
         frame=derived("layout_spread")),
)


def section(results: Results) -> Section:
    s = Section("fp8", "fp8 KV cache and block-table layout")
    s.text("An fp8 cache (`torch.float8_e4m3fn` or `float8_e5m2`) stores K/V divided by a "
           "scale per KV head: `paged_decode(..., k_scale=, v_scale=)`, `paged_prefill` and "
           "`write_kv` take them; `write_kv` quantises with saturation; the torch backend "
           "dequantises while it gathers, the Triton kernels convert on load and fold the scales "
           "into the softmax scale and the output; the CUDA decode (`backend=\"cuda-fp8\"`, "
           "NVIDIA 8.9+, opt-in) loads fp8 straight into its MMA registers. `LLMEngine(..., kv_cache_dtype=\"fp8_e4m3\")` "
           "calibrates each layer's scales on its first step; `pagebench capacity --kv-dtype "
           "fp8_e4m3` plans with one byte per element. Correctness: property tests against a "
           "float64 reference on the dequantised cache (both formats, every backend that "
           "declares fp8, Triton interpreted on the CPU). The block-table layout is a sweep "
           "axis (`pagebench bench --layouts contiguous,shuffled,aged`); aged tables come from "
           "the block manager after it served a trace with churn.")
    s.table(claims_table(verdicts(results, s.id), "Verdicts"))
    s.show(results, (PLANNER,))
    return s.show(results, VIEWS, empty=f"fp8 and layout measurements ({SOURCE})")
