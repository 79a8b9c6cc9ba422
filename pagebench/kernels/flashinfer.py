"""FlashInfer's paged kernels as a backend on pagebench's own cache (``pagebench[flashinfer]``).

FlashInfer reads the same NHD cache (``[num_blocks, block_size, kv_heads, head_dim]``), so
nothing is copied: only the block table and lengths are converted to its CSR form
(:func:`paged_kv_layout`: ``indptr``, ``indices``, ``last_page_len``, on the tables' device).
A wrapper's ``plan`` reads that layout back to the host and sizes its work; it is host work a
serving engine pays every step, so it is done once per unchanged table (the value-check cache
of the other backends, ``value_checks.CheckedValues``) and its cost is kept on the plan
(``Plan.plan_us``) apart from the run's. A planned wrapper owns fixed index buffers
(``use_cuda_graph=True``), so its ``run`` can be captured in a CUDA graph.

Two decode variants: ``flashinfer`` (CUDA-core decode) and ``flashinfer-tc`` (tensor cores,
FlashInfer's prefill kernel with one query row per sequence); prefill (causal, aligned to each
sequence's end) on ``flashinfer``. Both use FlashInfer's FA2 kernels (``FI_BACKEND``), which
nvcc builds on first use (16-58 s each on an H100, docs/flashinfer.md). The CUDA-core decode
is compiled for 1, 2, 3, 4, 6, 8 or 16 query heads per KV head only; other groups (Qwen2.5-7B's
7) are refused with a ValueError naming ``flashinfer-tc``, which takes any.

fp8 caches: FlashInfer takes one ``k_scale`` and one ``v_scale`` per call (scalars), pagebench
one per KV head. Equal per-head scales are passed as FlashInfer's scalar; differing ones are
refused (:func:`scalar_scales`), never silently averaged.

The conversions and the refusals are plain torch (tested without FlashInfer); the kernels run
where ``flashinfer`` imports and CUDA is present.
"""

from __future__ import annotations

import functools
import importlib.util
import time
from dataclasses import dataclass

import torch

from pagebench.kernels.value_checks import CheckedValues

# the float workspace (split-KV partials): FlashInfer recommends 128 MiB, which its prefill
# plan outgrows from a few thousand query tokens (128 x 128 tokens, Llama-3-8B heads: 335 MB)
WORKSPACE_BYTES = 512 * 2**20
PLAN_CACHE_ENTRIES = 16  # each planned wrapper holds its own index and int workspace buffers
FI_BACKEND = "fa2"
HEAD_DIMS = (64, 128, 256)  # the head sizes FlashInfer instantiates for its FA2 kernels
# query heads per KV head the CUDA-core decode is compiled for (its DISPATCH_GQA_GROUP_SIZE);
# the tensor-core decode takes any
CUDA_CORE_GROUPS = (1, 2, 3, 4, 6, 8, 16)
PLANS = CheckedValues(PLAN_CACHE_ENTRIES)


def flashinfer_installed() -> bool:
    """Whether the ``flashinfer`` package is present (found without importing it)."""
    return importlib.util.find_spec("flashinfer") is not None


@functools.lru_cache(maxsize=1)
def flashinfer_available() -> bool:
    """Whether FlashInfer imports and a CUDA device is there to run it."""
    if not (flashinfer_installed() and torch.cuda.is_available()):
        return False
    import flashinfer  # noqa: F401 -- importing is the check

    return True


@dataclass(frozen=True)
class PagedKV:
    """A batch's pages in FlashInfer's CSR form (int32, on the tables' device)."""
    indptr: torch.Tensor  # [num_seqs + 1]: sequence s's pages are indices[indptr[s]:indptr[s+1]]
    indices: torch.Tensor  # [indptr[-1]]: physical page ids, sequence after sequence, in order
    last_page_len: torch.Tensor  # [num_seqs]: tokens in each sequence's last page (1..block)


def paged_kv_layout(block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    block_size: int) -> PagedKV:
    """pagebench's block table and lengths as FlashInfer's ``indptr`` / ``indices`` /
    ``last_page_len``: each sequence's first ``ceil(len / block_size)`` table entries, in
    order; table entries past them are never read (they may hold anything)."""
    lens = seq_lens.to(torch.int32)
    pages = (lens + block_size - 1) // block_size
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
    torch.cumsum(pages, 0, out=indptr[1:])
    cols = torch.arange(block_tables.shape[1], device=block_tables.device)
    indices = block_tables[cols[None, :] < pages[:, None]].to(torch.int32)
    return PagedKV(indptr, indices, lens - (pages - 1) * block_size)


