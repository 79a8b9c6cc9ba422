"""PyTorch kernels: gather-then-attend paged attention (runs anywhere), SDPA on a contiguous
cache, and the float64 reference every backend is tested against.

Gather-then-attend is what a framework without a paged kernel does: copy each sequence's K/V
out of its blocks into a contiguous tensor, then call dense attention. It is correct by
construction and costs an extra write and read of all K/V -- the cost a real paged kernel avoids.
An fp8 cache is dequantised as it is gathered, to q's dtype (float32 for an fp16 q: see
``attend_dtype``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagebench.kernels.quant import dequantize


# How SDPA sees GQA decode: "groups" lays the G query heads of a KV head out as G query
# positions (reads each K/V head once, any torch); "gqa" passes one query position per head
# with enable_gqa=True (torch >= 2.5). Both compute the same. Measured on an H200 (bf16,
# 32/8 x 128, torch 2.11): "gqa" 77 us vs "groups" 750 us at 1 x 65536 (CUDA's kernel splits
# the KV only there), "groups" 8-13% faster at batch 8-64 x 4096, equal at 256. "auto" picks
# "gqa" while sequences x KV heads is below 64 (a few programs per SM), else "groups".
LOG2E = 1.4426950408889634  # kernels take exp2: a softmax scale is multiplied by log2(e)
SDPA_GQA_MODE = "auto"


def _sdpa_mode(mode, num_seqs: int, kv_heads: int) -> str:
    mode = mode or SDPA_GQA_MODE
    if mode == "auto":
        return "gqa" if num_seqs * kv_heads < 64 else "groups"
    return mode


def attend_decode(q, k, v, valid, scale, mode=None):
    """Dense decode attention. q [S, Hq, D]; k, v [S, Hkv, L, D]; valid [S, L] bool or None."""
    num_seqs, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = q_heads // kv_heads
    mask = None if valid is None else valid[:, None, None, :]
    if _sdpa_mode(mode, num_seqs, kv_heads) == "gqa" and group > 1:
        out = F.scaled_dot_product_attention(q[:, :, None, :], k, v, attn_mask=mask,
                                             scale=scale, enable_gqa=True)
        return out.reshape(num_seqs, q_heads, head_dim)
    qg = q.reshape(num_seqs, kv_heads, group, head_dim)  # [S, Hkv, G, D]
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(num_seqs, q_heads, head_dim)


def attend_dtype(q, k_scale=None) -> torch.dtype:
    """The dtype the torch backend dequantises an fp8 cache (``k_scale`` given) to and attends
    in: q's, but float32 for an fp16 q, where stored x scale may exceed fp16's 65,504 although
    the scores and the output do not."""
    return torch.float32 if k_scale is not None and q.dtype == torch.float16 else q.dtype


def gather_kv(k_cache, v_cache, block_tables, seq_lens, k_scale=None, v_scale=None,
              dtype=None):
    """Copy each sequence's K/V out of its blocks, head-major: ([S, Hkv, L, D] x2, valid [S, L]).
    An fp8 cache (``k_scale``, ``v_scale`` given) comes out dequantised to ``dtype``. Positions
    at or beyond a sequence's length hold finite values that ``valid`` masks: a poisoned or
    stale slot is never copied out.

    On CUDA, whole blocks are gathered (one index per block, not per token), then transposed to
    head-major with those positions zeroed in the same pass; L is the table's capacity
    (max_blocks_per_seq * block_size) so that no device sync is needed. On the CPU see
    :func:`_gather_kv_rows`.
    """
    if k_cache.device.type == "cpu":
        return _gather_kv_rows(k_cache, v_cache, block_tables, seq_lens, k_scale, v_scale, dtype)
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    lens = seq_lens.to(torch.int64)
    needed = (lens + block_size - 1) // block_size
    max_blocks = block_tables.shape[1]
    device = k_cache.device
    used = torch.arange(max_blocks, device=device)[None, :] < needed[:, None]
    # unused table entries may hold anything: point them at block 0, then mask
    table = torch.where(used, block_tables.to(torch.int64), 0).reshape(-1)
    length = max_blocks * block_size
    valid = torch.arange(length, device=device)[None, :] < lens[:, None]  # [S, L]
    keep = valid[:, None, :, None]
    num_seqs = block_tables.shape[0]

    def gather(cache, cache_scale):
        raw = _bytes_of_fp8(cache, cache_scale)
        blocks = raw.reshape(num_blocks, -1).index_select(0, table)  # [S*blocks, bs*Hkv*D]
        x = blocks.view(num_seqs, length, kv_heads, head_dim).transpose(1, 2)
        if cache_scale is not None:
            x = dequantize(x.view(cache.dtype), cache_scale, dtype, head_axis=1)
        # out=: where's own output would keep x's token-major strides, which SDPA reads
        # several times slower than head-major rows
        out = torch.empty(num_seqs, kv_heads, length, head_dim, dtype=x.dtype, device=device)
        return torch.where(keep, x, x.new_zeros(()), out=out)

    return gather(k_cache, k_scale), gather(v_cache, v_scale), valid


def _gather_kv_rows(k_cache, v_cache, block_tables, seq_lens, k_scale=None, v_scale=None,
                    dtype=None):
    """:func:`gather_kv` on the CPU: one ``index_select`` of head_dim-long rows straight into
    head-major order, a single pass over the K/V read (the block gather's second, masking and
    transposing pass cost as much as the first). L stops at the longest sequence's last block
    (reading a length costs nothing on the CPU); positions at or beyond a sequence's length
    read its position 0, which ``valid`` masks (its real K/V: finite whenever the attended
    ones are). The index is [S, Hkv, L], fine at CPU sizes, too large at a GPU's capacity."""
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    lens = seq_lens.to(torch.int64)
    max_blocks = block_tables.shape[1]
    if lens.numel():
        max_blocks = min(max_blocks, int((lens.max() + block_size - 1) // block_size))
    length = max_blocks * block_size
    pos = torch.arange(length)
    valid = pos[None, :] < lens[:, None]  # [S, L]
    pos = torch.where(valid, pos, 0)  # only the entries of used blocks are read
    blocks = block_tables[:, :max_blocks].to(torch.int64).gather(1, pos // block_size)
    slots = blocks * block_size + pos % block_size  # [S, L]
    rows = (slots[:, None, :] * kv_heads + torch.arange(kv_heads)[:, None]).reshape(-1)
    shape = (block_tables.shape[0], kv_heads, length, head_dim)

    def gather(cache, cache_scale):
        x = _bytes_of_fp8(cache, cache_scale).reshape(-1, head_dim).index_select(0, rows)
        x = x.view(shape)
        if cache_scale is not None:
            x = dequantize(x.view(cache.dtype), cache_scale, dtype, head_axis=1)
        return x

    return gather(k_cache, k_scale), gather(v_cache, v_scale), valid


def torch_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale=None,
                       v_scale=None):
    dtype = attend_dtype(q, k_scale)
    k, v, valid = gather_kv(k_cache, v_cache, block_tables, seq_lens, k_scale, v_scale, dtype)
    return attend_decode(q.to(dtype), k, v, valid, scale).to(q.dtype)


def _seq_kv(k_cache, v_cache, table_row, length, k_scale=None, v_scale=None, dtype=None):
    """One sequence's K/V [n, Hkv, D] (an fp8 cache dequantised to ``dtype``)."""
    block_size = k_cache.shape[1]
    pos = torch.arange(length, device=k_cache.device)
    blocks = table_row.to(torch.int64)[pos // block_size]
    k = _bytes_of_fp8(k_cache, k_scale)[blocks, pos % block_size]
    v = _bytes_of_fp8(v_cache, v_scale)[blocks, pos % block_size]
    if k_scale is not None:
        k = dequantize(k.view(k_cache.dtype), k_scale, dtype)
        v = dequantize(v.view(v_cache.dtype), v_scale, dtype)
    return k, v


def _bytes_of_fp8(cache, cache_scale):
    """An fp8 cache (``cache_scale`` given) as bytes: indexing kernels do not cover fp8 on
    every device, and gathering bytes is the same copy."""
    return cache if cache_scale is None else cache.view(torch.uint8)


def torch_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                        k_scale=None, v_scale=None):
    """q packed in sequence order [query_start_loc[-1], Hq, D]; causal over the cached
    prefix."""
    out = torch.empty_like(q)
    q_heads, kv_heads = q.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    dtype = attend_dtype(q, k_scale)
    for s, (n, start, ql) in enumerate(query_spans(seq_lens, query_start_loc)):
        if not ql:
            continue
        k, v = _seq_kv(k_cache, v_cache, block_tables[s], n, k_scale, v_scale, dtype)
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, n, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        qs = q[start:start + ql].transpose(0, 1).to(dtype)  # [Hq, ql, D]
        q_pos = torch.arange(n - ql, n, device=q.device)
        mask = torch.arange(n, device=q.device)[None, :] <= q_pos[:, None]  # [ql, n]
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale)
        out[start:start + ql] = o.transpose(0, 1)
    return out


def cumulative_offsets(lengths, device=None, dtype=torch.int32) -> torch.Tensor:
    """``[0, l0, l0 + l1, ..]``: the ``query_start_loc`` of queries packed with ``lengths``
    (a list or a tensor) per sequence."""
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    starts = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths.cpu(), 0, out=starts[1:])
    return starts.to(device=device or lengths.device, dtype=dtype)


