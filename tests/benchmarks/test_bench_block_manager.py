"""Block-manager throughput: appended tokens per second, block size 16, prefix caching off/on.

CI runs these once as checks (``--benchmark-disable``); ``make bench`` times them and writes
JSON with ``tokens_per_s`` in each benchmark's ``extra_info``.
"""

from __future__ import annotations

import pytest

from pagebench.engine.block_manager import BlockManager

NUM_SEQS = 64
TOKENS_PER_SEQ = 2048  # 131,072 appended tokens per round


def decode_round(bm: BlockManager) -> int:
    """64 sequences grow one token at a time, round robin (as decode steps do), then free."""
    for s in range(NUM_SEQS):
        bm.allocate(s, [s])
    append = bm.append_token
    for t in range(TOKENS_PER_SEQ):
        for s in range(NUM_SEQS):
            append(s, t)
    for s in range(NUM_SEQS):
        bm.free(s)
    return NUM_SEQS * TOKENS_PER_SEQ


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["prefix_off", "prefix_on"])
def test_append_throughput(benchmark, prefix_caching):
    bm = BlockManager(NUM_SEQS * (TOKENS_PER_SEQ // 16 + 2), 16, enable_prefix_caching=prefix_caching)
    appended = benchmark(decode_round, bm)
    assert appended == NUM_SEQS * TOKENS_PER_SEQ
    if not prefix_caching:
        assert bm.num_free_blocks == bm.num_blocks  # every block came back
    else:  # freed full blocks stay findable in the prefix cache
        assert bm.num_used_blocks == 0 and bm.prefix_cache_entries()
    benchmark.extra_info.update(block_size=16, prefix_caching=prefix_caching,
                                appended_tokens=appended)
    if benchmark.stats is not None:
        benchmark.extra_info["tokens_per_s"] = appended / benchmark.stats.stats.median


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["prefix_off", "prefix_on"])
def test_allocate_free_2048_token_prompts(benchmark, prefix_caching):
    """16 new prompts a round: each round's first tokens are its own, so with prefix caching
    on the allocations hash and register their blocks but never hit (the same prompts every
    round timed prefix hits from the second round on)."""
    bm = BlockManager(4096, 16, enable_prefix_caching=prefix_caching)
    body = list(range(2047))
    rounds = iter(range(1 << 62))

    def allocate_free():
        first = next(rounds) * 16
        for i in range(16):
            bm.allocate(i, [first + i] + body)
        cached = sum(bm.num_cached_tokens(i) for i in range(16))
        for i in range(16):
            bm.free(i)
        return cached

    assert benchmark(allocate_free) == 0
    assert allocate_free() == 0  # a later round: still no hit
    assert bm.num_used_blocks == 0
