"""H200 experiment: a warp-specialised Hopper paged prefill in Gluon (Triton 3.6), timed against
the package's Triton kernel and SDPA; not part of the package (it lost at 8 x 512, the point it
was written for: docs/kernels.md, "A warp-specialised Gluon prefill").

    PYTHONPATH=. python3 scripts/gluon_prefill_sm90.py          # float64 checks, H100/H200
    PYTHONPATH=. python3 scripts/h200_prefill_ab.py --out $OUT --bf16-only \
        --copy scripts/gluon_prefill_sm90.py [--copy-launch stages=2 ...]

A persistent grid (``ctas_per_sm`` programs per SM; each serves virtual programs p, p + grid,
..). A loader warp copies each K/V page of a tile with the tensor memory accelerator (one copy
per page, from the block table, into a ring of ``stages`` shared-memory buffers, signalled by
mbarriers); a consumer warpgroup runs the online softmax on warpgroup MMAs (QK^T and PV from
shared memory, ``block_n`` keys a tile); with ``consumers=2`` two warpgroups take 64 rows each
of a program and read the same stages. A virtual program takes the queries of one sequence
with all heads of a KV head (rows = tokens x group), as the Triton kernel does, numbered from
the last tile so that long walks start first; the next program's block ids, lengths and
queries load while one runs. Slots past the sequence in the last tile are zeroed in shared
memory before the PV MMA (their P is 0, but 0 x NaN is NaN). ``triton_paged_prefill`` is the
entry ``--copy`` calls: this kernel where ``supports`` holds, else the package's.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from pagebench.kernels import triton_prefill as _triton
from pagebench.kernels.triton_decode import next_pow2


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _lengths(Q_LENS, SEQ_LENS, num_seqs, TOKENS: gl.constexpr, SCAN: gl.constexpr,
             NW: gl.constexpr):
    """Every sequence's query and total lengths, query tiles, and tiles up to and including
    it: loaded once per program (``SCAN`` >= the sequences)."""
    # every warp holds all SCAN lengths (the layout repeats across the warps), so the sums
    # over them are shuffles within a warp, with no barrier between the warps
    layout: gl.constexpr = gl.BlockedLayout([SCAN // 32], [32], [NW], [0])
    idx = gl.arange(0, SCAN, layout)
    listed = idx < num_seqs
    lens = gl.load(Q_LENS + idx, mask=listed, other=0)
    totals = gl.load(SEQ_LENS + idx, mask=listed, other=0).to(gl.int32)
    tiles = (lens + (TOKENS - 1)) // TOKENS
    return lens, totals, tiles, gl.associative_scan(tiles, 0, _add)


@gluon.jit
def _tile_info(lengths, v, n_virtual, KV_HEADS: gl.constexpr, TOKENS: gl.constexpr,
               BLOCK_N: gl.constexpr):
    """Virtual program ``v``: its KV head, sequence, queries and number of key tiles (0 past
    the last query tile). Numbered from the last tile, so the longest walks come first."""
    lens, totals, tiles, through = lengths
    kv_head = v % KV_HEADS
    tile = (n_virtual - 1 - v) // KV_HEADS
    before = through <= tile
    mine = (through - tiles <= tile) & (tile < through)
    seq = gl.sum(before.to(gl.int32), 0)
    q_start = gl.sum(gl.where(before, lens, 0), 0)
    first = (tile - gl.sum(gl.where(before, tiles, 0), 0)) * TOKENS
    q_len = gl.sum(gl.where(mine, lens, 0), 0)
    seq_len = gl.sum(gl.where(mine, totals, 0), 0)
    end = seq_len - q_len + gl.minimum(first + TOKENS, q_len)
    return kv_head, seq, q_start, q_len, seq_len, first, (end + BLOCK_N - 1) // BLOCK_N


@gluon.jit
def _zero_rows_from(buf, keep, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, NW: gl.constexpr):
    """Rows ``keep ..`` of a shared-memory tile set to zero (slots past the sequence: P is 0
    there, but 0 x NaN is NaN in the MMA)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    for r in gl.static_range(0, ROWS, 32):
        part = buf.slice(r, 32)
        vals = part.load(layout)
        rows = r + gl.arange(0, 32, gl.SliceLayout(1, layout))
        part.store(gl.where((rows < keep)[:, None], vals, gl.zeros_like(vals)))
    fence_async_shared()


