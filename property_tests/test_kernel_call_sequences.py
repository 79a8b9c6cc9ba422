"""Kernels called as users call them: one process, calls in random order, each with its own
index dtypes, memory layouts, float dtype and cache format (q's dtype or fp8 with per-head
scales), over shapes that repeat.

A user passes an int64 table after an int32 one of the same shape, a strided slice of a length
vector, a transposed table, a view into a larger buffer; the Triton backend caches a launch plan
per call signature, so what a call gets can depend on the calls before it. Each example here is
a sequence of decode and prefill calls over one or two fixed geometries (so shapes repeat while
dtypes and layouts change); every call runs on every backend under test (on a GPU, cuda-fp8
too for the fp8 decode calls its capabilities accept) and must equal the float64 reference,
and the backends one another. A layout validation refuses must raise a
``ValueError`` naming the argument. On CUDA the same sequences run at larger sizes, where the
plan cache launches compiled kernels directly.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, note, settings
from kernel_cases import formats_read_on

from pagebench.kernels import (FP8_DTYPES, available_backends, paged_decode, paged_prefill,
                               registered_backends)
from pagebench.measure.kernel_cases import (LAYOUTS, TOLERANCE, make_paged_inputs, quantized_inputs,
                                        relative_error, spare_block, with_layout)
from pagebench.kernels.reference import cumulative_offsets, reference_decode, reference_prefill

BACKENDS = ["torch"] + (["triton"] if "triton" in available_backends() else [])
# backends that take only some calls (cuda-fp8: decode of fp8 caches, on NVIDIA 8.9+ GPUs):
# they join the calls their capabilities accept
PARTIAL = [name for name in ("cuda-fp8",) if name in available_backends()]
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int32, torch.int64]
CACHE_LAYOUTS_ACCEPTED = ("contiguous", "offset", "padded")  # head_dim at unit stride
CI_EXAMPLES = 12  # in the "ci" profile (40 examples); scaled with the profile


def cache_formats(device: str) -> list:
    """None (the cache in q's dtype) and the fp8 formats every backend under test reads on
    ``device`` (Triton: e4m3 from compute capability 8.9)."""
    return [None] + [d for d in FP8_DTYPES
                     if all(d in formats_read_on(device, backend) for backend in BACKENDS)]


def examples(cuda: bool) -> int:
    return max(1, round((6 if cuda else CI_EXAMPLES) * settings.default.max_examples / 40))


@st.composite
def geometries(draw, large: bool):
    block_size = draw(st.sampled_from([1, 3, 4, 16] if not large else [1, 16, 32, 128]))
    kv_heads = draw(st.sampled_from([1, 2]) if not large else st.sampled_from([1, 2, 8]))
    ratio = draw(st.sampled_from([1, 2, 4]) if not large else st.sampled_from([1, 4, 8]))
    head_dim = draw(st.sampled_from([16, 32]) if not large else st.sampled_from([64, 128]))
    num_seqs = draw(st.integers(1, 3) if not large else st.integers(1, 8))
    longest = 2 * block_size + 5 if not large else 3000
    lengths = draw(st.lists(st.integers(1, longest), min_size=num_seqs, max_size=num_seqs))
    return dict(lengths=lengths, q_heads=kv_heads * ratio, kv_heads=kv_heads,
                head_dim=head_dim, block_size=block_size, seed=draw(st.integers(0, 2**16)))


@st.composite
def calls(draw, num_geometries: int, formats: list):
    """One call's choices: everything a user may vary for a fixed geometry."""
    return dict(
        geometry=draw(st.integers(0, num_geometries - 1)),
        op=draw(st.sampled_from(["decode", "prefill"])),
        dtype=draw(st.sampled_from(FLOAT_DTYPES)),
        cache=draw(st.sampled_from(formats)),
        table_dtype=draw(st.sampled_from(INDEX_DTYPES)),
        lens_dtype=draw(st.sampled_from(INDEX_DTYPES)),
        starts_dtype=draw(st.sampled_from(INDEX_DTYPES)),
        table_layout=draw(st.sampled_from(LAYOUTS)),
        lens_layout=draw(st.sampled_from(LAYOUTS)),
        starts_layout=draw(st.sampled_from(LAYOUTS)),
        q_layout=draw(st.sampled_from(LAYOUTS)),
        cache_layout=draw(st.sampled_from(LAYOUTS)),
        query_fraction=draw(st.sampled_from([0.0, 0.5, 1.0])),  # prefill: 1 token .. whole
        no_queries=draw(st.sets(st.integers(0, 7), max_size=2)),  # prefill: these have none
    )


@st.composite
def call_sequences(draw, formats: list, large: bool = False):
    geometry_list = draw(st.lists(geometries(large), min_size=1, max_size=2))
    sequence = draw(st.lists(calls(len(geometry_list), formats), min_size=2, max_size=5))
    return geometry_list, sequence


def build_call(geometry: dict, call: dict, device: str, large: bool):
    """The call's arguments in its dtypes and layouts, and an fp8 cache's scales (keywords);
    the memory around each view holds values that give a wrong (NaN) result if read: a
    poisoned block, a length of 1."""
    inp = make_paged_inputs(geometry["lengths"], geometry["q_heads"], geometry["kv_heads"],
                            geometry["head_dim"], geometry["block_size"], call["dtype"], device,
                            seed=geometry["seed"])
    if call["cache"] is not None:
        inp = quantized_inputs(inp, call["cache"], seed=geometry["seed"])
    num_blocks = inp.k_cache.shape[0]
    junk_block = spare_block(inp.block_tables.cpu(), geometry["lengths"],
                             geometry["block_size"], num_blocks)
    nan = float("nan")
    tables = with_layout(inp.block_tables.to(call["table_dtype"]), call["table_layout"],
                         junk_block)
    seq_lens = with_layout(inp.seq_lens.to(call["lens_dtype"]), call["lens_layout"], 1)
    k_cache = with_layout(inp.k_cache, call["cache_layout"], nan)
    v_cache = with_layout(inp.v_cache, call["cache_layout"], nan)
    if call["op"] == "decode":
        q = with_layout(inp.q, call["q_layout"], nan)
        return (q, k_cache, v_cache, tables, seq_lens), inp.scales()
    # large: at most 128 queries (the float64 reference holds heads x queries x keys scores)
    qlens = [0 if s in call["no_queries"] else
             min(max(1, round(n * call["query_fraction"])), 128 if large else n)
             for s, n in enumerate(geometry["lengths"])]
    gen = torch.Generator().manual_seed(geometry["seed"] + 1)
    q = torch.randn(sum(qlens), geometry["q_heads"], geometry["head_dim"], generator=gen)
    q = with_layout(q.to(device, call["dtype"]), call["q_layout"], nan)
    starts = cumulative_offsets(qlens, device, call["starts_dtype"])
    starts = with_layout(starts, call["starts_layout"], 1)
    return (q, k_cache, v_cache, tables, seq_lens, starts), inp.scales()


def call_backends(geometry: dict, call: dict, device: str) -> list[str]:
    """``BACKENDS``, and those of ``PARTIAL`` whose capabilities accept the call."""
    return BACKENDS + [name for name in PARTIAL if registered_backends()[name].supports(
        call["op"], device, call["dtype"], geometry["block_size"], geometry["head_dim"],
        call["cache"])]


def run_sequence(geometry_list, sequence, device: str, large: bool = False) -> None:
    for i, call in enumerate(sequence):
        geometry = geometry_list[call["geometry"]]
        args, scales = build_call(geometry, call, device, large)
        backends = call_backends(geometry, call, device)
        kernel, reference = ((paged_decode, reference_decode) if call["op"] == "decode"
                             else (paged_prefill, reference_prefill))
        note(f"call {i}: {call}")
        if call["cache_layout"] not in CACHE_LAYOUTS_ACCEPTED:  # head_dim not at unit stride
            for backend in backends:
                with pytest.raises(ValueError, match=r"^k_cache:"):
                    kernel(*args, backend=backend, **scales)
            continue
        ref = reference(*args, **scales)
        outs = {}
        for backend in backends:
            out = outs[backend] = kernel(*args, backend=backend, **scales)
            assert out.shape == args[0].shape and out.dtype == args[0].dtype, backend
            assert not torch.isnan(out).any(), f"{backend}, call {i}: NaN (a poisoned read)"
            err = relative_error(out, ref)
            assert err < TOLERANCE[call["dtype"]], f"{backend}, call {i}: error {err:.2e}"
        if len(outs) > 1:
            err = relative_error(outs["triton"], outs["torch"])
            assert err < 2 * TOLERANCE[call["dtype"]], f"triton vs torch, call {i}: {err:.2e}"


@pytest.mark.slow
def test_call_sequences_match_reference_cpu():
    @settings(max_examples=examples(cuda=False), deadline=None)
    @given(drawn=call_sequences(cache_formats("cpu")))
    def prop(drawn):
        run_sequence(*drawn, device="cpu")
    prop()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_call_sequences_match_reference_cuda():
    @settings(max_examples=examples(cuda=True), deadline=None)
    @given(drawn=call_sequences(cache_formats("cuda"), large=True))
    def prop(drawn):
        run_sequence(*drawn, device="cuda", large=True)
    prop()