def query_spans(seq_lens, query_start_loc) -> list[tuple[int, int, int]]:
    """Each sequence's (length, first query row, query count), read back to the host."""
    starts = query_start_loc.tolist()
    return [(n, a, b - a) for n, a, b in zip(seq_lens.tolist(), starts, starts[1:])]


def sdpa_contiguous_decode(q, k, v, seq_lens, scale, mode=None):
    """Contiguous baseline; ``seq_lens=None`` means every sequence fills max_len (no mask)."""
    valid = None
    if seq_lens is not None:
        valid = torch.arange(k.shape[1], device=k.device)[None, :] < seq_lens.to(torch.int64)[:, None]
    return attend_decode(q, k.transpose(1, 2), v.transpose(1, 2), valid, scale, mode)


# ---- float64 reference (tests) -------------------------------------------------------------

def _softmax_attend64(q, k, v, mask, scale):
    """q [Hq, m, D], k/v [Hq, n, D], mask [m, n] bool, all float64."""
    scores = torch.einsum("hmd,hnd->hmn", q, k) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hmn,hnd->hmd", torch.softmax(scores, dim=-1), v)


def reference_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=None, *, k_scale=None,
                     v_scale=None):
    """Paged decode in float64 on the CPU, one sequence at a time from its logical K/V."""
    starts = torch.arange(seq_lens.shape[0] + 1, dtype=torch.int64)
    return reference_prefill(q, k_cache, v_cache, block_tables, seq_lens, starts, scale,
                             k_scale=k_scale, v_scale=v_scale)


