"""Kernels: API behaviour, prefill, cache writes, head dims, registry, sweep and CLI (CPU)."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

import pytest
import torch

from pagebench.cli import main as cli_main
from pagebench.kernels import (available_backends, contiguous_decode, copy_blocks,
                               cumulative_offsets, get_backend, paged_decode, paged_prefill,
                               register_backend,
                               registered_backends, unregister_backend, write_kv)
from pagebench.measure.kernel_cases import TOLERANCE, make_paged_inputs, relative_error
from pagebench.kernels.reference import (gather_kv, reference_contiguous, reference_decode,
                                         reference_prefill, torch_paged_decode)
from property_tests.kernel_cases import backends_for, run_property

HAS_TRITON = "triton" in available_backends()


def test_triton_interpret_is_set_by_the_kernels_not_by_import_pagebench():
    if torch.cuda.is_available():
        pytest.skip("CUDA present: Triton compiles for the GPU")
    code = ("import os, pagebench, pagebench.kernels; print('TRITON_INTERPRET' in os.environ); "
            "import importlib.util as u; u.find_spec('triton') and "
            "__import__('pagebench.kernels.triton_decode'); "
            "print(os.environ.get('TRITON_INTERPRET'))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1]).stdout.split()
    assert out[0] == "False"  # importing the package changes no environment variable
    if HAS_TRITON:
        assert out[1] == "1"  # the kernel module switched Triton to its interpreter


def test_available_backends_report_capabilities():
    backends = available_backends()
    assert {"torch", "sdpa"} <= set(backends)
    torch_caps = backends["torch"]
    assert "cpu" in torch_caps["devices"]
    assert set(torch_caps["dtypes"]) == {"float32", "float16", "bfloat16"}
    assert torch_caps["block_sizes"] == "any >= 1"
    assert "decode" in torch_caps["operations"] and "prefill" in torch_caps["operations"]
    assert backends["sdpa"]["operations"] == ["contiguous"]


def test_auto_on_cpu_uses_the_torch_backend_and_matches_reference():
    inp = make_paged_inputs([1, 5, 16, 17], 8, 2, 32, 16, seed=1)
    out = paged_decode(*inp.args())
    assert relative_error(out, reference_decode(*inp.args())) < 1e-5
    assert torch.equal(out, paged_decode(*inp.args(), backend="torch"))


def test_scale_argument_is_used():
    inp = make_paged_inputs([9, 30], 4, 4, 16, 4, seed=2)
    out = paged_decode(*inp.args(), scale=0.3, backend="torch")
    ref = reference_decode(*inp.args(), scale=0.3)
    assert relative_error(out, ref) < 1e-5
    assert relative_error(paged_decode(*inp.args(), backend="torch"), ref) > 1e-3


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_triton_head_dims(head_dim):
    inp = make_paged_inputs([1, 15, 16, 33], 4, 2, head_dim, 16, torch.float16, seed=head_dim)
    out = paged_decode(*inp.args(), backend="triton")
    assert relative_error(out, reference_decode(*inp.args())) < TOLERANCE[torch.float16]


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("ratio", [1, 2, 4, 7, 8, 16])
def test_triton_gqa_ratios(ratio):
    inp = make_paged_inputs([3, 21], 2 * ratio, 2, 32, 5, torch.float32, seed=ratio)
    out = paged_decode(*inp.args(), backend="triton")
    assert relative_error(out, reference_decode(*inp.args())) < 1e-5


@pytest.mark.parametrize("backend", ["sdpa"] + (["triton"] if HAS_TRITON else []))
def test_contiguous_decode_matches_reference(backend):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 8, 32, generator=g)
    k, v = torch.randn(2, 3, 40, 2, 32, generator=g)
    lens = torch.tensor([1, 17, 40], dtype=torch.int32)
    out = contiguous_decode(q, k, v, lens, backend=backend)
    assert relative_error(out, reference_contiguous(q, k, v, lens)) < 1e-5
    full = torch.full((3,), 40, dtype=torch.int32)  # every sequence full: the unmasked path
    out = contiguous_decode(q, k, v, full, backend=backend)
    assert relative_error(out, reference_contiguous(q, k, v, full)) < 1e-5


def test_paged_equals_contiguous_on_the_same_tokens():
    inp = make_paged_inputs([7, 12], 4, 2, 16, 3, poison=False, seed=4)
    k = torch.stack([inp.k_cache[inp.block_tables[s, :4].long()].reshape(12, 2, 16)
                     for s in range(2)])
    v = torch.stack([inp.v_cache[inp.block_tables[s, :4].long()].reshape(12, 2, 16)
                     for s in range(2)])
    paged = paged_decode(*inp.args())
    contiguous = contiguous_decode(inp.q, k, v, inp.seq_lens, backend="sdpa")
    assert relative_error(paged, contiguous) < 1e-5


def test_torch_gather_on_cpu_is_head_major_and_reads_only_each_sequence_s_slots():
    """The torch backend's CPU gather: contiguous head-major K/V (SDPA's CPU kernel reads a
    transposed view several times slower), each sequence's tokens in order, and nothing read
    from a poisoned slot (NaN) or table entry (out of range)."""
    lens, block = [7, 12, 1], 3
    inp = make_paged_inputs(lens, 4, 2, 16, block, seed=4)
    k, v, valid = gather_kv(inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens)
    assert k.shape == v.shape == (3, 2, 12, 16) and k.is_contiguous() and v.is_contiguous()
    assert torch.isfinite(k).all() and torch.isfinite(v).all()
    assert valid.sum(dim=1).tolist() == lens
    for s, n in enumerate(lens):
        blocks = inp.block_tables[s, :-(-n // block)].long()
        for cache, out in ((inp.k_cache, k), (inp.v_cache, v)):
            assert torch.equal(out[s, :, :n], cache[blocks].flatten(0, 1)[:n].transpose(0, 1))


# ---- prefill --------------------------------------------------------------------------------

def _prefill_case(seed=5, block_size=4, lens=(9, 1, 6), qlens=(3, 1, 6), q_heads=6, kv_heads=2,
                  dtype=torch.float32):
    inp = make_paged_inputs(list(lens), q_heads, kv_heads, 16, block_size, dtype, seed=seed)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(qlens), q_heads, 16, generator=g).to(dtype)
    return q, inp, cumulative_offsets(qlens)


def test_prefill_matches_float64_reference():
    q, inp, starts = _prefill_case()
    out = paged_prefill(q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, starts)
    ref = reference_prefill(q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, starts)
    assert not torch.isnan(out).any()
    assert relative_error(out, ref) < 1e-5


def test_prefill_is_causal_a_chunk_equals_successive_decodes():
    q, inp, starts = _prefill_case(lens=(11,), qlens=(4,))
    out = paged_prefill(q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, starts)
    for i in range(4):  # query i sits at position 7 + i and sees 8 + i tokens
        lens = torch.tensor([8 + i], dtype=torch.int32)
        step = paged_decode(q[i:i + 1], inp.k_cache, inp.v_cache, inp.block_tables, lens)
        assert relative_error(out[i:i + 1], step) < 1e-5


@pytest.mark.parametrize("backend", backends_for("cpu", "prefill"))
def test_prefill_sequences_without_queries_leave_the_rest_unchanged(backend):
    """A sequence with no queries (equal offsets) between others: the others' rows are those
    of the call without it."""
    q, inp, starts = _prefill_case(lens=(9, 7, 6, 5), qlens=(3, 0, 6, 0))
    out = paged_prefill(q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, starts,
                        backend=backend)
    keep = [0, 2]
    alone = paged_prefill(q, inp.k_cache, inp.v_cache, inp.block_tables[keep],
                          inp.seq_lens[keep], cumulative_offsets([3, 6]), backend=backend)
    assert starts.tolist() == [0, 3, 3, 9, 9]
    assert relative_error(out, alone) < 1e-6


@functools.cache
def _chosen_prefill_launches() -> list:
    """Every launch ``prefill_launch`` picks over a grid of its inputs (head dim, group, block
    size and table width, q dtype, sequences, chunk length, device, SM count, Hopper or not, an
    fp8 cache or not), with them."""
    from pagebench.kernels.triton_prefill import prefill_launch

    chosen = []
    for device in (torch.device("cuda"), torch.device("cpu")):
        for head_dim in (64, 128, 256):
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                for group in range(1, 9):
                    for sequences in (1, 2, 8, 16, 64, 256):
                        for chunk in (1, 16, 128, 512, 1024, 2048, 8192):
                            for block_size, width in ((1, 300), (16, 8), (16, 160), (256, 64)):
                                if block_size * width < chunk:
                                    continue
                                for sms, hopper, fp8 in ((78, False, False), (132, True, False),
                                                         (132, True, True)):
                                    given = dict(group=group, kv_heads=max(1, 8 // group),
                                                 total=sequences * chunk, sequences=sequences,
                                                 max_keys=block_size * width, sm_count=sms,
                                                 hopper=hopper, fp8_cache=fp8)
                                    launch = prefill_launch(head_dim, dtype, device, **given)
                                    chosen.append((dict(given, head_dim=head_dim, dtype=dtype,
                                                        device=device), launch))
    return chosen


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_every_chosen_prefill_launch_is_valid_for_its_inputs():
    """Whatever the launch rules pick (docs/kernels.md, "Launch rules"), the launch is one the
    kernel can run: rows a power of two >= 16 and >= the group, no more than the mean chunk
    needs; key tiles powers of two; a register cap that fits the SM's register file; block ids
    ahead only in the one-walk loop with a stage to hold them; the lazy rescale only on Hopper
    with more programs than a wave; plain launches wherever the rules were not measured.
    Which launches compile without spills is tests/test_kernels_compile.py's (on a GPU)."""
    seen = 0
    for inputs, launch in _chosen_prefill_launches():
        seen += 1
        where = f"{inputs} -> {launch}"
        group, mean_chunk = inputs["group"], -(-inputs["total"] // inputs["sequences"])
        assert _power_of_two(launch.rows) and 16 <= launch.rows <= 128, where
        assert launch.rows >= group, where
        assert launch.rows <= max(16, 2 * mean_chunk * group), where  # no idle half
        assert _power_of_two(launch.tile_n) and 16 <= launch.tile_n <= 128, where
        assert launch.num_warps in (1, 2, 4, 8) and 1 <= launch.num_stages <= 4, where
        if launch.maxnreg is not None:  # 64K registers an SM, at most 255 a thread
            assert launch.maxnreg <= 255 and launch.maxnreg * 32 * launch.num_warps <= 65536, where
        assert not launch.table_ahead or (launch.one_loop and launch.num_stages >= 3), where
        assert not launch.lazy_rescale or (inputs["hopper"]
                                           and launch.rows == 16 * launch.num_warps), where
        tuned = (inputs["device"].type == "cuda" and inputs["head_dim"] <= 128
                 and inputs["dtype"] != torch.float32)
        if not tuned:  # one plain launch wherever the rules were not measured
            assert (launch.maxnreg, launch.one_loop, launch.table_ahead,
                    launch.lazy_rescale) == (None, False, False, False), where
            fp32_cuda = inputs["device"].type == "cuda" and inputs["dtype"] == torch.float32
            assert launch.tile_n == (16 if fp32_cuda else 32 if inputs["dtype"] == torch.float32
                                     or inputs["head_dim"] > 128 else 64), where
    assert seen > 10000


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_every_chosen_prefill_launch_matches_the_reference():
    """Each distinct launch the rules pick (with the largest group it was picked for), forced on a small
    ragged case (a chunk after a prefix, a whole prompt, one query, none), run here
    (interpreted): the float64 reference's result (fp8 caches: property_tests). The register
    cap is Triton's option, not the kernel's: the interpreter ignores it."""
    from pagebench.kernels.triton_prefill import triton_paged_prefill

    groups = {}  # each launch with the largest group it was picked for
    for inputs, launch in _chosen_prefill_launches():
        launch = dataclasses.replace(launch, maxnreg=None)
        groups[launch] = max(groups.get(launch, 0), inputs["group"])
    assert len(groups) >= 10
    for launch, group in sorted(groups.items(), key=repr):
        q, inp, starts = _prefill_case(lens=(9, 40, 6, 3), qlens=(3, 40, 1, 0),
                                       q_heads=group, kv_heads=1, dtype=torch.float16)
        args = (q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, starts)
        out = triton_paged_prefill(*args, 0.25, launch=launch)
        ref = reference_prefill(*args, 0.25)
        assert relative_error(out, ref) < TOLERANCE[torch.float16], (launch, group)


def test_a_prefill_launch_is_built_by_keyword_and_checked():
    from pagebench.errors import ConfigError
    from pagebench.kernels.triton_prefill import PrefillLaunch

    launch = PrefillLaunch(rows=64, tile_n=32, num_warps=4, num_stages=2)
    assert (launch.maxnreg, launch.one_loop, launch.table_ahead, launch.lazy_rescale) == (
        None, False, False, False)
    with pytest.raises(TypeError):
        PrefillLaunch(64, 32, 4, 2)  # the fields are keywords only
    for bad, field in ((dict(rows=48), "rows"), (dict(rows=8), "rows"),
                       (dict(tile_n=24), "tile_n"), (dict(num_warps=3), "num_warps"),
                       (dict(num_stages=0), "num_stages"), (dict(maxnreg=300), "maxnreg"),
                       (dict(table_ahead=True), "table_ahead")):
        with pytest.raises(ConfigError, match=f"^launch: {field}="):
            dataclasses.replace(launch, **bad)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_triton_prefill_64_bit_offsets_match(monkeypatch):
    """The 64-bit index path (taken for caches of 2^31 elements or more, too large to build
    here) forced on a small cache: the same result as the 32-bit path."""
    from pagebench.kernels import triton_prefill

    q, inp, starts = _prefill_case(lens=(9, 40, 6), qlens=(3, 40, 1))
    args = (q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, starts, 0.25)
    small = triton_prefill.PrefillLaunch(rows=16, tile_n=16, num_warps=4, num_stages=2)
    narrow = triton_prefill.triton_paged_prefill(*args, launch=small)
    monkeypatch.setattr(triton_prefill, "INT32_SPAN", 1)
    wide = triton_prefill.triton_paged_prefill(*args, launch=small)
    ref = reference_prefill(*args[:6], scale=0.25)
    assert not torch.isnan(wide).any()
    assert relative_error(wide, ref) < 1e-5 and torch.equal(wide, narrow)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("offsets", ["int32", "int64", "strided view", "offset view"])
def test_triton_prefill_vector_and_binary_search_find_the_same_sequences(monkeypatch, offsets):
    """A program finds its sequence by one vector load of the offsets where the sequences fit
    its width (forced to 4 here), else by a binary search: on ragged batches of 3, 4 and 5
    sequences (some without queries: first, in between, last), the output is the reference's
    and the binary search's, with the offsets in either integer type or a view."""
    from pagebench.kernels import triton_prefill

    small = triton_prefill.PrefillLaunch(rows=16, tile_n=16, num_warps=4, num_stages=2)
    searched = []
    for lens, qlens in [((9, 40, 6), (0, 40, 1)), ((9, 40, 6, 3), (3, 40, 0, 3)),
                        ((9, 40, 6, 3, 20), (3, 0, 6, 2, 0))]:
        q, inp, starts = _prefill_case(lens=lens, qlens=qlens)
        if offsets == "int64":
            starts = starts.long()
        elif offsets == "strided view":
            starts = torch.stack([starts, torch.full_like(starts, -7)], 1)[:, 0]
        elif offsets == "offset view":
            starts = torch.cat([torch.tensor([-7], dtype=starts.dtype), starts])[1:]
        args = (q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, starts, 0.25)
        monkeypatch.setattr(triton_prefill, "VECTOR_SEARCH_SEQS", 4)
        searched.append(triton_prefill.search_width(len(lens)))
        vector = triton_prefill.triton_paged_prefill(*args, launch=small)
        monkeypatch.setattr(triton_prefill, "VECTOR_SEARCH_SEQS", 0)
        binary = triton_prefill.triton_paged_prefill(*args, launch=small)
        assert not torch.isnan(vector).any()
        assert relative_error(vector, reference_prefill(*args[:6], scale=0.25)) < 1e-5
        assert torch.equal(vector, binary)
    assert searched == [4, 4, 0]


# ---- cache writes ---------------------------------------------------------------------------

def test_write_kv_then_decode_reads_what_was_written():
    num_blocks, bs, heads, dim = 6, 4, 2, 8
    k_cache = torch.full((num_blocks, bs, heads, dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    g = torch.Generator().manual_seed(6)
    k, v = torch.randn(2, 7, heads, dim, generator=g)
    table = torch.tensor([[4, 1]], dtype=torch.int32)
    slots = torch.tensor([4 * bs + i for i in range(4)] + [1 * bs + i for i in range(3)])
    write_kv(k_cache, v_cache, k, v, slots)
    assert torch.equal(k_cache[4], k[:4]) and torch.equal(v_cache[1, :3], v[4:])
    q = torch.randn(1, 4, dim, generator=g)
    out = paged_decode(q, k_cache, v_cache, table, torch.tensor([7], dtype=torch.int32))
    ref = reference_contiguous(q, k[None], v[None], torch.tensor([7]))
    assert relative_error(out, ref) < 1e-5


def test_write_kv_skips_padding_slots():
    k_cache = torch.zeros(2, 2, 1, 4)
    v_cache = torch.zeros_like(k_cache)
    k = torch.ones(3, 1, 4)
    write_kv(k_cache, v_cache, k, 2 * k, torch.tensor([3, -1, 0]))
    assert k_cache.view(4, 4)[[0, 3]].eq(1).all() and k_cache.view(4, 4)[[1, 2]].eq(0).all()


@pytest.mark.parametrize("source", ["own cache", "other cache"])
def test_write_kv_moves_tokens_within_the_cache(source):
    # audit finding 1: torch refused V's store from a view of v_cache after K was written; a v
    # viewing k_cache would read K's new tokens. Sources are read as they were before the call.
    k_cache = torch.randn(3, 2, 1, 4)
    v_cache = torch.randn_like(k_cache)
    before = k_cache.clone().view(6, 1, 4), v_cache.clone().view(6, 1, 4)
    flat = k_cache.view(6, 1, 4), v_cache.view(6, 1, 4)
    k, v = (flat[0][0:3], flat[1][0:3]) if source == "own cache" else (flat[1][0:3], flat[0][0:3])
    write_kv(k_cache, v_cache, k, v, torch.tensor([1, 2, 3]))  # overlaps tokens 0..2
    want_k, want_v = (before[0], before[1]) if source == "own cache" else (before[1], before[0])
    assert torch.equal(flat[0][1:4], want_k[0:3]) and torch.equal(flat[1][1:4], want_v[0:3])
    assert torch.equal(flat[0][[0, 4, 5]], before[0][[0, 4, 5]])


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn])
def test_write_kv_records_no_autograd_history(cache_dtype):
    # audit finding 3: K/V requiring grad gave a float cache a CopySlices history, so the next
    # write_kv refused it ("requires grad"); an fp8 cache got none
    k_cache = torch.zeros(2, 2, 1, 4, dtype=cache_dtype)
    v_cache = torch.zeros_like(k_cache)
    scales = {} if cache_dtype == torch.float32 else {"k_scale": 1.0, "v_scale": 1.0}
    w = torch.ones(4, 4, requires_grad=True)
    x = torch.ones(2, 1, 4)
    write_kv(k_cache, v_cache, x @ w, 2 * (x @ w), torch.tensor([0, 3]), **scales)
    assert not k_cache.requires_grad and k_cache.grad_fn is None and v_cache.grad_fn is None
    write_kv(k_cache, v_cache, x, x, torch.tensor([1, 2]), **scales)  # not refused
    flat = k_cache.view(4, 4).float(), v_cache.view(4, 4).float()
    assert flat[0][[0, 3]].eq(4).all() and flat[1][[0, 3]].eq(8).all()
    assert flat[0][[1, 2]].eq(1).all()


def test_copy_blocks_copies_k_and_v():
    k_cache = torch.arange(5 * 2 * 1 * 3, dtype=torch.float32).view(5, 2, 1, 3)
    v_cache = -k_cache.clone()
    before_k, before_v = k_cache.clone(), v_cache.clone()
    copy_blocks(k_cache, v_cache, [(0, 3), (2, 4)])
    assert torch.equal(k_cache[3], before_k[0]) and torch.equal(v_cache[4], before_v[2])
    assert torch.equal(k_cache[:3], before_k[:3])
    copy_blocks(k_cache, v_cache, [])  # nothing to do
    copy_blocks(k_cache, v_cache, torch.tensor([[1, 0]]))
    assert torch.equal(k_cache[0], before_k[1])


# ---- registry: a third-party backend is picked up everywhere --------------------------------

@pytest.fixture
def tiny_backend():
    calls = []

    def decode(q, k_cache, v_cache, block_tables, seq_lens, scale):
        calls.append(q.shape)
        return torch_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale)

    register_backend("tiny", decode=decode, devices=("cpu",), dtypes=(torch.float32,),
                     description="test backend")
    yield calls
    unregister_backend("tiny")


