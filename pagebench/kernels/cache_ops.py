"""Cache writes for the engine: store new tokens' K/V, copy whole blocks (copy-on-write)."""

from __future__ import annotations

import torch

from pagebench.kernels.validate import check_copy_blocks, check_write_kv


def write_kv(k_cache, v_cache, k, v, slot_mapping, validate="cached") -> None:
    """Store token ``i``'s K/V (``k``, ``v``: ``[num_tokens, num_kv_heads, head_dim]``) at
    slot ``slot_mapping[i] = block * block_size + offset``, in place. A slot of -1 skips that
    token (padding). Slots must be distinct; the cache must be contiguous. ``validate`` as in
    ``paged_decode``."""
    no_padding = check_write_kv(k_cache, v_cache, k, v, slot_mapping, validate)
    slots = slot_mapping.to(torch.int64)
    if not no_padding:
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]
    store_kv(k_cache, v_cache, k, v, slots)


def store_kv(k_cache, v_cache, k, v, slots) -> None:
    """``write_kv`` without its checks: ``slots`` int64, every one valid and distinct. For
    callers that build the slots themselves (the engine's model runner)."""
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