def reference_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale=None,
                      *, k_scale=None, v_scale=None):
    """float64 CPU result [query_start_loc[-1], Hq, D]; sequence s's queries are its last
    ``query_start_loc[s + 1] - query_start_loc[s]`` positions.
    An fp8 cache is dequantised exactly (in float64) with its per-head scales (numbers or
    tensors [num_kv_heads])."""
    q64, kc, vc = (t.detach().to("cpu", torch.float64) for t in (q, k_cache, v_cache))
    kv_heads = k_cache.shape[2]
    if k_scale is not None:
        kc = kc * _scales64(k_scale, kv_heads)[:, None]
    if v_scale is not None:
        vc = vc * _scales64(v_scale, kv_heads)[:, None]
    tables = block_tables.detach().cpu()
    head_dim = q.shape[-1]
    scale = head_dim ** -0.5 if scale is None else float(scale)
    group = q.shape[1] // k_cache.shape[2]
    outs = []
    for s, (n, start, ql) in enumerate(query_spans(seq_lens, query_start_loc)):
        if not ql:
            continue
        k, v = _seq_kv(kc, vc, tables[s], n)
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        qs = q64[start:start + ql].transpose(0, 1)
        mask = torch.arange(n)[None, :] <= torch.arange(n - ql, n)[:, None]
        outs.append(_softmax_attend64(qs, k, v, mask, scale).transpose(0, 1))
    return torch.cat(outs) if outs else q64.new_empty(q.shape)


def _scales64(s, kv_heads: int) -> torch.Tensor:
    return torch.as_tensor(s, dtype=torch.float64).detach().cpu().expand(kv_heads)


def reference_contiguous(q, k, v, seq_lens, scale=None):
    """float64 CPU decode on a contiguous cache [S, max_len, Hkv, D]."""
    num_seqs, max_len = k.shape[:2]
    # a contiguous cache is a paged cache with one block of max_len per sequence
    return reference_decode(q, k, v, identity_tables(num_seqs, "cpu"), seq_lens, scale)


def identity_tables(num_seqs: int, device) -> torch.Tensor:
    """Block table [num_seqs, 1] mapping sequence s to block s: a contiguous cache as paged."""
    return torch.arange(num_seqs, dtype=torch.int32, device=device)[:, None]
