"""Bad input raises ValueError naming the argument, before anything runs or changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagebench.kernels import (contiguous_decode, copy_blocks, paged_decode, paged_prefill,
                               write_kv)
from pagebench.measure.kernel_cases import make_paged_inputs


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


# True and "0.125" used to run as 1.0 and 0.125 (float() takes them)
@pytest.mark.parametrize("scale", [0, -1.0, float("inf"), "x", 1e39, 1e-46, 10**400, True,
                                   np.True_, "0.125", torch.tensor(0.125)])
def test_bad_scale(inp, scale):
    with pytest.raises(ValueError, match="^scale:"):
        paged_decode(*inp.args(), scale=scale)


@pytest.mark.parametrize("scale", [np.float32(0.25), np.float64(0.25), np.int64(1), 1])
def test_scale_takes_any_real_number(inp, scale):
    out = paged_decode(*inp.args(), scale=scale, backend="torch")
    assert torch.equal(out, paged_decode(*inp.args(), scale=float(scale), backend="torch"))


def test_unknown_or_unsuitable_backend(inp):
    with pytest.raises(ValueError, match="^backend:"):
        paged_decode(*inp.args(), backend="nope")
    with pytest.raises(ValueError, match="^backend:"):  # sdpa has no paged kernel
        paged_decode(*inp.args(), backend="sdpa")
    with pytest.raises(ValueError, match="^backend:"):  # flex needs pages of 16k tokens
        paged_decode(*inp.args(), backend="flex")


def _offsets(*values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype)


@pytest.mark.parametrize("starts, total, match", [
    ((0, 2, 3), 4, "ends at 3 but q has 4 query tokens"),
    ((1, 2, 4), 4, "must start at 0, got 1"),
    ((0, 3, 2), 2, r"decreases at sequence 1 \(3 then 2\)"),
    ((0, 6, 10), 10, r"sequence 0: query length 6 exceeds its seq_len \(5\)"),  # [5, 9]
    ((0, 2, 4, 4), 4, r"has 4 entries for the 2 sequences of seq_lens \(it needs"),
    ((0, 4), 4, r"has 2 entries for the 2 sequences of seq_lens \(it needs num_seqs \+ 1 = 3"),
    ((), 0, "is empty"),
])
def test_prefill_rejects_bad_query_start_loc(inp, starts, total, match):
    """Each bad ``query_start_loc`` named, on every backend, before any state changes (the
    validation's cache of checked values included: the next good call still passes)."""
    args = (inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens)
    for dtype in (torch.int32, torch.int64):
        with pytest.raises(ValueError, match=f"^query_start_loc: {match}"):
            paged_prefill(torch.randn(total, 8, 16), *args, _offsets(*starts, dtype=dtype))
    assert paged_prefill(torch.randn(4, 8, 16), *args, _offsets(0, 2, 4)).shape == (4, 8, 16)


def test_prefill_rejects(inp):
    q = torch.randn(4, 8, 16)
    starts = _offsets(0, 2, 4)
    args = (inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens)
    with pytest.raises(ValueError, match="^query_start_loc: ends at 4 but q has 3"):
        paged_prefill(q[:3], *args, starts)
    with pytest.raises(ValueError, match="^query_start_loc: dtype"):
        paged_prefill(q, *args, starts.float())
    with pytest.raises(ValueError, match="^query_start_loc: expected 1 dimensions"):
        paged_prefill(q, *args, starts[None])
    with pytest.raises(ValueError, match="^query_start_loc: expected a torch.Tensor"):
        paged_prefill(q, *args, [0, 2, 4])
    # a sequence may have no queries
    assert paged_prefill(q, *args, _offsets(0, 0, 4)).shape == q.shape


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
    with pytest.raises(ValueError, match="^k: num_kv_heads and head_dim"):
        contiguous_decode(q[..., :0], k[..., :0], k[..., :0], lens)


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


@pytest.mark.parametrize("unwritable", ["requires grad", "inference tensor"])
def test_write_kv_refuses_a_cache_it_cannot_write_in_place_before_writing_either(unwritable):
    # torch refuses these only at the in-place store: V's refusal came after K was written
    k_cache = torch.zeros(3, 2, 1, 4)
    if unwritable == "requires grad":
        v_cache = torch.zeros_like(k_cache, requires_grad=True)
    else:
        with torch.inference_mode():
            v_cache = torch.zeros_like(k_cache)
    with pytest.raises(ValueError, match=f"^v_cache: .*{unwritable}"):
        write_kv(k_cache, v_cache, torch.ones(2, 1, 4), torch.ones(2, 1, 4), torch.tensor([0, 1]))
    assert k_cache.eq(0).all() and v_cache.eq(0).all()
    # where torch lets the store happen, write_kv does it
    with torch.inference_mode() if unwritable == "inference tensor" else torch.no_grad():
        write_kv(k_cache, v_cache, torch.ones(2, 1, 4), torch.ones(2, 1, 4), torch.tensor([0, 1]))
    assert v_cache.sum() == 8


@pytest.mark.parametrize("unwritable", ["requires grad", "inference tensor"])
def test_copy_blocks_refuses_a_cache_it_cannot_write_in_place_before_copying_either(unwritable):
    # audit finding 2: K was copied, then torch refused V's store (a RuntimeError)
    k_cache = torch.randn(4, 2, 1, 4)
    if unwritable == "requires grad":
        v_cache = torch.randn(4, 2, 1, 4, requires_grad=True)
    else:
        with torch.inference_mode():
            v_cache = torch.randn(4, 2, 1, 4)
    before = k_cache.clone(), v_cache.detach().clone()
    with pytest.raises(ValueError, match=f"^v_cache: .*{unwritable}"):
        copy_blocks(k_cache, v_cache, [(0, 2)])
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache.detach(), before[1])
    # where torch lets the store happen, copy_blocks does it
    with torch.inference_mode() if unwritable == "inference tensor" else torch.no_grad():
        copy_blocks(k_cache, v_cache, [(0, 2)])
    assert torch.equal(k_cache[2], before[0][0]) and torch.equal(v_cache[2].detach(), before[1][0])


