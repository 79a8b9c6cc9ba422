"""The physical block pool: refcounts, a free queue, and the prefix-cache hash map.

Free blocks wait in two insertion-ordered queues: blocks holding no cached content are handed
out first; blocks that still hold a cached, hashed prefix are handed out least recently freed
first, and leave the prefix cache at that moment (eviction). Both queues are dicts, so taking a
block out of the middle (a prefix-cache hit on a free block) is O(1). They are ``OrderedDict``s, not
plain dicts: taking the first key of a dict whose front was deleted scans the dead slots, which
makes a long run of takes quadratic; ``OrderedDict.popitem(last=False)`` is O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from numbers import Integral

from pagebench.errors import OutOfBlocksError, check_positive_int


def check_block_id(name: str, block, num_blocks: int) -> int:
    """``block`` as an int if it is a block id (an integer in 0..num_blocks - 1, not a bool),
    else a ValueError naming ``name``."""
    if isinstance(block, bool) or not isinstance(block, Integral):
        raise ValueError(f"{name}: block ids are integers, got {block!r}")
    if not 0 <= block < num_blocks:
        raise ValueError(f"{name}: {block!r} outside 0..{num_blocks - 1}")
    return int(block)


class BlockPool:
    __slots__ = ("num_blocks", "ref_cnt", "block_hash", "block_key", "_free_plain",
                 "_free_cached", "_cache")

    def __init__(self, num_blocks: int):
        self.num_blocks = check_positive_int("num_blocks", num_blocks)
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        # (parent_hash, token_ids) of each cached block: a hit must match it exactly,
        # so a hash collision can never hand out another prefix's KV.
        self.block_key: list[tuple | None] = [None] * num_blocks
        self._free_plain: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._cache: dict[int, int] = {}  # block hash -> block id

    @property
    def num_free(self) -> int:
        return len(self._free_plain) + len(self._free_cached)

    def take(self, n: int) -> list[int]:
        """n fresh blocks with refcount 1; evicts least recently freed cached blocks if needed."""
        if n > self.num_free:
            raise OutOfBlocksError(f"need {n} free blocks, {self.num_free} of "
                                   f"{self.num_blocks} are free")
        out = []
        for _ in range(n):
            if self._free_plain:
                block = self._free_plain.popitem(last=False)[0]
            else:
                block = self._free_cached.popitem(last=False)[0]
                del self._cache[self.block_hash[block]]
                self.block_hash[block] = self.block_key[block] = None
            self.ref_cnt[block] = 1
            out.append(block)
        return out

    def incref(self, block: int) -> None:
        """One more reference to a block in use, or to a free block holding a cached prefix
        (a hit); a free block without one is ``take``n, not referenced."""
        if type(block) is not int or not 0 <= block < self.num_blocks:  # the fast path first
            block = check_block_id("block", block, self.num_blocks)
        if self.ref_cnt[block] == 0:  # a cached block that was free comes back into use
            if block not in self._free_cached:
                raise ValueError(f"block {block}: free and not cached; take() it instead")
            del self._free_cached[block]
        self.ref_cnt[block] += 1

    def decref(self, block: int) -> None:
        if type(block) is not int or not 0 <= block < self.num_blocks:  # the fast path first
            block = check_block_id("block", block, self.num_blocks)
        if self.ref_cnt[block] == 0:  # a second free would queue it twice, then hand it out twice
            raise ValueError(f"block {block}: already free")
        self.ref_cnt[block] -= 1
        if self.ref_cnt[block] == 0:
            if self.block_hash[block] is None:
                self._free_plain[block] = None
            else:
                self._free_cached[block] = None

    # prefix cache
    def lookup(self, block_hash: int, key: tuple) -> int | None:
        block = self._cache.get(block_hash)
        if block is not None and self.block_key[block] == key:
            return block
        return None

    def can_register(self, block: int, block_hash: int) -> bool:
        """Whether ``register`` would take this block: it is not findable yet, and no other block
        is cached under its hash."""
        return self.block_hash[block] is None and block_hash not in self._cache

    def register(self, block: int, block_hash: int, key: tuple) -> None:
        """Make a full, computed block findable. The first block cached under a hash wins."""
        if self.can_register(block, block_hash):
            self._cache[block_hash] = block
            self.block_hash[block] = block_hash
            self.block_key[block] = key

    def unregister(self, block: int) -> None:
        """Make a block unfindable (its KV will never be written); a free one becomes plain."""
        if self.block_hash[block] is None:
            return
        del self._cache[self.block_hash[block]]
        self.block_hash[block] = self.block_key[block] = None
        if block in self._free_cached:
            del self._free_cached[block]
            self._free_plain[block] = None

    def reset_prefix_cache(self) -> int:
        """Forget the cached prefix of every free block (as vLLM's ``reset_prefix_cache``):
        a later run finds nothing an earlier one left. Blocks in use keep theirs. Returns how
        many were forgotten."""
        dropped = list(self._free_cached)
        for block in dropped:
            self.unregister(block)
        return len(dropped)

    def is_free(self, block: int) -> bool:
        return block in self._free_plain or block in self._free_cached

    def cached_items(self) -> list[tuple[int, int]]:
        """(hash, block id) of every block findable in the prefix cache."""
        return list(self._cache.items())
