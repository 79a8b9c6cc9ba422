"""The reference paged engine: decode throughput versus batch size across block sizes, prefill,
and prefix caching on and off.

A random-weight model from a preset config: on CPU a tiny Qwen2 (2 layers, hidden 128) so the
engine's own overheads (scheduling, block tables, cache writes) show; on a GPU the real
Qwen2.5-0.5B shape in bf16 with the Triton kernel, where the engine's decode steps replay CUDA
graphs of its compiled layers (its default there). Decode cases generate 32 tokens per request
from 16-token prompts, so the run is decode-dominated; tokens/s counts generated tokens, and
the decode tracks read the engine's own per-step times of its decode-only steps.
"""

from __future__ import annotations

import dataclasses

from .common import (SkipCase, cpu_median_us, defaults, gpu_median_us, on_gpu, require,
                     require_cpu)

ON_GPU = on_gpu()
NEW_TOKENS = 32
PROMPT_LEN = 16


def build_engine(block_size: int, prefix_caching: bool = False, num_blocks: int = 4096,
                 max_num_seqs: int = 256):
    import torch

    engine_mod = require("pagebench.engine", "LLMEngine", "SamplingParams")
    config_mod = require("pagebench.config", "preset_config")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    if ON_GPU:
        config = config_mod.preset_config("qwen2.5-0.5b")
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to("cuda")
        kernel = "triton"
    else:
        require_cpu()  # sets the torch thread count
        config = config_mod.preset_config("qwen2.5-0.5b", **defaults.TINY_MODEL)
        model = AutoModelForCausalLM.from_config(config)
        kernel = "auto"
    try:
        engine = engine_mod.LLMEngine(model, block_size=block_size, num_blocks=num_blocks,
                                      kernel=kernel, enable_prefix_caching=prefix_caching,
                                      max_num_seqs=max_num_seqs,
                                      max_num_batched_tokens=max(2048, max_num_seqs * PROMPT_LEN))
    except TypeError as e:  # an engine from before one of these arguments existed
        raise SkipCase(f"LLMEngine: {e}") from e
    return engine, engine_mod.SamplingParams, config.vocab_size


def _median_us(fn) -> float:
    # a whole generate call syncs with the host (sampling): no CUDA graph
    return (gpu_median_us(fn, cuda_graph=False, repeat=5) if ON_GPU
            else cpu_median_us(fn, repeat=3, warmup=0))


class Decode:
    """`generate` for a batch of 16-token prompts, 32 new tokens each (greedy, ignore EOS)."""

    params = [[1, 8, 32], [8, 16, 128]] if not ON_GPU else [[1, 32, 256], [16, 128]]
    param_names = ["batch", "block_size"]
    timeout = 900

    def setup(self, batch, block_size):
        import random

        self.engine, sampling, vocab = build_engine(block_size)
        r = random.Random(batch)
        self.prompts = [[r.randrange(vocab) for _ in range(PROMPT_LEN)] for _ in range(batch)]
        self.sampling = sampling(max_tokens=NEW_TOKENS, ignore_eos=True)
        self.run()  # warm-up (and Triton compilation on a GPU)

    def run(self):
        return self.engine.generate(self.prompts, self.sampling, use_tqdm=False)

    def track_tokens_per_s(self, batch, block_size):
        return batch * NEW_TOKENS / (_median_us(self.run) * 1e-6)

    track_tokens_per_s.unit = "tokens/s"

    def _decode_stats(self, key):
        """Median over 3 calls of a decode-only-steps figure of ``engine.stats`` (on a GPU:
        graph-replayed steps); an engine without per-step times falls back to whole calls."""
        values = []
        for _ in range(3):
            self.run()
            stats = self.engine.stats
            if not isinstance(stats, dict):  # EngineStats, from the engine's step() API on
                stats = dataclasses.asdict(stats)
            if key not in stats:
                raise SkipCase(f"engine.stats has no {key!r}")
            values.append(stats[key] if key != "decode_time_s" else
                          stats[key] / max(1, stats["num_decode_steps"]))
        return sorted(values)[1]

    def track_decode_step_ms(self, batch, block_size):
        """Median wall time of one decode-only step (scheduling and sampling included)."""
        return self._decode_stats("decode_time_s") * 1e3

    track_decode_step_ms.unit = "ms"

    def track_decode_tokens_per_s(self, batch, block_size):
        """Tokens sampled in decode-only steps / those steps' wall time."""
        return self._decode_stats("decode_tokens_per_s")

    track_decode_tokens_per_s.unit = "tokens/s"


class Prefill:
    """Prefill of 8 prompts that share a system prompt (3/4 of each), with prefix caching off
    and on; one new token each. With caching on, the shared blocks stay cached between calls,
    as a server's system prompt would; each call's last quarters are new (drawn in the timed
    call, ~0.1 ms), so only the shared part can hit."""

    params = [[256, 1024], [False, True]]
    param_names = ["prompt_len", "prefix_caching"]
    timeout = 900

    def setup(self, prompt_len, prefix_caching):
        import random

        self.engine, sampling, self.vocab = build_engine(16, prefix_caching=prefix_caching)
        self.random = random.Random(prompt_len)
        self.shared = [self.random.randrange(self.vocab) for _ in range(prompt_len * 3 // 4)]
        self.unique = prompt_len - len(self.shared)
        self.sampling = sampling(max_tokens=1, ignore_eos=True)
        self.run()

    def run(self):
        tokens = range(self.vocab)
        prompts = [self.shared + self.random.choices(tokens, k=self.unique) for _ in range(8)]
        return self.engine.generate(prompts, self.sampling, use_tqdm=False)

    def time_prefill(self, prompt_len, prefix_caching):
        self.run()

    def track_prefill_tokens_per_s(self, prompt_len, prefix_caching):
        """Prompt tokens per second (cached ones count: they are served, not computed)."""
        return 8 * prompt_len / (_median_us(self.run) * 1e-6)

    track_prefill_tokens_per_s.unit = "tokens/s"