def test_write_kv_and_copy_blocks_refuse_one_cache_as_both():
    """The same tensor (or overlapping views of one) as K and V cache: V's write used to
    overwrite K's. The K and V halves of one allocation, as the engine keeps them, are two."""
    kv = torch.zeros(2, 3, 2, 1, 4)
    k, slots = torch.ones(2, 1, 4), torch.tensor([0, 1])
    for k_cache, v_cache in [(kv[0], kv[0]), (kv.view(6, 2, 1, 4)[:4], kv.view(6, 2, 1, 4)[2:])]:
        with pytest.raises(ValueError, match="^v_cache: shares memory with k_cache"):
            write_kv(k_cache, v_cache, k, 2 * k, slots)
        with pytest.raises(ValueError, match="^v_cache: shares memory with k_cache"):
            copy_blocks(k_cache, v_cache, [(0, 1)])
        assert kv.eq(0).all()
    write_kv(kv[0], kv[1], k, 2 * k, slots)
    assert kv[0].sum() == 8 and kv[1].sum() == 16


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


def test_empty_batches_give_empty_outputs_on_every_backend():
    """No sequences (a table of no rows, or of no columns): an empty result, whatever the
    backend (some crashed dividing by the table's width, or indexing its first row)."""
    from pagebench.kernels import available_backends

    k_cache = torch.randn(2, 16, 1, 16)
    q = torch.randn(0, 2, 16)
    lens = torch.zeros(0, dtype=torch.int32)
    for width in (0, 2):
        tables = torch.zeros(0, width, dtype=torch.int32)
        for name, b in available_backends().items():
            if "decode" in b["operations"]:
                assert paged_decode(q, k_cache, k_cache, tables, lens, backend=name).shape == q.shape
            if "prefill" in b["operations"]:
                assert paged_prefill(q, k_cache, k_cache, tables, lens,
                                     torch.zeros(1, dtype=torch.int32),
                                     backend=name).shape == q.shape
    for name, b in available_backends().items():
        if "contiguous" in b["operations"]:
            k = torch.randn(0, 0, 1, 16)
            assert contiguous_decode(q, k, k, lens, backend=name).shape == q.shape


def test_flex_refuses_a_page_listed_twice_in_one_sequence():
    """Its mask maps a physical page to one logical page: a repeated page (which the other
    backends read twice, as the table says) was silently read once."""
    from pagebench.kernels.flex import flex_available

    if not flex_available():
        pytest.skip("this torch has no flex_attention")
    k_cache = torch.randn(3, 16, 1, 16)
    q = torch.randn(1, 1, 16)
    args = (q, k_cache, k_cache, torch.tensor([[1, 1, 2]], dtype=torch.int32),
            torch.tensor([33], dtype=torch.int32))
    with pytest.raises(ValueError, match="^block_tables: sequence 0 lists a block more"):
        paged_decode(*args, backend="flex")
    paged_decode(*args, backend="torch")  # valid input: the table says read block 1 twice
    # the same block in two sequences is fine
    two = (q.expand(2, -1, -1), k_cache, k_cache, torch.tensor([[1, 2], [1, 0]], dtype=torch.int32),
           torch.tensor([20, 17], dtype=torch.int32))
    assert torch.allclose(paged_decode(*two, backend="flex"), paged_decode(*two, backend="torch"),
                          atol=1e-5)


def test_triton_decode_takes_a_one_column_table_of_any_stride():
    """A [num_seqs, 1] table's column stride is immaterial (a transposed row has stride 2
    there); the kernel's layout check refused it though the validation accepted it."""
    from pagebench.kernels.reference import reference_decode

    inp = make_paged_inputs([5, 8], 2, 1, 16, 8, seed=0, poison=False)
    table = torch.tensor([[int(inp.block_tables[0, 0]), int(inp.block_tables[1, 0])]],
                         dtype=torch.int32).t()
    assert table.stride() == (1, 2)
    args = (inp.q, inp.k_cache, inp.v_cache, table, inp.seq_lens)
    assert torch.allclose(paged_decode(*args, backend="triton"), reference_decode(*args).float(),
                          atol=1e-5)
