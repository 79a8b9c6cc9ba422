"""Every registered paged-decode and paged-prefill backend that runs here equals a float64
reference, on any input.

hypothesis draws the shape (sequences, KV heads, GQA ratio, head_dim), the block size (1,
non-powers of two, ...), each sequence's length (1, block_size - 1, block_size, block_size + 1,
or anything up to a few blocks), the dtype and a scattered block table. Every cache slot and
table entry a sequence must not read is poisoned (NaN; large finite values for backends that
declare ``nan_safe=False``), so any out-of-range read shows in the output. Backends are taken
from the registry at collection time: a third-party backend registered before the tests run
(e.g. in a conftest) is checked with no other change. On CUDA the same suite runs at real sizes.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import example, given, settings
from kernel_cases import (PREFILL_LAUNCHES, backends_for, check_backend, check_prefill,
                          decode_cases, examples_for, prefill_cases, run_property)

from pagebench.measure.kernel_cases import LAYOUTS, spare_block, with_layout


@pytest.mark.slow
@pytest.mark.parametrize("backend", backends_for("cpu"))
def test_paged_decode_matches_float64_reference_cpu(backend):
    run_property(backend)


@pytest.mark.slow
def test_triton_split_kv_and_tiles_match_reference():
    """The split-KV merge and tile boundaries, forced at CPU sizes (auto picks one split)."""
    if "triton" not in backends_for("cpu"):
        pytest.skip("triton not installed")
    from pagebench.kernels.triton_decode import DecodeLaunch, triton_paged_decode

    @settings(max_examples=examples_for("triton"), deadline=None)
    @given(case=decode_cases("triton"), splits=st.integers(2, 5),
           tile_n=st.sampled_from([16, 32, 128]))
    def prop(case, splits, tile_n):
        check_backend("triton", case, decode=lambda *args: triton_paged_decode(
            *args, case["head_dim"] ** -0.5,
            launch=DecodeLaunch(num_splits=splits, tile_n=tile_n)))
    prop()


@pytest.mark.slow
def test_triton_ragged_default_splits_match_reference(monkeypatch):
    """The default split count on ragged batches, at a tile CPU sizes split (16 tokens): each
    sequence takes the splits the batch's lengths leave it, read on the device; lengths 1 and
    the table's whole capacity beside the drawn ones, int32/int64 tables and lengths, q a
    strided view. The host's gate on the uniform split's length is opened (these tables are
    far shorter than where the ragged grid pays on a GPU); fp8 caches keep the uniform grid."""
    if "triton" not in backends_for("cpu"):
        pytest.skip("triton not installed")
    from pagebench.kernels import triton_decode
    from pagebench.kernels.triton_decode import DecodeLaunch, decode_plan, triton_paged_decode
    monkeypatch.setattr(triton_decode, "RAGGED_MIN_SPLIT_TILES", 1)
    monkeypatch.setattr(triton_decode, "RAGGED_MIN_FUSED_SPLIT_TILES", 1)
    launch = DecodeLaunch(tile_n=16)

    @settings(max_examples=examples_for("triton"), deadline=None)
    @given(case=decode_cases("triton"), index=st.sampled_from([torch.int32, torch.int64]),
           longest=st.integers(97, 200))
    def prop(case, index, longest):
        case = dict(case, lengths=[1, *case["lengths"], longest])

        def decode(q, k_cache, v_cache, tables, seq_lens):
            wide = torch.zeros(*q.shape[:2], 2 * q.shape[2], dtype=q.dtype)
            wide[..., :q.shape[2]] = q
            args = (wide[..., :q.shape[2]], k_cache, v_cache, tables.to(index),
                    seq_lens.to(index))
            plan = decode_plan(*args, case["head_dim"] ** -0.5, launch)
            fp8 = plan.split.kwargs["FP8"]
            assert plan.max_splits == 1 or plan.split.kwargs["ADAPTIVE"] != fp8
            return triton_paged_decode(*args, case["head_dim"] ** -0.5, launch=launch)
        check_backend("triton", case, decode=decode)
    prop()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", backends_for("cuda"))
def test_paged_decode_matches_float64_reference_cuda(backend):
    run_property(backend, device="cuda", large=True, examples=10)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or "triton" not in backends_for("cuda"),
                    reason="needs a CUDA device and triton")
def test_triton_split_merges_match_reference_cuda():
    """Both merges of the splits (the split kernel's own, the combine kernel), forced or by
    the split count, at the counts the defaults take on an H200 (2-4, 16-64); each case twice
    on one plan, whose merge counters must be back at zero after the first call."""
    from pagebench.kernels.triton_decode import (FUSED_MERGE_SPLITS, DecodeLaunch,
                                                 triton_paged_decode)

    @settings(max_examples=24, deadline=None)
    @given(case=decode_cases("triton", large=True), splits=st.sampled_from([2, 3, 4, 7, 16, 64]),
           fused=st.sampled_from([None, True, False]))
    def prop(case, splits, fused):
        if fused and splits > FUSED_MERGE_SPLITS:  # it merges at most that many
            fused = False

        def decode(*args):
            return triton_paged_decode(*args, case["head_dim"] ** -0.5,
                                       launch=DecodeLaunch(num_splits=splits, fused_merge=fused))
        for _ in range(2):
            check_backend("triton", case, "cuda", decode=decode)
    prop()


FP32_LARGE_SCORES = dict(lengths=[15, 1], q_heads=4, kv_heads=2, head_dim=16, block_size=16,
                         dtype=torch.float32, seed=2516)


@pytest.mark.slow
@pytest.mark.parametrize("backend", backends_for("cpu", "prefill"))
def test_paged_prefill_matches_float64_reference_cpu(backend):
    @settings(max_examples=examples_for(backend), deadline=None)
    @given(drawn=prefill_cases(backend))
    def prop(drawn):
        check_prefill(backend, *drawn)
    prop()


@pytest.mark.slow
def test_triton_prefill_tiles_match_reference():
    """Several query tiles per sequence and key tiles across the diagonal, forced small; one
    walk over the keys or two, block ids loaded with their tile or a tile ahead, the output
    rescaled whenever a row's running max moves or only when it moves by more than 2^8; the
    table, the lengths and the query offsets int32 or int64, contiguous or views with junk
    around them; sequences without queries among the others; queries scaled so that the
    running max rises between key tiles by more than fp16 and fp32 hold unrescaled (gain 8
    and 200), and by little (gain 1)."""
    if "triton" not in backends_for("cpu", "prefill"):
        pytest.skip("triton not installed")
    from pagebench.kernels.triton_prefill import PrefillLaunch, triton_paged_prefill

    @settings(max_examples=examples_for("triton"), deadline=None)
    @given(drawn=prefill_cases("triton"), rows=st.sampled_from([16, 32]),
           tile_n=st.sampled_from([16, 32]), one_loop=st.booleans(), table_ahead=st.booleans(),
           lazy=st.booleans(), q_gain=st.sampled_from([1.0, 8.0, 200.0]),
           index_dtype=st.sampled_from([torch.int32, torch.int64]),
           index_layout=st.sampled_from(LAYOUTS))
    # found by the long profile: fp32 at gain 200, 1.6e-5 against 1e-5 before logit_slack
    @example(drawn=(FP32_LARGE_SCORES, [1, 1]), rows=16, tile_n=16, one_loop=False,
             table_ahead=False, lazy=False, q_gain=200.0, index_dtype=torch.int32,
             index_layout="contiguous")
    def prop(drawn, rows, tile_n, one_loop, table_ahead, lazy, q_gain, index_dtype,
             index_layout):
        case, query_lens = drawn
        launch = PrefillLaunch(rows=rows, tile_n=tile_n, num_warps=4, num_stages=3,
                               one_loop=one_loop, table_ahead=table_ahead and one_loop,
                               lazy_rescale=lazy)

        def prefill(q, k_cache, v_cache, tables, seq_lens, starts):
            # the table, the lengths and the offsets in the drawn dtype and layout, junk around
            junk = spare_block(tables, case["lengths"], case["block_size"], k_cache.shape[0])
            tables = with_layout(tables.to(index_dtype), index_layout, junk)
            seq_lens = with_layout(seq_lens.to(index_dtype), index_layout, 1)
            starts = with_layout(starts.to(index_dtype), index_layout, 1)
            return triton_paged_prefill(q, k_cache, v_cache, tables, seq_lens, starts,
                                        case["head_dim"] ** -0.5, launch=launch)
        check_prefill("triton", case, query_lens, q_gain=q_gain, prefill=prefill)
    prop()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("launch", sorted(PREFILL_LAUNCHES))
def test_triton_prefill_launches_match_reference_cuda(launch):
    if "triton" not in backends_for("cuda", "prefill"):
        pytest.skip("triton not available on CUDA")
    from pagebench.kernels.triton_prefill import PrefillLaunch, triton_paged_prefill

    @settings(max_examples=6, deadline=None)
    @given(drawn=prefill_cases("triton", large=True), q_gain=st.sampled_from([1.0, 40.0]),
           lazy=st.booleans())
    def prop(drawn, q_gain, lazy):
        case, query_lens = drawn
        case = dict(case, head_dim=min(case["head_dim"], 128),
                    dtype=torch.bfloat16 if case["dtype"] == torch.float32 else case["dtype"])
        forced = PrefillLaunch(**PREFILL_LAUNCHES[launch], lazy_rescale=lazy)
        check_prefill("triton", case, query_lens, device="cuda", q_gain=q_gain,
                      prefill=lambda *args: triton_paged_prefill(
                          *args, case["head_dim"] ** -0.5, launch=forced))
    prop()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", backends_for("cuda", "prefill"))
def test_paged_prefill_matches_float64_reference_cuda(backend):
    @settings(max_examples=10, deadline=None)
    @given(drawn=prefill_cases(backend, large=True))
    def prop(drawn):
        check_prefill(backend, *drawn, device="cuda")
    prop()