def test_registered_backend_is_available_and_selectable(tiny_backend):
    assert "tiny" in available_backends()
    assert available_backends()["tiny"]["dtypes"] == ["float32"]
    inp = make_paged_inputs([3, 8], 4, 2, 16, 4, seed=7)
    out = paged_decode(*inp.args(), backend="tiny")
    assert tiny_backend and relative_error(out, reference_decode(*inp.args())) < 1e-5
    with pytest.raises(ValueError, match="backend"):  # it declared float32 only
        inp16 = make_paged_inputs([3], 4, 2, 16, 4, torch.float16)
        paged_decode(*inp16.args(), backend="tiny")


def test_registered_backend_gets_the_property_suite_and_the_sweep(tiny_backend):
    from pagebench.measure.kernel_sweep import COLUMNS, run_sweep, variants

    assert "tiny" in backends_for("cpu")
    run_property("tiny", examples=5)
    assert any(v.label == "tiny-paged" for v in variants("cpu"))
    df = run_sweep("cpu", quick=True, shapes={"t": (4, 2, 16)}, points=[(2, 32)],
                   block_sizes=(8,), include=["tiny", "sdpa"], repeat=2)
    assert list(df.columns) == COLUMNS
    assert set(df.backend) == {"tiny-paged", "sdpa-contiguous"}
    assert (df.time_us > 0).all() and (df.gbps > 0).all()


