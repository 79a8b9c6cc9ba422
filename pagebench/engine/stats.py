"""What the engine records per step and summarises per run (``LLMEngine.stats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

UTILISATION_EVERY = 8  # steps between samples of the pool's token utilisation


@dataclass(slots=True)
class StepRecord:
    """One engine step: its batch, the KV it read and wrote, its wall time.

    ``num_prefill_tokens`` are prompt (or recomputed) positions; ``num_decode_seqs`` sequences
    computed one sampled token each; ``num_context_tokens`` is the KV the step's attention reads
    (every scheduled sequence's computed tokens plus its new ones): the inputs of a step-cost
    model."""

    step: int
    batch_size: int
    num_batched_tokens: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_context_tokens: int
    blocks_used: int
    num_preempted: int
    num_sampled: int = 0
    time_s: float = 0.0

    @property
    def is_decode(self) -> bool:
        return self.num_batched_tokens == self.batch_size


@dataclass(slots=True)
class EngineStats:
    """A run of the engine (one ``generate`` call, or ``begin_stats`` .. ``end_stats``).

    ``peak_blocks`` / ``mean_blocks``: blocks in use after scheduling, over steps;
    ``token_utilisation``: filled slots / slots of blocks in use, sampled every 8 steps;
    ``prefix_cache_hit_rate``: prompt tokens found cached at first admission / prompt tokens;
    ``num_computed_prompt_tokens``: prompt positions run through the model, recomputation after
    preemption included; ``tokens_per_s``: generated tokens / wall time of the run;
    ``decode_tokens_per_s``: tokens sampled in decode-only steps / those steps' wall time;
    ``graphs``: the CUDA-graph and compile setup (``LLMEngine.graphs()``)."""

    graphs: dict
    num_blocks: int
    block_size: int
    peak_blocks: int = 0
    mean_blocks: float = 0.0
    token_utilisation: float = 0.0
    num_preemptions: int = 0
    prefix_cache_hit_rate: float = 0.0
    num_prompt_tokens: int = 0
    num_computed_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    elapsed_s: float = 0.0
    tokens_per_s: float = 0.0
    num_decode_steps: int = 0
    decode_time_s: float = 0.0
    num_decode_tokens: int = 0
    decode_tokens_per_s: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def cuda_graphs(self) -> bool:
        return bool(self.graphs.get("cuda_graphs", False))

    @property
    def compiled_layers(self) -> bool:
        return bool(self.graphs.get("compiled_layers", False))


class StatsRecorder:
    """Accumulates a run's steps; ``summary`` turns them into :class:`EngineStats`."""

    def __init__(self):
        self.steps: list[StepRecord] = []
        self.utilisation: list[float] = []
        self.num_prompt_tokens = 0
        self.num_computed_prompt_tokens = 0
        self.num_generated_tokens = 0

    def wants_utilisation(self) -> bool:
        """Sampled, not every step: reading it is O(blocks)."""
        return len(self.steps) % UTILISATION_EVERY == 1

    def summary(self, graphs: dict, num_blocks: int, block_size: int, num_preemptions: int,
                num_cached_prompt_tokens: int, elapsed_s: float) -> EngineStats:
        steps, prompt = self.steps, self.num_prompt_tokens
        blocks = [s.blocks_used for s in steps] or [0]
        util = self.utilisation or [0.0]
        decode = [s for s in steps if s.is_decode]
        decode_s = sum(s.time_s for s in decode)
        decode_tokens = sum(s.num_sampled for s in decode)
        generated = self.num_generated_tokens
        return EngineStats(
            graphs=graphs, num_blocks=num_blocks, block_size=block_size,
            peak_blocks=max(blocks), mean_blocks=sum(blocks) / len(blocks),
            token_utilisation=sum(util) / len(util), num_preemptions=num_preemptions,
            prefix_cache_hit_rate=num_cached_prompt_tokens / prompt if prompt else 0.0,
            num_prompt_tokens=prompt, num_computed_prompt_tokens=self.num_computed_prompt_tokens,
            num_generated_tokens=generated, elapsed_s=elapsed_s,
            tokens_per_s=generated / elapsed_s if elapsed_s > 0 else 0.0,
            num_decode_steps=len(decode), decode_time_s=decode_s,
            num_decode_tokens=decode_tokens,
            decode_tokens_per_s=decode_tokens / decode_s if decode_s > 0 else 0.0,
            steps=steps)
