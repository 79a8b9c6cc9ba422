import pytest

from pagebench.engine import BlockManager, BlockPool
from pagebench.engine.block_manager import blocks_needed, slot_mapping
from pagebench.errors import ConfigError, OutOfBlocksError, SequenceError


def test_allocate_takes_ceil_blocks_and_grows_only_when_full():
    bm = BlockManager(10, 4)
    assert len(bm.allocate("a", [1, 2, 3, 4, 5])) == 2
    assert bm.num_free_blocks == 8
    assert bm.append_token("a", 6) is None  # slots 6..8 of block 2 are free
    bm.append_token("a", 7)
    bm.append_token("a", 8)
    assert bm.append_token("a", 9) is not None  # the 9th token opens a third block
    assert len(bm.block_table("a")) == 3 and bm.num_tokens("a") == 9


def test_fork_shares_and_copy_on_write_on_divergence():
    bm = BlockManager(10, 4)
    parent = bm.allocate("p", [1, 2, 3, 4, 5, 6])
    assert bm.fork("p", "c") == parent
    assert [bm.ref_count(b) for b in parent] == [2, 2]
    dst = bm.append_token("c", 7)  # the shared, half-full last block is copied first
    assert bm.take_copies() == [(parent[1], dst)]
    assert bm.take_copies() == []
    assert bm.block_table("c") == [parent[0], dst]
    assert bm.ref_count(parent[1]) == 1 and bm.ref_count(parent[0]) == 2
    assert bm.append_token("p", 9) is None  # parent owns its block alone again: no copy
    assert bm.take_copies() == []


def test_prefix_cache_hit_is_block_aligned_and_leaves_last_token():
    bm = BlockManager(10, 4, enable_prefix_caching=True)
    a = bm.allocate("a", list(range(10)))
    b = bm.allocate("b", list(range(9)) + [99])
    assert b[:2] == a[:2] and b[2] != a[2]
    assert bm.num_cached_tokens("b") == 8
    assert bm.ref_count(a[0]) == 2
    # a prompt that is exactly the cached blocks still computes its last token
    c = bm.allocate("c", list(range(8)))
    assert bm.num_cached_tokens("c") == 4 and c[0] == a[0] and c[1] != a[1]


def test_freed_cached_blocks_are_reused_and_evicted_least_recent_first():
    bm = BlockManager(4, 2, enable_prefix_caching=True)
    first = bm.allocate("a", [1, 2, 3, 4, 5])  # 3 blocks, 2 of them full and cached
    bm.free("a")
    assert bm.num_free_blocks == 4
    again = bm.allocate("b", [1, 2, 3, 4, 9])
    assert again[:2] == first[:2] and bm.num_cached_tokens("b") == 4
    bm.free("b")
    bm.allocate("c", [7, 7])  # never-cached blocks are handed out first
    bm.allocate("d", [8, 8])
    assert bm.ref_count(first[0]) == bm.ref_count(first[1]) == 0
    bm.allocate("e", [9, 9])  # now eviction: the prefix's tail block goes first
    bm.free("c")
    bm.free("d")
    f = bm.allocate("f", [1, 2, 3, 4, 6])
    assert f[0] == first[0] and bm.num_cached_tokens("f") == 2


def test_deferred_caching_waits_for_computed_tokens():
    bm = BlockManager(8, 2, enable_prefix_caching=True, deferred_caching=True)
    bm.allocate("a", [1, 2, 3, 4, 5])
    bm.allocate("b", [1, 2, 3, 4, 6])
    assert bm.num_cached_tokens("b") == 0
    bm.cache_full_blocks("a", 3)  # only the first block is computed
    bm.allocate("c", [1, 2, 3, 4, 7])
    assert bm.num_cached_tokens("c") == 2


def test_usage_and_token_utilisation_count_shared_blocks_once():
    bm = BlockManager(8, 4)
    bm.allocate("a", [1, 2, 3, 4, 5])
    bm.fork("a", "b")
    assert bm.usage == 2 / 8
    assert bm.token_utilisation == 5 / 8


def test_errors_leave_state_unchanged():
    bm = BlockManager(2, 4)
    bm.allocate("a", [1])
    with pytest.raises(OutOfBlocksError, match="free blocks"):
        bm.allocate("big", list(range(9)))
    with pytest.raises(SequenceError, match="already exists"):
        bm.allocate("a", [1])
    with pytest.raises(SequenceError, match="unknown"):
        bm.append_token("zz", 1)
    with pytest.raises(SequenceError, match="unknown"):
        bm.free("zz")
    with pytest.raises(ValueError, match="empty prompt"):
        bm.allocate("b", [])
    # an unhashable id used to be Python's bare TypeError from the dict
    for call in (lambda: bm.allocate(["b"], [1]), lambda: bm.free(["a"]),
                 lambda: bm.append_token({}, 1), lambda: bm.fork("a", ["c"]),
                 lambda: ["a"] in bm, lambda: bm.block_table(["a"])):
        with pytest.raises(ValueError, match="(seq|child)_id: a sequence id must be hashable"):
            call()
    assert bm.seq_ids == ["a"] and bm.num_free_blocks == 1
    with pytest.raises(ConfigError):
        BlockManager(0, 16)
    with pytest.raises(ConfigError):
        BlockManager(4, 0)