def query_indptr(query_start_loc: torch.Tensor) -> torch.Tensor:
    """``query_start_loc`` as FlashInfer's ``qo_indptr`` (the same offsets: sequence s's rows
    are ``[qo[s], qo[s+1])``), int32 and contiguous."""
    return query_start_loc.to(torch.int32).contiguous()


def scalar_scales(k_scale: torch.Tensor, v_scale: torch.Tensor) -> tuple[float, float]:
    """pagebench's per-KV-head fp8 scales as FlashInfer's two scalars; a ValueError where the
    heads' scales differ (FlashInfer applies one scale to every head). Reads them to the host."""
    out = []
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        values = s.detach().float().cpu().flatten()
        if values.numel() and bool((values != values[0]).any()):
            raise ValueError(
                f"{name}: FlashInfer takes one scale per cache, these per-head scales differ "
                f"({float(values.min()):.4g}..{float(values.max()):.4g}); quantise with one "
                "scale for every head, or use backend='triton' or 'cuda-fp8'")
        out.append(float(values[0]) if values.numel() else 1.0)
    return out[0], out[1]


@functools.cache
def _workspace(device: torch.device) -> torch.Tensor:
    """One float workspace per device, shared by every wrapper (calls on one stream take
    turns with it; FlashInfer keeps only a call's partial results there)."""
    return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)


@dataclass
class Plan:
    """A planned FlashInfer wrapper for one table: ``run(q, k_cache, v_cache)`` is the kernel
    (graph-capturable), ``plan_us`` the host time the first plan took (the wrapper and its
    buffers made, the layout converted, ``plan``)."""
    wrapper: object
    # no-argument call: convert the table again and plan again on the same wrapper, what a
    # serving step pays for a new table of the same batch size
    replan: object
    k_scale: float | None
    v_scale: float | None
    plan_us: float

    def run(self, q, k_cache, v_cache):
        kwargs = {} if self.k_scale is None else {"k_scale": self.k_scale,
                                                  "v_scale": self.v_scale}
        return self.wrapper.run(q, (k_cache, v_cache), **kwargs)


def check_group(num_q_heads: int, num_kv_heads: int, tensor_cores: bool) -> None:
    """A ValueError where the CUDA-core decode has no kernel for this many query heads per KV
    head (Qwen2.5-7B's 28/4 = 7, say), before FlashInfer fails inside its dispatch."""
    group = num_q_heads // num_kv_heads
    if not tensor_cores and group not in CUDA_CORE_GROUPS:
        raise ValueError(
            f"q: FlashInfer's CUDA-core decode takes {', '.join(map(str, CUDA_CORE_GROUPS))} "
            f"query heads per KV head, got {group} ({num_q_heads}/{num_kv_heads}); "
            "backend 'flashinfer-tc' takes any")


def _scales(k_scale, v_scale):
    return (None, None) if k_scale is None else scalar_scales(k_scale, v_scale)


def plan_decode(block_tables, seq_lens, k_scale, v_scale, *, tensor_cores: bool,
                num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                q_dtype, kv_dtype, scale: float) -> Plan:
    """A decode wrapper planned for this table (``k_scale``/``v_scale``: fp8 only, else None)."""
    check_group(num_q_heads, num_kv_heads, tensor_cores)  # refusals come before anything is built
    ks, vs = _scales(k_scale, v_scale)
    import flashinfer

    t0 = time.perf_counter()
    kv = paged_kv_layout(block_tables, seq_lens, block_size)  # sizes the wrapper's buffers
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        _workspace(block_tables.device), "NHD", use_cuda_graph=True,
        use_tensor_cores=tensor_cores, paged_kv_indptr_buffer=torch.empty_like(kv.indptr),
        paged_kv_indices_buffer=torch.empty_like(kv.indices),
        paged_kv_last_page_len_buffer=torch.empty_like(kv.last_page_len), backend=FI_BACKEND)

    def replan():
        kv = paged_kv_layout(block_tables, seq_lens, block_size)
        wrapper.plan(kv.indptr, kv.indices, kv.last_page_len, num_q_heads, num_kv_heads,
                     head_dim, block_size, q_data_type=q_dtype, kv_data_type=kv_dtype,
                     sm_scale=scale)

    replan()
    return Plan(wrapper, replan, ks, vs, (time.perf_counter() - t0) * 1e6)