@gluon.jit
def _tile_rows(table_row, j, n_tiles, max_pages, copies, BLOCK_SIZE: gl.constexpr,
               BLOCK_N: gl.constexpr, PAGE_ROWS: gl.constexpr):
    """The cache rows where tile ``j``'s copies start, one vector load of their block ids
    (none for a program with no tiles: its table row may not exist)."""
    pos = j * BLOCK_N + copies * PAGE_ROWS
    page = gl.minimum(pos // BLOCK_SIZE, max_pages - 1)  # inside the table row
    ids = gl.load(table_row + page, mask=(copies < BLOCK_N // PAGE_ROWS) & (j < n_tiles),
                  other=0)
    return ids.to(gl.int32) * BLOCK_SIZE + pos % BLOCK_SIZE


@gluon.jit
def _loader(k_desc, v_desc, TABLES, SEQ_LENS, Q_LENS, k_bufs, v_bufs, ready, empty, num_seqs,
            n_virtual, stride_ts, max_pages, KV_HEADS: gl.constexpr, TOKENS: gl.constexpr,
            BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
            STAGES: gl.constexpr, SCAN: gl.constexpr):
    PAGE_ROWS: gl.constexpr = k_desc.block_type.shape[0]
    COPIES: gl.constexpr = BLOCK_N // PAGE_ROWS
    TILE_BYTES: gl.constexpr = 2 * BLOCK_N * HEAD_DIM * k_desc.dtype.primitive_bitwidth // 8
    lanes: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    copies = gl.arange(0, 32, lanes)
    lengths = _lengths(Q_LENS, SEQ_LENS, num_seqs, TOKENS, SCAN, 1)
    it = 0
    kv_head, seq, _, _, _, _, n_tiles = _tile_info(lengths, gl.program_id(0), n_virtual,
                                                   KV_HEADS, TOKENS, BLOCK_N)
    rows = _tile_rows(TABLES + seq * stride_ts, 0, n_tiles, max_pages, copies, BLOCK_SIZE,
                      BLOCK_N, PAGE_ROWS)
    for v in range(gl.program_id(0), n_virtual, gl.num_programs(0)):
        # the next program's first block ids load while this one's copies go out
        n_kv_head, n_seq, _, _, _, _, n_n_tiles = _tile_info(lengths, v + gl.num_programs(0),
                                                             n_virtual, KV_HEADS, TOKENS, BLOCK_N)
        n_rows = _tile_rows(TABLES + n_seq * stride_ts, 0, n_n_tiles, max_pages, copies,
                            BLOCK_SIZE, BLOCK_N, PAGE_ROWS)
        table_row = TABLES + seq * stride_ts
        col = kv_head * HEAD_DIM
        for j in range(n_tiles):
            # the next tile's block ids while this tile's copies go out
            rows_next = _tile_rows(table_row, j + 1, n_tiles, max_pages, copies, BLOCK_SIZE,
                                   BLOCK_N, PAGE_ROWS)
            stage = it % STAGES
            mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, TILE_BYTES)
            k_buf = k_bufs.index(stage)
            v_buf = v_bufs.index(stage)
            for c in gl.static_range(COPIES):
                row = gl.sum(gl.where(copies == c, rows, 0), 0)
                tma.async_copy_global_to_shared(k_desc, [row, col], bar,
                                                k_buf.slice(c * PAGE_ROWS, PAGE_ROWS))
                tma.async_copy_global_to_shared(v_desc, [row, col], bar,
                                                v_buf.slice(c * PAGE_ROWS, PAGE_ROWS))
            rows = rows_next
            it += 1
        kv_head, seq, n_tiles, rows = n_kv_head, n_seq, n_n_tiles, n_rows


@gluon.jit
def _softmax_tile(s, m_i, l_i, start, q_pos, keys, first_pos, seq_len, scale_log2e,
                  dtype: gl.constexpr, BLOCK_N: gl.constexpr, p_layout: gl.constexpr):
    """One key tile of the online softmax (log2 domain): P as the PV MMA's operand, the
    rescale of the output, and the running max and sum."""
    if start + BLOCK_N > first_pos + 1:  # across the diagonal (or the sequence's end)
        pos = start + keys
        seen = (pos[None, :] <= q_pos[:, None]) & (pos < seq_len)[None, :]
        s = gl.where(seen, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * scale_log2e)
    p = gl.exp2(s * scale_log2e - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return gl.convert_layout(p.to(dtype), p_layout), alpha, m_new, l_i


@gluon.jit
def _q_rows(Q, q_start, q_len, first, kv_head, rows, dims, stride_qt, stride_qh,
            GROUP: gl.constexpr, TOKENS: gl.constexpr):
    """A program's query rows (queries x the group's heads; 0 past its queries, and for a
    program past the last, whose ``first`` is negative)."""
    tok = first + rows // GROUP
    row_ok = (rows < TOKENS * GROUP) & (tok < q_len) & (tok >= 0)
    return gl.load(Q + (q_start + tok).to(gl.int64)[:, None] * stride_qt
                   + (kv_head * GROUP + rows % GROUP)[:, None] * stride_qh + dims[None, :],
                   mask=row_ok[:, None], other=0.0)


@gluon.jit
def _consumer(Q, OUT, SEQ_LENS, Q_LENS, q_smems, k_bufs, v_bufs, ready, empty, tok, num_seqs,
              n_virtual, scale_log2e, stride_qt, stride_qh, stride_ot, stride_oh,
              KV_HEADS: gl.constexpr, GROUP: gl.constexpr, TOKENS: gl.constexpr,
              BM: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
              STAGES: gl.constexpr, SCAN: gl.constexpr, NW: gl.constexpr, HALF: gl.constexpr,
              OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, LATE_Q: gl.constexpr):
    """Rows ``HALF * BM ..`` of every program (one warpgroup; with two, each takes half the
    rows and both read the same K/V stages)."""
    q_smem = q_smems.index(HALF)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    dtype: gl.constexpr = Q.dtype.element_ty
    rows = HALF * BM + gl.arange(0, BM, gl.SliceLayout(1, ld_layout))
    dims = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, ld_layout))
    s_rows = HALF * BM + gl.arange(0, BM, gl.SliceLayout(1, s_layout))
    keys = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    o_rows = HALF * BM + gl.arange(0, BM, gl.SliceLayout(1, o_layout))
    o_dims = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
    s_zero = gl.zeros([BM, BLOCK_N], gl.float32, s_layout)
    lengths = _lengths(Q_LENS, SEQ_LENS, num_seqs, TOKENS, SCAN, NW)
    it = 0
    turn = 0  # MMA groups this consumer has issued (ping-pong)
    kv_head, _, q_start, q_len, seq_len, first, n_tiles = _tile_info(
        lengths, gl.program_id(0), n_virtual, KV_HEADS, TOKENS, BLOCK_N)
    q = _q_rows(Q, q_start, q_len, first, kv_head, rows, dims, stride_qt, stride_qh, GROUP,
                TOKENS)
    for v in range(gl.program_id(0), n_virtual, gl.num_programs(0)):
        # the next program's lengths and queries load while this one runs
        nxt = v + gl.num_programs(0)
        n_kv_head, _, n_q_start, n_q_len, n_seq_len, n_first, n_n_tiles = _tile_info(
            lengths, nxt, n_virtual, KV_HEADS, TOKENS, BLOCK_N)
        if not LATE_Q:  # in registers through the walk
            n_q = _q_rows(Q, n_q_start, n_q_len, n_first, n_kv_head, rows, dims, stride_qt,
                          stride_qh, GROUP, TOKENS)
        if n_tiles > 0:
            q_smem.store(q)
            fence_async_shared()
            q_pos = seq_len - q_len + first + s_rows // GROUP
            first_pos = seq_len - q_len + first
            m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
            l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
            acc = gl.zeros([BM, HEAD_DIM], gl.float32, o_layout)
            if OVERLAP:
                # FlashAttention-3's order within the warpgroup: tile j's QK^T and tile
                # j-1's PV issued together, j's softmax while that PV runs
                stage = it % STAGES
                mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
                if BLOCK_N > seq_len:
                    _zero_rows_from(v_bufs.index(stage), seq_len, BLOCK_N, HEAD_DIM, NW)
                if PINGPONG:
                    mbarrier.wait(tok.index(HALF), turn & 1)
                s = warpgroup_mma(q_smem, k_bufs.index(stage).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
                if PINGPONG:
                    mbarrier.arrive(tok.index(1 - HALF), count=1)
                    turn += 1
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
                p16, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, 0, q_pos, keys, first_pos,
                                                     seq_len, scale_log2e, dtype, BLOCK_N,
                                                     p_layout)
                prev = stage
                it += 1
                for j in range(1, n_tiles):
                    stage = it % STAGES
                    mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
                    start = j * BLOCK_N
                    if start + BLOCK_N > seq_len:
                        _zero_rows_from(v_bufs.index(stage), seq_len - start, BLOCK_N,
                                        HEAD_DIM, NW)
                    if PINGPONG:
                        mbarrier.wait(tok.index(HALF), turn & 1)
                    s = warpgroup_mma(q_smem, k_bufs.index(stage).permute((1, 0)), s_zero,
                                      use_acc=False, is_async=True)
                    acc = warpgroup_mma(p16, v_bufs.index(prev), acc, is_async=True)
                    if PINGPONG:
                        mbarrier.arrive(tok.index(1 - HALF), count=1)
                        turn += 1
                    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
                    p16, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, start, q_pos, keys,
                                                         first_pos, seq_len, scale_log2e,
                                                         dtype, BLOCK_N, p_layout)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                    mbarrier.arrive(empty.index(prev), count=1)
                    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                    prev = stage
                    it += 1
                if PINGPONG:
                    mbarrier.wait(tok.index(HALF), turn & 1)
                acc = warpgroup_mma(p16, v_bufs.index(prev), acc, is_async=True)
                if PINGPONG:
                    mbarrier.arrive(tok.index(1 - HALF), count=1)
                    turn += 1
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(empty.index(prev), count=1)
            else:
              for j in range(n_tiles):
                stage = it % STAGES
                mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
                k_buf = k_bufs.index(stage)
                v_buf = v_bufs.index(stage)
                start = j * BLOCK_N
                if start + BLOCK_N > seq_len:
                    _zero_rows_from(v_buf, seq_len - start, BLOCK_N, HEAD_DIM, NW)
                s = warpgroup_mma(q_smem, k_buf.permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
                p16, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, start, q_pos, keys,
                                                     first_pos, seq_len, scale_log2e, dtype,
                                                     BLOCK_N, p_layout)
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                acc = warpgroup_mma(p16, v_buf, acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(empty.index(stage), count=1)
                it += 1
            o_tok = first + o_rows // GROUP
            o_ok = (o_rows < TOKENS * GROUP) & (o_tok < q_len)
            out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
            gl.store(OUT + (q_start + o_tok).to(gl.int64)[:, None] * stride_ot
                     + (kv_head * GROUP + o_rows % GROUP)[:, None] * stride_oh
                     + o_dims[None, :], out.to(dtype), mask=o_ok[:, None])
        if LATE_Q:  # after the walk: its registers are free again
            n_q = _q_rows(Q, n_q_start, n_q_len, n_first, n_kv_head, rows, dims, stride_qt,
                          stride_qh, GROUP, TOKENS)
        kv_head, q_start, q_len, seq_len, first, n_tiles, q = (
            n_kv_head, n_q_start, n_q_len, n_seq_len, n_first, n_n_tiles, n_q)


@gluon.jit
def _prefill_sm90_kernel(
    Q, k_desc, v_desc, TABLES, SEQ_LENS, Q_LENS, OUT,
    num_seqs, n_virtual, max_pages, scale_log2e,
    stride_qt, stride_qh, stride_ts, stride_ot, stride_oh,
    KV_HEADS: gl.constexpr, GROUP: gl.constexpr, TOKENS: gl.constexpr, BM: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr, SCAN: gl.constexpr, Q_SMEM: gl.constexpr,
    CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
    OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, LATE_Q: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Persistent: program p serves virtual programs p, p + grid, .. < n_virtual."""
    q_smems = gl.allocate_shared_memory(Q.dtype.element_ty, [CONSUMERS, BM, HEAD_DIM], Q_SMEM)
    kv_layout: gl.constexpr = k_desc.layout
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONSUMERS)  # each consumer frees a stage
    # ping-pong: consumer h issues its MMAs when tok[h] completes a phase, then completes one of
    # tok[1 - h]'s, so the two take turns at the tensor cores (consumer 0 first)
    tok = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(tok.index(0), count=1)
    mbarrier.init(tok.index(1), count=1)
    if PINGPONG:
        mbarrier.arrive(tok.index(0), count=1)

    if CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer, (Q, OUT, SEQ_LENS, Q_LENS, q_smems, k_bufs, v_bufs, ready, empty, tok,
                         num_seqs, n_virtual, scale_log2e, stride_qt, stride_qh, stride_ot,
                         stride_oh, KV_HEADS, GROUP, TOKENS, BM, BLOCK_N, HEAD_DIM, STAGES, SCAN,
                         num_warps, 0, OVERLAP, PINGPONG, LATE_Q)),
            (_consumer, (Q, OUT, SEQ_LENS, Q_LENS, q_smems, k_bufs, v_bufs, ready, empty, tok,
                         num_seqs, n_virtual, scale_log2e, stride_qt, stride_qh, stride_ot,
                         stride_oh, KV_HEADS, GROUP, TOKENS, BM, BLOCK_N, HEAD_DIM, STAGES, SCAN,
                         num_warps, 1, OVERLAP, PINGPONG, LATE_Q)),
            (_loader, (k_desc, v_desc, TABLES, SEQ_LENS, Q_LENS, k_bufs, v_bufs, ready, empty,
                       num_seqs, n_virtual, stride_ts, max_pages, KV_HEADS, TOKENS, BLOCK_SIZE,
                       BLOCK_N, HEAD_DIM, STAGES, SCAN))], [num_warps, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (Q, OUT, SEQ_LENS, Q_LENS, q_smems, k_bufs, v_bufs, ready, empty, tok,
                         num_seqs, n_virtual, scale_log2e, stride_qt, stride_qh, stride_ot,
                         stride_oh, KV_HEADS, GROUP, TOKENS, BM, BLOCK_N, HEAD_DIM, STAGES, SCAN,
                         num_warps, 0, OVERLAP, PINGPONG, LATE_Q)),
            (_loader, (k_desc, v_desc, TABLES, SEQ_LENS, Q_LENS, k_bufs, v_bufs, ready, empty,
                       num_seqs, n_virtual, stride_ts, max_pages, KV_HEADS, TOKENS, BLOCK_SIZE,
                       BLOCK_N, HEAD_DIM, STAGES, SCAN))], [1], [LOADER_REGS])


def supports(q, k_cache, v_cache) -> bool:
    """Inputs this kernel takes: an sm_90 GPU, bf16/fp16 caches of q's dtype, head dim 64 or
    128, blocks of 8+ tokens, caches whose (block, slot) rows are one strided 2-D matrix."""
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    _, block_size, kv_heads, head_dim = k_cache.shape
    if q.dtype not in (torch.bfloat16, torch.float16) or k_cache.dtype != q.dtype:
        return False
    if head_dim not in (64, 128) or block_size < 8 or block_size & (block_size - 1):
        return False
    for c in (k_cache, v_cache):
        if c.stride(3) != 1 or c.stride(2) != head_dim or c.stride(0) != block_size * c.stride(1):
            return False
        if c.data_ptr() % 16 or (c.stride(1) * c.element_size()) % 16:
            return False
    return True


def _rows_view(cache):
    num_blocks, block_size, kv_heads, head_dim = cache.shape
    return cache.as_strided((num_blocks * block_size, kv_heads * head_dim), (cache.stride(1), 1))


def gluon_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_lens, scale, *,
                        block_n=64, stages=3, num_warps=4, loader_regs=56, maxnreg=128,
                        ctas_per_sm=2, consumers=1, consumer_regs=224, overlap=0,
                        pingpong=0, late_q=0):
    total, q_heads, head_dim = q.shape
    num_seqs = query_lens.shape[0]
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    group = q_heads // kv_heads
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    if total == 0 or num_seqs == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    bm = 16 * num_warps  # rows per consumer warpgroup
    tokens = consumers * bm // group
    page_rows = min(block_size, block_n)
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([page_rows, head_dim], gdt)
    descs = [TensorDescriptor(view, list(view.shape), list(view.stride()), [page_rows, head_dim],
                              layout) for view in (_rows_view(k_cache), _rows_view(v_cache))]
    q_lens = query_lens.to(torch.int32).contiguous()
    seq_lens = seq_lens if seq_lens.is_contiguous() else seq_lens.contiguous()
    n_virtual = (total // tokens + num_seqs) * kv_heads  # an upper bound on the query tiles
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
    grid = (min(n_virtual, ctas_per_sm * sms),)
    _prefill_sm90_kernel[grid](
        q, *descs, tables, seq_lens, q_lens, out,
        num_seqs, n_virtual, tables.shape[1], scale * 1.4426950408889634,
        q.stride(0), q.stride(1), tables.stride(0), out.stride(0), out.stride(1),
        KV_HEADS=kv_heads, GROUP=group, TOKENS=tokens, BM=bm, BLOCK_SIZE=block_size,
        BLOCK_N=block_n, HEAD_DIM=head_dim, STAGES=stages,
        SCAN=max(32 * num_warps, next_pow2(num_seqs)),
        Q_SMEM=gl.NVMMASharedLayout.get_default_for([bm, head_dim], gdt), CONSUMERS=consumers,
        CONSUMER_REGS=consumer_regs,
        LOADER_REGS=loader_regs, OVERLAP=bool(overlap or pingpong),
        PINGPONG=bool(pingpong), LATE_Q=bool(late_q), num_warps=num_warps,
        **({} if maxnreg is None else {"maxnreg": maxnreg}))
    return out


def triton_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_lens, scale,
                         k_scale=None, v_scale=None, **opts):
    """For ``scripts/h200_prefill_ab.py --copy``: this kernel where it applies, else the
    package's Triton kernel."""
    if k_scale is None and query_lens.shape[0] <= 1024 and supports(q, k_cache, v_cache):
        return gluon_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_lens,
                                   scale, **opts)
    return _triton.triton_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens,
                                        query_lens, scale, k_scale, v_scale)


