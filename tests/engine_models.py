"""The engine tests' model and prompts: a plain helper module (not a test module) shared by the
tests, ``tests/conftest.py``'s fixtures and the torchrun worker ``tests/tp_worker.py``.

``small_model`` builds through the package's one builder, ``pagebench.measure.engine_bench.tiny_model``,
at the tests' size: small enough that a test generates in well under a second, with a wide
initialisation so that greedy decoding has no near-ties.
"""

from __future__ import annotations

import torch

VOCAB = 256  # token ids the tests' prompts draw from
# 2 layers, hidden 64, 4 query heads over 2 KV heads of 16 dims
SMALL_MODEL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
# what a family needs beyond the shared shape (Qwen3 states its head dim; Mistral's sliding
# window is wider than any test's context, so it attends as the others do)
FAMILY_CONFIG = {"qwen3": {"head_dim": 16}, "mistral": {"sliding_window": 256}}


def small_model(family: str = "qwen2", seed: int = 0, **config):
    """A new random-weight model of ``family`` (qwen2, qwen3, llama, mistral) at the tests'
    size, ``config`` overriding it."""
    from pagebench.measure.engine_bench import tiny_model

    return tiny_model(seed, family=family, **SMALL_MODEL | FAMILY_CONFIG.get(family, {}) | config)


def random_prompts(lengths, seed: int = 1) -> list[list[int]]:
    """Token-id lists of those lengths, drawn below VOCAB."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def greedy(engine, prompts, max_tokens: int) -> list[list[int]]:
    """Each prompt's greedy token ids, every token asked for generated (no stop on EOS)."""
    from pagebench.engine import SamplingParams

    res = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return [r.outputs[0].token_ids for r in res]
