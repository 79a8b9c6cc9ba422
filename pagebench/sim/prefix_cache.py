"""Prefix caching for the time-stepped simulator: which prompt blocks are shared, and the cache.

Sharing rule
------------
A trace names each prompt's 512-token spans by ``hash_ids`` (equal leading ids = equal
tokens). A KV block of ``b`` tokens can be reused by a later request only if it is *full* and
its whole prefix is equal: block ``j`` (tokens ``[j*b, (j+1)*b)``) of a request is named by the
ids of every span up to the one holding its last token, ``hash_ids[:K+1]`` with
``K = ((j+1)*b - 1) // 512``, and by ``j``. For ``b`` dividing 512 each shared span is ``512/b``
shareable blocks; other block sizes share only the whole blocks lying inside a run of shared
spans. This is what a real prefix cache (vLLM's chained block hashes) sees when the tokens of a
span are a function of its id and position.

Cache
-----
:class:`PrefixBlockCache` keeps one entry per cached block key with a reference count (running
requests holding it). A block nobody references stays cached, and evictable, in LRU order; a
request that finishes or is preempted releases its blocks tail first, so the end of a prefix is
evicted before its start (as vLLM does). Matching stops at the first missing block and never
covers the last prompt token, which is always computed (at most ``(prompt_len - 1) // b``
blocks hit).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from pagebench.sim.trace import HASH_BLOCK_TOKENS

KEY_POSITION_BITS = 32  # key = prefix id << 32 | block index


class PrefixNames:
    """Interns prefixes of ``hash_ids`` as small integers: equal prefixes, equal ids."""

    def __init__(self):
        self._ids: dict[tuple[int, int], int] = {}

    def prefix_ids(self, hash_ids) -> np.ndarray:
        """``out[k]`` names ``hash_ids[:k+1]``."""
        out = np.empty(len(hash_ids), dtype=np.int64)
        parent = -1
        ids = self._ids
        for k, h in enumerate(hash_ids.tolist() if hasattr(hash_ids, "tolist") else hash_ids):
            parent = ids.setdefault((parent, h), len(ids))
            out[k] = parent
        return out

    def block_keys(self, hash_ids, prompt_len: int, block_size: int) -> list[int]:
        """Keys of the full ``block_size`` blocks of a prompt of ``prompt_len`` tokens whose
        spans are ``hash_ids`` (see the module doc)."""
        full = int(prompt_len) // block_size
        if full == 0 or hash_ids is None or len(hash_ids) == 0:
            return []
        prefix = self.prefix_ids(hash_ids)
        j = np.arange(full, dtype=np.int64)
        span = ((j + 1) * block_size - 1) // HASH_BLOCK_TOKENS
        return ((prefix[span] << KEY_POSITION_BITS) | j).tolist()


class PrefixBlockCache:
    """Cached full prompt blocks, by key.

    ``refs[key]`` is the number of running requests holding the block, or, for a block nobody
    holds (evictable), ``-stamp`` where ``stamp`` orders the moments blocks became free
    (least recently used = smallest). ``queue`` lists ``(key, -stamp)`` in that order; an entry
    whose block was taken again since is stale and skipped at eviction, which keeps every
    operation a bulk dict or deque update. ``shared_extra`` is the number of references beyond
    the first, summed over blocks: the blocks that sharing saves right now.
    """

    def __init__(self):
        self.refs: dict[int, int] = {}
        self.queue: deque[tuple[int, int]] = deque()
        self.num_evictable = 0
        self.shared_extra = 0
        self._clock = 0

    @property
    def num_cached(self) -> int:
        return len(self.refs)

    def evictable_keys(self) -> list[int]:
        """Unreferenced cached keys, least recently used first (for tests and inspection)."""
        refs = self.refs
        return [k for k, mark in self.queue if refs.get(k) == mark]

    def match(self, keys: list[int], limit: int) -> tuple[int, int]:
        """``(hits, unreferenced)``: how many leading ``keys`` (at most ``limit``) are cached,
        and how many of those no one references (taking them makes them unevictable)."""
        refs = self.refs
        hits = unreferenced = 0
        for k in keys:
            if hits >= limit:
                break
            r = refs.get(k)
            if r is None:
                break
            hits += 1
            unreferenced += r < 0
        return hits, unreferenced

    def acquire(self, keys: list[int], hits: int) -> None:
        """Reference the first ``hits`` keys (all cached: :meth:`match` said so)."""
        refs = self.refs
        for k in keys[:hits]:
            r = refs[k]
            if r > 0:
                self.shared_extra += 1
                refs[k] = r + 1
            else:
                self.num_evictable -= 1
                refs[k] = 1

    def register(self, keys: list[int]) -> list[int]:
        """Cache the newly computed blocks ``keys`` with one reference each; a key already
        cached stays as it is (the new block stays private). Returns the keys registered."""
        refs = self.refs
        added = [k for k in keys if k not in refs]
        refs.update(dict.fromkeys(added, 1))
        return added

    def release(self, keys: list[int]) -> int:
        """Drop one reference from each of ``keys`` (a request's cached blocks, in order);
        returns how many became unreferenced (now evictable, the last block first)."""
        refs = self.refs
        tail_first = keys[::-1]
        left = [refs[k] - 1 for k in tail_first]
        refs.update(zip(tail_first, left))
        unreferenced = [k for k, r in zip(tail_first, left) if not r]
        marks = range(-self._clock - 1, -self._clock - 1 - len(unreferenced), -1)
        self._clock += len(unreferenced)
        refs.update(zip(unreferenced, marks))
        self.queue.extend(zip(unreferenced, marks))
        self.num_evictable += len(unreferenced)
        self.shared_extra -= len(keys) - len(unreferenced)
        return len(unreferenced)

    def evict(self, count: int) -> None:
        """Forget the ``count`` least recently used unreferenced blocks."""
        if count > self.num_evictable:
            raise ValueError(f"count: {count} blocks to evict, {self.num_evictable} evictable")
        refs, popleft = self.refs, self.queue.popleft
        self.num_evictable -= count
        while count:
            entries = [popleft() for _ in range(count)]
            victims = [k for k, mark in entries if refs.get(k) == mark]
            for k in victims:
                del refs[k]
            count -= len(victims)
