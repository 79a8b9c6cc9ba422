"""Cache writes for the engine: store new tokens' K/V, copy whole blocks (copy-on-write)."""

from __future__ import annotations

import torch

from pagebench.kernels.quant import check_kv_scales, is_fp8, quantize
from pagebench.kernels.validate import check_copy_blocks, check_write_kv, shares_memory


def write_kv(k_cache, v_cache, k, v, slot_mapping, validate="cached", *, k_scale=None,
             v_scale=None) -> None:
    """Store token ``i``'s K/V (``k``, ``v``: ``[num_tokens, num_kv_heads, head_dim]``) at
    slot ``slot_mapping[i] = block * block_size + offset``, in place. A slot of -1 skips that
    token (padding). Slots must be distinct; the caches must be contiguous and must not
    overlap (the two halves of one tensor are fine). ``validate`` as in
    ``paged_decode``. ``k`` and ``v`` may be views of either cache (tokens moved within it):
    they are read as they were before the call. The cache is a buffer: autograd records
    nothing (sources that require grad are written detached).

    An fp8 cache stores ``k / k_scale`` and ``v / v_scale`` (per KV head; required for fp8,
    refused otherwise), saturated to the format's finite range (``quant.quantize``)."""
    no_padding = check_write_kv(k_cache, v_cache, k, v, slot_mapping, validate)
    k_scale, v_scale = check_kv_scales(k_cache, k_scale, v_scale)
    slots = slot_mapping.to(torch.int64)
    if not no_padding:
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]  # copies: nothing left aliasing a cache
    else:
        k, v = (_unaliased(x, k_cache, v_cache) for x in (k, v))
    store_kv(k_cache, v_cache, k, v, slots, k_scale, v_scale)


def _unaliased(x, *caches):
    """``x``, or a copy of it where it shares memory with one of ``caches``: torch refuses an
    in-place store from a view of its destination, and writing K first would change a ``v``
    that views the K cache."""
    return x.clone() if any(shares_memory(x, c) for c in caches) else x


def store_kv(k_cache, v_cache, k, v, slots, k_scale=None, v_scale=None) -> None:
    """``write_kv`` without its checks: ``slots`` int64, every one valid and distinct; for an
    fp8 cache, scales as float32 tensors [num_kv_heads]. For callers that build the slots
    themselves (the engine's model runner). Records no autograd history (sources detached)."""
    k, v = k.detach(), v.detach()
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
