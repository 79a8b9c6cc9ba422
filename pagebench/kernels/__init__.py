"""Paged KV-cache attention kernels behind one registry.

Cache layout (vLLM / FlashInfer "NHD"): ``k_cache``, ``v_cache`` are
``[num_blocks, block_size, num_kv_heads, head_dim]``; token ``p`` of sequence ``s`` lives in block
``block_tables[s, p // block_size]`` at slot ``p % block_size``. ``block_tables`` is int32
``[num_seqs, max_blocks_per_seq]``, ``seq_lens`` int32 ``[num_seqs]`` (each >= 1). GQA/MQA:
``num_q_heads`` is any multiple of ``num_kv_heads``. The cache has q's dtype, or is fp8
(``torch.float8_e4m3fn``, ``torch.float8_e5m2``) with per-KV-head scales ``k_scale``,
``v_scale`` (stored value x scale = real value; ``pagebench.kernels.quant``). Every entry point
validates its arguments before launching anything and raises ``ValueError`` naming the
offending argument. Shapes,
dtypes and devices are checked on every call; the values (block ids inside the cache, lengths
within the table) need a device sync on a GPU, so there they are checked once per unchanged
set of tensors: ``validate="cached"`` (the default; "unchanged" as torch's version counter
sees it, see ``value_checks``) or ``validate="always"`` (every call, for tensors written
behind torch's back: DLPack, ``.data``, a custom kernel, a CUDA graph replay).

Backends (``available_backends()`` lists what runs here): ``torch`` (gather-then-attend, runs
anywhere), ``triton`` (paged decode with split-KV; on a machine without a GPU it runs
interpreted, see ``pagebench.triton_setup``), ``sdpa`` (contiguous baseline),
``flex`` (FlexAttention with a page table, where the installed torch has it), ``cuda-fp8``
(decode of fp8 caches in CUDA C++, NVIDIA compute capability 8.9+; opt-in: ``"auto"`` keeps
Triton). Third-party kernels are added with ``register_backend``.
"""

from __future__ import annotations

import torch

from pagebench.kernels import builtin  # importing it registers the built-in backends
from pagebench.kernels.cache_ops import copy_blocks, write_kv
from pagebench.kernels.quant import FP8_DTYPES, check_kv_scales
from pagebench.kernels.reference import cumulative_offsets
from pagebench.kernels.registry import (
    Backend, available_backends, get_backend, register_backend, registered_backends, resolve,
    unregister_backend)
from pagebench.kernels.validate import check_contiguous, check_decode, check_prefill

__all__ = [
    "paged_decode", "paged_prefill", "contiguous_decode", "write_kv", "copy_blocks",
    "available_backends", "register_backend", "unregister_backend", "registered_backends",
    "get_backend", "Backend", "FP8_DTYPES", "cumulative_offsets",
]
del builtin


def paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=None, backend="auto",
                 validate="cached", *, k_scale=None, v_scale=None):
    """One decode step of attention through a block table.

    q ``[num_seqs, num_q_heads, head_dim]`` (the newest token of each sequence, whose K/V is
    already in the cache); returns ``out`` shaped and typed like q. ``scale`` defaults to
    ``head_dim ** -0.5``. ``backend``: a name from ``available_backends()`` or ``"auto"``
    (Triton on CUDA when installed, else the PyTorch gather-then-attend backend).
    ``validate``: ``"cached"`` checks the table's and the lengths' values once while those
    tensors are unchanged (no device sync on later calls), ``"always"`` on every call.
    ``k_scale``, ``v_scale``: required for an fp8 cache, refused otherwise (a number, or a
    float32 tensor ``[num_kv_heads]``; a GPU tensor's values are not read back).
    """
    scale = check_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, validate)
    k_scale, v_scale = check_kv_scales(k_cache, k_scale, v_scale)
    impl = resolve("decode", backend, q.device, q.dtype, k_cache.shape[1], q.shape[-1],
                   k_cache.dtype)
    if q.shape[0] == 0:  # no sequences: nothing for a backend to launch
        return torch.empty_like(q)
    if k_scale is None:
        return impl.decode(q, k_cache, v_cache, block_tables, seq_lens, scale)
    return impl.decode(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale=k_scale,
                       v_scale=v_scale)


def paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale=None,
                  backend="auto", validate="cached", *, k_scale=None, v_scale=None):
    """Attention for the last ``query_start_loc[s + 1] - query_start_loc[s]`` positions of each
    sequence (chunked prefill, or a prompt that starts from a prefix-cache hit), causal over
    everything cached before them.

    q is ``[total_query_tokens, num_q_heads, head_dim]``, the sequences' queries packed one after
    another in sequence order: sequence s's are rows ``query_start_loc[s] ..
    query_start_loc[s + 1] - 1``. ``query_start_loc`` (int32 or int64 ``[num_seqs + 1]``) holds
    those cumulative offsets, starting at 0 and ending at ``total_query_tokens``, as vLLM's
    ``query_start_loc`` and FlashInfer's ``qo_indptr``; a sequence may have no queries.
    ``seq_lens[s]`` counts all of sequence s's tokens including the new ones, whose K/V must
    already be written to the cache (``write_kv``). Returns ``out`` shaped and typed like q.
    ``validate``, ``k_scale`` and ``v_scale`` as in ``paged_decode`` (the offsets are values too).
    """
    scale = check_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                          validate)
    k_scale, v_scale = check_kv_scales(k_cache, k_scale, v_scale)
    impl = resolve("prefill", backend, q.device, q.dtype, k_cache.shape[1], q.shape[-1],
                   k_cache.dtype)
    if q.shape[0] == 0:  # no query tokens: nothing for a backend to launch
        return torch.empty_like(q)
    if k_scale is None:
        return impl.prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)
    return impl.prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                        k_scale=k_scale, v_scale=v_scale)


def contiguous_decode(q, k, v, seq_lens, scale=None, backend="auto", validate="cached"):
    """Decode attention on a contiguous cache ``k``, ``v``: ``[num_seqs, max_len, num_kv_heads,
    head_dim]`` (sequence s uses its first ``seq_lens[s]`` positions): the baseline that paging is
    measured against. ``backend``: ``"sdpa"``, ``"triton"`` (the paged kernel through an identity
    block table) or ``"auto"``; ``validate`` as in ``paged_decode``."""
    scale, all_full = check_contiguous(q, k, v, seq_lens, scale, validate)
    impl = resolve("contiguous", backend, q.device, q.dtype, None, q.shape[-1])
    if q.shape[0] == 0:
        return torch.empty_like(q)
    return impl.contiguous(q, k, v, None if all_full else seq_lens, scale)