def test_property_check_catches_a_kernel_that_reads_past_the_length():
    def overreads(q, k_cache, v_cache, block_tables, seq_lens, scale):
        capacity = block_tables.shape[1] * k_cache.shape[1]
        return torch_paged_decode(q, k_cache, v_cache, block_tables.clamp(0, k_cache.shape[0] - 1),
                                  torch.clamp(seq_lens + 1, max=capacity), scale)

    register_backend("overreads", decode=overreads, devices=("cpu",))
    try:
        with pytest.raises(AssertionError):
            run_property("overreads", examples=20)
    finally:
        unregister_backend("overreads")


def test_register_backend_rejects_bad_definitions():
    with pytest.raises(ValueError, match="name"):
        register_backend("torch", decode=torch_paged_decode)  # taken
    with pytest.raises(ValueError, match="name"):
        register_backend("auto", decode=torch_paged_decode)
    with pytest.raises(ValueError, match="decode"):
        register_backend("empty")
    with pytest.raises(ValueError, match="devices"):
        register_backend("tpu", decode=torch_paged_decode, devices=("tpu",))
    assert "empty" not in registered_backends()
    with pytest.raises(ValueError, match="backend"):
        get_backend("nope")


# ---- sweep and CLI --------------------------------------------------------------------------

def _carries_the_environment(df):
    """Every row names its device, versions, commit and timing harness (the sweeps once kept
    only the first six of these, so GPU rows timed by harness 2 read as harness 1)."""
    from pagebench.measure.timing import ENVIRONMENT_COLUMNS, HARNESS, environment

    assert set(ENVIRONMENT_COLUMNS) == set(environment("cpu"))
    assert df[list(ENVIRONMENT_COLUMNS)].notna().all().drop("triton_version").all()
    assert (df.timing_harness == HARNESS).all()