def test_append_into_full_pool_raises_and_changes_nothing():
    bm = BlockManager(1, 2)
    bm.allocate("a", [1, 2])
    with pytest.raises(OutOfBlocksError):
        bm.append_token("a", 3)
    assert bm.num_tokens("a") == 2 and bm.block_table("a") == [0]


def test_copy_source_freed_in_the_same_step_is_not_reused_as_a_copy_destination():
    # issue 12 item 3 at the block manager's level: a copies its shared half-full block, the
    # other sharer is preempted, then b copies too while the pool is dry
    bm = BlockManager(4, 4)
    bm.allocate("p", [1, 2])
    bm.allocate("q", [3, 4])
    bm.fork("p", "a")
    bm.fork("q", "b")
    bm.append_token("a", 5)  # copy-on-write: (p's block, a fresh block)
    src = bm.block_table("p")[0]
    bm.free("p")  # preempted: a's pending copy still reads src
    assert bm.ref_count(src) == 1 and bm.num_free_blocks == 1
    bm.append_token("b", 6)
    copies = bm.take_copies()
    assert {d for _, d in copies}.isdisjoint(s for s, _ in copies), copies
    assert len(copies) == 2 and src not in {d for _, d in copies}
    assert bm.ref_count(src) == 0 and bm.num_free_blocks == 1


def test_the_pool_refuses_a_reference_count_below_zero():
    # a second decref used to leave -1; the next incref made it 0 while the block sat in the
    # free queue, and take() then handed it to a second owner
    pool = BlockPool(3)
    (block,) = pool.take(1)
    pool.decref(block)
    for call in (pool.decref, pool.incref):  # free, and no cached prefix to hit
        with pytest.raises(ValueError, match=f"block {block}"):
            call(block)
    for bad in (-1, 3, True):
        with pytest.raises(ValueError, match="block"):
            pool.incref(bad)
    assert pool.ref_cnt == [0, 0, 0] and sorted(pool.take(3)) == [0, 1, 2]


def test_the_last_sharer_writes_in_place():
    # n sharers of a half-full block make n - 1 copies: once the others have copied, the hold
    # of their pending copies (performed before the step writes) is no reason to copy again
    bm = BlockManager(5, 4)
    bm.allocate("a", [1, 2, 3, 4, 5])
    bm.fork("a", "b")
    bm.fork("a", "c")
    tail = bm.block_table("a")[1]
    assert bm.can_append("c") and bm.num_free_blocks == 3
    for seq, token in (("a", 6), ("b", 7)):
        assert bm.append_token(seq, token) is not None  # copy-on-write
    assert bm.num_free_blocks == 1 and bm.can_append("c")
    assert bm.append_token("c", 8) is None and bm.block_table("c")[1] == tail  # in place
    copies = bm.take_copies()
    assert [src for src, _ in copies] == [tail, tail] and bm.ref_count(tail) == 1
    assert bm.num_free_blocks == 1


def test_a_copy_into_a_freed_block_is_dropped():
    bm = BlockManager(4, 4)
    bm.allocate("p", [1, 2])
    bm.fork("p", "a")
    dst = bm.append_token("a", 5)
    assert bm.pending_copies == [(bm.block_table("p")[0], dst)]
    bm.free("a")  # preempted before the step ran: nothing to copy
    assert bm.take_copies() == [] and bm.num_free_blocks == 3


def test_bad_token_ids_are_refused_before_any_change():
    # issue 12 item 6: append_token("a", [5]) used to append, then fail hashing the block
    for prefix in (False, True):
        bm = BlockManager(4, 4, enable_prefix_caching=prefix)
        bm.allocate("a", [1, 2, 3])
        for bad in ([5], 0.5, True, "5", None):
            with pytest.raises(ValueError, match="token_id: token ids must be integers"):
                bm.append_token("a", bad)
            assert bm.token_ids("a") == [1, 2, 3] and bm.num_free_blocks == 3
        with pytest.raises(ValueError, match="token_ids: token ids must be integers"):
            bm.allocate("b", [1, 2.0])
        assert bm.seq_ids == ["a"] and bm.num_free_blocks == 3
        bm.append_token("a", 4)
        assert bm.token_ids("a") == [1, 2, 3, 4]
        for bad in (True, 1.0, -1, 4):
            with pytest.raises(ValueError, match="block_id"):
                bm.ref_count(bad)


def test_token_ids_are_stored_as_ints_and_only_integers_pass():
    """Exact ints take the fast path; numpy integers are converted; bools (Python's or numpy's)
    and floats of any kind are refused, in a prompt and as one appended token."""
    import numpy as np

    bm = BlockManager(8, 4, enable_prefix_caching=True)
    bm.allocate("a", np.arange(5))
    bm.append_token("a", np.int32(7))
    assert bm.token_ids("a") == [0, 1, 2, 3, 4, 7]
    assert {type(t) for t in bm.token_ids("a")} == {int}
    for bad in (True, np.bool_(True), 1.0, np.float64(1.0)):
        with pytest.raises(ValueError, match="token_ids: token ids must be integers"):
            bm.allocate("b", [1, 2, bad])
        with pytest.raises(ValueError, match="token_id: token ids must be integers"):
            bm.append_token("a", bad)
    assert bm.seq_ids == ["a"] and bm.num_tokens("a") == 6 and bm.num_free_blocks == 6


