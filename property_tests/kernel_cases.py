"""The kernel property suites' shared cases and checks: a plain helper module (not a test
module), imported by test_kernel_equivalence, test_kernel_fp8, test_kernel_call_sequences,
tests/test_kernels.py and tests/test_kernels_compile.py.

``decode_cases`` / ``prefill_cases`` draw inputs (shape, block size, lengths at block
boundaries, dtype, a seed for scattered tables and poisoned slots); ``check_backend`` /
``check_prefill`` compare a backend with the float64 reference on one; ``run_property`` runs
the decode property on one backend; ``PREFILL_LAUNCHES`` are the launches ``prefill_launch``
picks on a GPU, forced by the GPU suites and compiled by the compile test.
"""

from __future__ import annotations

import functools

import hypothesis.strategies as st
import torch
from hypothesis import given, note, settings

from pagebench.kernels import FP8_DTYPES, paged_decode, paged_prefill, registered_backends
from pagebench.kernels.reference import cumulative_offsets, reference_decode, reference_prefill
from pagebench.measure.kernel_cases import TOLERANCE, make_paged_inputs, relative_error
from pagebench.kernels.registry import backend_available


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# examples per backend in the "ci" profile (40 examples); scaled up with the profile
CI_EXAMPLES = {"torch": 60, "triton": 30, "flex": 6}
DEFAULT_CI_EXAMPLES = 12


def backends_for(device: str, op: str = "decode") -> list[str]:
    """Registered, available backends with a paged ``op`` kernel that runs on ``device`` and
    reads a cache of q's dtype (fp8-only kernels: ``test_kernel_fp8``)."""
    return sorted(name for name, b in registered_backends().items()
                  if getattr(b, op) is not None and device in b.devices and backend_available(b)
                  and b.reads_own_dtype)


def examples_for(backend: str) -> int:
    budget = CI_EXAMPLES.get(backend, DEFAULT_CI_EXAMPLES)
    return max(1, round(budget * settings.default.max_examples / 40))


@st.composite
def decode_cases(draw, backend, large=False):
    b = registered_backends()[backend]
    block_size = draw(st.sampled_from([1, 2, 3, 5, 8, 16, 17, 32] if not large
                                      else [1, 7, 16, 32, 128]))
    if not b.supports_block_size(block_size):
        block_size = draw(st.sampled_from([16, 32]))
    kv_heads = draw(st.sampled_from([1, 2]) if not large else st.sampled_from([1, 2, 8]))
    ratio = draw(st.sampled_from([r for r in (1, 2, 4, 7, 8, 16) if b.supports_group(r)]))
    head_dims = [16, 32, 64] if not large else [64, 80, 96, 128, 256]
    head_dim = draw(st.sampled_from([d for d in head_dims if b.supports_head_dim(d)]))
    num_seqs = draw(st.integers(1, 3 if not large else 8))
    longest = 3 * block_size + 5 if not large else 6000
    lengths = draw(st.lists(
        st.one_of(st.sampled_from([1, max(1, block_size - 1), block_size, block_size + 1]),
                  st.integers(1, longest)), min_size=num_seqs, max_size=num_seqs))
    dtype = draw(st.sampled_from([d for d in DTYPES if d in b.dtypes]))
    seed = draw(st.integers(0, 2**16))
    return dict(lengths=lengths, q_heads=kv_heads * ratio, kv_heads=kv_heads, head_dim=head_dim,
                block_size=block_size, dtype=dtype, seed=seed)


def check_backend(backend: str, case: dict, device: str = "cpu", decode=None) -> None:
    """``decode`` (q, k_cache, v_cache, block_tables, seq_lens) replaces the public entry point,
    e.g. to force a kernel's launch options."""
    b = registered_backends()[backend]
    poison = float("nan") if b.nan_safe else 300.0
    inp = make_paged_inputs(case["lengths"], case["q_heads"], case["kv_heads"], case["head_dim"],
                            case["block_size"], case["dtype"], device, seed=case["seed"],
                            poison_value=poison)
    note(f"tables={inp.block_tables.tolist()}")
    ref = reference_decode(*inp.args())
    out = (decode or functools.partial(paged_decode, backend=backend))(*inp.args())
    assert out.shape == inp.q.shape and out.dtype == inp.q.dtype
    assert not torch.isnan(out).any(), "NaN in the output: a poisoned slot or entry was read"
    err = relative_error(out, ref)
    assert err < TOLERANCE[case["dtype"]], f"relative error {err:.2e}"


def run_property(backend: str, device: str = "cpu", large: bool = False, examples=None):
    """The decode property on ``backend``; a failure raises its first falsifying example's
    error (one bug reported, not a group of every distinct one Hypothesis finds)."""
    @settings(max_examples=examples or examples_for(backend), deadline=None,
              report_multiple_bugs=False)
    @given(case=decode_cases(backend, large))
    def prop(case):
        check_backend(backend, case, device)
    prop()