def test_quick_cpu_sweep_has_the_shared_columns():
    from pagebench.measure.kernel_sweep import COLUMNS, run_sweep
    df = run_sweep("cpu", quick=True, shapes={"t": (4, 2, 16)}, points=[(1, 64), (2, 32)],
                   block_sizes=(1, 16), repeat=2)
    assert list(df.columns) == COLUMNS
    assert set(df.backend) == {"torch-paged", "sdpa-contiguous"}
    assert len(df) == 2 * (1 + 2)  # per point: sdpa once, torch-paged per block size
    _carries_the_environment(df)
    row = df[(df.backend == "torch-paged") & (df.batch == 2)].iloc[0]
    assert row.kv_bytes == 2 * 2 * 32 * 2 * 16 * 4
    assert row.gbps == pytest.approx(row.kv_bytes / row.time_us / 1e3)


def test_cli_bench_writes_csv_and_json(tmp_path, capsys):
    out = tmp_path / "k.csv"
    rc = cli_main(["bench", "--shape", "t=4/2/16", "--batches", "1,2", "--contexts", "32",
                   "--block-sizes", "8", "--repeat", "2", "--out", str(out)])
    assert rc == 0
    import pandas as pd
    df = pd.read_csv(out)
    assert len(df) == 4 and set(df.model_shape) == {"t"}
    captured = capsys.readouterr()
    assert "wrote 4 rows" in captured.err
    table, _, legend = captured.out.partition("\n\ncolumns:\n")
    table = table.splitlines()
    assert table[0].split()[:4] == ["shape", "batch", "context", "(tokens)"]
    assert legend.splitlines()[0].split()[0] == "shape"  # a line per column: what it holds
    # columns are the runs of dashes under the header; block size is the fourth
    spans = [m.span() for m in re.finditer(r"-+", table[1])]
    assert table[0][slice(*spans[3])].strip() == "block (tokens)"
    # 8 on paged rows, "-" on contiguous ones (never 8.0 or NaN)
    assert {row[slice(*spans[3])].strip() for row in table[2:]} == {"8", "-"}
    assert "NaN" not in captured.out


