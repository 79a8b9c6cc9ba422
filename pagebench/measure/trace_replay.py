"""Replay a sample of a real trace through the engine, next to the simulator on the same sample.

The engine needs token ids; traces have none. Token ``x`` of a prompt is synthesised from the
prompt's 512-token span id and the position in the span, ``mix(hash_ids[x // 512], x % 512)``,
so requests that share leading ``hash_ids`` share identical token blocks and the engine's own
prefix cache (chained block hashes over the tokens) sees exactly the trace's sharing. Requests
without ``hash_ids`` (Azure) get ids of their own: nothing is shared.

Each request arrives at its trace arrival step (``step_ms`` per engine step; idle steps are
skipped, :func:`generate_at_steps`) and generates exactly its (clipped) output length. The simulator
(:func:`pagebench.sim.dynamic.simulate_allocator`, paged, prefix caching) runs the same
workload with the engine's pool as its budget. Both match blocks the same way (leading full
blocks, never the last prompt token, blocks shared from the moment they are allocated), so
with a pool that never evicts the two hit rates are equal. Under memory pressure they can
drift apart by what differs in time: the engine chunks long prefills over steps
(``max_num_batched_tokens``) where the simulator's prefill takes one step, so preemptions and
LRU evictions fall at different moments and different blocks are still cached when a sharer
arrives.
"""

from __future__ import annotations

import numpy as np

from pagebench.engine.engine import LLMEngine
from pagebench.engine.sampling import SamplingParams
from pagebench.errors import ConfigError, check_int
from pagebench.results.datasets import REAL_TRACES_ENGINE
from pagebench.sim.real_traces import DEFAULT_STEP_MS, read_timed_trace
from pagebench.sim.trace import HASH_BLOCK_TOKENS, Workload
from pagebench.measure.timing import cpu_threads, environment

_MASK = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: distinct inputs give unrelated outputs (uint64)."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(_MASK)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def synthesise_prompts(workload: Workload, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Token ids for every request (see the module doc); equal leading ``hash_ids``, equal
    leading tokens."""
    prompts = []
    for i, length in enumerate(workload.prompt_len.tolist()):
        spans = -(-length // HASH_BLOCK_TOKENS)
        if workload.hash_ids is not None:
            ids = workload.hash_ids[i][:spans].astype(np.uint64)
        else:  # a namespace of its own per request: the top bit set, the request index below
            ids = np.full(spans, (1 << 63) | (i * 4096), dtype=np.uint64) + \
                np.arange(spans, dtype=np.uint64)
        pos = np.arange(length, dtype=np.uint64)
        span_id = ids[(pos // np.uint64(HASH_BLOCK_TOKENS)).astype(np.int64)]
        with np.errstate(over="ignore"):
            key = _mix(span_id ^ np.uint64(seed)) ^ (pos % np.uint64(HASH_BLOCK_TOKENS))
            tokens = _mix(key) % np.uint64(vocab_size)
        prompts.append(tokens.astype(np.int64).tolist())
    return prompts


def generate_at_steps(engine: LLMEngine, prompts, params: list[SamplingParams],
                      arrival_steps) -> tuple[list, int]:
    """Complete ``prompts`` with request ``i`` joining the queue at engine step
    ``arrival_steps[i]`` (integers >= 0); steps with nothing to run before the next arrival
    are skipped and counted. Returns the outputs in prompt order and the skipped steps;
    ``engine.stats`` describes the run."""
    arrivals = list(arrival_steps)
    if len(arrivals) != len(prompts):
        raise ConfigError(f"arrival_steps: expected {len(prompts)} integers >= 0, one per prompt")
    arrivals = [check_int(f"arrival_steps[{i}]", a) for i, a in enumerate(arrivals)]
    prompts, params = engine.check_requests(prompts, list(params))
    order = sorted(range(len(prompts)), key=lambda i: (arrivals[i], i), reverse=True)
    engine.begin_stats()
    ids, outputs, clock, idle = {}, {}, 0, 0
    while order or engine.has_unfinished_requests:
        while order and arrivals[order[-1]] <= clock:
            i = order.pop()
            ids[i] = engine.add_request(prompts[i], params[i])
        if not engine.has_unfinished_requests:
            idle += arrivals[order[-1]] - clock
            clock = arrivals[order[-1]]
            continue
        clock += 1
        outputs |= {out.request_id: out for out in engine.step().finished}
    engine.end_stats()
    return [outputs[ids[i]] for i in range(len(prompts))], idle


def replay_trace(model, trace: str, num_requests: int, *, max_model_len: int = 1024,
                 max_output_len: int | None = 64, step_ms: float = DEFAULT_STEP_MS,
                 block_size: int = 16, num_blocks: int | None = None, kernel: str = "auto",
                 seed: int = 0, threads: int | None = 1) -> dict:
    """One tidy row: the engine's and the simulator's prefix-cache hit rate on the same
    sample of ``trace`` (a name or file; see :mod:`pagebench.sim.real_traces`), with the
    engine's tokens/s, preemptions and peak blocks."""
    sample = read_timed_trace(trace).sample(num_requests, seed)
    workload = sample.to_workload(step_ms, max_model_len, max_output_len)
    prompts = synthesise_prompts(workload, model.config.vocab_size, seed)
    params = [SamplingParams(max_tokens=int(o), ignore_eos=True)
              for o in workload.output_len.tolist()]
    with cpu_threads(threads):
        engine = LLMEngine(model, block_size=block_size, num_blocks=num_blocks, kernel=kernel,
                           enable_prefix_caching=True, max_model_len=max_model_len)
        _, idle_steps = generate_at_steps(engine, prompts, params, workload.arrival.tolist())
    stats = engine.stats
    from pagebench.sim.dynamic import simulate_allocator

    sim, _ = simulate_allocator(workload, engine.num_blocks * block_size, "paged", block_size,
                                max_len=max_model_len, prefix_caching=True)
    device = next(model.parameters()).device
    cfg = model.config
    return REAL_TRACES_ENGINE.row(**environment(device) | dict(
        model=f"{cfg.model_type}-L{cfg.num_hidden_layers}-H{cfg.hidden_size}",
        trace=trace, num_requests=workload.num_requests, seed=seed, step_ms=step_ms,
        max_model_len=max_model_len, max_output_len=max_output_len,
        num_clipped=workload.num_clipped, block_size=block_size, num_blocks=engine.num_blocks,
        num_prompt_tokens=stats.num_prompt_tokens,
        engine_prefix_cache_hit_rate=stats.prefix_cache_hit_rate,
        sim_prefix_cache_hit_rate=sim["prefix_cache_hit_rate"],
        engine_num_preemptions=stats.num_preemptions,
        sim_num_preemptions=sim["num_preemptions"],
        engine_peak_blocks=stats.peak_blocks, engine_steps=len(stats.steps),
        idle_steps=idle_steps, tokens_per_s=stats.tokens_per_s,
        elapsed_s=stats.elapsed_s, torch_threads=threads))
