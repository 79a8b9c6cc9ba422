"""What a KV cache's dtype costs in prediction quality, on the shipped trained model.

Held-out windows of :mod:`pagebench.engine.trained_model`'s text run through the engine's own
path (``LLMEngine``'s block manager, ``ModelRunner.prepare`` / ``forward``, the paged prefill
kernel) with ``fresh_prefill=False``: every token's K/V is written to the paged cache first and
every attention reads it back from there, so each position attends over cached K/V exactly as
a decode step would, in one call per window batch instead of one per token.

One row of dataset ``kv_accuracy`` per (KV dtype, block size): the perplexity of the next byte
and the share of positions whose top-1 prediction equals the reference run's, against
:data:`PAIRS`: a bf16 model and cache against fp32, fp8 caches against a bf16 one.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from pagebench.engine import trained_model
from pagebench.engine.engine import LLMEngine
from pagebench.results import datasets
from pagebench.measure.timing import environment

# (KV cache dtype, reference): each model dtype with its own cache, fp8 beside bf16
PAIRS = (("bfloat16", "float32"), ("fp8_e4m3", "bfloat16"), ("fp8_e5m2", "bfloat16"))
BLOCK_SIZES = (1, 16, 128)
MODEL_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16,
               "fp8_e4m3": torch.bfloat16, "fp8_e5m2": torch.bfloat16}


@torch.inference_mode()
def cached_logits(model, windows: list[list[int]], block_size: int, kv_cache_dtype: str,
                  kernel: str = "auto") -> torch.Tensor:
    """float32 logits [sum of window lengths, vocab] of every position of ``windows`` (each a
    sequence from position 0), all attention read from a paged cache of ``kv_cache_dtype``."""
    total = sum(len(w) for w in windows)
    num_blocks = sum(-(-len(w) // block_size) for w in windows)
    is_fp8 = kv_cache_dtype.startswith("fp8")
    engine = LLMEngine(model, block_size=block_size, num_blocks=num_blocks, kernel=kernel,
                       kv_cache_dtype=kv_cache_dtype if is_fp8 else "auto",
                       fresh_prefill=False, enforce_eager=True, max_num_seqs=len(windows),
                       max_num_batched_tokens=total, max_model_len=max(map(len, windows)))
    blocks = []
    for i, tokens in enumerate(windows):
        engine.block_manager.allocate(i, tokens)
        blocks.append(engine.block_manager.schedule_step(i, len(tokens)))
    seqs = [SimpleNamespace(token_ids=w) for w in windows]
    runner = engine.runner
    input_ids, positions, meta, _, _ = runner.prepare(seqs, blocks)
    hidden = runner.forward(input_ids, positions, meta)
    return runner.lm_head(hidden).float()


def targets(windows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows of the packed logits that predict a next token, the tokens they predict)."""
    rows, nxt, start = [], [], 0
    for w in windows:
        rows.extend(range(start, start + len(w) - 1))
        nxt.extend(w[1:])
        start += len(w)
    return torch.tensor(rows), torch.tensor(nxt)


def perplexity(logits: torch.Tensor, rows: torch.Tensor, nxt: torch.Tensor) -> float:
    return math.exp(float(F.cross_entropy(logits[rows], nxt)))


def accuracy_rows(num_windows: int = 8, length: int = 512, block_sizes=BLOCK_SIZES,
                  pairs=PAIRS, device: str = "cpu", kernel: str = "auto",
                  model_dir=None) -> list[dict]:
    """One ``kv_accuracy`` row per (pair, block size) on ``num_windows`` held-out windows of
    ``length`` bytes (:func:`pagebench.engine.trained_model.windows`)."""
    windows = trained_model.windows(num_windows, length)
    rows_idx, nxt = targets(windows)
    models, logits = {}, {}

    def run(kv: str, block_size: int) -> torch.Tensor:
        key = (kv, block_size)
        if key not in logits:
            dtype = MODEL_DTYPE[kv]
            if dtype not in models:
                models[dtype] = trained_model.load(dtype, device, model_dir)
            logits[key] = cached_logits(models[dtype], windows, block_size, kv, kernel).cpu()
        return logits[key]

    env = environment(torch.device(device))
    if torch.device(device).type == "cpu":  # the device label names a CPU's core count
        env["cpu_count"] = os.cpu_count()
    out = []
    for block_size in block_sizes:
        for kv, ref in pairs:
            got, want = run(kv, block_size), run(ref, block_size)
            agree = (got[rows_idx].argmax(-1) == want[rows_idx].argmax(-1)).float().mean()
            out.append(datasets.KV_ACCURACY.row(
                **env, model=trained_model.MODEL_NAME, kv_dtype=kv, reference_dtype=ref,
                block_size=block_size, perplexity=perplexity(got, rows_idx, nxt),
                perplexity_reference=perplexity(want, rows_idx, nxt),
                top1_agreement=float(agree), tokens=int(len(nxt)), windows=num_windows,
                window_len=length))
    return out