def test_prefill_sweep_times_every_prefill_backend_and_sdpa(tmp_path, capsys):
    from pagebench.measure.prefill_sweep import PREFILL_COLUMNS, causal_flops, run_prefill_sweep
    # 2 sequences, 3 queries each after 5 cached tokens: each query sees 6, 7, 8 keys
    assert causal_flops(2, 3, 5, 4, 16) == 4.0 * 2 * 4 * 16 * (6 + 7 + 8)
    df = run_prefill_sweep("cpu", shapes={"t": (4, 2, 16)}, points=[(2, 3, 5), (1, 8, 0)],
                           block_size=4, repeat=2, include=["torch", "triton"])
    assert list(df.columns) == PREFILL_COLUMNS
    _carries_the_environment(df)
    expected = {"sdpa-contiguous", "torch-paged"} | ({"triton-paged"} if HAS_TRITON else set())
    assert set(df.backend) == expected and len(df) == 2 * len(expected)
    assert not df.cuda_graphs.any()  # CPU: no graph rows
    row = df[(df.backend == "torch-paged") & (df.cached == 5)].iloc[0]
    assert row.tflops == pytest.approx(causal_flops(2, 3, 5, 4, 16) / row.time_us / 1e6)
    assert row.block_size == 4 and pd.isna(df[df.backend == "sdpa-contiguous"].block_size).all()
    out = tmp_path / "p.csv"
    assert cli_main(["bench", "--prefill", "--shape", "t=4/2/16", "--repeat", "1",
                     "--out", str(out)]) == 0
    assert set(pd.read_csv(out).backend) == {"sdpa-contiguous", "torch-paged"}  # CPU default


