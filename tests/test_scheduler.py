"""Scheduler alone (no model): budgets, chunked prefill, preemption order, requeue at front."""

import pytest

from pagebench.engine.block_manager import BlockManager
from pagebench.engine.sampling import SamplingParams
from pagebench.engine.scheduler import Scheduler, Sequence
from pagebench.errors import ConfigError


def make(num_blocks=16, block_size=4, max_num_seqs=8, max_num_batched_tokens=64):
    bm = BlockManager(num_blocks, block_size, deferred_caching=True)
    return Scheduler(bm, max_num_seqs, max_num_batched_tokens)


def seq(i, n_tokens, max_tokens=8):
    return Sequence(i, i, 0, list(range(1, n_tokens + 1)), SamplingParams(max_tokens), None)


def run_step(sched, batch, new_token=7):
    """What the engine does after a step: give sequences whose tokens are all computed a new one."""
    for s, kv in zip(batch.seqs, batch.blocks):
        if kv.num_computed + kv.num_new == len(s.token_ids):
            s.token_ids.append(new_token)


def test_bad_limits():
    bm = BlockManager(4, 4)
    with pytest.raises(ConfigError, match="max_num_seqs"):
        Scheduler(bm, 0, 16)
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        Scheduler(bm, 4, 0)


def test_max_num_seqs_and_token_budget():
    sched = make(max_num_seqs=2, max_num_batched_tokens=10)
    for i in range(3):
        sched.add(seq(i, 4))
    batch = sched.schedule()
    assert [s.seq_id for s in batch.seqs] == [0, 1]  # third waits: max_num_seqs
    assert batch.num_new == [4, 4]
    run_step(sched, batch)
    batch = sched.schedule()
    assert batch.num_new == [1, 1]  # decodes


def test_long_prompt_is_chunked():
    sched = make(num_blocks=32, max_num_batched_tokens=8)
    s = seq(0, 21)
    sched.add(s)
    chunks = []
    while sum(chunks) < 21:
        batch = sched.schedule()
        chunks.append(batch.num_new[0])
        run_step(sched, batch)
    assert chunks == [8, 8, 5]
    assert sched.bm.num_tokens(0) == 21 and sched.bm.num_computed_tokens(0) == 21


def test_preempts_most_recent_and_requeues_at_front():
    # 4 blocks of 4 tokens; two prompts of 8 tokens fill the pool
    sched = make(num_blocks=4, block_size=4)
    a, b, c = seq(0, 8), seq(1, 8), seq(2, 3)
    for s in (a, b, c):
        sched.add(s)
    batch = sched.schedule()
    assert batch.seqs == [a, b]  # c does not fit
    run_step(sched, batch)
    batch = sched.schedule()  # a needs a fifth block: b (admitted last) is preempted
    assert batch.num_preempted == 1 and sched.num_preemptions == 1
    assert batch.seqs == [a] and batch.num_new == [1]
    assert list(sched.waiting) == [b, c]
    assert 1 not in sched.bm  # its KV state went with its blocks
    assert b.token_ids[-1] == 7  # its output so far is kept and recomputed later


def test_sequence_preempts_itself_when_alone_at_the_back():
    sched = make(num_blocks=3, block_size=4)
    a, b = seq(0, 4), seq(1, 8)
    sched.add(a)
    sched.add(b)
    run_step(sched, sched.schedule())
    # a needs a new block (pos 4); b is newer and goes first; then a fits
    batch = sched.schedule()
    assert batch.seqs == [a] and sched.waiting[0] is b


def test_abort_all_frees_everything():
    sched = make()
    for i in range(3):
        sched.add(seq(i, 5))
    sched.schedule()
    sched.abort_all()
    assert sched.bm.num_used_blocks == 0 and not sched.has_work


def test_prefix_blocks_scheduled_in_a_step_are_hits_for_later_admissions_of_that_step():
    bm = BlockManager(16, 4, enable_prefix_caching=True, deferred_caching=True)
    sched = Scheduler(bm, 8, 64)
    prefix = [9, 8, 7, 6, 5, 4, 3, 2]
    a, b = seq(0, 0), seq(1, 0)
    a.token_ids, b.token_ids = prefix + [1], prefix + [2, 3]
    a.prompt_len, b.prompt_len = 9, 10
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert batch.seqs == [a, b] and batch.num_new == [9, 2]  # b computes only its own tail
    table_a, table_b = batch.block_tables
    assert table_a == tuple(bm.block_table(a.seq_id)) and table_b == tuple(bm.block_table(b.seq_id))
    assert table_b[:2] == table_a[:2] and sched.num_cached_prompt_tokens == 8
    assert bm.unwritten_blocks == set(table_a[:2])
    bm.blocks_written()  # what the engine does once the step has run
    run_step(sched, batch)
    assert bm.unwritten_blocks == set()