def test_a_block_registered_before_its_kv_exists_is_shared_in_the_same_step():
    bm = BlockManager(8, 2, enable_prefix_caching=True, deferred_caching=True)
    a = bm.allocate("a", [1, 2, 3, 4, 5])
    bm.cache_full_blocks("a", 5, written=False)  # scheduled: this step fills a's two full blocks
    assert bm.unwritten_blocks == set(a[:2])
    b = bm.allocate("b", [1, 2, 3, 4, 6])  # admitted later in the same step
    assert b[:2] == a[:2] and bm.num_cached_tokens("b") == 4
    bm.blocks_written()
    assert bm.unwritten_blocks == set()


def test_freeing_an_unwritten_block_makes_it_unfindable():
    bm = BlockManager(8, 2, enable_prefix_caching=True, deferred_caching=True)
    bm.allocate("a", [1, 2, 3, 4, 5])
    bm.cache_full_blocks("a", 5, written=False)
    bm.free("a")  # its step never ran: the blocks hold no KV
    assert bm.prefix_cache_entries() == [] and bm.unwritten_blocks == set()
    assert bm.num_free_blocks == 8
    bm.allocate("b", [1, 2, 3, 4, 6])
    assert bm.num_cached_tokens("b") == 0
    # a written block stays findable after its sequence is freed
    bm.cache_full_blocks("b", 4)
    bm.free("b")
    bm.allocate("c", [1, 2, 3, 4, 7])
    assert bm.num_cached_tokens("c") == 4


def test_schedule_step_registers_only_the_blocks_the_step_fills_and_returns_the_table():
    bm = BlockManager(8, 2, enable_prefix_caching=True, deferred_caching=True)
    a = bm.allocate("a", [1, 2, 3, 4, 5])
    step = bm.schedule_step("a", 1)  # fills no block: nothing findable
    assert step.block_ids == tuple(a) and bm.prefix_cache_entries() == []
    assert (step.num_computed, step.slot_mapping) == (0, (a[0] * 2,))
    step = bm.schedule_step("a", 3)  # tokens 1..3 fill blocks 0 and 1
    assert step.block_ids == tuple(a) and bm.unwritten_blocks == set(a[:2])
    assert step.num_computed == 1 and step.num_new == 3
    assert step.slot_mapping == (a[0] * 2 + 1, a[1] * 2, a[1] * 2 + 1)
    assert bm.num_computed_tokens("a") == 4
    bm.blocks_written()
    bm.append_token("a", 6)
    step = bm.schedule_step("a", 2)
    assert step.block_ids == tuple(bm.block_table("a")) and step.num_computed == 4
    assert bm.unwritten_blocks == {bm.block_table("a")[2]}
    before = (bm.block_table("a"), bm.unwritten_blocks, bm.prefix_cache_entries(),
              bm.num_computed_tokens("a"))
    for bad in (-1, True, 1.0, 1):  # 1: all 6 tokens are computed already
        with pytest.raises(ValueError, match="num_new"):
            bm.schedule_step("a", bad)
    assert (bm.block_table("a"), bm.unwritten_blocks, bm.prefix_cache_entries(),
            bm.num_computed_tokens("a")) == before
    with pytest.raises(SequenceError, match="seq_id"):
        bm.schedule_step("zz", 1)


def test_computed_tokens_start_at_the_prefix_hits_and_follow_forks_and_frees():
    bm = BlockManager(8, 2, enable_prefix_caching=True, deferred_caching=True)
    bm.allocate("a", [1, 2, 3, 4, 5])
    assert bm.num_computed_tokens("a") == 0
    bm.schedule_step("a", 5)
    bm.blocks_written()
    bm.fork("a", "b")
    assert bm.num_computed_tokens("b") == 5
    bm.allocate("c", [1, 2, 3, 4, 9])
    assert bm.num_computed_tokens("c") == bm.num_cached_tokens("c") == 4
    bm.free("c")
    with pytest.raises(SequenceError, match="seq_id"):
        bm.num_computed_tokens("c")


@pytest.mark.parametrize("block_size", [1, 2, 3, 4])
def test_slot_mapping_places_token_p_at_its_block_and_offset(block_size):
    table = [5, 0, 7, 2]
    for start in range(4 * block_size + 1):
        for end in range(start, 4 * block_size + 1):
            expected = [table[p // block_size] * block_size + p % block_size
                        for p in range(start, end)]
            assert slot_mapping(table, start, end, block_size) == expected
    assert blocks_needed(0, block_size) == 0 and blocks_needed(1, block_size) == 1
    assert blocks_needed(block_size + 1, block_size) == 2
