"""fp8 KV caches: every backend that declares an fp8 cache dtype equals a float64 reference
computed from the dequantised cache, on any input.

The cases are the bf16/fp16/fp32 suite's (``test_kernel_equivalence``: any block size, GQA
ratio, head_dim, lengths at block boundaries, scattered tables, NaN-poisoned slots and table
entries), with the cache quantised to e4m3 or e5m2 and per-KV-head scales over a 256x range of
magnitudes, so a scale applied to the wrong head shows. q (and the output) keep the drawn
dtype. Each example also checks the quantisation itself: every stored element, times its
head's scale, is within the format's rounding of the unquantised value (``ROUNDING``). The
output's error against the unquantised cache is noted, not bounded: at a few tokens and small
head dims a sharp softmax can amplify one rounding to 15-20% of the output (hypothesis found
such cases), so no fixed bound on it is both safe and meaningful; `pagebench bench --fp8`
reports it at real sizes.
"""

from __future__ import annotations

import dataclasses
import functools

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, note, settings
from kernel_cases import decode_cases, examples_for, formats_read_on, prefill_cases

from pagebench.kernels import FP8_DTYPES, paged_decode, paged_prefill, registered_backends
from pagebench.measure.kernel_cases import (TOLERANCE, make_paged_inputs, quantized_inputs,
                                        relative_error, unquantized_caches)
from pagebench.kernels.reference import cumulative_offsets, reference_decode, reference_prefill
from pagebench.kernels.registry import backend_available

# per stored element: |stored x scale - real| <= rel x |real| + abs_step x scale. rel is half
# the spacing of normal numbers (3 mantissa bits for e4m3, 2 for e5m2), abs_step half the
# subnormal spacing (2^-9 and 2^-16); 2^-8 more covers the unquantised cache's own bf16 rounding,
# and half its dtype's subnormal spacing its rounding of tiny values (fp16: 2^-25, which e5m2
# with a small scale resolves more finely).
ROUNDING = {torch.float8_e4m3fn: (2.0 ** -4 + 2.0 ** -8, 2.0 ** -10),
            torch.float8_e5m2: (2.0 ** -3 + 2.0 ** -8, 2.0 ** -17)}


def fp8_backends_for(device: str, op: str) -> list[str]:
    return sorted(name for name, b in registered_backends().items()
                  if getattr(b, op) is not None and device in b.devices and backend_available(b)
                  and any(d in (b.cache_dtypes or ()) for d in FP8_DTYPES))


