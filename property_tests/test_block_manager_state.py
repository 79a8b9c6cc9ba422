"""The block manager under any sequence of allocate / append / fork / free, with eviction pressure.

The test keeps its own model of what each physical block holds (the "KV cache": token ids in
slots), writes every computed token through the block table, applies copy-on-write copies as an
engine would, and checks the invariants after every step.

With deferred caching the test plays an engine's steps: an allocated or appended sequence is
scheduled into the step in flight (``pending``), and its full blocks may become findable at once
(``written=False``), before their KV exists; ``execute`` writes every scheduled token, and only
then do the sequences of the step read the cache. So a request that hits a block filled in the
same step is checked to read it after it is written; a block findable before its KV exists must
be written by a sequence of the step; freeing such a sequence (a step that never runs for it)
must leave nothing findable that was never written. A step scheduled through ``schedule_step``
writes its tokens through the slots the manager returns, so the reads through the table check
the manager's slot mapping and its count of computed tokens.
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
        self.pending: dict[int, int] = {}  # scheduled in the step in flight: seq -> first unwritten
        self.steps: dict = {}  # pending sequences scheduled by schedule_step: seq -> KVBlocks
        note(f"block_size={block_size} num_blocks={num_blocks} prefix={prefix} deferred={deferred}")

    # ---- helpers --------------------------------------------------------------------------
    def snapshot(self):
        bm = self.bm
        return ({s: (bm.block_table(s), bm.num_tokens(s), bm.num_cached_tokens(s),
                     bm.num_computed_tokens(s)) for s in bm.seq_ids},
                [bm.ref_count(b) for b in range(bm.num_blocks)], bm.num_free_blocks,
                sorted(bm.prefix_cache_entries()), bm.pending_copies, bm.unwritten_blocks)

    def copy(self):
        """Apply pending copies as the kernel does: all at once, so they must be independent."""
        copies = self.bm.take_copies()
        dsts, srcs = [d for _, d in copies], {s for s, _ in copies}
        assert len(set(dsts)) == len(dsts), f"a destination appears twice: {copies}"
        assert not srcs & set(dsts), f"a block is both a source and a destination: {copies}"
        before = {b: list(self.kv[b]) for b in srcs}
        for src, dst in copies:
            self.kv[dst] = before[src]

    def write(self, seq_id, start):
        """Write tokens [start:] of a sequence through its block table, after pending copies."""
        self.copy()
        table = self.bm.block_table(seq_id)
        for pos in range(start, len(self.tokens[seq_id])):
            block = self.kv.setdefault(table[pos // self.bs], [None] * self.bs)
            block[pos % self.bs] = self.tokens[seq_id][pos]

    def schedule(self, seq_id, start, register_now):
        """Deferred caching: seq computes tokens [start:] in the step in flight (an engine
        registers its full blocks as it schedules it); without it, the tokens are written now."""
        if not self.bm.deferred_caching:
            self.write(seq_id, start)
            return
        self.pending[seq_id] = start
        if register_now:  # as the engine's scheduler does
            toks, bs = self.tokens[seq_id], self.bs
            step = self.bm.schedule_step(seq_id, len(toks) - self.bm.num_computed_tokens(seq_id))
            table = self.bm.block_table(seq_id)
            assert step.block_ids == tuple(table) and step.num_computed <= start
            assert self.bm.num_computed_tokens(seq_id) == len(toks)
            assert list(step.slot_mapping) == [table[p // bs] * bs + p % bs
                                               for p in range(step.num_computed, len(toks))]
            self.steps[seq_id] = step

    def reads_own_tokens(self, seq_id, kv):
        table, toks = self.bm.block_table(seq_id), self.tokens[seq_id]
        read = [kv[table[p // self.bs]][p % self.bs] for p in range(len(toks))]
        assert read == toks, f"sequence {seq_id} reads {read}, owns {toks}"

    def holds_unwritten_shared(self, seq_id):
        return any(b in self.bm.unwritten_blocks and self.bm.ref_count(b) > 1
                   for b in self.bm.block_table(seq_id))

    def expect_failure(self, call, error=PagebenchError):
        before = self.snapshot()
        try:
            call()
        except (error, ValueError, KeyError):
            assert self.snapshot() == before, "a call that raised changed the manager's state"
            return True
        return False

    # ---- rules ----------------------------------------------------------------------------
    @rule(target=seqs, data=st.data(), register_now=st.booleans())
    def allocate(self, data, register_now):
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
        self.schedule(seq_id, cached, register_now)
        return seq_id

    @rule(seq=seqs, token=TOKEN, register_now=st.booleans())
    def append(self, seq, token, register_now):
        assume(seq in self.tokens and seq not in self.pending)  # one step computes it once
        if not self.bm.can_append(seq):
            assert self.expect_failure(lambda: self.bm.append_token(seq, token), OutOfBlocksError)
            return
        self.bm.append_token(seq, token)
        self.tokens[seq].append(token)
        self.schedule(seq, len(self.tokens[seq]) - 1, register_now)

    @precondition(lambda self: self.pending)
    @rule()
    def execute(self):
        """The step runs: copies, then every scheduled token's KV, then attention reads."""
        self.copy()
        for seq, start in self.pending.items():
            step = self.steps.get(seq)
            if step is None:
                table = self.bm.block_table(seq)
                slots = {p: table[p // self.bs] * self.bs + p % self.bs
                         for p in range(start, len(self.tokens[seq]))}
            else:  # through the manager's slots
                slots = dict(enumerate(step.slot_mapping, step.num_computed))
            for pos in range(start, len(self.tokens[seq])):
                block, offset = divmod(slots[pos], self.bs)
                self.kv.setdefault(block, [None] * self.bs)[offset] = self.tokens[seq][pos]
        for seq in self.pending:  # hits on blocks filled in this step included
            self.reads_own_tokens(seq, self.kv)
        self.bm.blocks_written()
        self.pending.clear()
        self.steps.clear()

    @precondition(lambda self: self.pending)
    @rule()
    def abort_step(self):
        """The step fails before running: every scheduled sequence is freed (the engine aborts)."""
        for seq in list(self.pending):
            self.bm.free(seq)
            del self.tokens[seq]
        self.pending.clear()
        self.steps.clear()
        assert not self.bm.unwritten_blocks

    @rule(target=seqs, parent=seqs)
    def fork(self, parent):
        assume(parent in self.tokens and parent not in self.pending)  # engines fork after a step
        child = self.next_id
        self.next_id += 1
        self.bm.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq):
        # a scheduled sequence is freed (preempted) before its step runs only if no other
        # request hit the blocks it was to fill: an engine never preempts one it scheduled
        assume(seq in self.tokens and not self.holds_unwritten_shared(seq))
        self.bm.free(seq)
        del self.tokens[seq]
        self.pending.pop(seq, None)
        self.steps.pop(seq, None)

    @rule(seq=seqs)
    def cache_computed(self, seq):
        assume(seq in self.tokens and seq not in self.pending)
        self.bm.cache_full_blocks(seq)

    @precondition(lambda self: self.tokens)
    @rule()
    def free_all(self):
        for seq in list(self.tokens):
            self.bm.free(seq)
            del self.tokens[seq]
        self.pending.clear()
        self.steps.clear()
        assert not self.bm.unwritten_blocks and not self.bm.pending_copies
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
                 lambda: bm.block_table(unknown), lambda: bm.allocate(unknown, [1, [2]]),
                 lambda: bm.allocate(unknown, [1, 2.0]), lambda: bm.allocate(unknown, [True]),
                 lambda: bm.schedule_step(unknown, 1), lambda: bm.num_computed_tokens(unknown)]
        if dup is not None:
            calls += [lambda: bm.allocate(dup, [1, 2]), lambda: bm.fork(dup, dup),
                      lambda: bm.append_token(dup, [5]), lambda: bm.append_token(dup, 0.5),
                      lambda: bm.append_token(dup, False),
                      lambda: bm.cache_full_blocks(dup, bm.num_tokens(dup) + 1),
                      lambda: bm.cache_full_blocks(dup, -1),
                      lambda: bm.schedule_step(dup, -1),
                      lambda: bm.schedule_step(dup, bm.num_tokens(dup) + 1)]
        call = data.draw(st.sampled_from(calls))
        assert self.expect_failure(call), "bad input did not raise"

    # ---- invariants -------------------------------------------------------------------------
    @invariant()
    def blocks_free_or_used(self):  # 1 (a pending copy's source is in use until copied)
        bm = self.bm
        used = {b for s in bm.seq_ids for b in bm.block_table(s)}
        used |= {src for src, _ in bm.pending_copies}
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
        for src, _ in self.bm.pending_copies:
            counts[src] += 1
        assert counts == [self.bm.ref_count(b) for b in range(self.bm.num_blocks)]

    @invariant()
    def tables_sized_to_tokens(self):  # 3
        for s, toks in self.tokens.items():
            assert self.bm.num_tokens(s) == len(toks)
            table = self.bm.block_table(s)
            assert len(table) == math.ceil(len(toks) / self.bs)
            assert len(table) * self.bs - len(toks) <= self.bs - 1

    @invariant()
    def computed_tokens_between_hits_and_tokens(self):
        for s in self.tokens:
            bm = self.bm
            assert bm.num_cached_tokens(s) <= bm.num_computed_tokens(s) <= bm.num_tokens(s)

    @invariant()
    def each_sequence_reads_its_own_tokens(self):  # 4 (copy-on-write isolation)
        copied = dict(self.kv)
        for src, dst in self.bm.pending_copies:
            copied[dst] = list(copied[src])
        for s in self.tokens:
            if s not in self.pending:  # those read in ``execute``, after the step's writes
                self.reads_own_tokens(s, copied)

    @invariant()
    def prefix_cache_entries_are_full_and_consistent(self):  # 5
        unwritten = self.bm.unwritten_blocks
        entries = self.bm.prefix_cache_entries()
        assert unwritten <= {block for _, block, _, _ in entries}
        if not self.pending:
            assert not unwritten
        for h, block, parent, toks in entries:
            assert len(toks) == self.bs and block_hash(parent, toks) == h
            if block in unwritten:
                assert self.written_by_this_step(block, list(toks)), \
                    f"block {block} is findable, unwritten, and no scheduled sequence writes it"
            else:
                assert self.kv.get(block) == list(toks), "a cached block does not hold its tokens"

    def written_by_this_step(self, block, toks) -> bool:
        """Some scheduled sequence owns ``toks`` in ``block``: the slots before its first
        unwritten token hold them already, ``execute`` writes the rest (if any)."""
        for seq, start in self.pending.items():
            for i, b in enumerate(self.bm.block_table(seq)):
                lo = i * self.bs
                if b == block and self.tokens[seq][lo:lo + self.bs] == toks:
                    held = self.kv.get(block, [None] * self.bs)
                    done = min(start - lo, self.bs)  # slots an earlier step has written
                    if held[:max(done, 0)] == toks[:max(done, 0)]:
                        return True
        return False


TestBlockManagerStateMachine = BlockManagerMachine.TestCase