# (shape, block size, dtype, table dtype, sequence lengths, query lengths): ragged, NaN-poisoned
CHECKS = [((32, 8, 128), 16, torch.bfloat16, torch.int32, [1, 15, 16, 17, 300, 1000, 513, 64],
           [1, 15, 3, 17, 300, 0, 100, 64]),
          ((32, 8, 128), 16, torch.bfloat16, torch.int64, [512] * 4 + [100, 37],
           [512, 512, 500, 1, 100, 37]),
          ((32, 8, 128), 128, torch.float16, torch.int32, [700, 129, 5], [700, 60, 5]),
          ((32, 8, 128), 32, torch.bfloat16, torch.int32, [333, 64], [333, 10]),
          ((14, 2, 64), 16, torch.bfloat16, torch.int32, [1, 15, 16, 17, 300, 1000, 513, 64],
           [1, 15, 3, 17, 300, 0, 100, 64]),
          ((14, 2, 64), 64, torch.bfloat16, torch.int64, [2048, 77], [2048, 77])]
TWO = dict(consumers=2, ctas_per_sm=1, maxnreg=168, loader_regs=40, consumer_regs=224)
PING = dict(TWO, loader_regs=56, pingpong=1, late_q=1)  # 40: the loader spills
LAUNCHES = [{}, dict(overlap=1), dict(PING, block_n=128, stages=2),
            dict(PING, block_n=128, stages=3), dict(PING, block_n=64, stages=4),
            dict(PING, block_n=128, stages=2, pingpong=0, overlap=1)]