def check_prefill(backend: str, case: dict, query_lens: list[int], device: str = "cpu",
                  prefill=None, q_gain: float = 1.0) -> None:
    """Queries for the last ``query_lens[s]`` positions of each sequence (their offsets
    ``query_start_loc``), against float64; ``q_gain`` scales the queries (large: scores whose
    running max jumps between key tiles)."""
    b = registered_backends()[backend]
    inp = make_paged_inputs(case["lengths"], case["q_heads"], case["kv_heads"], case["head_dim"],
                            case["block_size"], case["dtype"], device, seed=case["seed"],
                            poison_value=float("nan") if b.nan_safe else 300.0)
    gen = torch.Generator().manual_seed(case["seed"])
    q = torch.randn(sum(query_lens), case["q_heads"], case["head_dim"], generator=gen) * q_gain
    q = q.to(device, case["dtype"])
    starts = cumulative_offsets(query_lens, device)
    args = (q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, starts)
    note(f"query_lens={query_lens} tables={inp.block_tables.tolist()}")
    out = (prefill or functools.partial(paged_prefill, backend=backend))(*args)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert not torch.isnan(out).any(), "NaN in the output: a poisoned slot or entry was read"
    err = relative_error(out, reference_prefill(*args))
    tolerance = TOLERANCE[case["dtype"]] + logit_slack(q, inp.k_cache, case["head_dim"] ** -0.5)
    assert err < tolerance, f"relative error {err:.2e} (tolerance {tolerance:.2e})"


def logit_slack(q: torch.Tensor, k_cache: torch.Tensor, scale: float) -> float:
    """The output error that rounding the scores in fp32 alone may cause: a score ``s`` is
    accumulated and exponentiated in fp32, off by about ``eps * |s|``, and the output's relative
    error follows the scores' absolute one. At large query gains this exceeds the fp32
    tolerance for any fp32 kernel (at gain 200 the torch backend 8.7e-6 and Triton 1.6e-5
    against 1e-5). ``|s|`` is taken as the largest over every query and cached key of its KV
    head (an upper bound of the visible ones), in float64; twice ``eps * |s|`` is allowed."""
    if q.shape[0] == 0:  # no queries: no scores
        return 0.0
    keys = k_cache.double().nan_to_num(0.0).flatten(0, 1)  # [slots, kv_heads, dim]
    group = q.shape[1] // keys.shape[1]
    queries = q.double().unflatten(1, (keys.shape[1], group))  # [tokens, kv_heads, group, dim]
    # a few queries at a time: every query against every slot of a large GPU case (1,024
    # queries, 48,000 slots, 128 heads) would be 50 GB of float64 scores at once
    largest = max(float(torch.einsum("tkgd,skd->tkgs", chunk, keys).abs().max())
                  for chunk in queries.split(16))
    return 2 * torch.finfo(torch.float32).eps * scale * largest


@st.composite
def prefill_cases(draw, backend, large=False):
    """A decode case plus, per sequence, how many of its last tokens are queries (the whole
    prompt, one token, a chunk after a cached prefix, or none)."""
    case = draw(decode_cases(backend, large))
    cap = 128 if large else None  # the float64 reference holds heads x queries x keys scores
    query_lens = [min(draw(st.one_of(st.just(n), st.just(1), st.integers(0, n))), cap or n)
                  for n in case["lengths"]]
    return case, query_lens


# Every launch ``prefill_launch`` picks on a GPU (docs/kernels.md): the float64 reference holds
# at most 128 queries a sequence, so the default launch of these cases never takes the regime
# of long chunks; each launch is forced here with all its options (warps, register cap), on
# the inputs the launch table serves (bf16/fp16, head dims <= 128): forced on fp32 or head
# dim 256 cases as well, the H200 run failed and stalled (docs/kernels.md).
PREFILL_LAUNCHES = {"long chunks": dict(rows=128, tile_n=32, num_warps=8, num_stages=2,
                                        one_loop=False, table_ahead=False, maxnreg=128),
                    "short tables": dict(rows=64, tile_n=32, num_warps=4, num_stages=3,
                                         one_loop=True, table_ahead=True, maxnreg=168),
                    "very short tables": dict(rows=64, tile_n=32, num_warps=4, num_stages=2,
                                              one_loop=True, table_ahead=False, maxnreg=128),
                    "ids ahead": dict(rows=64, tile_n=64, num_warps=4, num_stages=3,
                                      one_loop=True, table_ahead=True, maxnreg=255)}


def formats_read_on(device: str, backend: str) -> list[torch.dtype]:
    """The fp8 formats ``backend`` reads on ``device`` (Triton: e4m3 from compute capability
    8.9)."""
    return [d for d in FP8_DTYPES
            if registered_backends()[backend].supports_cache_dtype(d, None, device)]
