"""Bad input raises ValueError naming the argument, before anything runs or changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagebench.kernels import (contiguous_decode, copy_blocks, paged_decode, paged_prefill,
                               write_kv)
from pagebench.kernels.fixtures import make_paged_inputs


@pytest.fixture
def inp():
    return make_paged_inputs([5, 9], 8, 2, 16, 4, seed=0)


def _with(inp, **changes):
    args = dict(q=inp.q, k_cache=inp.k_cache, v_cache=inp.v_cache,
                block_tables=inp.block_tables, seq_lens=inp.seq_lens)
    args.update(changes)
    return args


BAD = {
    "q rank": (lambda i: dict(q=i.q[0]), "q"),
    "q dtype": (lambda i: dict(q=i.q.double()), "q"),
    "q int": (lambda i: dict(q=i.q.int()), "q"),
    "k_cache rank": (lambda i: dict(k_cache=i.k_cache[0]), "k_cache"),
    "v_cache shape": (lambda i: dict(v_cache=i.v_cache[:, :2]), "v_cache"),
    "cache dtype": (lambda i: dict(k_cache=i.k_cache.half(), v_cache=i.v_cache.half()), "k_cache"),
    "head_dim": (lambda i: dict(q=i.q[..., :8]), "q"),
    "heads don't divide": (lambda i: dict(q=i.q[:, :7]), "q"),
    "device": (lambda i: dict(k_cache=torch.empty(i.k_cache.shape, device="meta"),
                              v_cache=torch.empty(i.k_cache.shape, device="meta")), "k_cache"),
    "table float": (lambda i: dict(block_tables=i.block_tables.float()), "block_tables"),
    "table rows": (lambda i: dict(block_tables=i.block_tables[:1]), "block_tables"),
    "seq_lens rank": (lambda i: dict(seq_lens=i.seq_lens[:, None]), "seq_lens"),
    "seq_lens count": (lambda i: dict(seq_lens=i.seq_lens[:1]), "seq_lens"),
    "seq_len zero": (lambda i: dict(seq_lens=torch.tensor([0, 9], dtype=torch.int32)), "seq_lens"),
    "seq_len beyond table": (lambda i: dict(
        seq_lens=torch.tensor([5, 4 * i.block_tables.shape[1] + 1], dtype=torch.int32)),
        "seq_lens"),
    "block outside cache": (lambda i: dict(block_tables=torch.where(
        torch.arange(i.block_tables.shape[1]) == 0, i.k_cache.shape[0], i.block_tables)),
        "block_tables"),
    "negative block": (lambda i: dict(block_tables=torch.where(
        torch.arange(i.block_tables.shape[1]) == 1, -1, i.block_tables)), "block_tables"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_paged_decode_rejects(inp, case):
    change, name = BAD[case]
    with pytest.raises(ValueError, match=rf"^{name}:"):
        paged_decode(**_with(inp, **change(inp)), backend="torch")


def test_unused_table_entries_may_hold_anything(inp):
    # make_paged_inputs puts out-of-range garbage past each sequence's last block
    assert (inp.block_tables < 0).any() or (inp.block_tables >= inp.k_cache.shape[0]).any()
    paged_decode(*inp.args())


@pytest.mark.parametrize("scale", [0, -1.0, float("inf"), "x"])
def test_bad_scale(inp, scale):
    with pytest.raises(ValueError, match="^scale:"):
        paged_decode(*inp.args(), scale=scale)


def test_unknown_or_unsuitable_backend(inp):
    with pytest.raises(ValueError, match="^backend:"):
        paged_decode(*inp.args(), backend="nope")
    with pytest.raises(ValueError, match="^backend:"):  # sdpa has no paged kernel
        paged_decode(*inp.args(), backend="sdpa")
    with pytest.raises(ValueError, match="^backend:"):  # flex needs pages of 16k tokens
        paged_decode(*inp.args(), backend="flex")


def test_prefill_rejects(inp):
    q = torch.randn(4, 8, 16)
    qlens = torch.tensor([2, 2], dtype=torch.int32)
    args = (inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens)
    with pytest.raises(ValueError, match="^q:"):
        paged_prefill(q[:3], *args, qlens)
    with pytest.raises(ValueError, match="^query_lens:"):
        paged_prefill(q, *args, torch.tensor([0, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match="^query_lens:"):
        paged_prefill(torch.randn(16, 8, 16), *args, torch.tensor([6, 10], dtype=torch.int32))
    with pytest.raises(ValueError, match="^query_lens:"):
        paged_prefill(q, *args, qlens.float())


def test_contiguous_rejects():
    q, k = torch.randn(2, 4, 8), torch.randn(2, 10, 2, 8)
    lens = torch.tensor([3, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="^seq_lens:"):
        contiguous_decode(q, k, k, torch.tensor([3, 11], dtype=torch.int32))
    with pytest.raises(ValueError, match="^v:"):
        contiguous_decode(q, k, k[:, :5], lens)
    with pytest.raises(ValueError, match="^k:"):
        contiguous_decode(q, k[:1], k[:1], lens)
    with pytest.raises(ValueError, match="^q:"):
        contiguous_decode(q[:, :3], k, k, lens)


def test_write_kv_rejects_and_leaves_the_cache_unchanged():
    k_cache = torch.zeros(3, 2, 1, 4)
    v_cache = torch.zeros_like(k_cache)
    k = torch.ones(2, 1, 4)
    for slots, name in [(torch.tensor([0, 6]), "slot_mapping"),
                        (torch.tensor([-2, 1]), "slot_mapping"),
                        (torch.tensor([1, 1]), "slot_mapping"),
                        (torch.tensor([1.0, 2.0]), "slot_mapping"),
                        (torch.tensor([1]), "k")]:
        with pytest.raises(ValueError, match=rf"^{name}:"):
            write_kv(k_cache, v_cache, k, k, slots)
    with pytest.raises(ValueError, match="^k:"):
        write_kv(k_cache, v_cache, torch.ones(2, 2, 4), k, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="^k:"):
        write_kv(k_cache, v_cache, k.half(), k, torch.tensor([0, 1]))
    assert k_cache.eq(0).all() and v_cache.eq(0).all()


def test_copy_blocks_rejects_and_leaves_the_cache_unchanged():
    k_cache = torch.randn(4, 2, 1, 4)
    v_cache = torch.randn(4, 2, 1, 4)
    before = k_cache.clone(), v_cache.clone()
    for pairs in ([(0, 4)], [(-1, 2)], [(0, 2), (1, 2)], [(0, 1), (1, 2)], [(0, 1, 2)], "ab"):
        with pytest.raises(ValueError, match="^pairs:"):
            copy_blocks(k_cache, v_cache, pairs)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_copy_blocks_refuses_non_integer_block_ids():
    # issue 12 item 6: floats and bools used to be truncated to block ids (0.7 -> 0, True -> 1)
    k_cache = torch.randn(4, 2, 1, 4)
    v_cache = torch.randn(4, 2, 1, 4)
    before = k_cache.clone(), v_cache.clone()
    for pairs in ([(0.7, 1.9)], [(True, False)], [(0, 2.0)], [(1, None)],
                  torch.tensor([[0.0, 1.0]]), torch.tensor([[True, False]])):
        with pytest.raises(ValueError, match="^pairs: block ids must be integers"):
            copy_blocks(k_cache, v_cache, pairs)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])
    copy_blocks(k_cache, v_cache, [(np.int64(0), 1)])  # any integer type is a block id
    assert torch.equal(k_cache[1], before[0][0])
