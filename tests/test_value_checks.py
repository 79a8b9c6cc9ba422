"""Value checks run once per unchanged set of tensors, and never vouch for changed values."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch

from pagebench.kernels import (available_backends, contiguous_decode, paged_decode,
                               paged_prefill, write_kv)
from pagebench.measure.kernel_cases import make_paged_inputs
from pagebench.kernels.value_checks import CheckedValues

HAS_CUDA = torch.cuda.is_available()


class CountingCheck:
    """A value check that refuses a negative entry and counts its runs."""

    def __init__(self):
        self.runs = 0

    def __call__(self, table, limit):
        self.runs += 1
        if int(table.min()) < 0 or int(table.max()) >= limit:
            raise ValueError("table: out of range")
        return "ok"


def test_an_unchanged_tensor_is_checked_once():
    checked, check = CheckedValues(), CountingCheck()
    table = torch.arange(6).reshape(2, 3)
    for _ in range(3):
        assert checked.run(check, (table,), (10,)) == "ok"
    assert check.runs == 1
    checked.run(check, (table,), (20,))  # other parameters: checked again
    assert check.runs == 2


@pytest.mark.parametrize("write", [
    lambda t: t.__setitem__((0, 0), -1),
    lambda t: t[:, 1].fill_(-1),  # through a view
    lambda t: t.T[2].sub_(100),  # through a transposed view
    lambda t: t.copy_(torch.full_like(t, -1)),
    lambda t: torch.add(t, -100, out=t),
])
def test_an_in_place_change_is_checked_again(write):
    checked, check = CheckedValues(), CountingCheck()
    table = torch.arange(6).reshape(2, 3)
    checked.run(check, (table,), (10,))
    write(table)
    with pytest.raises(ValueError, match="^table:"):
        checked.run(check, (table,), (10,))
    with pytest.raises(ValueError, match="^table:"):  # a failed check records nothing
        checked.run(check, (table,), (10,))
    assert check.runs == 3


@pytest.mark.slow
def test_a_new_tensor_at_a_freed_ones_id_and_address_is_checked():
    """A new tensor with a dead one's id, address, shape, strides and version: only the weak
    reference tells them apart. The memory is one buffer (so the address is the same by
    construction, not by the allocator's choice), written behind the version counter; each
    table is a new view object, which CPython places at the freed one's id."""
    checked, check = CheckedValues(), CountingCheck()
    buffer = torch.zeros(16, dtype=torch.int64)
    seen, reused = set(), 0
    for i in range(40):
        buffer.data.fill_(3 if i % 2 == 0 else -1)  # every other one is bad
        table = buffer.view(4, 4)
        reused += id(table) in seen
        seen.add(id(table))
        with contextlib.nullcontext() if i % 2 == 0 else pytest.raises(ValueError):
            checked.run(check, (table,), (10,))
        del table
        gc.collect()
    assert check.runs == 40
    assert reused, "no tensor reused a freed one's id: the case was not exercised"


def test_inference_tensors_are_always_checked():
    checked, check = CheckedValues(), CountingCheck()
    with torch.inference_mode():
        table = torch.arange(6)
    checked.run(check, (table,), (10,))
    checked.run(check, (table,), (10,))
    assert check.runs == 2


def test_the_cache_is_bounded():
    checked, check = CheckedValues(max_entries=4), CountingCheck()
    tables = [torch.arange(3) for _ in range(10)]
    for t in tables:
        checked.run(check, (t,), (10,))
    assert len(checked) <= 4


def test_cpu_calls_check_values_every_time():
    inp = make_paged_inputs([5, 9], 4, 2, 16, 4)
    paged_decode(*inp.args(), backend="torch")
    inp.block_tables[1, 0] = inp.k_cache.shape[0]  # now out of range
    with pytest.raises(ValueError, match="^block_tables:"):
        paged_decode(*inp.args(), backend="torch")


def test_validate_must_be_a_known_mode():
    inp = make_paged_inputs([5], 4, 2, 16, 4)
    with pytest.raises(ValueError, match="^validate:"):
        paged_decode(*inp.args(), validate=False)


# ---- CUDA: the cached path does not synchronise, and still refuses changed values ---------

cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
BACKENDS = ["torch"] + (["triton"] if "triton" in available_backends() else [])


@contextlib.contextmanager
def no_sync():
    """Any device->host read or synchronisation inside raises."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@cuda_only
@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_decode_checks_an_unchanged_table_once(backend):
    inp = make_paged_inputs([50, 9, 33], 8, 2, 64, 16, torch.bfloat16, "cuda")
    first = paged_decode(*inp.args(), backend=backend)
    with no_sync():
        again = paged_decode(*inp.args(), backend=backend)
    torch.testing.assert_close(again, first)
    with no_sync(), pytest.raises(RuntimeError):  # validate="always" reads the values back
        paged_decode(*inp.args(), backend=backend, validate="always")


@pytest.mark.gpu
@cuda_only
@pytest.mark.gpu
@pytest.mark.parametrize("change, name", [
    (lambda i: i.block_tables.__setitem__((1, 0), i.k_cache.shape[0]), "block_tables"),
    (lambda i: i.block_tables[0].fill_(-1), "block_tables"),
    (lambda i: i.seq_lens.__setitem__(2, 10**6), "seq_lens"),
    (lambda i: i.seq_lens.zero_(), "seq_lens"),
])
def test_cuda_decode_refuses_a_table_changed_after_its_check(change, name):
    inp = make_paged_inputs([50, 9, 33], 8, 2, 64, 16, torch.bfloat16, "cuda")
    for backend in BACKENDS:
        paged_decode(*inp.args(), backend=backend)
    change(inp)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match=f"^{name}:"):
            paged_decode(*inp.args(), backend=backend)


@pytest.mark.gpu
@cuda_only
@pytest.mark.gpu
def test_cuda_new_tables_in_a_loop_are_each_checked():
    inp = make_paged_inputs([50, 9, 33], 8, 2, 64, 16, torch.bfloat16, "cuda")
    for i in range(20):
        tables = inp.block_tables.clone()
        if i % 2:
            tables[0, 0] = -1
        with contextlib.nullcontext() if i % 2 == 0 else pytest.raises(ValueError):
            paged_decode(inp.q, inp.k_cache, inp.v_cache, tables, inp.seq_lens, backend="triton")
        del tables


@pytest.mark.gpu
@cuda_only
@pytest.mark.gpu
def test_cuda_prefill_contiguous_and_write_kv_cached_without_sync():
    inp = make_paged_inputs([50, 9], 8, 2, 64, 16, torch.bfloat16, "cuda")
    starts = torch.tensor([0, 20, 29], dtype=torch.int32, device="cuda")
    q = torch.randn(29, 8, 64, device="cuda", dtype=torch.bfloat16)
    args = (q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, starts)
    paged_prefill(*args, backend="triton")
    with no_sync():
        paged_prefill(*args, backend="triton")
    starts[1] = 30  # a decrease
    with pytest.raises(ValueError, match="^query_start_loc:"):
        paged_prefill(*args, backend="triton")

    k = torch.randn(2, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([64, 30], dtype=torch.int32, device="cuda")
    contiguous_decode(inp.q[:2], k, k, lens, backend="triton")
    with no_sync():
        contiguous_decode(inp.q[:2], k, k, lens, backend="triton")
    lens[1] = 65
    with pytest.raises(ValueError, match="^seq_lens:"):
        contiguous_decode(inp.q[:2], k, k, lens, backend="triton")

    slots = torch.tensor([3, 17, 40], dtype=torch.int64, device="cuda")
    kv = torch.randn(3, 2, 64, device="cuda", dtype=torch.bfloat16)
    write_kv(inp.k_cache, inp.v_cache, kv, kv, slots)
    with no_sync():
        write_kv(inp.k_cache, inp.v_cache, kv, kv, slots)
    slots[2] = 17
    with pytest.raises(ValueError, match="^slot_mapping:"):
        write_kv(inp.k_cache, inp.v_cache, kv, kv, slots)
