"""Every layout validation accepts is read correctly: strided, offset and transposed views of
the lengths and block tables, int32 and int64 indices in any order (issue 12, items 1, 2, 4).

Each test runs on the CPU (Triton interpreted) and, where there is one, on CUDA, where the
decode plan cache and the direct launches exist.
"""

from __future__ import annotations

import pytest
import torch

from pagebench.kernels import (available_backends, contiguous_decode, paged_decode,
                               paged_prefill, write_kv)
from pagebench.measure.kernel_cases import (LAYOUTS, TOLERANCE, make_paged_inputs, relative_error,
                                        with_layout)
from pagebench.kernels.reference import (reference_contiguous, reference_decode,
                                         reference_prefill)

HAS_TRITON = "triton" in available_backends()
DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)]
                     if torch.cuda.is_available() else [])
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")


def strided(values, dtype=torch.int32, device="cpu", junk=1):
    """``values`` with ``junk`` between its elements: ``tensor([10, 1, 7, 1])[::2]``."""
    return with_layout(torch.tensor(values, dtype=dtype, device=device), "strided", junk)


def assert_close(out, ref, dtype=torch.float32):
    assert not torch.isnan(out).any(), "NaN in the output: a poisoned slot or entry was read"
    err = relative_error(out, ref)
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("junk", [1, 10**6])
def test_triton_decode_reads_strided_seq_lens(device, junk):
    # issue 12 item 1: sl = torch.tensor([10, 1, 7, 1], dtype=torch.int32)[::2]; with large
    # values between the elements the old kernel read out of bounds
    inp = make_paged_inputs([10, 7], 4, 2, 16, 4, device=device)
    sl = strided([10, 7], device=device, junk=junk)
    assert sl.stride(0) == 2
    out = paged_decode(inp.q, inp.k_cache, inp.v_cache, inp.block_tables, sl, backend="triton")
    torch_out = paged_decode(inp.q, inp.k_cache, inp.v_cache, inp.block_tables, sl,
                             backend="torch")
    ref = reference_decode(inp.q, inp.k_cache, inp.v_cache, inp.block_tables, sl)
    assert_close(out, ref)
    assert_close(torch_out, ref)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["seq_lens", "query_start_loc", "both"])
def test_triton_prefill_reads_strided_lengths(device, which):
    inp = make_paged_inputs([10, 7], 4, 2, 16, 4, device=device)
    starts = [0, 4, 11]
    q = torch.randn(starts[-1], 4, 16, generator=torch.Generator().manual_seed(1)).to(device)
    sl = strided([10, 7], device=device) if which != "query_start_loc" else inp.seq_lens
    ql = (strided(starts, device=device) if which != "seq_lens"
          else torch.tensor(starts, dtype=torch.int32, device=device))
    args = (q, inp.k_cache, inp.v_cache, inp.block_tables, sl, ql)
    assert_close(paged_prefill(*args, backend="triton"), reference_prefill(*args))


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_triton_contiguous_decode_reads_strided_seq_lens(device):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 16, generator=gen).to(device)
    k = torch.randn(2, 12, 2, 16, generator=gen).to(device)
    v = torch.randn(2, 12, 2, 16, generator=gen).to(device)
    k[1, 7:] = float("nan")  # past sequence 1's length
    v[1, 7:] = float("nan")
    sl = strided([12, 7], device=device)
    assert_close(contiguous_decode(q, k, v, sl, backend="triton"),
                 reference_contiguous(q, k, v, sl))


def table_views(tables: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same table in every layout validation accepts, int32 and int64, with out-of-range
    block ids around it."""
    return {f"{layout} {dtype}": with_layout(tables.to(dtype), layout, junk=10**6)
            for layout in LAYOUTS for dtype in (torch.int32, torch.int64)}


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["torch"] + (["triton"] if HAS_TRITON else []))
def test_table_views_decode_and_prefill(device, backend):
    inp = make_paged_inputs([10, 7, 3], 4, 2, 16, 4, device=device)
    starts = torch.tensor([0, 3, 10, 11], dtype=torch.int32, device=device)
    q_pre = torch.randn(11, 4, 16, generator=torch.Generator().manual_seed(3)).to(device)
    for name, tables in table_views(inp.block_tables).items():
        assert torch.equal(tables.cpu().long(), inp.block_tables.cpu().long()), name
        args = (inp.q, inp.k_cache, inp.v_cache, tables, inp.seq_lens)
        assert_close(paged_decode(*args, backend=backend), reference_decode(*args))
        args = (q_pre, inp.k_cache, inp.v_cache, tables, inp.seq_lens, starts)
        assert_close(paged_prefill(*args, backend=backend), reference_prefill(*args))


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_int32_then_int64_table_of_the_same_shape(device):
    # issue 12 item 2: the plan cache reused the int32-specialised kernel for an int64 table
    inp = make_paged_inputs([40, 9], 8, 2, 32, 4, device=device)
    t32, t64 = inp.block_tables, inp.block_tables.long()
    for tables in (t32, t64, t32, t64, t64):
        args = (inp.q, inp.k_cache, inp.v_cache, tables, inp.seq_lens)
        assert_close(paged_decode(*args, backend="triton"), reference_decode(*args))
    for lens in (inp.seq_lens, inp.seq_lens.long(), inp.seq_lens):
        args = (inp.q, inp.k_cache, inp.v_cache, t64, lens)
        assert_close(paged_decode(*args, backend="triton"), reference_decode(*args))


@needs_triton
def test_decode_plan_key_covers_every_dtype_and_layout():
    from pagebench.kernels.triton_decode import decode_plan
    inp = make_paged_inputs([9, 5], 8, 2, 16, 4)
    q, k, v, t, sl = inp.args()
    base = decode_plan(q, k, v, t, sl, 0.25)
    assert decode_plan(q, k, v, t.clone(), sl.clone(), 0.25) is base  # same layout: reused
    variants = {
        "table int64": (q, k, v, t.long(), sl),
        "lengths int64": (q, k, v, t, sl.long()),
        "table rows strided": (q, k, v, torch.cat([t, t], 1)[:, :t.shape[1]], sl),
        "q rows strided": (torch.cat([q, q], 1)[:, :q.shape[1]], k, v, t, sl),
        "v strided": (q, k, torch.cat([v, v], 2)[:, :, :2], t, sl),
        "half": (q.half(), k.half(), v.half(), t, sl),
    }
    for name, args in variants.items():
        assert decode_plan(*args, 0.25) is not base, name
    with pytest.raises(ValueError, match="^seq_lens:"):
        decode_plan(q, k, v, t, strided([9, 5]), 0.25)
    with pytest.raises(ValueError, match="^block_tables:"):
        decode_plan(q, k, v, t.T.contiguous().T, sl, 0.25)


def test_write_kv_with_v_cache_of_another_dtype_writes_nothing():
    # issue 12 item 4: it wrote k_cache, then failed on v_cache
    k_cache = torch.zeros(4, 2, 1, 8)
    v_cache = torch.zeros(4, 2, 1, 8, dtype=torch.float16)
    k = torch.ones(3, 1, 8)
    slots = torch.tensor([0, 3, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="^v_cache:"):
        write_kv(k_cache, v_cache, k, k.clone(), slots)
    assert not k_cache.any() and not v_cache.any()
