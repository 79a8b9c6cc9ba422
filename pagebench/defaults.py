"""The constants every sweep, test and benchmark shares: one home each, derived where possible.

- the article's reference workload (its length distribution, sample size, seed, max length);
- the block sizes swept: one list that the simulators, the kernel sweeps and the block-size
  recommendation all range over, so the recommendation is never limited to an accidental
  intersection of two lists;
- the attention shapes the kernel sweeps time, derived from ``config.PRESETS``;
- the one tiny random-weight model that CPU runs and tests build.
"""

from __future__ import annotations

from pagebench.config import PRESETS, KVGeometry

# The article's workload: sequence lengths log-normal(mu 5.5, sigma 0.9) in tokens (median
# ~245), 2,000 sequences, seed 0, clipped at a max_model_len of 4,096.
REFERENCE_LENGTHS = "lognormal:5.5,0.9"
REFERENCE_NUM_SEQS = 2000
REFERENCE_SEED = 0
REFERENCE_MAX_LEN = 4096
# The dynamic reference run's requests (simulate --dynamic, the report's dynamic section)
REFERENCE_NUM_REQUESTS = 20_000

# samples per request (n) at most, for simulated and traced requests alike: a request's blocks
# are n times its length's, and n times the longest trace value must stay inside int64
MAX_SAMPLES = 1024

BLOCK_SIZE = 16  # vLLM's default page size
# Swept everywhere a block size varies: from one token per block to 128.
BLOCK_SIZES = (1, 8, 16, 32, 128)
# The smallest, the default and the largest: where a sweep must stay short (CPU asv cases).
SHORT_BLOCK_SIZES = (min(BLOCK_SIZES), BLOCK_SIZE, max(BLOCK_SIZES))
# The engine and the time-stepped simulator leave out one-token blocks (a table entry per
# token makes them slow and no engine uses it).
ENGINE_BLOCK_SIZES = tuple(b for b in BLOCK_SIZES if b > 1)
# A finer grid for the static utilisation curve (cheap to simulate): the powers of two up to
# the largest swept size, a superset of ``BLOCK_SIZES``.
CURVE_BLOCK_SIZES = tuple(2 ** i for i in range(max(BLOCK_SIZES).bit_length()))


def attention_shape(model: str) -> tuple[int, int, int]:
    """(num_q_heads, num_kv_heads, head_dim) of a preset in ``config.PRESETS``."""
    if model not in PRESETS:  # a preset's key only (KVGeometry.from_name takes paths too)
        raise ValueError(f"model: expected one of {sorted(PRESETS)}, got {model!r}")
    geometry = KVGeometry.from_config(PRESETS[model], name=model)
    return geometry.num_q_heads, geometry.num_kv_heads, geometry.head_dim


# The kernel sweeps' shapes: a GQA-4 model with 128-wide heads and a GQA-7 one with 64-wide.
KERNEL_MODELS = ("llama-3-8b", "qwen2.5-0.5b")
SHAPES = {name: attention_shape(name) for name in KERNEL_MODELS}

# The tiny random-weight Qwen2 model of CPU runs and tests (``measure.engine_bench.tiny_model``):
# 2 layers, hidden 128, 4 query / 2 KV heads of 32.
TINY_MODEL = dict(vocab_size=1024, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)

# Share of a serving run's requests that must meet every SLO for the run to meet it
# (``serve-bench --slo-attainment``'s default; the real-trace goodput search's).
SLO_ATTAINMENT = 0.9
# serve-bench: untimed all-at-once runs of each trace per engine before the timed ones
WARMUP_PASSES = 1
