"""Serving predicted on a CPU: the engine's scheduler replayed in time, each step lasting what a
:class:`~pagebench.sim.step_cost.StepCostModel` says it costs.

The schedule is the engine's (``pagebench.engine.scheduler``): running sequences first, in
admission order, each taking its next uncomputed tokens (one for a decoding sequence, a chunk of
at most the remaining token budget for a prefilling one); a decoding sequence that needs a block
when the pool is dry preempts the most recently admitted (recompute: it returns to the front of
the queue and is prefilled again, outputs included); then, unless the step preempted, waiting
requests are admitted first come first served while the budget, ``max_num_seqs`` and the pool
allow, with a prefix-cache hit skipping the leading blocks it finds. A sequence whose step
reaches its last token samples one at the step's end. Requests arrive at their times; arrivals
are admitted at the first step that starts after them, and an idle engine waits for the next.
The step's cost is prefill (and recomputed) tokens, decoding sequences, the context tokens
read and the sequences prefilling, so prefill costs what it costs and a long prompt delays
every sequence batched with it.

Prefix caching is modelled at block granularity from the trace's ``hash_ids`` (a block is
identified by its 512-token span's id and its offset in the span, as the trace replay
synthesises tokens), blocks become findable when the step computing them is scheduled, and
are never evicted (the pool is taken as large enough to keep them; sharing does not reduce the
blocks a request holds). With ``reserve_len`` the pool is a contiguous reservation instead of
paging: a request is admitted only if ``reserve_len`` slots for it fit (reserve-max: the model's
``max_model_len``; Orca's power-of-two and exact-size reservations likewise), holds them until
it finishes and so never needs a block while decoding. A step is *memory-bound* when a waiting
request was refused for want of free blocks or a sequence was preempted. Results: every request's arrival, first scheduled step, token times
and finish (:class:`~pagebench.sim.latency.RequestTiming`), scored by
:func:`~pagebench.sim.latency.serving_metrics`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from pagebench.errors import ConfigError, check_positive_int
from pagebench.sim.latency import RequestTiming
from pagebench.sim.step_cost import StepCostModel
from pagebench.sim.trace import HASH_BLOCK_TOKENS


@dataclass(slots=True)
class SimulatedStep:
    start_s: float
    end_s: float
    num_prefill_tokens: int
    num_decode_seqs: int
    num_context_tokens: int
    blocks_used: int
    tokens_held: int = 0  # KV entries the running sequences hold at the step's end
    memory_bound: bool = False  # a waiting request did not fit the free blocks, or a preemption


@dataclass(slots=True)
class SimulatedRun:
    requests: list[RequestTiming]
    steps: list[SimulatedStep]
    duration_s: float
    num_preemptions: int
    num_cached_prompt_tokens: int


class _Seq:
    __slots__ = ("index", "prompt_len", "max_tokens", "length", "computed", "blocks",
                 "admitted", "keys")

    def __init__(self, index, prompt_len, max_tokens, keys):
        self.index, self.prompt_len, self.max_tokens = index, prompt_len, max_tokens
        self.length = prompt_len  # prompt + sampled tokens
        self.computed = 0
        self.blocks = 0
        self.admitted = False
        self.keys = keys  # prefix-cache identity of each full prompt block (None: unshared)


def _block_keys(index: int, prompt_len: int, block_size: int, hash_ids) -> list:
    full = prompt_len // block_size
    if hash_ids is None or HASH_BLOCK_TOKENS % block_size:
        return [(-1 - index, k) for k in range(full)]  # a namespace of the request's own
    spans = np.asarray(hash_ids).tolist()
    return [(spans[k * block_size // HASH_BLOCK_TOKENS], k * block_size % HASH_BLOCK_TOKENS)
            if k * block_size // HASH_BLOCK_TOKENS < len(spans) else (-1 - index, k)
            for k in range(full)]


def simulate_serving(arrival_s, prompt_len, output_len, cost: StepCostModel, *,
                     block_size: int, num_blocks: int, max_num_seqs: int = 256,
                     max_num_batched_tokens: int = 2048, prefix_caching: bool = False,
                     hash_ids=None, reserve_len=None) -> SimulatedRun:
    """Serve every request (see the module doc); ``hash_ids``: one array of span ids per
    request (Mooncake traces), or None; ``reserve_len``: the slots each request reserves at
    admission (a contiguous reservation, at least prompt + output - 1), or None (paging)."""
    for name, value in (("block_size", block_size), ("num_blocks", num_blocks),
                        ("max_num_seqs", max_num_seqs),
                        ("max_num_batched_tokens", max_num_batched_tokens)):
        check_positive_int(name, value)
    arrival = np.asarray(arrival_s, dtype=np.float64)
    prompts, outputs = np.asarray(prompt_len).tolist(), np.asarray(output_len).tolist()
    if not (len(arrival) == len(prompts) == len(outputs)):
        raise ConfigError("arrival_s, prompt_len, output_len: one value per request each")
    if min(prompts + outputs, default=1) < 1:
        raise ConfigError("prompt_len, output_len: every request needs >= 1 of each")
    seqs = [_Seq(i, p, o, _block_keys(i, p, block_size, None if hash_ids is None
                                      else hash_ids[i]) if prefix_caching else [])
            for i, (p, o) in enumerate(zip(prompts, outputs))]
    if reserve_len is not None:
        reserve = np.asarray(reserve_len).tolist()
        if len(reserve) != len(prompts) or any(
                r < p + o - 1 for r, p, o in zip(reserve, prompts, outputs)):
            raise ConfigError("reserve_len: one value per request, each >= prompt + output - 1")
        if prefix_caching:
            raise ConfigError("reserve_len: a contiguous reservation shares no blocks; "
                              "prefix_caching needs paging")
    else:
        reserve = [p + o - 1 for p, o in zip(prompts, outputs)]
    need = [-(-r // block_size) for r in reserve]
    if max(need, default=0) > num_blocks:
        raise ConfigError(f"num_blocks: a request needs {max(need)} blocks of {block_size} "
                          f"tokens alone, the pool has {num_blocks}")
    timings = [RequestTiming(float(a), p) for a, p in zip(arrival.tolist(), prompts)]
    order = deque(sorted(range(len(seqs)), key=lambda i: (arrival[i], i)))
    waiting: deque[_Seq] = deque()
    running: list[_Seq] = []
    cached: set = set()
    free = num_blocks
    steps: list[SimulatedStep] = []
    now, preemptions, hits = 0.0, 0, 0

    def blocks_for(n):
        return -(-n // block_size)

    while order or waiting or running:
        while order and arrival[order[0]] <= now:
            waiting.append(seqs[order.popleft()])
        if not waiting and not running:
            now = float(arrival[order[0]])
            continue
        budget, batch, preempted, refused = max_num_batched_tokens, [], False, False
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            if seq.computed == seq.length - 1 and blocks_for(seq.length) > seq.blocks:
                while free < 1:  # the newest token needs a block: preempt from the back
                    victim = running.pop()
                    free += victim.blocks
                    victim.blocks, victim.computed = 0, 0
                    waiting.appendleft(victim)
                    preemptions += 1
                    preempted = True
                    if victim is seq:
                        break
                if seq.blocks == 0 and seq not in running:
                    break
                seq.blocks += 1
                free -= 1
            new = min(seq.length - seq.computed, budget)
            batch.append((seq, seq.computed, new))
            budget -= new
            i += 1
        occupied = len(running)
        while not preempted and waiting and budget > 0 and occupied < max_num_seqs:
            seq = waiting[0]
            have = 0
            if prefix_caching:
                limit = (seq.length - 1) // block_size  # the last token is always computed
                while have < min(limit, len(seq.keys)) and seq.keys[have] in cached:
                    have += 1
            held = blocks_for(seq.length if reserve_len is None else reserve[seq.index])
            fresh = held - have
            if fresh > free:
                refused = True
                break
            waiting.popleft()
            free -= fresh
            seq.blocks = held
            seq.computed = have * block_size
            if not seq.admitted:
                hits += seq.computed
                seq.admitted = True
            running.append(seq)
            occupied += 1
            new = min(seq.length - seq.computed, budget)
            batch.append((seq, seq.computed, new))
            budget -= new
        if not batch:
            raise ConfigError("num_blocks: no request could be scheduled (pool too small)")
        prefill = decode = context = prefill_seqs = 0
        for seq, start, new in batch:
            context += start + new
            if new == 1 and start >= seq.prompt_len and start + 1 == seq.length:
                decode += 1
            else:
                prefill += new
                prefill_seqs += 1
            if prefix_caching:
                cached.update(seq.keys[:min(start + new, seq.prompt_len) // block_size])
            t = timings[seq.index]
            if t.first_scheduled_s is None:
                t.first_scheduled_s = now
        end = now + cost.step_ms(prefill, decode, context, prefill_seqs) / 1e3
        step = SimulatedStep(now, end, prefill, decode, context, num_blocks - free,
                             memory_bound=preempted or refused)
        steps.append(step)
        for seq, start, new in batch:
            seq.computed = start + new
        step.tokens_held = sum(seq.computed for seq in running)
        for seq, _, _ in batch:
            if seq.computed < seq.length:
                continue  # a prefill chunk: nothing sampled yet
            t = timings[seq.index]
            t.token_s.append(end)
            seq.length += 1
            if len(t.token_s) >= seq.max_tokens:
                t.finish_s = end
                running.remove(seq)
                free += seq.blocks
                seq.blocks = 0
        now = end
    return SimulatedRun(timings, steps, max((t.finish_s for t in timings), default=0.0),
                        preemptions, hits)
