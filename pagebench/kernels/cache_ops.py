"""Cache writes for the engine: store new tokens' K/V, copy whole blocks (copy-on-write)."""

from __future__ import annotations

import torch

from pagebench.kernels.quant import check_kv_scales, is_fp8, quantize
from pagebench.kernels.validate import check_copy_blocks, check_write_kv


def write_kv(k_cache, v_cache, k, v, slot_mapping, validate="cached", *, k_scale=None,
             v_scale=None) -> None:
    """Store token ``i``'s K/V (``k``, ``v``: ``[num_tokens, num_kv_heads, head_dim]``) at
    slot ``slot_mapping[i] = block * block_size + offset``, in place. A slot of -1 skips that
    token (padding). Slots must be distinct; the cache must be contiguous. ``validate`` as in
    ``paged_decode``.

    An fp8 cache stores ``k / k_scale`` and ``v / v_scale`` (per KV head; required for fp8,
    refused otherwise), saturated to the format's finite range (``quant.quantize``)."""
    no_padding = check_write_kv(k_cache, v_cache, k, v, slot_mapping, validate)
    k_scale, v_scale = check_kv_scales(k_cache, k_scale, v_scale)
    slots = slot_mapping.to(torch.int64)
    if not no_padding:
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]
    store_kv(k_cache, v_cache, k, v, slots, k_scale, v_scale)


def store_kv(k_cache, v_cache, k, v, slots, k_scale=None, v_scale=None) -> None:
    """``write_kv`` without its checks: ``slots`` int64, every one valid and distinct; for an
    fp8 cache, scales as float32 tensors [num_kv_heads]. For callers that build the slots
    themselves (the engine's model runner)."""
    if is_fp8(k_cache.dtype):
        # fp8 has no index_copy_ kernel on every device: copy the bytes
        k = quantize(k, k_scale, k_cache.dtype).view(torch.uint8)
        v = quantize(v, v_scale, v_cache.dtype).view(torch.uint8)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def copy_blocks(k_cache, v_cache, pairs) -> None:
    """Copy block ``src`` to block ``dst`` for each ``(src, dst)`` in ``pairs`` (a list of pairs
    or an int tensor ``[n, 2]``), in place, K and V. Destinations must be distinct and no block
    may be both a source and a destination, so the copies are independent of their order."""
    table = check_copy_blocks(k_cache, v_cache, pairs)
    if table.numel() == 0:
        return
    src, dst = table[:, 0], table[:, 1]
    k_cache[dst] = k_cache[src]
    v_cache[dst] = v_cache[src]
