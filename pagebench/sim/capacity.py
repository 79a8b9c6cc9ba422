"""Capacity planning: how many blocks, tokens and concurrent sequences a GPU's KV cache holds.

The arithmetic is vLLM's: the KV cache gets what is left of
``gpu_memory * gpu_memory_utilization`` after the weights and the overhead (activations, CUDA
graphs, allocator slack); it is cut into blocks of ``block_size`` tokens;
``cacheable_tokens = num_blocks * block_size``. Concurrency is then

- naive reservation: every sequence reserves ``max_model_len`` slots, so
  ``cacheable_tokens // max_model_len`` (vLLM logs this as "maximum concurrency");
- pow2 / oracle (contiguous, exact size) / paged: ``cacheable_tokens`` divided by the mean slots
  a sequence of the length distribution holds at its final length (next power of two, its
  length, or its length rounded up to whole blocks). This is the expected number of finished-
  length sequences that fit at once; sequences still growing hold less.

Tensor parallelism over ``tensor_parallel_size`` GPUs (``gpu_memory`` is then per GPU): each
GPU holds ``1 / tp`` of the weights (vLLM shards embeddings and LM head too) and
``num_kv_heads / tp`` KV heads of every block, so a block costs each GPU ``1 / tp`` of its
bytes, unless tp exceeds the KV heads: then each GPU holds one whole head, replicated on
``tp / num_kv_heads`` GPUs. Blocks are counted per GPU; every GPU holds a slice of the same
blocks, so the group caches ``num_blocks * block_size`` tokens. ``blocks_vs_tp1`` compares the
blocks one GPU of the same memory holds alone (None when the weights leave it no cache).
"""

from __future__ import annotations

import os

import numpy as np

from pagebench.config import (PRESETS, KVGeometry, ceil_div, config_json_path, dtype_bytes,
                              parse_bytes, preset_key, read_config_json, unknown_model)
from pagebench.defaults import (REFERENCE_LENGTHS, REFERENCE_MAX_LEN, REFERENCE_NUM_SEQS,
                                REFERENCE_SEED)
from pagebench.errors import ConfigError, check_positive_int
from pagebench.sim.static import reserved_slots
from pagebench.sim.workloads import sample_lengths

# The article's opening arithmetic: a 16 GB card at 0.9 utilisation, about 1 GB of bf16 weights
# and 1 GB of overhead leave 12.4 GB of KV cache; 4,096-token sequences.
ARTICLE_CASE = dict(model="qwen2.5-0.5b", gpu_memory="16GB", gpu_memory_utilization=0.9,
                    weights_bytes="1GB", overhead_bytes="1GB", max_model_len=4096, block_size=16)


def _config_dict(model) -> dict:
    """The config of ``model`` (preset name, config path, dict or PretrainedConfig) as a dict."""
    if isinstance(model, dict):
        return model
    if isinstance(model, (str, os.PathLike)):
        key = preset_key(str(model))
        if key in PRESETS:
            return PRESETS[key]
        path = config_json_path(model)
        if not os.path.exists(path):
            raise unknown_model(model)
        return read_config_json(path, "model")
    if hasattr(model, "to_dict"):
        return model.to_dict()
    raise ConfigError(f"model: expected a preset name, config path, dict or PretrainedConfig, "
                      f"got {type(model).__name__}")


EXPERT_FIELDS = ("num_local_experts", "n_routed_experts", "num_experts")  # MoE configs


def estimate_num_parameters(config) -> int:
    """Parameters of a Llama/Qwen2/Mistral-style decoder from its config.

    Embedding (+ untied LM head), per layer q/k/v/o projections (q/k/v biases for Qwen2 or when
    ``attention_bias``), a gated MLP (gate, up, down) and two RMSNorms, plus the final norm.
    Qwen2.5-0.5B gives 494,032,768, its published count.
    """
    cfg = _config_dict(config)
    cfg = cfg.get("text_config") or cfg
    experts = [k for k in EXPERT_FIELDS if (cfg.get(k) or 0) > 1]
    if experts:  # each expert has its own MLP: counting one under-sizes the weights
        raise ConfigError(f"weights_bytes: a mixture-of-experts config ({experts[0]} = "
                          f"{cfg[experts[0]]}) is not estimated; give --weights-bytes")
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        inter = int(cfg["intermediate_size"])
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"weights_bytes: cannot estimate parameters from the config (missing "
                          f"{e}); give --weights-bytes") from None
    qkv_bias = bool(cfg.get("attention_bias")) or cfg.get("model_type") == "qwen2"
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = hidden * (q + 2 * kv) + q * hidden + ((q + 2 * kv) if qkv_bias else 0)
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings + hidden


