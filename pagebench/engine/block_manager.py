"""Per-sequence KV state over a shared block pool: allocate, append, fork, schedule, free.

The manager is the one owner of each sequence's KV-side state: its block table, the tokens
that have a cache slot, how many of them are computed (their KV is in the cache, or written by
the step in flight), and the prefix-cache hashes of its full blocks. A scheduler keeps the
request side (prompt, sampled tokens, sampling state) and reads this side through counts and
``KVBlocks``; the block-boundary arithmetic (blocks for n tokens, a token's cache slot) lives
here too, so that nothing outside computes ``position // block_size``.

Copy-on-write: a sequence about to write into a block that others also reference takes a fresh
block, records a (src, dst) copy for the KV cache to perform (``take_copies``), and repoints its
table. Until the copy is handed out, the sequence's reference stays on the source: its content
must survive until it is copied, so a block that the other sharers free meanwhile (a preemption
in the same step) cannot be handed out again, as another copy's destination, before that. The
last sharer writes in place: references held only for pending copies do not count, since the
copies run before the step writes any KV (so n sharers make n - 1 copies, as in vLLM).

Prefix caching: every full block is identified by a chained hash of (parent block's hash,
this block's token ids); a new prompt reuses cached blocks for its longest block-aligned prefix,
capped one token short of the prompt so that the last prompt token is always computed. An
engine registers a full block when it schedules the step that fills it (``schedule_step``, i.e.
``cache_full_blocks(..., written=False)``, vLLM v1's rule), so later requests of the same step already share it: they read
it only within that step's attention, after every layer has written the whole step's K/V. Such
a block stays "unwritten" until ``blocks_written``; freeing a sequence that holds one (a step
that never runs) makes it unfindable, so no later request can hit KV that was never written.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from numbers import Integral
from operator import countOf

from pagebench.config import ceil_div
from pagebench.engine.block_pool import BlockPool, check_block_id
from pagebench.errors import OutOfBlocksError, SequenceError, check_positive_int

ROOT_HASH = 0x9E3779B97F4A7C15  # parent hash of a sequence's first block


def block_hash(parent_hash: int, token_ids: tuple) -> int:
    return hash((parent_hash, token_ids))


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` tokens that hold ``num_tokens`` tokens."""
    return ceil_div(num_tokens, block_size)