def test_both_cpu_sweeps_time_on_one_thread(monkeypatch):
    """The decode sweep timed on one thread, the prefill sweep on all cores, and no row said
    which: their CPU numbers were not comparable."""
    from pagebench.measure import prefill_sweep
    from pagebench.measure import kernel_sweep
    from pagebench.measure.timing import measure

    threads = []

    def spy(fn, **kw):
        threads.append(torch.get_num_threads())
        return measure(fn, **kw)

    for module in (kernel_sweep, prefill_sweep):
        monkeypatch.setattr(module, "measure", spy)
    kernel_sweep.run_sweep("cpu", points=[(1, 16)], block_sizes=(4,), repeat=1,
                    shapes={"t": (4, 2, 16)}, include=["torch"])
    prefill_sweep.run_prefill_sweep("cpu", shapes={"t": (4, 2, 16)}, points=[(1, 3, 0)],
                                    block_size=4, repeat=1, include=["torch"])
    assert len(threads) >= 3 and set(threads) == {1}  # decode and prefill rows alike


@pytest.mark.parametrize("argv, message", [
    (["bench", "--prefill", "--batches", "1", "--contexts", "8"], "--prefill"),
    (["bench", "--prefill", "--block-sizes", "8,16"], "--prefill"),
    (["bench", "--backends", "nope"], "--backends"),
    (["bench", "--shape", "t=5/2/16"], "--shape"),
    (["bench", "--batches", "2"], "--batches"),
    (["bench", "--device", "cuda"] if not torch.cuda.is_available() else ["bench", "--repeat", "0"],
     "--device" if not torch.cuda.is_available() else "--repeat"),
])
def test_cli_bench_bad_arguments_exit_2(argv, message, capsys):
    assert cli_main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_split_choice_fills_whole_waves():
    """The wave model at the H200's measured points (528 slots: 4 programs x 132 SMs)."""
    from pagebench.kernels.triton_decode import choose_num_splits
    slots, tile = 528, 64
    # batch x 8 KV heads at 4096 tokens: the programs fill one wave, never spill into a second
    for batch, splits in ((8, 8), (16, 4), (32, 2), (64, 1), (256, 1)):
        assert choose_num_splits(batch * 8, 4096, tile, slots) == splits
    assert choose_num_splits(8, 65536, tile, slots) == 64  # batch 1: 512 programs of 1024
    assert choose_num_splits(8, 1024, tile, slots) == 16  # short: one tile per split
    assert choose_num_splits(8, 4096, tile, slots) == 32  # 64 would add a merge step
    assert choose_num_splits(2, 65536, tile, 1056) == 128  # not 512: merging them costs more
    assert choose_num_splits(8, 40, tile, slots) == 1  # one tile: nothing to split
    # more slots (a smaller kernel) take more splits at the same batch
    assert choose_num_splits(16 * 8, 4096, tile, 1056) == 8


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("regs, shared, warps, slots", [
    (105, 38912, 4, 528),  # bf16 32/8 x 128 on an H200: registers allow 4 programs per SM
    (62, 20480, 4, 1056),  # bf16 14/2 x 64: 8 per SM
    (168, 73728, 4, 396),  # tile 128: shared memory and registers both allow 3
    (32, 1024, 1, 4224),  # tiny: the 32-blocks-per-SM limit
])
def test_slots_follow_the_cuda_occupancy_rule(monkeypatch, regs, shared, warps, slots):
    from types import SimpleNamespace

    from pagebench.kernels import triton_decode as td
    h200 = SimpleNamespace(regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
                           max_threads_per_multi_processor=2048, multi_processor_count=132)
    monkeypatch.setattr(td.torch.cuda, "get_device_properties", lambda index: h200)
    kernel = SimpleNamespace(run=None, n_regs=regs,
                             metadata=SimpleNamespace(num_warps=warps, shared=shared))
    assert td._slots(kernel, 0) == slots


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("splits", [2, 33, 70])
def test_triton_combines_many_splits(splits):
    """2 splits: the split kernel merges them itself; 33 and 70 (past ``FUSED_MERGE_SPLITS``
    and ``COMBINE_CHUNK``): the combine kernel merges them in chunks; empty splits weigh 0."""
    from pagebench.kernels.triton_decode import DecodeLaunch, triton_paged_decode
    inp = make_paged_inputs([1, 40, 300, 1100], 8, 2, 32, 16, seed=splits)
    out = triton_paged_decode(*inp.args(), 32 ** -0.5,
                              launch=DecodeLaunch(num_splits=splits, tile_n=16))
    assert relative_error(out, reference_decode(*inp.args())) < TOLERANCE[torch.float32]


class _MockKernel:
    """A Triton JIT function ``(A, B, n, m, C: constexpr)`` that records its launches in
    ``calls``: through Triton ("jit", grid, args, kwargs), then its compiled launcher's
    ("direct", args)."""
    arg_names = ["A", "B", "n", "m", "C"]

    def __init__(self, calls: list):
        self.calls = calls

    def __getitem__(self, grid):
        from types import SimpleNamespace

        def jit(*args, **kwargs):
            self.calls.append(("jit", grid, args, kwargs))
            return SimpleNamespace(run=lambda *a: self.calls.append(("direct", a)),
                                   function="fn", packed_metadata="meta")
        return jit


