"""A step-cost model: an engine step's wall time from what the step computes.

``step_ms = base_ms + prefill_token_ms * prefill tokens + decode_seq_ms * decoding sequences
+ context_ktoken_ms * (context tokens read / 1000) + prefill_step_ms * [any prefill]
+ prefill_seq_ms * prefilling sequences`` -- Vidur's idea (profiled per-step costs predict
serving latency) at its smallest: a linear model of one engine on one device, for one block
size and cache dtype, fitted by least squares on measured steps
(:mod:`pagebench.measure.step_cost`) and committed as data (``step_cost.csv``).

The last two terms are the engine's two paths: a decode-only step replays a CUDA graph, a step
with any prompt tokens runs the model eagerly (a fixed cost of tens of milliseconds for a
24-layer model's Python and kernel launches, ``prefill_step_ms``), and each prompt being
prefilled adds its own attention call (``prefill_seq_ms``). Without them a linear fit either
under-prices every prefill step or over-prices every decode step. Files written before they
existed read them as 0.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass

from pagebench.errors import ConfigError

COEFFICIENTS = ("base_ms", "prefill_token_ms", "decode_seq_ms", "context_ktoken_ms",
                "prefill_step_ms", "prefill_seq_ms")
OPTIONAL_COEFFICIENTS = ("prefill_step_ms", "prefill_seq_ms")  # 0 where a file lacks them


@dataclass(frozen=True, slots=True)
class StepCostModel:
    base_ms: float
    prefill_token_ms: float
    decode_seq_ms: float
    context_ktoken_ms: float
    prefill_step_ms: float = 0.0
    prefill_seq_ms: float = 0.0

    def __post_init__(self):
        for name in COEFFICIENTS:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name}: a step cost must be a finite number >= 0, "
                                  f"got {value!r}")

    def step_ms(self, prefill_tokens: int, decode_seqs: int, context_tokens: int,
                prefill_seqs: int | None = None) -> float:
        """``prefill_seqs``: the sequences with prompt tokens in the step (None: one if there
        are prompt tokens, else none)."""
        if prefill_seqs is None:
            prefill_seqs = int(prefill_tokens > 0)
        return (self.base_ms + self.prefill_token_ms * prefill_tokens
                + self.decode_seq_ms * decode_seqs
                + self.context_ktoken_ms * context_tokens / 1000.0
                + (self.prefill_step_ms if prefill_seqs > 0 else 0.0)
                + self.prefill_seq_ms * prefill_seqs)


def read_step_cost(path, *, block_size: int, kv_cache_dtype: str = "auto",
                   model: str | None = None) -> StepCostModel:
    """The model of ``block_size`` and ``kv_cache_dtype`` (and ``model``, where the file has
    several) from a ``step_cost.csv``."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if r.get("block_size") == str(block_size)
                and r.get("kv_cache_dtype") == kv_cache_dtype
                and (model is None or r.get("model") == model)]
    if len(rows) != 1:
        what = "no" if not rows else f"{len(rows)}"
        raise ConfigError(f"step_cost: {what} models for block {block_size}, {kv_cache_dtype}"
                          f"{', ' + model if model else ''} in {path} (give --model to choose)"
                          if rows else f"step_cost: no model for block {block_size}, "
                          f"{kv_cache_dtype}{', ' + model if model else ''} in {path}")
    try:
        return StepCostModel(*(float(rows[0].get(name) or 0.0) if name in OPTIONAL_COEFFICIENTS
                               else float(rows[0][name]) for name in COEFFICIENTS))
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"step_cost: {path} lacks a number in {', '.join(COEFFICIENTS)}") \
            from None


def fit_engine_batch(rows) -> StepCostModel:
    """A step-cost model from the engine's batch sweep (``engine_throughput_vs_batch`` rows:
    ``batch`` requests of ``prompt_len`` tokens, ``max_tokens`` outputs each, ``num_steps``
    steps in ``time_s``, decode steps of ``decode_step_ms``), for when no serving steps were
    measured on a GPU.

    ``base_ms`` and ``decode_seq_ms``: a least-squares line through (batch, decode_step_ms);
    ``prefill_token_ms``: the run's time left over after its ``max_tokens`` decode steps, per
    prompt token, from the row with the most prompt tokens. Every row decodes at one context
    length, so the context term cannot be told from the per-sequence one: it is 0 and the
    per-sequence cost carries it at that length.
    """
    import numpy as np

    rows = list(rows)
    if len(rows) < 2 or len({float(r["batch"]) for r in rows}) < 2:
        raise ConfigError("rows: need decode steps at two batch sizes or more")
    batch = np.array([float(r["batch"]) for r in rows])
    step = np.array([float(r["decode_step_ms"]) for r in rows])
    slope, base = np.polyfit(batch, step, 1)
    big = max(rows, key=lambda r: float(r["batch"]) * float(r["prompt_len"]))
    decode_ms = float(big["max_tokens"]) * (base + slope * float(big["batch"]))
    prefill = (float(big["time_s"]) * 1e3 - decode_ms) / (float(big["batch"])
                                                          * float(big["prompt_len"]))
    return StepCostModel(float(base), max(float(prefill), 0.0), max(float(slope), 0.0), 0.0)


# fit_engine_batch on reports/data/h200/engine_throughput_vs_batch.csv, the rows of block 16 in
# mode "graphs" (random-weight Qwen2.5-0.5B shape, bf16, NVIDIA H200, commit c46d36d): the
# only engine steps measured on a GPU so far; tests/test_real_load.py refits them.
H200_ENGINE_STEP_COST = StepCostModel(base_ms=1.6956, prefill_token_ms=0.0054247,
                                      decode_seq_ms=0.0062063, context_ktoken_ms=0.0)
H200_ENGINE_STEP_COST_SOURCE = (
    "derived from the H200 engine batch sweep (Qwen2.5-0.5B shape, bf16, block 16; "
    "reports/data/h200/engine_throughput_vs_batch.csv)")