def slot_mapping(block_ids, start: int, end: int, block_size: int) -> list[int]:
    """The cache slot (block id * block_size + offset in the block) of each token at positions
    ``start..end-1`` of a sequence whose block table is ``block_ids``."""
    if end == start + 1:  # a decode step's one token
        return [block_ids[start // block_size] * block_size + start % block_size]
    slots: list[int] = []
    for i in range(start // block_size, blocks_needed(end, block_size)):
        first = i * block_size
        base = block_ids[i] * block_size - first  # position p of block i lives at slot base + p
        slots.extend(range(base + max(start, first), base + min(end, first + block_size)))
    return slots


def _unhashable(name: str, seq_id) -> ValueError:
    """A sequence id keys a dict: the error for one that cannot (a list), naming it."""
    return ValueError(f"{name}: a sequence id must be hashable (an int or a str), got "
                      f"{type(seq_id).__name__} {seq_id!r}")


def _token_id(name: str, t) -> int:
    """``t`` as an int if it is an integer (numpy's too; not a bool), else a ValueError."""
    if isinstance(t, bool) or not isinstance(t, Integral):
        raise ValueError(f"{name}: token ids must be integers, got {t!r}")
    return int(t)


def _token_ids(name: str, token_ids) -> list[int]:
    try:
        tokens = list(token_ids)
    except TypeError:
        raise ValueError(f"{name}: expected a sequence of token ids, got {token_ids!r}") from None
    # exactly int, the usual case, checked at C speed; anything else one by one
    if countOf(map(type, tokens), int) != len(tokens):
        tokens = [_token_id(name, t) for t in tokens]
    return tokens


@dataclass(slots=True)  # not frozen: a frozen init costs twice as much, once per sequence and step
class KVBlocks:
    """What one scheduled step needs of a sequence's KV cache, and none of the manager's
    internals (hashes, refcounts, its copy of the tokens), so that schedulers and model runners
    read the sequence's KV state from its one owner (vLLM v1's ``KVCacheBlocks`` idea)."""

    block_ids: tuple[int, ...]
    num_computed: int  # tokens whose KV precedes the step: the first new token's position
    slot_mapping: tuple[int, ...]  # cache slot of each token the step computes

    @property
    def num_new(self) -> int:
        """Tokens the step computes."""
        return len(self.slot_mapping)


class _Seq:
    __slots__ = ("blocks", "tokens", "num_computed", "num_cached_tokens", "hashes")

    def __init__(self, blocks, tokens, num_computed, num_cached_tokens, hashes):
        self.blocks: list[int] = blocks
        self.tokens: list[int] = tokens  # the tokens that have a slot
        self.num_computed: int = num_computed  # tokens whose KV is (being) written
        self.num_cached_tokens: int = num_cached_tokens
        self.hashes: list[int] = hashes  # chained hash of each full block, in order


class BlockManager:
    """Block tables for sequences over a pool of ``num_blocks`` blocks of ``block_size`` tokens.

    ``deferred_caching=True`` (for engines) makes full blocks findable in the prefix cache only
    when ``cache_full_blocks`` says their KV has been computed, or is being computed by the
    step being scheduled; by default they are findable as soon as they are full.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 *, deferred_caching: bool = False):
        block_size = check_positive_int("block_size", block_size)
        self.pool = BlockPool(num_blocks)
        self.num_blocks = self.pool.num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.deferred_caching = bool(deferred_caching)
        self._seqs: dict[object, _Seq] = {}
        self._copies: dict[int, int] = {}  # pending copy-on-write: dst -> src (src held)
        self._held: Counter[int] = Counter()  # src -> pending copies holding a reference to it
        self._unwritten: set[int] = set()  # findable, KV written by the step in flight

    # ---- queries -------------------------------------------------------------------------
    def __contains__(self, seq_id) -> bool:
        return self._known("seq_id", seq_id)

    def _known(self, name: str, seq_id) -> bool:
        try:
            return seq_id in self._seqs
        except TypeError:
            raise _unhashable(name, seq_id) from None

    @property
    def seq_ids(self) -> list:
        return list(self._seqs)

    def _seq(self, seq_id) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise SequenceError(f"seq_id: unknown sequence {seq_id!r}") from None
        except TypeError:
            raise _unhashable("seq_id", seq_id) from None

    def block_table(self, seq_id) -> list[int]:
        return list(self._seq(seq_id).blocks)

    def token_ids(self, seq_id) -> list[int]:
        return list(self._seq(seq_id).tokens)

    def num_tokens(self, seq_id) -> int:
        return len(self._seq(seq_id).tokens)

    def num_cached_tokens(self, seq_id) -> int:
        """Prompt tokens whose KV came from the prefix cache at ``allocate``."""
        return self._seq(seq_id).num_cached_tokens

    def num_computed_tokens(self, seq_id) -> int:
        """Tokens whose KV is in the cache or written by a scheduled step (``schedule_step``):
        the prefix-cache hits at ``allocate``, then every token scheduled since."""
        return self._seq(seq_id).num_computed

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.pool.num_free

    def ref_count(self, block_id: int) -> int:
        return self.pool.ref_cnt[check_block_id("block_id", block_id, self.num_blocks)]

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold a sequence of ``num_tokens`` tokens."""
        return blocks_needed(num_tokens, self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new prompt of ``num_tokens`` fits without any prefix-cache hit."""
        return self.blocks_needed(check_positive_int("num_tokens", num_tokens)) <= self.pool.num_free

    def can_append(self, seq_id, num_new_tokens: int = 1) -> bool:
        """Whether ``num_new_tokens`` more tokens fit (counting a copy-on-write block)."""
        return self._blocks_for_append(self._seq(seq_id), num_new_tokens) <= self.pool.num_free

    @property
    def usage(self) -> float:
        """Blocks in use / all blocks."""
        return self.num_used_blocks / self.num_blocks

    @property
    def token_utilisation(self) -> float:
        """Token slots holding a token / slots of blocks in use (a shared block counts once)."""
        filled: dict[int, int] = {}
        bs = self.block_size
        for seq in self._seqs.values():
            n = len(seq.tokens)
            for i, block in enumerate(seq.blocks):
                filled[block] = max(filled.get(block, 0), min(bs, n - i * bs))
        used = self.num_used_blocks
        return sum(filled.values()) / (used * bs) if used else 0.0

    def prefix_cache_entries(self) -> list[tuple[int, int, int, tuple]]:
        """(hash, block id, parent hash, token ids) of every block findable in the cache."""
        return [(h, b, *self.pool.block_key[b]) for h, b in self.pool.cached_items()]

    @property
    def unwritten_blocks(self) -> set[int]:
        """Findable blocks whose KV the step in flight writes (see ``blocks_written``)."""
        return set(self._unwritten)

    @property
    def pending_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write (src, dst) copies not yet handed out by ``take_copies``."""
        return [(src, dst) for dst, src in self._copies.items()]

    # ---- operations ----------------------------------------------------------------------
    def allocate(self, seq_id, token_ids) -> list[int]:
        """Blocks for a new sequence's prompt; full blocks may come from the prefix cache."""
        if self._known("seq_id", seq_id):
            raise SequenceError(f"seq_id: sequence {seq_id!r} already exists")
        tokens = _token_ids("token_ids", token_ids)
        if not tokens:
            raise ValueError(f"token_ids: sequence {seq_id!r} has an empty prompt")
        bs, pool = self.block_size, self.pool
        num_blocks = self.blocks_needed(len(tokens))
        hashes: list[int] = []
        hits: list[int] = []
        if self.enable_prefix_caching:
            parent = ROOT_HASH
            for i in range(len(tokens) // bs):
                key = (parent, tuple(tokens[i * bs:(i + 1) * bs]))
                parent = block_hash(*key)
                hashes.append(parent)
                if len(hits) == i and (i + 1) * bs < len(tokens):  # last token: always compute
                    block = pool.lookup(parent, key)
                    if block is not None:
                        hits.append(block)
        revived = sum(1 for b in hits if pool.ref_cnt[b] == 0)
        fresh = num_blocks - len(hits)
        if fresh + revived > pool.num_free:
            raise OutOfBlocksError(
                f"allocate {seq_id!r}: {len(tokens)} tokens need {fresh + revived} free blocks "
                f"({len(hits)} cached), {pool.num_free} of {self.num_blocks} are free")
        for b in hits:
            pool.incref(b)
        seq = _Seq(hits + pool.take(fresh), tokens, len(hits) * bs, len(hits) * bs, hashes)
        self._seqs[seq_id] = seq
        if self.enable_prefix_caching and not self.deferred_caching:
            self._register(seq, 0, len(hashes))
        return list(seq.blocks)

    def _shared(self, block: int) -> bool:
        """Whether a sequence writing into ``block`` must copy it first: another sequence
        reads it too (a pending copy's hold does not count: its copy runs before the write)."""
        return self.pool.ref_cnt[block] - self._held.get(block, 0) > 1  # no __missing__ call

    def _blocks_for_append(self, seq: _Seq, n: int) -> int:
        if n < 1:
            raise ValueError(f"num_new_tokens: must be >= 1, got {n}")
        length, bs = len(seq.tokens), self.block_size
        need = self.blocks_needed(length + n) - len(seq.blocks)
        if length % bs and self._shared(seq.blocks[-1]):
            need += 1  # the shared, partly filled last block must be copied first
        return need

    def append_token(self, seq_id, token_id: int) -> int | None:
        """Add one token; returns the block newly taken for it (fresh or copy), else None."""
        try:  # inline: once per token per sequence
            seq = self._seqs[seq_id]
        except (KeyError, TypeError):
            seq = self._seq(seq_id)  # raises the error that names seq_id
        if type(token_id) is not int:
            token_id = _token_id("token_id", token_id)
        tokens, blocks = seq.tokens, seq.blocks
        bs = self.block_size
        slot = len(tokens) % bs
        new_block = None
        if slot == 0:
            new_block = self.pool.take(1)[0]
            blocks.append(new_block)
        elif self._shared(blocks[-1]):  # copy-on-write
            new_block = self.pool.take(1)[0]
            self._copies[new_block] = blocks[-1]  # keeps seq's reference until copied
            self._held[blocks[-1]] += 1
            blocks[-1] = new_block
        tokens.append(token_id)
        if slot == bs - 1 and self.enable_prefix_caching:
            start = len(tokens) - bs
            parent = seq.hashes[-1] if seq.hashes else ROOT_HASH
            seq.hashes.append(block_hash(parent, tuple(tokens[start:])))
            if not self.deferred_caching:
                self._register(seq, len(seq.hashes) - 1, len(seq.hashes))
        return new_block

    def cache_full_blocks(self, seq_id, num_computed_tokens: int | None = None, *,
                          written: bool = True) -> None:
        """Make the full blocks among the first ``num_computed_tokens`` (default: all) findable.

        Args:
            written: True if their KV is in the cache. False if the step being scheduled
                writes it (for some of them, earlier steps may have): a request that finds
                such a block must be in that same step, and the blocks registered by this call
                count as unwritten until ``blocks_written``.
        """
        seq = self._seq(seq_id)
        n = len(seq.tokens) if num_computed_tokens is None else num_computed_tokens
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(seq.tokens):
            raise ValueError(f"num_computed_tokens: {n!r} outside 0..{len(seq.tokens)}")
        if self.enable_prefix_caching:
            registered = self._register(seq, 0, n // self.block_size)
            if not written:
                self._unwritten.update(registered)

    def schedule_step(self, seq_id, num_new: int) -> KVBlocks:
        """The step being scheduled computes the sequence's next ``num_new`` tokens (those after
        its ``num_computed_tokens``), which count as computed from now on.

        With prefix caching, the blocks this step fills become findable at once, as unwritten
        (``cache_full_blocks(..., written=False)``), so later requests of the same step share
        them.

        Returns:
            The step's view of the sequence: its table, the position of the first new token
            (``num_computed``) and the new tokens' cache slots.
        """
        seq = self._seq(seq_id)
        if isinstance(num_new, bool) or not isinstance(num_new, int) or num_new < 0:
            raise ValueError(f"num_new: expected an integer >= 0, got {num_new!r}")
        start, bs = seq.num_computed, self.block_size
        end = start + num_new
        if end > len(seq.tokens):
            raise ValueError(f"num_new: {start} computed + {num_new} tokens exceed the "
                             f"{len(seq.tokens)} of sequence {seq_id!r}")
        if self.enable_prefix_caching and start // bs < end // bs:
            self.cache_full_blocks(seq_id, end, written=False)
        seq.num_computed = end
        return KVBlocks(tuple(seq.blocks), start, tuple(slot_mapping(seq.blocks, start, end, bs)))

    def blocks_written(self) -> None:
        """The step in flight has written its KV: its unwritten blocks are plain cached ones."""
        self._unwritten.clear()

    def _register(self, seq: _Seq, first: int, end: int) -> list[int]:
        bs, pool = self.block_size, self.pool
        registered = []
        for i in range(first, end):
            if not pool.can_register(seq.blocks[i], seq.hashes[i]):
                continue  # registered already (cache_full_blocks revisits every full block)
            parent = seq.hashes[i - 1] if i else ROOT_HASH
            pool.register(seq.blocks[i], seq.hashes[i],
                          (parent, tuple(seq.tokens[i * bs:(i + 1) * bs])))
            registered.append(seq.blocks[i])
        return registered

    def fork(self, parent_id, child_id) -> list[int]:
        """The child shares every block of the parent (refcounts + 1); returns its table."""
        parent = self._seq(parent_id)
        if self._known("child_id", child_id):
            raise SequenceError(f"child_id: sequence {child_id!r} already exists")
        for b in parent.blocks:
            self.pool.incref(b)
        self._seqs[child_id] = _Seq(list(parent.blocks), list(parent.tokens), parent.num_computed,
                                    parent.num_cached_tokens, list(parent.hashes))
        return list(parent.blocks)

    def free(self, seq_id) -> None:
        """Drop the sequence; blocks no longer referenced return to the free queue.

        Blocks are released tail first, so a cached prefix's tail is evicted before its head.
        A copy into a block that nobody references any more is dropped; an unwritten block
        leaves the prefix cache (its step will not run for this sequence).
        """
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        pool, unwritten, copies = self.pool, self._unwritten, self._copies
        for b in reversed(seq.blocks):
            if b in unwritten:
                unwritten.discard(b)
                pool.unregister(b)
            pool.decref(b)
            if b in copies and pool.ref_cnt[b] == 0:
                src = copies.pop(b)
                self._held[src] -= 1
                pool.decref(src)

    def take_copies(self) -> list[tuple[int, int]]:
        """Pending copy-on-write (src, dst) block copies, cleared by this call.

        The sources' references are released here: the caller performs the copies before it
        takes any block again, and before the step writes any KV (the last sharer of a source
        writes into it in place).
        """
        copies = self.pending_copies
        self._copies = {}
        self._held.clear()
        for src, _ in copies:
            self.pool.decref(src)
        return copies
