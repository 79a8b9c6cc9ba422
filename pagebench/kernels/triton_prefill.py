"""Triton paged prefill: causal attention for a chunk of queries over everything cached before it.

Grid ``(query tile, KV head)``, the query tiles of all sequences numbered one after another
(each program finds its sequence by a binary search of the cumulative tile counts). A program
takes ``TOKENS`` consecutive queries of one sequence and the whole group of query heads that
share its KV head, as ``TOKENS x GROUP`` rows of one matrix, so each K/V tile read from the
cache serves every head of the group (as the decode kernel does). Query ``i`` of a chunk of
``query_len`` sits at position ``seq_len - query_len + i`` and sees keys ``0 ..`` that
position; the program walks the keys up to its last query's position in tiles of ``TILE_N``
tokens through the block table (any block size), with the online softmax in fp32. Tiles wholly
above the diagonal are not visited.
"""

from __future__ import annotations

import torch

from pagebench.config import ceil_div
from pagebench.kernels.quant import is_fp8
from pagebench.kernels.triton_decode import INTERPRETED, attend_tile, default_tile_n, next_pow2

# triton_decode, imported above, has set TRITON_INTERPRET where Triton needs it
import triton  # noqa: E402 (after TRITON_INTERPRET is decided)
import triton.language as tl  # noqa: E402 (after TRITON_INTERPRET is decided)


@triton.jit
def _prefill_kernel(
    Q, K, V, TABLES, SEQ_LENS, Q_LENS, Q_ENDS, TILE_ENDS, OUT, K_SCALE, V_SCALE,
    num_seqs, scale_log2e,
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ts, stride_ot, stride_oh,
    GROUP: tl.constexpr, TOKENS: tl.constexpr, ROWS: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    IEEE_DOT: tl.constexpr, FP8: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    if FP8:  # as in the decode kernel: k_scale folds into the softmax scale
        scale_log2e = scale_log2e * tl.load(K_SCALE + kv_head)
    # this tile's sequence: the first whose cumulative tile count exceeds it (binary search)
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(TILE_ENDS + mid) <= tile:
            lo = mid + 1
        else:
            hi = mid
    seq = lo
    if seq < num_seqs:  # the grid is an upper bound on the tile count: the rest do nothing
        q_len = tl.load(Q_LENS + seq)
        first = (tile - tl.load(TILE_ENDS + seq) + tl.cdiv(q_len, TOKENS)) * TOKENS
        seq_len = tl.load(SEQ_LENS + seq)
        q_start = tl.load(Q_ENDS + seq) - q_len
        rows = tl.arange(0, ROWS)
        tok = first + rows // GROUP  # query index in the chunk
        heads = kv_head * GROUP + rows % GROUP
        row_ok = (rows < TOKENS * GROUP) & (tok < q_len)
        q_pos = seq_len - q_len + tok  # each row's position in the sequence
        dims = tl.arange(0, DIM_PAD)
        dim_ok = dims < HEAD_DIM
        q = tl.load(Q + (q_start + tok)[:, None] * stride_qt + heads[:, None] * stride_qh
                    + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, DIM_PAD], tl.float32)
        # keys up to the last query of this tile (key 0 is visible to every row, so each row's
        # running max is finite after the first tile)
        end = seq_len - q_len + tl.minimum(first + TOKENS, q_len)
        table_row = TABLES + seq * stride_ts
        for start in range(0, end, TILE_N):
            pos = start + tl.arange(0, TILE_N)
            pos_ok = pos < end
            block = tl.load(table_row + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
            k_row = block * stride_kb + (pos % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
            v_row = block * stride_vb + (pos % BLOCK_SIZE) * stride_vt + kv_head * stride_vh
            kv_mask = pos_ok[:, None] & dim_ok[None, :]
            k = tl.load(K + k_row[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(q.dtype)
            v = tl.load(V + v_row[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(q.dtype)
            visible = pos_ok[None, :] & (pos[None, :] <= q_pos[:, None])
            m_i, l_i, acc = attend_tile(q, k, v, visible, m_i, l_i, acc, scale_log2e, IEEE_DOT)
        out = acc / l_i[:, None]
        if FP8:
            out = out * tl.load(V_SCALE + kv_head)
        tl.store(OUT + (q_start + tok)[:, None] * stride_ot + heads[:, None] * stride_oh
                 + dims[None, :], out.to(OUT.dtype.element_ty),
                 mask=row_ok[:, None] & dim_ok[None, :])


def default_rows(head_dim: int, dtype: torch.dtype, device: torch.device) -> int:
    """Query rows (tokens x heads of a group) per program."""
    if device.type != "cuda" or head_dim > 128 or dtype == torch.float32:
        return 64
    return 128


def triton_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_lens, scale,
                         k_scale=None, v_scale=None, *, rows: int | None = None,
                         tile_n: int | None = None, num_warps: int | None = None,
                         num_stages: int = 2):
    """Paged prefill; arguments as ``pagebench.kernels.paged_prefill`` (already validated; an
    fp8 cache's scales as float32 tensors ``[num_kv_heads]``, converted and applied as in the
    decode kernel).

    ``rows``: query rows per program (rounded up to a power of two >= 16 and >= the group; a
    program takes ``rows // group`` queries of one sequence with all ``group`` heads of a KV
    head);
    ``tile_n``: keys per tile. Nothing is read back to the host, so a call can be captured in
    a CUDA graph.
    """
    total, q_heads, head_dim = q.shape
    num_seqs = query_lens.shape[0]
    _, block_size, kv_heads, _ = k_cache.shape
    group = q_heads // kv_heads
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    if total == 0 or num_seqs == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    seq_lens = seq_lens if seq_lens.is_contiguous() else seq_lens.contiguous()
    if rows is None:  # no wider than the mean chunk needs: short chunks would waste rows
        rows = min(default_rows(head_dim, q.dtype, q.device), ceil_div(total, num_seqs) * group)
    rows = max(16, next_pow2(max(rows, group)))
    tokens = rows // group
    tile_n = tile_n or default_tile_n(head_dim, q.dtype)
    q_lens = query_lens.to(torch.int32).contiguous()  # the kernel reads lengths at unit stride
    q_ends = torch.cumsum(q_lens, 0, dtype=torch.int32)
    tile_ends = torch.cumsum((q_lens + (tokens - 1)) // tokens, 0, dtype=torch.int32)
    # sum(ceil(len / tokens)) <= total // tokens + num_seqs: a grid sized without a device sync
    _prefill_kernel[(total // tokens + num_seqs, kv_heads)](
        q, k_cache, v_cache, tables, seq_lens, q_lens, q_ends, tile_ends, out,
        q_lens if k_scale is None else k_scale, q_lens if v_scale is None else v_scale,
        num_seqs, scale * 1.4426950408889634,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, TOKENS=tokens, ROWS=rows, BLOCK_SIZE=block_size, TILE_N=tile_n,
        HEAD_DIM=head_dim, DIM_PAD=max(16, next_pow2(head_dim)),
        IEEE_DOT=q.dtype == torch.float32 or (INTERPRETED and q.dtype == torch.bfloat16),
        FP8=is_fp8(k_cache.dtype),
        num_warps=num_warps or (8 if rows >= 128 else 4), num_stages=num_stages)
    return out