def main() -> None:
    """Each launch against float64 on every check input; prints the worst relative error."""
    import dataclasses

    from pagebench.kernels.fixtures import make_paged_inputs, relative_error
    from pagebench.kernels.reference import reference_prefill

    gen = torch.Generator().manual_seed(3)
    worst = {}
    for shape, block_size, dtype, table_dtype, lens, qlens in CHECKS:
        inp = make_paged_inputs(lens, *shape, block_size, dtype, "cuda", seed=5)
        q = torch.randn(sum(qlens), shape[0], shape[2], generator=gen).to("cuda", dtype)
        inp = dataclasses.replace(inp, q=q, block_tables=inp.block_tables.to(table_dtype),
                                  query_lens=torch.tensor(qlens, dtype=torch.int32,
                                                          device="cuda"))
        assert supports(inp.q, inp.k_cache, inp.v_cache), (shape, block_size)
        ref = reference_prefill(*inp.args(), shape[2] ** -0.5)
        for launch in LAUNCHES:
            err = relative_error(gluon_paged_prefill(*inp.args(), shape[2] ** -0.5, **launch),
                                 ref)
            key = ",".join(f"{k}={v}" for k, v in launch.items()) or "default"
            worst[key] = max(worst.get(key, 0.0), err)
            print(f"{shape} block {block_size} {dtype} {table_dtype} {key}: {err:.2e}")
    print("worst:", {k: f"{v:.2e}" for k, v in worst.items()})
    assert max(worst.values()) < 5e-3


if __name__ == "__main__":
    main()