def _bytes(name: str, value) -> int:
    try:
        return parse_bytes(value)
    except ConfigError as e:
        raise ConfigError(f"{name}: {e}") from None


def capacity_plan(model="qwen2.5-0.5b", *, gpu_memory="16GiB",
                  gpu_memory_utilization: float = 0.9, max_model_len: int = REFERENCE_MAX_LEN,
                  block_size: int = 16, dtype="bfloat16", kv_dtype=None, weights_bytes=None,
                  overhead_bytes=0, kv_cache_bytes=None, lengths: str = REFERENCE_LENGTHS,
                  num_seqs: int = REFERENCE_NUM_SEQS, seed: int = REFERENCE_SEED,
                  tensor_parallel_size: int = 1) -> dict:
    """Blocks, cacheable tokens and concurrency for one model on one GPU (see module doc).

    ``model``: preset name, path to a ``config.json`` (or its folder), config dict,
    ``PretrainedConfig`` or a :class:`~pagebench.config.KVGeometry` (then give
    ``weights_bytes``). ``weights_bytes=None`` estimates parameters x dtype bytes.
    ``kv_dtype`` (default ``dtype``): the KV cache's dtype, e.g. ``"fp8_e4m3"`` (one byte per
    element: twice the tokens of a bf16 cache in the same memory).
    ``kv_cache_bytes`` skips the memory arithmetic and sizes the cache directly (per GPU).
    ``lengths``: a :func:`~pagebench.sim.workloads.sample_lengths` spec (``num_seqs`` drawn
    with ``seed``), or the lengths themselves (a user's requests, each used once, none above
    ``max_model_len``).
    Sizes accept ints or strings such as ``"16GiB"`` (binary) and ``"16GB"`` (decimal).
    Returns a flat dict (the JSON of ``pagebench capacity --json``).
    """
    if kv_dtype is not None:  # checked here, so that its error names it, not ``dtype``
        try:
            dtype_bytes(kv_dtype)
        except ConfigError as e:
            raise ConfigError(f"kv_dtype: {str(e).removeprefix('dtype: ')}") from None
    if isinstance(model, KVGeometry):
        geometry, config = model, None
        if kv_dtype is not None:
            geometry = geometry.with_dtype(kv_dtype)
    else:
        config = _config_dict(model)
        name = model if isinstance(model, str) else config.get("model_type", "custom")
        geometry = KVGeometry.from_config(config, dtype=kv_dtype or dtype, name=str(name))
    for arg, value in (("max_model_len", max_model_len), ("block_size", block_size),
                       ("num_seqs", num_seqs)):
        check_positive_int(arg, value)
    tp = tensor_parallel_size
    rank_geometry = geometry.per_rank(tp)  # validates tp against the heads
    notes = []
    cache_tp1 = None
    if kv_cache_bytes is not None:
        cache = _bytes("kv_cache_bytes", kv_cache_bytes)
        gpu = usable = weights = rank_weights = overhead = None
        num_params, weights_source = None, "not used (kv_cache_bytes given)"
    else:
        if not (isinstance(gpu_memory_utilization, (int, float))
                and 0 < gpu_memory_utilization <= 1):
            raise ConfigError(f"gpu_memory_utilization: must lie in (0, 1], got "
                              f"{gpu_memory_utilization!r}")
        gpu = _bytes("gpu_memory", gpu_memory)
        usable = int(gpu * gpu_memory_utilization)
        overhead = _bytes("overhead_bytes", overhead_bytes)
        num_params = None
        if weights_bytes is None:
            if config is None:
                raise ConfigError("weights_bytes: required when model is a KVGeometry")
            num_params = estimate_num_parameters(config)
            weights = num_params * dtype_bytes(dtype)
            weights_source = (f"estimated: {num_params:,} parameters x {dtype_bytes(dtype)} "
                              f"bytes ({dtype})")
        else:
            weights = _bytes("weights_bytes", weights_bytes)
            weights_source = "given"
        rank_weights = ceil_div(weights, tp)
        cache = usable - rank_weights - overhead
        cache_tp1 = usable - weights - overhead
        if cache <= 0:
            raise ConfigError(f"gpu_memory: {gpu:,} B x {gpu_memory_utilization} leaves no room "
                              f"for the KV cache after {weights:,} B of weights and {overhead:,} "
                              "B of overhead")
        if overhead == 0:
            notes.append("overhead_bytes is 0: activations, CUDA graphs and allocator slack "
                         "usually take some GiB; compare with vLLM's startup log")
    bytes_per_block = geometry.bytes_per_block(block_size)
    rank_block = rank_geometry.bytes_per_block(block_size)
    num_blocks = cache // rank_block
    if kv_cache_bytes is not None:
        cache_tp1 = cache
    blocks_tp1 = (max(0, cache_tp1) // bytes_per_block
                  if cache_tp1 is not None else None)
    if num_blocks < 1:
        raise ConfigError(f"kv_cache_bytes: {cache:,} B holds no block of {rank_block:,} B")
    cacheable = num_blocks * block_size
    if isinstance(lengths, str):
        sample = sample_lengths(lengths, num_seqs, seed, max_model_len)
    else:
        sample = given_lengths(lengths, max_model_len)
        num_seqs, lengths = int(sample.size), f"{sample.size:,} given lengths"
    mean_slots = {a: float(reserved_slots(a, sample, max_model_len, block_size).mean())
                  for a in ("naive", "pow2", "oracle", "paged")}
    concurrency = {a: int(cacheable // s) for a, s in mean_slots.items()}
    concurrency["naive"] = int(cacheable // max_model_len)
    if concurrency["naive"] < 1:
        notes.append(f"not one {max_model_len}-token sequence fits under naive reservation")
    tokens = float(sample.mean())
    return {
        "model": geometry.name, "dtype": geometry.dtype,  # the KV cache's
        "weights_dtype": str(dtype), "num_layers": geometry.num_layers,
        "num_kv_heads": geometry.num_kv_heads, "head_dim": geometry.head_dim,
        "bytes_per_token": geometry.bytes_per_token, "block_size": block_size,
        "bytes_per_block": bytes_per_block, "gpu_memory_bytes": gpu,
        "gpu_memory_utilization": None if gpu is None else gpu_memory_utilization,
        "usable_bytes": usable, "num_parameters": num_params, "weights_bytes": weights,
        "weights_source": weights_source, "overhead_bytes": overhead, "kv_cache_bytes": cache,
        "num_blocks": int(num_blocks), "cacheable_tokens": int(cacheable),
        "max_model_len": max_model_len, "lengths": lengths, "num_seqs": num_seqs, "seed": seed,
        "mean_length": tokens,
        "max_concurrency_naive": concurrency["naive"],
        "max_concurrency_pow2": concurrency["pow2"],
        "max_concurrency_oracle": concurrency["oracle"],
        "max_concurrency_paged": concurrency["paged"],
        "paged_vs_naive": (concurrency["paged"] / concurrency["naive"]
                           if concurrency["naive"] else None),
        "token_utilisation_naive": tokens / max_model_len,
        "token_utilisation_pow2": tokens / mean_slots["pow2"],
        "token_utilisation_paged": tokens / mean_slots["paged"],
        "tensor_parallel_size": tp, "weights_bytes_per_rank": rank_weights,
        "kv_heads_per_rank": rank_geometry.num_kv_heads,
        "kv_replication": geometry.kv_replication(tp),
        "bytes_per_token_per_rank": rank_geometry.bytes_per_token,
        "bytes_per_block_per_rank": rank_block,
        "max_concurrency_paged_per_gpu": concurrency["paged"] / tp,
        "num_blocks_tp1": blocks_tp1,
        "blocks_vs_tp1": num_blocks / blocks_tp1 if blocks_tp1 else None,
        "notes": notes,
    }


def given_lengths(lengths, max_model_len: int) -> np.ndarray:
    """``lengths`` as int64, each checked to lie in ``1..max_model_len``."""
    sample = np.asarray(lengths, dtype=np.int64)
    if sample.ndim != 1 or sample.size == 0:
        raise ConfigError("lengths: need a non-empty list of lengths")
    if sample.min() < 1 or sample.max() > max_model_len:
        raise ConfigError(f"lengths: every length must lie in 1..max_model_len = "
                          f"{max_model_len:,}; the longest is {int(sample.max()):,}")
    return sample


def _size(value) -> str:
    if value is None:
        return "-"
    return f"{value:,} B ({value / 1e9:.2f} GB, {value / 2**30:.2f} GiB)"


def format_capacity(plan: dict) -> str:
    """The human-readable form of :func:`capacity_plan`'s result."""
    p = plan
    tp = p["tensor_parallel_size"]
    lines = [f"model {p['model']} (KV cache {p['dtype']}): {p['num_layers']} layers x "
             f"{p['num_kv_heads']} KV heads x head dim {p['head_dim']}",
             f"  bytes per token           {p['bytes_per_token']:,}",
             f"  bytes per block ({p['block_size']:>3})     {p['bytes_per_block']:,}"]
    if tp > 1:
        lines[0] += f"; tensor parallel over {tp} GPUs (memory and blocks per GPU)"
        lines += [f"  KV heads per GPU          {p['kv_heads_per_rank']}"
                  + (f"  (each head on {p['kv_replication']} GPUs)"
                     if p["kv_replication"] > 1 else ""),
                  f"  bytes per token per GPU   {p['bytes_per_token_per_rank']:,}",
                  f"  bytes per block per GPU   {p['bytes_per_block_per_rank']:,}"]
    if p["gpu_memory_bytes"] is not None:
        lines += [f"  GPU memory                {_size(p['gpu_memory_bytes'])}",
                  f"  x utilisation {p['gpu_memory_utilization']:<10} {_size(p['usable_bytes'])}",
                  (f"  - weights                 {_size(p['weights_bytes'])}  " if tp == 1 else
                   f"  - weights / {tp:<13} {_size(p['weights_bytes_per_rank'])}  ")
                  + f"[{p['weights_source']}]",
                  f"  - overhead                {_size(p['overhead_bytes'])}"]
    lines += [f"  = KV cache                {_size(p['kv_cache_bytes'])}",
              f"  blocks                    {p['num_blocks']:,}",
              f"  cacheable tokens          {p['cacheable_tokens']:,}  (blocks x block size)",
              "",
              f"concurrent sequences (max_model_len {p['max_model_len']:,}; lengths {p['lengths']}, "
              f"mean {p['mean_length']:.0f} tokens over {p['num_seqs']:,} draws):",
              f"  naive (reserve max_model_len)   {p['max_concurrency_naive']:>8,}   "
              f"token utilisation {p['token_utilisation_naive']:.1%}",
              f"  pow2 (next power of two)        {p['max_concurrency_pow2']:>8,}   "
              f"token utilisation {p['token_utilisation_pow2']:.1%}",
              f"  oracle (exact length)           {p['max_concurrency_oracle']:>8,}",
              f"  paged (block {p['block_size']})                {p['max_concurrency_paged']:>8,}"
              f"   token utilisation {p['token_utilisation_paged']:.1%}",
              "  paged / naive                   "
              + (f"{p['paged_vs_naive']:>8.1f}x" if p["paged_vs_naive"] else "       -")]
    if tp > 1:
        alone = (f"{p['num_blocks_tp1']:,} blocks on one GPU alone, "
                 f"{p['blocks_vs_tp1']:.2f}x per GPU at tp={tp}" if p["blocks_vs_tp1"]
                 else "one GPU alone holds no KV cache")
        lines += [f"  paged per GPU                   {p['max_concurrency_paged_per_gpu']:>10,.1f}",
                  f"  equal per-GPU memory: {alone}"]
    lines += [f"note: {n}" for n in p["notes"]]
    return "\n".join(lines)


def article_capacity(**overrides) -> dict:
    """:func:`capacity_plan` with :data:`ARTICLE_CASE` (the article's ~250-request arithmetic):
    the row of the ``capacity_article`` dataset (``pagebench.measure.memory`` names it)."""
    return capacity_plan(**(ARTICLE_CASE | overrides))


def article_budget_tokens() -> int:
    """Cacheable tokens of the article's case: the budget of the reference dynamic run."""
    return article_capacity()["cacheable_tokens"]



# ---- the planner cases the report shows ------------------------------------------------------

PLANNER_CASES = (
    dict(model="qwen2.5-0.5b", gpu_memory="16GiB", max_model_len=4096),
    dict(model="qwen2.5-0.5b", gpu_memory="16GiB", max_model_len=32768),
    dict(model="qwen2.5-7b", gpu_memory="80GiB", max_model_len=4096),
    dict(model="llama-3-8b", gpu_memory="80GiB", max_model_len=8192),
    dict(model="llama-3-8b", gpu_memory="141GiB", max_model_len=8192),
    dict(model="mistral-7b", gpu_memory="141GiB", max_model_len=32768),
)
PLAN_COLUMNS = ("model", "gpu_memory_bytes", "max_model_len", "block_size", "bytes_per_token",
                "bytes_per_block", "weights_bytes", "kv_cache_bytes", "num_blocks",
                "cacheable_tokens", "max_concurrency_naive", "max_concurrency_pow2",
                "max_concurrency_oracle", "max_concurrency_paged", "paged_vs_naive")
FP8_CASES = (("llama-3-8b", "141GB", 8192), ("qwen2.5-7b", "80GB", 32768),
             ("mistral-7b", "141GB", 32768))
TP_CASES = (("llama-3-8b", (1, 2, 4, 8, 16)), ("llama-3-70b", (2, 4, 8)))


def geometry_rows(dtype: str = "bfloat16") -> list[dict]:
    """KV geometry of every preset: bytes per token and per 16-token block."""
    rows = []
    for name in PRESETS:
        g = KVGeometry.from_name(name, dtype=dtype)
        rows.append(dict(model=name, dtype=dtype, num_layers=g.num_layers,
                         num_kv_heads=g.num_kv_heads, head_dim=g.head_dim,
                         bytes_per_token=g.bytes_per_token,
                         bytes_per_block_16=g.bytes_per_block(16)))
    return rows


def planner_case_rows(lengths: str = REFERENCE_LENGTHS,
                      seed: int = REFERENCE_SEED) -> tuple[list, list]:
    """(rows, errors): :data:`PLANNER_CASES` at 0.9 utilisation, block 16; a case the planner
    refuses is named in ``errors`` and the others are kept."""
    rows, errors = [], []
    for case in PLANNER_CASES:
        try:
            plan = capacity_plan(**case, gpu_memory_utilization=0.9, block_size=16,
                                 lengths=lengths, seed=seed)
        except ConfigError as e:
            errors.append(f"{case}: {e}")
            continue
        rows.append(dict(gpu_memory=case["gpu_memory"], **{k: plan.get(k) for k in PLAN_COLUMNS}))
    return rows, errors


def fp8_rows() -> list[dict]:
    """Blocks and naive concurrency for bf16 and fp8 (e4m3) caches, bf16 weights, 0.9 of the
    GPU, 4 GiB overhead, block 16."""
    rows = []
    for model, gpu, max_len in FP8_CASES:
        bf16, fp8 = (capacity_plan(model, gpu_memory=gpu, max_model_len=max_len,
                                   overhead_bytes="4GiB", kv_dtype=kv, num_seqs=500)
                     for kv in ("bfloat16", "fp8_e4m3"))
        rows.append({"model": model, "gpu_memory": gpu, "max_model_len": max_len,
                     "blocks_bf16": bf16["num_blocks"], "blocks_fp8": fp8["num_blocks"],
                     "blocks_ratio": fp8["num_blocks"] / bf16["num_blocks"],
                     "concurrency_bf16": bf16["max_concurrency_naive"],
                     "concurrency_fp8": fp8["max_concurrency_naive"]})
    return rows


def tensor_parallel_rows() -> list[dict]:
    """The planner on a 141 GB GPU (0.9 utilisation, 4 GiB overhead) for each tp of
    :data:`TP_CASES`; a tp whose weights leave no room says so in ``note``."""
    rows = []
    for model, sizes in TP_CASES:
        for tp in sizes:
            try:
                p = capacity_plan(model, gpu_memory="141GB", overhead_bytes="4GiB",
                                  tensor_parallel_size=tp, num_seqs=500)
            except ConfigError as e:
                rows.append(dict(model=model, tensor_parallel_size=tp, note=str(e)))
                continue
            rows.append({k: p[k] for k in (
                "model", "tensor_parallel_size", "kv_heads_per_rank", "kv_replication",
                "bytes_per_token_per_rank", "weights_bytes_per_rank", "kv_cache_bytes",
                "num_blocks", "blocks_vs_tp1", "max_concurrency_paged",
                "max_concurrency_paged_per_gpu")})
    return rows