def _direct_launches(monkeypatch):
    """triton_runtime with direct launches on (as on a GPU), its stream a placeholder."""
    from pagebench.kernels import triton_runtime as td
    monkeypatch.setattr(td, "DIRECT_LAUNCH", True)
    monkeypatch.setattr(td, "_current_stream", lambda index: "stream")
    return td


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_launcher_reuses_the_compiled_kernel_per_alignment(monkeypatch):
    """First launch per tensor-alignment pattern goes through Triton (which compiles); later ones
    call the compiled kernel's launcher with the same arguments in the kernel's order; a
    profiler hook sends every launch through Triton again."""
    from types import SimpleNamespace

    td = _direct_launches(monkeypatch)
    calls = []
    launch = td.Launcher(_MockKernel(calls), (4, 2), (7, 9), {"C": 3}, {"num_warps": 4}, num_tensors=2)
    a, b = torch.zeros(8), torch.zeros(8)
    launch(a, b)
    launch(a, b)
    assert calls[0] == ("jit", (4, 2, 1), (a, b, 7, 9), {"C": 3, "num_warps": 4})
    assert calls[1] == ("direct", (4, 2, 1, "stream", "fn", "meta", None, None, None,
                                   a, b, 7, 9, 3))
    launch(a[1:], b)  # 4 bytes off: Triton may specialise differently, so it decides
    assert calls[2][0] == "jit" and len(launch.compiled) == 2
    hooks = SimpleNamespace(launch_enter_hook=SimpleNamespace(calls=[print]),
                            launch_exit_hook=None)
    monkeypatch.setattr(td.triton, "knobs", SimpleNamespace(runtime=hooks), raising=False)
    launch(a, b)
    assert calls[3][0] == "jit"
    with pytest.raises(AssertionError, match="tensors, scalars, constexprs"):
        td.Launcher(_MockKernel(calls), (1,), (7,), {"C": 3}, {}, num_tensors=2)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_launch_keeps_a_launcher_per_arguments_and_takes_each_calls_grid(monkeypatch):
    """``launch`` (the prefill's two kernels): calls with the same dtypes, scalars, constexprs
    and options share a launcher, so the second skips Triton even with another grid; another
    scalar or tensor dtype is another launcher, whose first launch goes through Triton."""
    td = _direct_launches(monkeypatch)
    calls = []
    monkeypatch.setattr(td, "_LAUNCHERS", {})
    kernel, a, b = _MockKernel(calls), torch.zeros(8), torch.zeros(8)
    td.launch(kernel, (4,), (a, b), (7, 9), {"C": 3}, {"num_warps": 4})
    td.launch(kernel, (6,), (a, b), (7, 9), {"C": 3}, {"num_warps": 4})
    assert calls[0] == ("jit", (4, 1, 1), (a, b, 7, 9), {"C": 3, "num_warps": 4})
    assert calls[1] == ("direct", (6, 1, 1, "stream", "fn", "meta", None, None, None,
                                   a, b, 7, 9, 3))
    td.launch(kernel, (6,), (a, b), (8, 9), {"C": 3}, {"num_warps": 4})
    td.launch(kernel, (6,), (a, b.int()), (7, 9), {"C": 3}, {"num_warps": 4})
    assert [c[0] for c in calls[2:]] == ["jit", "jit"] and calls[2][2][2] == 8
    assert len(td._LAUNCHERS) == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON,
                    reason="needs a CUDA device and Triton")