def plan_prefill(block_tables, seq_lens, query_start_loc, k_scale, v_scale, *, num_q_heads: int,
                 num_kv_heads: int, head_dim: int, block_size: int, q_dtype, kv_dtype,
                 scale: float) -> Plan:
    """A causal prefill wrapper planned for this table and these query offsets (the causal
    mask is aligned to each sequence's end, as ``paged_prefill`` defines it)."""
    ks, vs = _scales(k_scale, v_scale)  # a refusal comes before anything is built
    import flashinfer

    t0 = time.perf_counter()
    kv = paged_kv_layout(block_tables, seq_lens, block_size)  # sizes the wrapper's buffers
    qo = query_indptr(query_start_loc)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        _workspace(block_tables.device), "NHD", use_cuda_graph=True,
        qo_indptr_buf=torch.empty_like(qo), paged_kv_indptr_buf=torch.empty_like(kv.indptr),
        paged_kv_indices_buf=torch.empty_like(kv.indices),
        paged_kv_last_page_len_buf=torch.empty_like(kv.last_page_len), backend=FI_BACKEND)

    def replan():
        kv = paged_kv_layout(block_tables, seq_lens, block_size)
        qo = query_indptr(query_start_loc)
        wrapper.plan(qo, kv.indptr, kv.indices, kv.last_page_len, num_q_heads, num_kv_heads,
                     head_dim, block_size, causal=True, sm_scale=scale, q_data_type=q_dtype,
                     kv_data_type=kv_dtype)

    replan()
    return Plan(wrapper, replan, ks, vs, (time.perf_counter() - t0) * 1e6)


def _plan_key(tensors: tuple, k_scale, v_scale) -> tuple:
    """The tensors a plan depends on: the table, the lengths, and an fp8 cache's scales."""
    return tensors + (() if k_scale is None else (k_scale, v_scale))


def _make_decode(*args) -> Plan:
    """``plan_decode`` from the plan cache's arguments: the key's tensors, then its params."""
    *tensors, tc, hq, hkv, d, bs, qd, kd, sc, _device = args
    block_tables, seq_lens, *scales = tensors
    return plan_decode(block_tables, seq_lens, *(scales or (None, None)), tensor_cores=tc,
                       num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=bs,
                       q_dtype=qd, kv_dtype=kd, scale=sc)


def _decode_plan(block_tables, seq_lens, k_scale, v_scale, tensor_cores, q, k_cache, scale):
    params = (tensor_cores, q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1],
              q.dtype, k_cache.dtype, float(scale), q.device)
    return PLANS.run(_make_decode, _plan_key((block_tables, seq_lens), k_scale, v_scale),
                     params)


def decode(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale=None, v_scale=None, *,
           tensor_cores: bool = False):
    """Paged decode through FlashInfer, planned once per unchanged table."""
    return _decode_plan(block_tables, seq_lens, k_scale, v_scale, tensor_cores, q, k_cache,
                        scale).run(q, k_cache, v_cache)


def prepare_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale=None,
                   v_scale=None, *, tensor_cores: bool = False):
    """``decode`` as a no-argument call, planned now (the registry's ``prepare`` hook)."""
    plan = _decode_plan(block_tables, seq_lens, k_scale, v_scale, tensor_cores, q, k_cache,
                        scale)
    return lambda: plan.run(q, k_cache, v_cache)


def _make_prefill(*args) -> Plan:
    """``plan_prefill`` from the plan cache's arguments: the key's tensors, then its params."""
    *tensors, hq, hkv, d, bs, qd, kd, sc, _device = args
    block_tables, seq_lens, query_start_loc, *scales = tensors
    return plan_prefill(block_tables, seq_lens, query_start_loc, *(scales or (None, None)),
                        num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=bs,
                        q_dtype=qd, kv_dtype=kd, scale=sc)


def _prefill_plan(block_tables, seq_lens, query_start_loc, k_scale, v_scale, q, k_cache, scale):
    params = (q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], q.dtype,
              k_cache.dtype, float(scale), q.device)
    return PLANS.run(_make_prefill, _plan_key((block_tables, seq_lens, query_start_loc), k_scale,
                                              v_scale), params)


def prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, k_scale=None,
            v_scale=None):
    """Causal paged prefill through FlashInfer, planned once per unchanged table and offsets."""
    return _prefill_plan(block_tables, seq_lens, query_start_loc, k_scale, v_scale, q, k_cache,
                         scale).run(q, k_cache, v_cache)


def prepare_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                    k_scale=None, v_scale=None):
    """``prefill`` as a no-argument call, planned now (the registry's ``prepare`` hook)."""
    plan = _prefill_plan(block_tables, seq_lens, query_start_loc, k_scale, v_scale, q, k_cache,
                         scale)
    return lambda: plan.run(q, k_cache, v_cache)
