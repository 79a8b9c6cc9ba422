"""The block manager under any sequence of allocate / append / fork / free, with eviction pressure.

The test keeps its own model of what each physical block holds (the "KV cache": token ids in
slots), writes every computed token through the block table, applies copy-on-write copies as an
engine would, and checks the seven invariants after every step.
"""

import math

import hypothesis.strategies as st
from hypothesis import assume, note
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, consumes, initialize,
                                 invariant, multiple, precondition, rule)

from pagebench.engine import BlockManager
from pagebench.engine.block_manager import block_hash
from pagebench.errors import OutOfBlocksError, PagebenchError

# a small vocabulary and a few shared stems, so prompts share prefixes and hit the cache
STEMS = [[1] * 300, [1, 2, 3] * 100, [7, 8] * 150]
TOKEN = st.integers(0, 9)


@st.composite
def prompts(draw, block_size):
    stem = draw(st.sampled_from(STEMS))
    n_stem = draw(st.integers(0, 2 * block_size + 1))
    tail = draw(st.lists(TOKEN, max_size=block_size + 1))
    prompt = (stem[:n_stem] + tail) or [draw(TOKEN)]
    return prompt[: 3 * block_size + 2]


class BlockManagerMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    @initialize(block_size=st.sampled_from([1, 2, 3, 7, 16, 31, 128]),
                num_blocks=st.integers(1, 40), prefix=st.booleans(), deferred=st.booleans())
    def setup(self, block_size, num_blocks, prefix, deferred):
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix,
                               deferred_caching=deferred)
        self.bs = block_size
        self.tokens: dict[int, list[int]] = {}  # the model: tokens of each live sequence
        self.kv: dict[int, list] = {}  # the model of the KV cache: block -> slot contents
        self.next_id = 0
        note(f"block_size={block_size} num_blocks={num_blocks} prefix={prefix} deferred={deferred}")

    # ---- helpers --------------------------------------------------------------------------
    def snapshot(self):
        bm = self.bm
        return ({s: (bm.block_table(s), bm.num_tokens(s), bm.num_cached_tokens(s))
                 for s in bm.seq_ids},
                [bm.ref_count(b) for b in range(bm.num_blocks)], bm.num_free_blocks,
                sorted(bm.prefix_cache_entries()), list(bm._copies))

    def write(self, seq_id, start):
        """Write tokens [start:] of a sequence through its block table, after pending copies."""
        for src, dst in self.bm.take_copies():
            self.kv[dst] = list(self.kv[src])
        table = self.bm.block_table(seq_id)
        for pos in range(start, len(self.tokens[seq_id])):
            block = self.kv.setdefault(table[pos // self.bs], [None] * self.bs)
            block[pos % self.bs] = self.tokens[seq_id][pos]

    def expect_failure(self, call, error=PagebenchError):
        before = self.snapshot()
        try:
            call()
        except (error, ValueError, KeyError):
            assert self.snapshot() == before, "a call that raised changed the manager's state"
            return True
        return False

    # ---- rules ----------------------------------------------------------------------------
    @rule(target=seqs, data=st.data())
    def allocate(self, data):
        prompt = data.draw(prompts(self.bs))
        seq_id = self.next_id
        if not self.bm.can_allocate(len(prompt)) and not self.bm.enable_prefix_caching:
            assert self.expect_failure(lambda: self.bm.allocate(seq_id, prompt), OutOfBlocksError)
            return multiple()  # a failed allocate adds no sequence
        try:
            before = self.snapshot()
            self.bm.allocate(seq_id, prompt)
        except OutOfBlocksError:
            assert self.snapshot() == before, "failed allocate changed the manager's state"
            return multiple()  # a failed allocate adds no sequence
        self.next_id += 1
        cached = self.bm.num_cached_tokens(seq_id)
        # a hit is block-aligned, a prefix of the prompt, and leaves the last token to compute
        assert cached % self.bs == 0 and cached < len(prompt)
        self.tokens[seq_id] = list(prompt)
        self.write(seq_id, cached)
        return seq_id

    @rule(seq=seqs, token=TOKEN)
    def append(self, seq, token):
        assume(seq in self.tokens)
        if not self.bm.can_append(seq):
            assert self.expect_failure(lambda: self.bm.append_token(seq, token), OutOfBlocksError)
            return
        self.bm.append_token(seq, token)
        self.tokens[seq].append(token)
        self.write(seq, len(self.tokens[seq]) - 1)

    @rule(target=seqs, parent=seqs)
    def fork(self, parent):
        assume(parent in self.tokens)
        child = self.next_id
        self.next_id += 1
        self.bm.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq):
        assume(seq in self.tokens)
        self.bm.free(seq)
        del self.tokens[seq]

    @rule(seq=seqs)
    def cache_computed(self, seq):
        assume(seq in self.tokens)
        self.bm.cache_full_blocks(seq)

    @precondition(lambda self: self.tokens)
    @rule()
    def free_all(self):
        for seq in list(self.tokens):
            self.bm.free(seq)
            del self.tokens[seq]
        # 7. every block returns; with prefix caching they stay findable but count as free
        assert self.bm.num_free_blocks == self.bm.num_blocks
        if not self.bm.enable_prefix_caching:
            assert self.bm.prefix_cache_entries() == []

    @rule(data=st.data())
    def bad_calls(self, data):
        bm, known = self.bm, list(self.tokens)
        unknown = self.next_id + 1000
        dup = known[0] if known else None
        calls = [lambda: bm.append_token(unknown, 1), lambda: bm.free(unknown),
                 lambda: bm.fork(unknown, unknown + 1), lambda: bm.allocate(unknown, []),
                 lambda: bm.block_table(unknown)]
        if dup is not None:
            calls += [lambda: bm.allocate(dup, [1, 2]), lambda: bm.fork(dup, dup)]
        call = data.draw(st.sampled_from(calls))
        assert self.expect_failure(call), "bad input did not raise"

    # ---- invariants -------------------------------------------------------------------------
    @invariant()
    def blocks_free_or_used(self):  # 1
        bm = self.bm
        used = {b for s in bm.seq_ids for b in bm.block_table(s)}
        free = {b for b in range(bm.num_blocks) if bm.pool.is_free(b)}
        assert not used & free
        assert len(used) + len(free) == bm.num_blocks == bm.num_free_blocks + bm.num_used_blocks
        assert len(free) == bm.num_free_blocks

    @invariant()
    def refcounts_match_tables(self):  # 2
        counts = [0] * self.bm.num_blocks
        for s in self.bm.seq_ids:
            for b in self.bm.block_table(s):
                counts[b] += 1
        assert counts == [self.bm.ref_count(b) for b in range(self.bm.num_blocks)]

    @invariant()
    def tables_sized_to_tokens(self):  # 3
        for s, toks in self.tokens.items():
            assert self.bm.num_tokens(s) == len(toks)
            table = self.bm.block_table(s)
            assert len(table) == math.ceil(len(toks) / self.bs)
            assert len(table) * self.bs - len(toks) <= self.bs - 1

    @invariant()
    def each_sequence_reads_its_own_tokens(self):  # 4 (copy-on-write isolation)
        pending = dict(self.kv)
        for src, dst in self.bm._copies:
            pending[dst] = list(pending[src])
        for s, toks in self.tokens.items():
            table = self.bm.block_table(s)
            read = [pending[table[p // self.bs]][p % self.bs] for p in range(len(toks))]
            assert read == toks, f"sequence {s} reads {read}, owns {toks}"

    @invariant()
    def prefix_cache_entries_are_full_and_consistent(self):  # 5
        for h, block, parent, toks in self.bm.prefix_cache_entries():
            assert len(toks) == self.bs and block_hash(parent, toks) == h
            assert self.kv[block] == list(toks), "a cached block does not hold its tokens"


TestBlockManagerStateMachine = BlockManagerMachine.TestCase