def test_triton_prefill_direct_launches_match_reference_cuda(monkeypatch):
    """Two chunks of the same launch (sequence count, table width, dtypes) but other lengths,
    so other grids, called in turn: only the first call goes through Triton's launch, the
    others launch the compiled kernel directly with their own grid, each matching float64."""
    from triton.runtime.jit import JITFunction

    from pagebench.kernels import triton_runtime
    from pagebench.measure.kernel_cases import TOLERANCE, make_paged_inputs, relative_error
    from pagebench.kernels.reference import reference_prefill
    from pagebench.kernels.triton_prefill import triton_paged_prefill
    monkeypatch.setattr(triton_runtime, "_LAUNCHERS", {})
    through_triton = []
    run = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **kw: (
        through_triton.append(self), run(self, *a, **kw))[1])
    cases = []
    for seed, (lens, query_lens) in enumerate([([300, 120, 513, 64], [100, 37, 200, 64]),
                                               ([513, 300, 200, 100], [90, 90, 90, 90])]):
        inp = make_paged_inputs(lens, 8, 2, 64, 16, torch.bfloat16, "cuda", seed=seed)
        q = torch.randn(sum(query_lens), 8, 64, device="cuda", dtype=torch.bfloat16)
        cases.append(dataclasses.replace(inp, q=q, query_start_loc=cumulative_offsets(
            query_lens, "cuda")))
    for case in cases * 2:
        out = triton_paged_prefill(*case.args(), 64 ** -0.5)
        err = relative_error(out, reference_prefill(*case.args(), 64 ** -0.5))
        assert err < TOLERANCE[torch.bfloat16], err
    assert len(through_triton) == 1 and len(triton_runtime._LAUNCHERS) == 1


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_launch_defaults_widen_tiles_only_for_long_contexts_over_few_pairs():
    from pagebench.kernels.triton_decode import default_launch
    bf16 = torch.bfloat16
    assert default_launch(64, bf16, 2, 65536) == (128, 8)  # Qwen shape, batch 1, 64k
    assert default_launch(64, bf16, 4, 16384) == (128, 8)  # Qwen shape, batch 2, 16k
    assert default_launch(128, bf16, 8, 65536) == (64, 4)  # Llama shape, batch 1: 8 pairs
    assert default_launch(64, bf16, 2, 4096) == (64, 4)  # short
    assert default_launch(128, bf16, 64, 65536) == (64, 4)  # many pairs fill the GPU anyway
    assert default_launch(256, bf16, 2, 65536) == (32, 4)  # large heads keep small tiles
    assert default_launch(128, torch.float32, 2, 65536) == (32, 4)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_fp8_caches_in_blocks_take_half_tiles_on_two_warps():
    from pagebench.kernels.triton_decode import FP8_LAUNCH, default_launch
    bf16 = torch.bfloat16
    assert FP8_LAUNCH == (32, 2)
    assert default_launch(128, bf16, 256, 4096, fp8=True, block_size=16) == FP8_LAUNCH
    assert default_launch(128, bf16, 8, 65536, fp8=True, block_size=128) == FP8_LAUNCH
    assert default_launch(128, bf16, 256, 4096, fp8=True, block_size=1) == (64, 4)
    assert default_launch(128, bf16, 256, 4096, fp8=False, block_size=16) == (64, 4)
    assert default_launch(64, bf16, 2, 65536, fp8=True, block_size=16) == (128, 8)
    assert default_launch(128, torch.float32, 256, 4096, fp8=True, block_size=16) == (32, 4)
    assert default_launch(256, bf16, 256, 4096, fp8=True, block_size=16) == (32, 4)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_fp8_decode_pairs_kv_heads_where_both_groups_fit_the_padded_rows():
    from pagebench.measure.kernel_cases import quantized_inputs
    from pagebench.kernels.triton_decode import (FP8_LAUNCH, DecodeLaunch, decode_plan,
                                                 kv_heads_pair, triton_paged_decode)

    assert kv_heads_pair(4, 8, fp8=True) and kv_heads_pair(7, 2, fp8=True)  # Llama, Qwen
    assert not kv_heads_pair(4, 8, fp8=False)
    assert not kv_heads_pair(4, 1, fp8=True) and not kv_heads_pair(4, 3, fp8=True)
    assert not kv_heads_pair(16, 4, fp8=True)  # one group fills the 16 rows

    def launch(inp, **options):
        kw = decode_plan(*inp.args(), 0.25, DecodeLaunch(**options)).split.kwargs
        return kw["KV_PER_PROGRAM"], (kw["TILE_N"], kw["num_warps"]), kw["GROUP_PAD"]

    for block in (1, 16):
        inp = make_paged_inputs([5, 70], 16, 4, 16, block, torch.bfloat16, poison=False)
        fp8 = quantized_inputs(inp, torch.float8_e4m3fn, seed=1)
        assert launch(fp8) == (2, FP8_LAUNCH, 16)  # block 1 too: its (64, 4) was slower
        assert launch(inp) == (1, (64, 4), 16)  # bf16 keeps one KV head per program
        # one head per program on request: the launch it had before pairs existed
        assert launch(fp8, kv_per_program=1) == (1, FP8_LAUNCH if block > 1 else (64, 4), 16)
        assert launch(fp8, kv_per_program=4, tile_n=16) == (4, (16, 4), 16)
        # two K/V tiles in flight for pairs at every block size (block 1: every fp8 launch)
        stages = {kv: decode_plan(*fp8.args(), 0.25, DecodeLaunch(kv_per_program=kv)).split.kwargs[
            "num_stages"] for kv in (None, 1)}
        assert stages == {None: 5, 1: 5 if block == 1 else 2}
        assert decode_plan(*inp.args(), 0.25).split.kwargs["num_stages"] == (3 if block == 1
                                                                             else 2)
        ref = reference_decode(*fp8.args(), 0.25, **fp8.scales())
        for kv_per_program in (None, 1, 2, 4):
            for splits in (None, 1):
                out = triton_paged_decode(*fp8.args(), 0.25, **fp8.scales(), launch=DecodeLaunch(
                    num_splits=splits, kv_per_program=kv_per_program))
                assert relative_error(out, ref) < TOLERANCE[torch.bfloat16]
    odd = quantized_inputs(make_paged_inputs([5], 12, 3, 16, 16, torch.bfloat16),
                           torch.float8_e5m2)
    assert launch(odd)[0] == 1
    with pytest.raises(ValueError, match="kv_per_program: must divide the 3 KV heads"):
        decode_plan(*odd.args(), 0.25, DecodeLaunch(kv_per_program=2))


def test_triton_takes_cpu_tensors_only_where_it_interprets():
    """On a GPU machine Triton compiles: CPU tensors would reach its driver, so the backend does
    not list "cpu" and a CPU call is a ValueError, not a driver error (TRITON_INTERPRET=0 stands
    in for such a machine here; without CUDA the error says Triton is not available)."""
    code = (
        "import torch, pagebench.kernels as k\n"
        "from pagebench.measure.kernel_cases import make_paged_inputs\n"
        "print(k.registered_backends()['triton'].devices)\n"
        "case = make_paged_inputs([5, 9], 4, 2, 16, block_size=4, dtype=torch.float32)\n"
        "try:\n"
        "    k.paged_decode(*case.args(), backend='triton')\n"
        "except ValueError as e:\n"
        "    print('ValueError', e)\n")
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert out.returncode == 0, out.stderr
    devices, error = out.stdout.splitlines()[:2]
    assert devices == "('cuda',)"
    assert error.startswith("ValueError") and "triton" in error
