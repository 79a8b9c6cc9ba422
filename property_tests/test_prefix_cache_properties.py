"""Prefix caching in the time-stepped simulator against slow, obvious references.

- Sharing rule: with an unlimited budget nothing is evicted, so a request's hit blocks are the
  leading full blocks whose *token prefix* appeared in an earlier request's full block (tokens
  synthesised from the hash ids: token ``x`` of a prompt is ``(hash_ids[x // 512], x % 512)``),
  at most ``(prompt_len - 1) // b`` of them. Any block size, dividing 512 or not.
- Cache: every operation sequence keeps :class:`PrefixBlockCache` equal to a plain model (a
  dict of reference counts and a list in LRU order).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pagebench.sim.dynamic import run_dynamic
from pagebench.sim.prefix_cache import PrefixBlockCache, PrefixNames
from pagebench.sim.trace import HASH_BLOCK_TOKENS
from pagebench.sim.trace import Workload


@st.composite
def shared_traces(draw):
    """Prompts of up to 4 spans whose ids branch from a few common prefixes."""
    count = draw(st.integers(1, 10))
    prompts, ids = [], []
    for _ in range(count):
        spans = draw(st.integers(1, 4))
        # few distinct ids per position: prefixes are often shared, sometimes only partly
        ids.append([draw(st.integers(0, 2)) * 10 + k for k in range(spans)])
        last = draw(st.integers(1, HASH_BLOCK_TOKENS))
        prompts.append((spans - 1) * HASH_BLOCK_TOKENS + last)
    arrival = np.cumsum(draw(st.lists(st.integers(0, 3), min_size=count, max_size=count)))
    outputs = draw(st.lists(st.integers(1, 40), min_size=count, max_size=count))
    return Workload(arrival, np.array(prompts), np.array(outputs), np.ones(count, np.int64),
                    hash_ids=tuple(np.array(h) for h in ids))


def reference_hit_tokens(w: Workload, b: int) -> int:
    seen: set = set()
    total = 0
    for P, ids in zip(w.prompt_len.tolist(), w.hash_ids):
        tokens = [(int(ids[x // HASH_BLOCK_TOKENS]), x % HASH_BLOCK_TOKENS) for x in range(P)]
        prefixes = [tuple(tokens[:(j + 1) * b]) for j in range(P // b)]
        hits = 0
        while hits < min(len(prefixes), (P - 1) // b) and prefixes[hits] in seen:
            hits += 1
        total += hits * b
        seen.update(prefixes)
    return total


@given(shared_traces(), st.sampled_from([1, 3, 16, 48, 100, 128, 512, 700]))
def test_unlimited_budget_hits_follow_the_sharing_rule(w, b):
    budget = int(w.length.sum()) * 2 + 2 * b
    result = run_dynamic(w, budget, allocators=("paged",), block_sizes=(b,),
                         max_len=4 * HASH_BLOCK_TOKENS + 64, prefix_caching=True)
    row = result.summary[0]
    expected = reference_hit_tokens(w, b)
    assert round(row["prefix_cache_hit_rate"] * int(w.prompt_len.sum())) == expected
    assert row["num_preemptions"] == 0


@given(shared_traces(), st.sampled_from([16, 64]), st.integers(0, 40))
def test_small_budgets_conserve_memory(w, b, extra_blocks):
    """Eviction and preemption under pressure: the breakdown still sums to the budget and the
    simulator's own end-of-run check finds no leaked or lost cached block."""
    need = int(-(-w.length.max() // b))
    budget = (need + extra_blocks) * b
    result = run_dynamic(w, budget, allocators=("paged",), block_sizes=(b,),
                         max_len=4 * HASH_BLOCK_TOKENS + 64, prefix_caching=True,
                         timeline_every=1)
    cols = result.timeline_columns
    total = sum(cols[c] for c in ("token_state", "internal_frag", "external_frag", "free"))
    assert (total == budget).all()
    assert (cols["token_state"] >= 0).all() and (cols["internal_frag"] >= 0).all()
    assert 0.0 <= result.summary[0]["prefix_cache_hit_rate"] < 1.0


ops = st.lists(st.tuples(st.sampled_from(["take", "drop", "evict"]),
                         st.lists(st.integers(0, 12), min_size=1, max_size=6, unique=True)),
               max_size=40)


@given(ops)
def test_cache_matches_a_plain_model(steps):
    cache = PrefixBlockCache()
    refs: dict[int, int] = {}
    lru: list[int] = []
    held: list[list[int]] = []
    for op, keys in steps:
        if op == "take":
            hits, unreferenced = cache.match(keys, len(keys))
            want = 0
            while want < len(keys) and keys[want] in refs:
                want += 1
            assert hits == want and unreferenced == sum(refs[k] == 0 for k in keys[:want])
            cache.acquire(keys, hits)
            for k in keys[:hits]:
                if refs[k] == 0:
                    lru.remove(k)
                refs[k] += 1
            added = cache.register(keys[hits:])
            assert added == [k for k in keys[hits:] if k not in refs]
            refs.update(dict.fromkeys(added, 1))
            held.append(keys[:hits] + added)
        elif op == "drop" and held:
            keys = held.pop(len(held) // 2)
            freed = cache.release(keys)
            became = [k for k in reversed(keys) if refs[k] == 1]
            for k in keys:
                refs[k] -= 1
            lru.extend(became)
            assert freed == len(became)
        elif op == "evict":
            count = min(len(keys), len(lru))
            cache.evict(count)
            for k in lru[:count]:
                del refs[k]
            del lru[:count]
        assert cache.evictable_keys() == lru and cache.num_evictable == len(lru)
        assert {k: max(r, 0) for k, r in cache.refs.items()} == refs
        assert cache.shared_extra == sum(max(r - 1, 0) for r in refs.values())


def test_block_keys_for_block_sizes_dividing_512_and_not():
    names = PrefixNames()
    a = names.block_keys(np.array([7, 8]), 1024, 256)
    b = names.block_keys(np.array([7, 9]), 1000, 256)
    assert a[:2] == b[:2] and a[2] != b[2] and len(b) == 3  # 1000 // 256 full blocks
    # 384-token blocks: block 1 spans both 512-token spans, so it is shared only if both are
    assert names.block_keys(np.array([7, 8]), 1024, 384)[:1] == \
        names.block_keys(np.array([7, 9]), 1024, 384)[:1]
    assert names.block_keys(np.array([7, 8]), 1024, 384)[1] != \
        names.block_keys(np.array([7, 9]), 1024, 384)[1]