def fp8_examples(backend: str) -> int:
    return max(1, examples_for(backend) // 3)


def _inputs(backend, case, cache_dtype, device):
    assert registered_backends()[backend].nan_safe  # fp8 caches are poisoned with NaN
    inp = make_paged_inputs(case["lengths"], case["q_heads"], case["kv_heads"], case["head_dim"],
                            case["block_size"], case["dtype"], device, seed=case["seed"])
    # FlashInfer applies one scale to every head (and refuses per-head ones, tested in
    # tests/test_flashinfer.py): its caches are stored with the largest head's scale
    one_scale = backend.startswith("flashinfer")
    return inp, quantized_inputs(inp, cache_dtype, seed=case["seed"], one_scale=one_scale)


def check_rounding(inp, fp8, cache_dtype, seed):
    """Each finite element of the fp8 caches, times its KV head's scale, is the unquantised
    value within the format's rounding; returns the unquantised (k, v) caches."""
    rel, abs_step = ROUNDING[cache_dtype]
    real = unquantized_caches(inp, seed=seed)
    for name, stored, scale, value in (("k", fp8.k_cache, fp8.k_scale, real[0]),
                                       ("v", fp8.v_cache, fp8.v_scale, real[1])):
        own = torch.finfo(value.dtype)
        value = value.to(torch.float64)
        scale = scale.to(value.device, torch.float64)[None, None, :, None]
        deq = stored.to(torch.float64) * scale
        finite = torch.isfinite(value)
        slack = rel * value.abs() + abs_step * scale + own.smallest_normal * own.eps / 2
        bad = finite & ((deq - value).abs() > slack)
        assert not bad.any(), f"{name}: {int(bad.sum())} elements off by more than the rounding"
    return real


def check_decode_fp8(backend, case, cache_dtype, device="cpu", decode=None):
    inp, fp8 = _inputs(backend, case, cache_dtype, device)
    note(f"cache={cache_dtype} tables={inp.block_tables.tolist()} k_scale={fp8.k_scale.tolist()}")
    run = decode or functools.partial(paged_decode, backend=backend)
    out = run(*fp8.args(), **fp8.scales())
    assert out.shape == inp.q.shape and out.dtype == inp.q.dtype
    assert not torch.isnan(out).any(), "NaN in the output: a poisoned slot or entry was read"
    err = relative_error(out, reference_decode(*fp8.args(), **fp8.scales()))
    assert err < TOLERANCE[case["dtype"]], f"relative error {err:.2e} vs the dequantised cache"
    k, v = check_rounding(inp, fp8, cache_dtype, case["seed"])
    loss = relative_error(out, reference_decode(inp.q, k, v, inp.block_tables, inp.seq_lens))
    note(f"error vs the unquantised cache: {loss:.3e}")


def check_prefill_fp8(backend, case, query_lens, cache_dtype, device="cpu"):
    inp, fp8 = _inputs(backend, case, cache_dtype, device)
    gen = torch.Generator().manual_seed(case["seed"])
    q = torch.randn(sum(query_lens), case["q_heads"], case["head_dim"], generator=gen)
    q = q.to(device, case["dtype"])
    starts = cumulative_offsets(query_lens, device)
    args = (q, fp8.k_cache, fp8.v_cache, inp.block_tables, inp.seq_lens, starts)
    note(f"cache={cache_dtype} query_lens={query_lens} tables={inp.block_tables.tolist()}")
    out = paged_prefill(*args, backend=backend, **fp8.scales())
    assert out.shape == q.shape and out.dtype == q.dtype
    assert not torch.isnan(out).any(), "NaN in the output: a poisoned slot or entry was read"
    err = relative_error(out, reference_prefill(*args, **fp8.scales()))
    assert err < TOLERANCE[case["dtype"]], f"relative error {err:.2e} vs the dequantised cache"
    k, v = check_rounding(inp, fp8, cache_dtype, case["seed"])
    loss = relative_error(out, reference_prefill(q, k, v, *args[3:]))
    note(f"error vs the unquantised cache: {loss:.3e}")


@pytest.mark.parametrize("backend", fp8_backends_for("cpu", "decode"))
def test_paged_decode_fp8_matches_float64_reference_cpu(backend):
    @settings(max_examples=fp8_examples(backend), deadline=None)
    @given(case=decode_cases(backend), cache_dtype=st.sampled_from(FP8_DTYPES))
    def prop(case, cache_dtype):
        check_decode_fp8(backend, case, cache_dtype)
    prop()


@pytest.mark.parametrize("backend", fp8_backends_for("cpu", "prefill"))
def test_paged_prefill_fp8_matches_float64_reference_cpu(backend):
    @settings(max_examples=fp8_examples(backend), deadline=None)
    @given(drawn=prefill_cases(backend), cache_dtype=st.sampled_from(FP8_DTYPES))
    def prop(drawn, cache_dtype):
        check_prefill_fp8(backend, *drawn, cache_dtype)
    prop()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", fp8_backends_for("cuda", "decode"))
def test_paged_decode_fp8_matches_float64_reference_cuda(backend):
    @settings(max_examples=10, deadline=None)
    @given(case=decode_cases(backend, large=True),
           cache_dtype=st.sampled_from(formats_read_on("cuda", backend)))
    def prop(case, cache_dtype):
        check_decode_fp8(backend, case, cache_dtype, device="cuda")
    prop()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", fp8_backends_for("cuda", "prefill"))
def test_paged_prefill_fp8_matches_float64_reference_cuda(backend):
    @settings(max_examples=10, deadline=None)
    @given(drawn=prefill_cases(backend, large=True),
           cache_dtype=st.sampled_from(formats_read_on("cuda", backend)))
    def prop(drawn, cache_dtype):
        check_prefill_fp8(backend, *drawn, cache_dtype, device="cuda")
    prop()


def test_triton_fp8_split_kv_matches_reference():
    """The split-KV path (partials scaled by v_scale before the merge), forced on the CPU,
    with one KV head per program or two (each head's scales on its own rows)."""
    if "triton" not in fp8_backends_for("cpu", "decode"):
        pytest.skip("triton not installed")
    from pagebench.kernels.triton_decode import DecodeLaunch, triton_paged_decode

    @settings(max_examples=fp8_examples("triton"), deadline=None)
    @given(case=decode_cases("triton"), cache_dtype=st.sampled_from(FP8_DTYPES),
           splits=st.integers(2, 5), tile_n=st.sampled_from([16, 32]), pair=st.booleans())
    def prop(case, cache_dtype, splits, tile_n, pair):
        kv_per_program = 2 if pair and case["kv_heads"] % 2 == 0 else 1
        check_decode_fp8("triton", case, cache_dtype, decode=lambda *args, **scales:
                         triton_paged_decode(*args, case["head_dim"] ** -0.5, **scales,
                                             launch=DecodeLaunch(
                                                 num_splits=splits, tile_n=tile_n,
                                                 kv_per_program=kv_per_program)))
    prop()


def test_triton_fp8_decode_any_query_magnitude():
    """With an fp8 cache the Triton decode runs its dots in fp16, bf16 q rescaled per head by a
    power of two: heads far beyond fp16's range (2^16) or deep in its subnormals, and all-zero
    heads, still match the float64 reference."""
    if "triton" not in fp8_backends_for("cpu", "decode"):
        pytest.skip("triton not installed")

    @settings(max_examples=fp8_examples("triton"), deadline=None)
    @given(case=decode_cases("triton"), cache_dtype=st.sampled_from(FP8_DTYPES),
           exponent=st.integers(-40, 40), spread=st.lists(st.integers(-8, 8), min_size=16,
                                                          max_size=16),
           zero_head=st.booleans())
    def prop(case, cache_dtype, exponent, spread, zero_head):
        case = dict(case, dtype=torch.bfloat16)
        inp, fp8 = _inputs("triton", case, cache_dtype, "cpu")
        factors = torch.tensor([2.0 ** (exponent + spread[h % 16])
                                for h in range(case["q_heads"])])
        if zero_head:
            factors[0] = 0.0
        q = (inp.q.double() * factors[None, :, None]).to(torch.bfloat16)
        args = (q, *fp8.args()[1:])
        note(f"cache={cache_dtype} factors={factors.tolist()}")
        out = paged_decode(*args, backend="triton", **fp8.scales())
        assert torch.isfinite(out).all()
        err = relative_error(out, reference_decode(*args, **fp8.scales()))
        assert err < TOLERANCE[torch.bfloat16], f"relative error {err:.2e}"
    prop()


def test_rounding_check_allows_the_unquantised_dtypes_own_rounding():
    """An fp16 cache's tiny values are fp16 subnormals, rounded more coarsely than e5m2 with a
    small scale stores them (found on the H200: 2^-24 in fp16 stored as 2.97e-8): the rounding
    check takes that rounding, and still refuses an element off by more than both."""
    case = dict(lengths=[1, 1, 1, 1, 1, 242], q_heads=8, kv_heads=8, head_dim=80, block_size=1,
                dtype=torch.float16, seed=1)
    inp, fp8 = _inputs("torch", case, torch.float8_e5m2, "cpu")
    check_rounding(inp, fp8, torch.float8_e5m2, case["seed"])
    k_cache = fp8.k_cache.clone()
    k_cache.view(torch.uint8).bitwise_xor_(0x04)  # the lowest exponent bit: a factor of 2 off
    off = dataclasses.replace(fp8, k_cache=k_cache)
    with pytest.raises(AssertionError, match="off by more than the rounding"):
        check_rounding(inp, off, torch.float8_e5m2, case["seed"])
