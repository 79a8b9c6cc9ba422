"""Triton paged decode: GQA-packed, online softmax over KV tiles, split-KV + combine.

Grid of stage 1: (sequence, KV head, KV split). One program loads the whole group of query heads
that share its KV head (G = num_q_heads / num_kv_heads, padded to 16 rows for ``tl.dot``), so
each K/V row is read from memory once per group. It walks its split's token range in tiles of
``TILE_N`` tokens; each token's physical slot is ``block_tables[s, p // BLOCK_SIZE]`` *
BLOCK_SIZE + ``p % BLOCK_SIZE``, so the tile size is independent of the block size and any
block size >= 1 works. Scores and the running max / sum / output are fp32 whatever the input
dtype. With one split the program normalises and writes ``out`` directly; with several, it
writes its unnormalised partial output and (max, sum), and a second kernel merges the splits
(flash-decoding), so one long sequence at batch 1 still fills the GPU.

On a machine without a GPU, ``import pagebench`` sets ``TRITON_INTERPRET=1`` before Triton is
imported, so the kernels run interpreted on CPU tensors.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

# Triton's interpreter (3.9) computes bf16 tl.dot wrongly: it runs the dots in fp32 there.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
MAX_SPLITS = 128
MIN_TOKENS_PER_SPLIT = 256
PROGRAMS_PER_SM = 4  # split until sequences x KV heads x splits reaches this many per SM


@triton.jit
def _decode_split_kernel(
    Q, K, V, TABLES, SEQ_LENS, OUT, PART_O, PART_ML,
    scale_log2e, tokens_per_split,
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ts,
    stride_os, stride_oh,
    stride_ps, stride_ph, stride_pk,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    DIRECT: tl.constexpr, IEEE_DOT: tl.constexpr, PAGE_TILES: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SEQ_LENS + seq)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, DIM_PAD)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    heads = kv_head * GROUP + rows
    # load q for the whole group: it stays in registers throughout
    q = tl.load(Q + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    table_row = TABLES + seq * stride_ts
    for tile_start in range(start, end, TILE_N):
        pos = tile_start + tl.arange(0, TILE_N)
        pos_ok = pos < end
        if PAGE_TILES == 1:  # tile inside one page: one table load, affine slots
            page = tl.load(table_row + tile_start // BLOCK_SIZE).to(tl.int64)
            slot = tile_start % BLOCK_SIZE + tl.arange(0, TILE_N)
            k_row = page * stride_kb + slot * stride_kt
            v_row = page * stride_vb + slot * stride_vt
        elif PAGE_TILES == 2:  # tile = whole pages: one table load per page
            page_idx = tile_start // BLOCK_SIZE + tl.arange(0, TILE_N // BLOCK_SIZE)
            pages = tl.load(table_row + page_idx, mask=page_idx * BLOCK_SIZE < end,
                            other=0).to(tl.int64)
            slots = tl.arange(0, BLOCK_SIZE)
            k_row = tl.reshape(pages[:, None] * stride_kb + slots[None, :] * stride_kt, [TILE_N])
            v_row = tl.reshape(pages[:, None] * stride_vb + slots[None, :] * stride_vt, [TILE_N])
        else:  # any block size: each token's page from the table
            block = tl.load(table_row + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
            k_row = block * stride_kb + (pos % BLOCK_SIZE) * stride_kt
            v_row = block * stride_vb + (pos % BLOCK_SIZE) * stride_vt
        kv_mask = pos_ok[:, None] & dim_ok[None, :]
        k = tl.load(K + (k_row + kv_head * stride_kh)[:, None] + dims[None, :],
                    mask=kv_mask, other=0.0)  # [TILE_N, DIM_PAD]
        v = tl.load(V + (v_row + kv_head * stride_vh)[:, None] + dims[None, :],
                    mask=kv_mask, other=0.0)
        if IEEE_DOT:  # fp32 inputs (or upcast bf16 when interpreted): exact fp32 products
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(pos_ok[None, :], s * scale_log2e, float("-inf"))  # log2 domain
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE_DOT:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    out_mask = row_ok[:, None] & dim_ok[None, :]
    if DIRECT:
        out = acc / l_i[:, None]
        tl.store(OUT + seq * stride_os + heads[:, None] * stride_oh + dims[None, :],
                 out.to(OUT.dtype.element_ty), mask=out_mask)
    else:
        part = seq * stride_ps + heads * stride_ph + split * stride_pk
        tl.store(PART_O + part[:, None] * DIM_PAD + dims[None, :], acc, mask=out_mask)
        tl.store(PART_ML + part * 2, m_i, mask=row_ok)
        tl.store(PART_ML + part * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _combine_kernel(
    PART_O, PART_ML, OUT, num_splits,
    stride_ps, stride_ph, stride_os, stride_oh,
    SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, DIM_PAD)
    split_ok = splits < num_splits
    part = seq * stride_ps + head * stride_ph + splits  # stride over splits is 1
    m = tl.load(PART_ML + part * 2, mask=split_ok, other=float("-inf"))
    l = tl.load(PART_ML + part * 2 + 1, mask=split_ok, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.where(split_ok & (m > float("-inf")), tl.exp2(m - m_max), 0.0)  # empty splits weigh 0
    o = tl.load(PART_O + part[:, None] * DIM_PAD + dims[None, :], mask=split_ok[:, None], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(OUT + seq * stride_os + head * stride_oh + dims, out.to(OUT.dtype.element_ty),
             mask=dims < HEAD_DIM)


@functools.lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(num_seqs: int, num_kv_heads: int, capacity: int, device,
                      num_sms: int | None = None) -> int:
    """Enough splits that (sequences x KV heads x splits) gives PROGRAMS_PER_SM programs per
    SM, each split keeping at least MIN_TOKENS_PER_SPLIT tokens of work."""
    if num_sms is not None:
        sms = num_sms
    elif torch.device(device).type == "cuda":
        sms = _num_sms(torch.device(device).index or torch.cuda.current_device())
    else:
        sms = 4  # interpreted on CPU: still exercise the split + combine path
    programs = max(1, num_seqs * num_kv_heads)
    wanted = triton.cdiv(PROGRAMS_PER_SM * sms, programs)
    most = max(1, capacity // MIN_TOKENS_PER_SPLIT)
    return max(1, min(wanted, most, MAX_SPLITS))


def default_tile_n(head_dim: int, dtype: torch.dtype) -> int:
    return 32 if head_dim > 128 or dtype == torch.float32 else 64


# Page-aligned tiles: when the tile and the page sizes divide one another (powers of two), a
# tile can load the table once per page instead of once per token. Measured on an H200 (bf16,
# 32/8 heads x 128, commit caac76a): 1.9x SLOWER in geometric mean (the reshape of the [pages,
# page] offsets costs more than the table loads it saves), equal at block 128. Off by default.
PAGE_ALIGNED_TILES = False


def page_tiles_mode(block_size: int, tile_n: int, aligned: bool) -> int:
    """0: per-token table loads; 1: each tile inside one page; 2: each tile = whole pages."""
    if not aligned:
        return 0
    if block_size >= tile_n and block_size % tile_n == 0:
        return 1
    if tile_n % block_size == 0:
        return 2
    return 0


def triton_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, *,
                        num_splits: int | None = None, tile_n: int | None = None,
                        num_warps: int = 4, num_stages: int = 2,
                        page_aligned: bool | None = None):
    """Paged decode; arguments as ``pagebench.kernels.paged_decode`` (already validated).

    ``num_splits`` defaults to ``choose_num_splits`` on the table's capacity (no device sync, so
    the call can be captured in a CUDA graph); ``tile_n`` is the tokens per KV tile (a power of
    two); ``page_aligned`` (default ``PAGE_ALIGNED_TILES``) loads the table per page, not per
    token, where tile and page sizes allow.
    """
    num_seqs, q_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = q_heads // kv_heads
    capacity = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, kv_heads, capacity, q.device)
    tile_n = tile_n or default_tile_n(head_dim, q.dtype)
    num_splits = max(1, min(num_splits, triton.cdiv(capacity, tile_n)))
    tokens_per_split = triton.cdiv(triton.cdiv(capacity, num_splits), tile_n) * tile_n
    num_splits = triton.cdiv(capacity, tokens_per_split)

    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    group_pad = max(16, triton.next_power_of_2(group))
    direct = num_splits == 1
    if direct:
        part_o = part_ml = out  # unused
    else:
        part_o = torch.empty(num_seqs, q_heads, num_splits, dim_pad, device=q.device,
                             dtype=torch.float32)
        part_ml = torch.empty(num_seqs, q_heads, num_splits, 2, device=q.device,
                              dtype=torch.float32)
    tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    _decode_split_kernel[(num_seqs, kv_heads, num_splits)](
        q, k_cache, v_cache, tables, seq_lens, out, part_o, part_ml,
        scale * 1.4426950408889634, tokens_per_split,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        tables.stride(0),
        out.stride(0), out.stride(1),
        q_heads * num_splits, num_splits, 1,
        GROUP=group, GROUP_PAD=group_pad, BLOCK_SIZE=block_size, TILE_N=tile_n,
        HEAD_DIM=head_dim, DIM_PAD=dim_pad, DIRECT=direct,
        IEEE_DOT=q.dtype == torch.float32 or (INTERPRETED and q.dtype == torch.bfloat16),
        PAGE_TILES=page_tiles_mode(block_size, tile_n,
                                   PAGE_ALIGNED_TILES if page_aligned is None else page_aligned),
        num_warps=num_warps, num_stages=num_stages)
    if not direct:
        _combine_kernel[(num_seqs, q_heads)](
            part_o, part_ml, out, num_splits,
            q_heads * num_splits, num_splits, out.stride(0), out.stride(1),
            SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)), HEAD_DIM=head_dim,
            DIM_PAD=dim_pad, num_warps=4)
    return out
