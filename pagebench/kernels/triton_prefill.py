"""Triton paged prefill: causal attention for a chunk of queries over everything cached before it.

A program takes ``TOKENS`` consecutive queries of one sequence and the whole group of query
heads that share one KV head, as ``TOKENS x GROUP`` rows of one matrix, so each K/V tile read
from the cache serves every head of the group (as the decode kernel does). Query ``i`` of a
chunk of ``query_len`` sits at position ``seq_len - query_len + i`` and sees keys ``0 ..`` that
position; the program walks the keys up to its last query's position in tiles of ``TILE_N``
tokens through the block table (any block size), with the online softmax in fp32 (log2 domain,
the softmax scale folded into the exponent).

Tiles wholly above the diagonal are not visited, and only the tiles across it are masked per
element. The walk is one loop (its pipeline filled once; the tiles every row sees whole skip
the causal mask by a uniform branch) or two, as FlashAttention's causal loop (those tiles
first, with no mask at all, then the diagonal ones). Each tile's block ids can be loaded a tile
ahead, so its K/V loads depend on no load of their own iteration and Triton pipelines them
``num_stages - 1`` tiles ahead. Where a tile holds whole blocks, each key's block within the
tile and slot within its block are computed once, before the walk. With ``lazy_rescale`` a
row's running max moves only when a tile's passes it by more than 2^8 (FlashAttention-4's
conditional rescaling), and a warp whose rows all kept theirs skips the output's rescale (a
vote, no barrier). ``prefill_launch`` picks these per regime (docs/kernels.md).

The grid is one dimension: program ``p`` serves KV head ``p % kv_heads`` and query tile
``last - p // kv_heads``, where the query tiles of all sequences are numbered one after another
(each program finds its sequence by scanning the query lengths). Numbering from the last tile
means the programs with the most keys to walk (the ends of long chunks) start first and the
short ones fill in behind them, rather than leaving a tail of long ones. Or (``round_robin``)
round ``r`` of the grid takes the ``r``-th tile from the last of every sequence in turn, so
that the long walks of all sequences start before the short ones of any; its rounds are as
many as the longest chunk can have tiles, so sequences with fewer leave empty programs. Either
grid is sized from the packed query count and the table's width alone, so nothing is read
back to the host. With many sequences a small kernel launched first lists each query tile's
sequence and offsets (``work_list``), and the prefill's programs read their tile's record
rather than each scanning the lengths.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from pagebench.config import ceil_div
from pagebench.kernels.quant import is_fp8
from pagebench.kernels.triton_decode import default_tile_n
from pagebench.kernels.reference import LOG2E
from pagebench.kernels.triton_runtime import INTERPRETED, launch, next_pow2
from pagebench.kernels.validate import element_span

# isort: split
# after triton_runtime, whose import set TRITON_INTERPRET where Triton needs it
import triton
import triton.language as tl

INT32_SPAN = 2**31  # element offsets at or beyond this need 64-bit index arithmetic
MAX_SCAN = 1024  # query lengths a program scans per step while finding its sequence
MIN_SCAN = 32  # the narrowest scan, but for one sequence without the re-read (_scan_width)
LONG_CHUNK = 2048  # queries per sequence from which a program takes 128 query rows
LONG_CHUNKS = 1024  # ... where there are several sequences
WORK_LIST_SEQS = 64  # sequences from which short-walk launches take a work list
WORK_LIST_SEQS_LONGER = 16  # ... from which those of walks over 4 tiles take one
SHORT_WALK_TILES = 16  # 32-key tiles in a table short enough for the many-program launch


@triton.jit
def _table_entries(table_row, start, pos, page, end, BLOCK_SIZE: tl.constexpr,
                   ALIGNED: tl.constexpr, MASKED: tl.constexpr):
    """The block ids of the key positions ``pos = start + offs`` (``MASKED``: 0 at or beyond
    ``end``); ``ALIGNED``: ``start`` is a multiple of the block size and ``page = offs //
    BLOCK_SIZE``, computed once outside the walk."""
    idx = start // BLOCK_SIZE + page if ALIGNED else pos // BLOCK_SIZE
    if MASKED:
        return tl.load(table_row + idx, mask=pos < end, other=0)
    return tl.load(table_row + idx)


@triton.jit
def _in_page(pos, stride_kt, stride_vt, k_head, v_head, BLOCK_SIZE: tl.constexpr):
    """The K and V element offsets of the key positions ``pos`` within their blocks."""
    slot = pos % BLOCK_SIZE
    return slot * stride_kt + k_head, slot * stride_vt + v_head


@triton.jit
def _kv_rows(K, V, block, pos, end, dims, k_in, v_in, stride_kb, stride_vb,
             HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, MASKED: tl.constexpr,
             WIDE_INDEX: tl.constexpr):
    """The K and V rows of the key positions ``pos``: in blocks ``block`` at offsets ``k_in``,
    ``v_in`` within them."""
    if WIDE_INDEX:
        block = block.to(tl.int64)
    k_ptr = K + (block * stride_kb + k_in)[:, None] + dims[None, :]
    v_ptr = V + (block * stride_vb + v_in)[:, None] + dims[None, :]
    if MASKED:
        kv_mask = (pos < end)[:, None] & (dims < HEAD_DIM)[None, :]
        k = tl.load(k_ptr, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr, mask=kv_mask, other=0.0)
    elif DIM_PAD != HEAD_DIM:
        dim_ok = (dims < HEAD_DIM)[None, :]
        k = tl.load(k_ptr, mask=dim_ok, other=0.0)
        v = tl.load(v_ptr, mask=dim_ok, other=0.0)
    else:
        k = tl.load(k_ptr)
        v = tl.load(v_ptr)
    return k, v


@triton.jit
def _scores(q, k, IEEE_DOT: tl.constexpr):
    """``q @ k^T`` in fp32. ``IEEE_DOT``: fp32 inputs (or bf16 upcast when interpreted) take
    exact fp32 products."""
    if IEEE_DOT:
        return tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    return tl.dot(q, tl.trans(k))


# The lazy rescale's multiply, skipped by a warp whose rows all kept their running max. Operands:
# the products $0.. (tied to the accumulator $PACK..), the rows' alpha $2*PACK.., their flags
# (1: the max moved) $3*PACK..; a warp votes on the flags of the first four elements of each
# thread's pack, which hold both of its rows in a Hopper (wgmma) accumulator (PTX's fragment
# order: two columns of one row, then two of the row eight below).
LAZY_PACK = 32
_LAZY_PACK = tl.constexpr(LAZY_PACK)
_RESCALE_ASM = tl.constexpr(
    f"{{ .reg .pred p, q; setp.ne.s32 p, ${3 * LAZY_PACK}, 0; "
    + "".join(f"setp.ne.s32 q, ${3 * LAZY_PACK + i}, 0; or.pred p, p, q; " for i in (1, 2, 3))
    + "vote.sync.any.pred p, p, -1; @!p bra SKIP; "
    + " ".join(f"mul.f32 ${i}, ${i + LAZY_PACK}, ${i + 2 * LAZY_PACK};" for i in range(LAZY_PACK))
    + " SKIP: }")
_RESCALE_CONSTRAINTS = tl.constexpr(",".join(
    ["=f"] * LAZY_PACK + [str(i) for i in range(LAZY_PACK)] + ["f"] * LAZY_PACK
    + ["r"] * LAZY_PACK))


@triton.jit
def _rescaled(acc, alpha, moved, VOTE: tl.constexpr):
    """``acc * alpha[:, None]``; ``VOTE`` (a Hopper wgmma accumulator): only in the warps where
    some row's ``moved`` is set (elsewhere alpha is 1)."""
    if VOTE:
        return tl.inline_asm_elementwise(_RESCALE_ASM, _RESCALE_CONSTRAINTS,
                                         [acc, alpha[:, None] + tl.zeros_like(acc),
                                          moved.to(tl.int32)[:, None]
                                          + tl.zeros(acc.shape, tl.int32)],
                                         dtype=tl.float32, is_pure=True, pack=_LAZY_PACK)
    return acc * alpha[:, None]


@triton.jit
def _softmax_step(s, v, m_i, l_i, acc, scale_log2e, IEEE_DOT: tl.constexpr,
                  LAZY: tl.constexpr, VOTE: tl.constexpr):
    """One key tile of the online softmax: running max ``m_i`` and sum ``l_i`` (log2 domain)
    and the output ``acc``, updated with the scores ``s`` (masked ones -inf) and values
    ``v``. The scale (positive) goes into the exponent's multiply-add; -inf stays -inf.
    ``LAZY``: a row's max moves only when the tile's passes it by more than 8 (so p <= 2^8,
    well within fp32 and bf16), and the output is rescaled only then (``_rescaled``)."""
    if LAZY:
        m_tile = tl.max(s, 1) * scale_log2e
        moved = m_tile > m_i + 8.0  # the first tile: m_i is -inf, every row moves
        m_new = tl.where(moved, m_tile, m_i)
        alpha = tl.where(moved, tl.exp2(m_i - m_new), 1.0)  # (no overflow where it is 1)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2e)
        alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * scale_log2e - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if LAZY:
        acc = _rescaled(acc, alpha, moved, VOTE)
    else:
        acc = acc * alpha[:, None]
    if IEEE_DOT:
        acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def _walk(q, K, V, table_row, lo, hi, full_end, end, q_pos, m_i, l_i, acc, scale_log2e,
          offs, dims, k_head, v_head, stride_kb, stride_kt, stride_vb, stride_vt,
          BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr,
          DIM_PAD: tl.constexpr, MASKED: tl.constexpr, TABLE_AHEAD: tl.constexpr,
          IEEE_DOT: tl.constexpr, WIDE_INDEX: tl.constexpr, LAZY: tl.constexpr,
          VOTE: tl.constexpr):
    """The online softmax over the key tiles ``lo, lo + TILE_N, .. < hi``. Keys at or beyond
    ``end`` are never read. ``MASKED``: loads are masked at ``end`` and tiles from
    ``full_end`` on take the causal mask (before it every row sees every key); otherwise no
    tile is masked. ``TABLE_AHEAD``: each tile's block ids are loaded one tile ahead, so the
    K/V loads depend on no load of their own iteration and the pipeliner can issue them
    ``num_stages - 1`` tiles ahead. Where a tile holds whole blocks (``TILE_N`` a multiple of
    the block size; ``lo`` is one of ``TILE_N``), each key's block within the tile and slot
    within its block are the same every tile, so they are computed once, before the walk."""
    ALIGNED: tl.constexpr = TILE_N % BLOCK_SIZE == 0
    page = offs // BLOCK_SIZE
    if ALIGNED:
        k_in, v_in = _in_page(offs, stride_kt, stride_vt, k_head, v_head, BLOCK_SIZE)
    if TABLE_AHEAD:
        block = _table_entries(table_row, lo, lo + offs, page, end, BLOCK_SIZE, ALIGNED, True)
    for start in range(lo, hi, TILE_N):
        pos = start + offs
        if TABLE_AHEAD:
            block_next = _table_entries(table_row, start + TILE_N, pos + TILE_N, page, end,
                                        BLOCK_SIZE, ALIGNED, True)
        else:
            block = _table_entries(table_row, start, pos, page, end, BLOCK_SIZE, ALIGNED, MASKED)
        if not ALIGNED:
            k_in, v_in = _in_page(pos, stride_kt, stride_vt, k_head, v_head, BLOCK_SIZE)
        k, v = _kv_rows(K, V, block, pos, end, dims, k_in, v_in, stride_kb, stride_vb,
                        HEAD_DIM, DIM_PAD, MASKED, WIDE_INDEX)
        s = _scores(q, k.to(q.dtype), IEEE_DOT)
        if MASKED:
            if start + TILE_N > full_end:
                # (keys at or beyond end are past every query row's position: loaded as zeros,
                # they reach only the padding rows past the chunk, which are never stored)
                s = tl.where(pos[None, :] <= q_pos[:, None], s, float("-inf"))
        m_i, l_i, acc = _softmax_step(s, v.to(q.dtype), m_i, l_i, acc, scale_log2e, IEEE_DOT,
                                      LAZY, VOTE)
        if TABLE_AHEAD:
            block = block_next
    return m_i, l_i, acc


@triton.jit
def _queries_of(Q_LENS, seq, SCAN: tl.constexpr):
    """Sequence ``seq``'s first row in the packed queries and its query count, read again by
    volatile loads (which the compiler does not merge with the reads before the walk)."""
    q_start = 0
    for chunk in range(0, seq, SCAN):
        idx = chunk + tl.arange(0, SCAN)
        q_start += tl.sum(tl.load(Q_LENS + idx, mask=idx < seq, other=0, volatile=True), 0)
    return q_start, tl.load(Q_LENS + seq, volatile=True)


@triton.jit
def _lengths(Q_LENS, SEQ_LENS, chunk, num_seqs, SCAN: tl.constexpr):
    """Sequences ``chunk .. chunk + SCAN - 1``: their indices, query counts and lengths (0 past
    the last), the lengths as int32 whatever the caller's dtype (they are summed into
    loop-carried int32, and fit)."""
    idx = chunk + tl.arange(0, SCAN)
    listed = idx < num_seqs
    lens = tl.load(Q_LENS + idx, mask=listed, other=0)
    return idx, lens, tl.load(SEQ_LENS + idx, mask=listed, other=0).to(tl.int32)


@triton.jit
def _tile_owner(tile, tiles_before, lens, TOKENS: tl.constexpr):
    """With the query tiles numbered one after another over the sequences, ``tiles_before`` of
    them before these sequences (query counts ``lens``): each sequence's tile count, and for
    ``tile`` (a scalar, or a column of tiles: then the flags are a matrix) whether each sequence
    lies wholly before it and whether it holds it."""
    tiles = (lens + (TOKENS - 1)) // TOKENS
    through = tiles_before + tl.cumsum(tiles, 0)  # tiles through each sequence
    return tiles, through <= tile, (through - tiles <= tile) & (tile < through)


@triton.jit
def _counted(before, mine, lens, totals, AXIS: tl.constexpr):
    """Summed over the sequences (``AXIS``): the queries of those ``before``, and the query
    count and length of the one that is ``mine``."""
    return (tl.sum(tl.where(before, lens, 0), AXIS), tl.sum(tl.where(mine, lens, 0), AXIS),
            tl.sum(tl.where(mine, totals, 0), AXIS))


WORK_FIELDS = 8  # int32 per query tile in the work list (five used; 32 bytes a record)
WORK_TILES = 8  # query tiles a program of the work-list kernel describes (one warp)
WORK_WARPS = 1
_WORK_FIELDS = tl.constexpr(WORK_FIELDS)


@triton.jit
def _work_list_kernel(Q_LENS, SEQ_LENS, WORK, num_seqs, TOKENS: tl.constexpr,
                      SCAN: tl.constexpr, BLOCK_T: tl.constexpr):
    """For each query tile (numbered one after another over the sequences): its sequence
    (``num_seqs`` past the last tile), its first query in the chunk, the sequence's first row
    in the packed queries, its query count and its length; the same scan as the prefill's,
    done once for ``BLOCK_T`` tiles rather than by every program (``WORK`` holds ``BLOCK_T``
    records a program)."""
    tile = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    seq = tl.zeros([BLOCK_T], tl.int32)
    tile_start = tl.zeros([BLOCK_T], tl.int32)
    q_start = tl.zeros([BLOCK_T], tl.int32)
    q_len = tl.zeros([BLOCK_T], tl.int32)
    seq_len = tl.zeros([BLOCK_T], tl.int32)
    tiles_before = 0
    for chunk in range(0, num_seqs, SCAN):
        idx, lens, totals = _lengths(Q_LENS, SEQ_LENS, chunk, num_seqs, SCAN)
        tiles, before, mine = _tile_owner(tile[:, None], tiles_before, lens, TOKENS)
        seq += tl.sum(before.to(tl.int32), 1)
        tile_start += tl.sum(tl.where(before, tiles, 0), 1)
        queries_before, count, length = _counted(before, mine, lens, totals, 1)
        q_start += queries_before
        q_len += count
        seq_len += length
        tiles_before += tl.sum(tiles, 0)
    record = WORK + tile * _WORK_FIELDS
    tl.store(record, seq)
    tl.store(record + 1, (tile - tile_start) * TOKENS)
    tl.store(record + 2, q_start)
    tl.store(record + 3, q_len)
    tl.store(record + 4, seq_len)


@triton.jit
def _prefill_kernel(
    Q, K, V, TABLES, SEQ_LENS, Q_LENS, OUT, K_SCALE, V_SCALE, WORK,
    num_seqs, scale_log2e,
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ts, stride_ot, stride_oh,
    KV_HEADS: tl.constexpr, GROUP: tl.constexpr, TOKENS: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr, SCAN: tl.constexpr, ONE_LOOP: tl.constexpr, TABLE_AHEAD: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    FP8: tl.constexpr, WIDE_INDEX: tl.constexpr, ROUND_ROBIN: tl.constexpr, REREAD: tl.constexpr,
    LAZY: tl.constexpr, VOTE: tl.constexpr, WORK_LIST: tl.constexpr,
):
    pid = tl.program_id(0)
    kv_head = pid % KV_HEADS
    if ROUND_ROBIN:  # round r takes the r-th tile from the last of each sequence in turn
        rank = pid // KV_HEADS // num_seqs
        seq = pid // KV_HEADS % num_seqs
    else:
        tile = (tl.num_programs(0) - 1 - pid) // KV_HEADS  # the last tiles (longest walks) first
        seq = 0
    if FP8:  # as in the decode kernel: k_scale folds into the softmax scale
        scale_log2e = scale_log2e * tl.load(K_SCALE + kv_head)
    if WORK_LIST:  # the tile's record, written by _work_list_kernel before this launch
        record = WORK + tile * _WORK_FIELDS
        seq = tl.load(record)
        first = tl.load(record + 1)
        q_start = tl.load(record + 2)
        q_len = tl.load(record + 3)
        seq_len = tl.load(record + 4)
        # every field before the branch (all are >= 0), so that the compiler issues the five
        # loads together instead of sinking four past it: one round trip to L2, not two
        live = (seq < num_seqs) & ((first | q_start | q_len | seq_len) >= 0)
    else:
        # Each program scans the query and sequence lengths itself, SCAN sequences at a time, in
        # one round of loads, for its sequence's query count and length and the queries before it.
        # By sequence, its sequence is the one whose tiles (numbered one after another over the
        # sequences) include this tile: the sequences before it are those whose cumulative tile
        # count is <= tile. (One pass of vector loads instead of prefix sums launched from the
        # host: those were separate kernels, each costing more than this scan on a small prefill.)
        q_start = 0
        tile_start = 0
        tiles_before = 0
        q_len = 0
        seq_len = 0
        for chunk in range(0, num_seqs, SCAN):
            idx, lens, totals = _lengths(Q_LENS, SEQ_LENS, chunk, num_seqs, SCAN)
            if ROUND_ROBIN:
                before = idx < seq
                mine = idx == seq
            else:
                tiles, before, mine = _tile_owner(tile, tiles_before, lens, TOKENS)
                seq += tl.sum(before.to(tl.int32), 0)
                tile_start += tl.sum(tl.where(before, tiles, 0), 0)
                tiles_before += tl.sum(tiles, 0)
            queries_before, count, length = _counted(before, mine, lens, totals, 0)
            q_start += queries_before
            q_len += count
            seq_len += length
        if ROUND_ROBIN:
            local = (q_len + (TOKENS - 1)) // TOKENS - 1 - rank
            live = local >= 0
        else:
            local = tile - tile_start
            live = seq < num_seqs
        first = local * TOKENS
    if live:  # the grid is an upper bound on the tile count: the rest do nothing
        rows = tl.arange(0, ROWS)
        tok = first + rows // GROUP  # query index in the chunk
        heads = kv_head * GROUP + rows % GROUP
        row_ok = (rows < TOKENS * GROUP) & (tok < q_len)
        q_pos = seq_len - q_len + tok  # each row's position in the sequence
        dims = tl.arange(0, DIM_PAD)
        dim_ok = dims < HEAD_DIM
        q_rows = (q_start + tok).to(tl.int64)  # outside the key loop: 64-bit costs nothing here
        q = tl.load(Q + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, DIM_PAD], tl.float32)
        k_head = kv_head * stride_kh
        v_head = kv_head * stride_vh
        if WIDE_INDEX:
            k_head = k_head.to(tl.int64)
            v_head = v_head.to(tl.int64)
        table_row = TABLES + seq * stride_ts
        # every row sees keys up to the first query's position: whole tiles below it unmasked
        first_pos = seq_len - q_len + first
        full_end = (first_pos + 1) // TILE_N * TILE_N
        # keys up to the last query of this tile
        end = seq_len - q_len + tl.minimum(first + TOKENS, q_len)
        offs = tl.arange(0, TILE_N)
        # (key 0 is visible to every row, so each row's running max is finite after the first
        # tile, whichever loop visits it)
        if ONE_LOOP:  # one pipelined walk; only the tiles across the diagonal are masked
            m_i, l_i, acc = _walk(q, K, V, table_row, 0, end, full_end, end, q_pos, m_i, l_i,
                                  acc, scale_log2e, offs, dims, k_head, v_head,
                                  stride_kb, stride_kt, stride_vb, stride_vt,
                                  BLOCK_SIZE, TILE_N, HEAD_DIM, DIM_PAD, True, TABLE_AHEAD,
                                  IEEE_DOT, WIDE_INDEX, LAZY, VOTE)
        else:  # two walks: the unmasked tiles, then those across the diagonal
            m_i, l_i, acc = _walk(q, K, V, table_row, 0, full_end, full_end, end, q_pos, m_i,
                                  l_i, acc, scale_log2e, offs, dims, k_head, v_head,
                                  stride_kb, stride_kt, stride_vb, stride_vt,
                                  BLOCK_SIZE, TILE_N, HEAD_DIM, DIM_PAD, False, TABLE_AHEAD,
                                  IEEE_DOT, WIDE_INDEX, LAZY, VOTE)
            m_i, l_i, acc = _walk(q, K, V, table_row, full_end, end, full_end, end, q_pos, m_i,
                                  l_i, acc, scale_log2e, offs, dims, k_head, v_head,
                                  stride_kb, stride_kt, stride_vb, stride_vt,
                                  BLOCK_SIZE, TILE_N, HEAD_DIM, DIM_PAD, True, TABLE_AHEAD,
                                  IEEE_DOT, WIDE_INDEX, LAZY, VOTE)
        out = acc / l_i[:, None]
        if FP8:
            out = out * tl.load(V_SCALE + kv_head)
        if WORK_LIST:
            # the rows' offsets rebuilt from two scalars kept through the walk, in a form the
            # compiler does not merge with q_rows (which it would then keep, at 14 registers)
            out_tile = OUT + (q_start + first).to(tl.int64) * stride_ot
            in_tile = rows // GROUP
            row_ok = (rows < TOKENS * GROUP) & (in_tile < q_len - first)
            out_ptr = out_tile + in_tile.to(tl.int64)[:, None] * stride_ot
        else:
            if REREAD:  # the rows' offsets read again, not kept through the walk (fewer spills)
                q_start, q_len = _queries_of(Q_LENS, seq, SCAN)
                q_rows = (q_start + tok).to(tl.int64)
                row_ok = (rows < TOKENS * GROUP) & (tok < q_len)
            out_ptr = OUT + q_rows[:, None] * stride_ot
        tl.store(out_ptr + heads[:, None] * stride_oh + dims[None, :],
                 out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


@dataclasses.dataclass(frozen=True, slots=True)
class PrefillLaunch:
    """A launch configuration of the prefill kernel (``triton_paged_prefill``'s options)."""
    rows: int  # query rows per program (queries x the group's heads)
    tile_n: int  # keys per tile
    num_warps: int
    num_stages: int  # Triton's pipelining depth
    one_loop: bool  # one walk over the keys, masking only the tiles across the diagonal
    table_ahead: bool  # each tile's block ids loaded a tile ahead of its K/V
    maxnreg: int | None = None  # registers per thread (None: the compiler's choice)
    round_robin: bool = False  # grid order: round r = each sequence's r-th tile from its last
    reread: bool = False  # the output rows' offsets read again after the walk (no work list)
    lazy_rescale: bool = False  # the running max moves by more than 2^8 or not at all
    work_list: bool = False  # the tiles' sequences listed by a kernel before the prefill


def prefill_launch(head_dim: int, dtype: torch.dtype, device: torch.device, *,
                   mean_chunk: int, programs: int, max_keys: int, sequences: int = 1,
                   sm_count: int | None = None) -> PrefillLaunch:
    """The launch for ``sequences`` chunks of ``mean_chunk`` queries on average, ``programs``
    programs of 64 rows, and at most ``max_keys`` keys per sequence (the block table's
    capacity), on a CUDA device of ``sm_count`` SMs (None: ``device``'s own).

    Three regimes, each fitted on an H200 (docs/kernels.md, "Launch rules", has the table and
    the numbers; reports/data/h200/kernels_prefill_tuning.csv the grid):

    - long chunks above head dim 64: 128 rows, so each K/V tile serves more queries, on 8
      warps capped at 128 registers (two programs per SM; four warps spill);
    - short tables with more than a wave of programs: 32-key tiles and capped registers, so
      that more programs share an SM and hide each one's fixed cost (scan, Q, first tiles,
      output); at head dim 64 only walks of at most four tiles;
    - otherwise 64 rows, 64-key tiles, block ids a tile ahead and 3 stages (two K/V tiles in
      flight), 255 registers only where the programs fit one wave (with more, the cap cost
      time).

    Head dim 64 orders the grid round-robin over the sequences (``round_robin``; the caller
    takes it where that grid is no larger) and never re-reads the rows' offsets; above it the offsets are read again after the walk
    (``reread``: kept through it, they made the long-chunk launch spill), and a work list
    replaces the per-program scan from ``WORK_LIST_SEQS`` sequences (``WORK_LIST_SEQS_LONGER``
    for walks over four tiles). The lazy rescale is taken where the programs exceed a wave.
    fp8 caches take these launches; fp32, head dims over 128 and other devices take a plain
    one (64 rows, two walks, 2 stages), not tuned."""
    tile_n = default_tile_n(head_dim, dtype)
    if device.type != "cuda" or head_dim > 128 or dtype == torch.float32:
        return PrefillLaunch(64, tile_n, 4, 2, False, False)
    cap = torch.version.hip is None  # maxnreg is an NVIDIA option
    by_round, reread = head_dim <= 64, head_dim > 64
    long = mean_chunk >= (LONG_CHUNKS if sequences > 1 else LONG_CHUNK)
    if long and head_dim > 64:
        return PrefillLaunch(128, 64, 8, 2, False, False, 128 if cap else None, reread=True)
    sms = sm_count or _sm_count(device)
    many = programs > 2 * sms  # more than a wave (two programs per SM): the lazy rescale
    listed = sequences >= WORK_LIST_SEQS and head_dim > 64
    if max_keys <= SHORT_WALK_TILES * 32 and many:
        if max_keys <= 4 * 32:
            return PrefillLaunch(64, 32, 4, 2, True, False, 128 if cap else None, by_round,
                                 reread, lazy_rescale=True, work_list=listed)
        if head_dim > 64:
            return PrefillLaunch(64, 32, 4, 3, True, True, 168 if cap else None, reread=True,
                                 lazy_rescale=True,
                                 work_list=sequences >= WORK_LIST_SEQS_LONGER)
    # the register cap only where the programs fit in one wave
    return PrefillLaunch(64, 64, 4, 3, True, True, 255 if cap and not many else None, by_round,
                         reread, lazy_rescale=many, work_list=listed)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _hopper(device: torch.device) -> bool:
    return torch.version.hip is None and torch.cuda.get_device_capability(device)[0] == 9


def _can_vote(q: torch.Tensor, rows: int, num_warps: int, dim_pad: int, ieee_dot: bool) -> bool:
    """Whether the lazy rescale's warp vote (``_rescaled``) holds: a compiled (not interpreted)
    bf16/fp16 ``wgmma`` accumulator of 16 rows a warp, whole packs of ``LAZY_PACK`` per thread,
    on a Hopper GPU, or on the CPU, where a kernel is only compiled for one
    (``offline_compile``), never run."""
    if INTERPRETED or ieee_dot or rows != 16 * num_warps or (dim_pad // 2) % LAZY_PACK:
        return False
    return q.device.type == "cpu" or (q.device.type == "cuda" and _hopper(q.device))


def _scan_width(num_seqs: int, reread: bool) -> int:
    """Query lengths a program scans per step: at least ``MIN_SCAN`` (narrower scans cost
    spills), except one for one sequence where the rows are not read again (there the one-lane
    scan was faster for short chunks; where the rows are read again it was not)."""
    if num_seqs == 1 and not reread:
        return 1
    return min(max(num_seqs, MIN_SCAN), MAX_SCAN)


def _padded_rows(rows: int, group: int) -> int:
    """Rows of a program: a power of two >= 16 (``tl.dot``) and >= the group."""
    return max(16, next_pow2(max(rows, group)))


def _grid_size(total: int, num_seqs: int, tokens: int, kv_heads: int, max_keys: int) -> int:
    """Programs for ``tokens`` queries each: an upper bound on the query tiles,
    sum(ceil(len / tokens)), known without a device sync: at most total // tokens + num_seqs,
    and at most ceil(max_keys / tokens) a sequence (no chunk has more queries than its table
    holds keys), which is exact for chunks that fill their tables."""
    return min(total // tokens + num_seqs, num_seqs * ceil_div(max_keys, tokens)) * kv_heads


def _round_grid_size(total: int, num_seqs: int, tokens: int, kv_heads: int,
                     max_keys: int) -> int:
    """Programs for the round-robin order: ``num_seqs`` a round, as many rounds as the longest
    chunk can have tiles (no more queries than the table holds keys, nor than the step has)."""
    return num_seqs * min(ceil_div(max_keys, tokens), total // tokens + 1) * kv_heads


def triton_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_lens, scale,
                         k_scale=None, v_scale=None, *, rows: int | None = None,
                         tile_n: int | None = None, num_warps: int | None = None,
                         num_stages: int | None = None, scan: int | None = None,
                         one_loop: bool | None = None, table_ahead: bool | None = None,
                         maxnreg: int | None = None, round_robin: bool | None = None,
                         reread: bool | None = None, lazy_rescale: bool | None = None,
                         work_list: bool | None = None):
    """Paged prefill; arguments as ``pagebench.kernels.paged_prefill`` (already validated; an
    fp8 cache's scales as float32 tensors ``[num_kv_heads]``, converted and applied as in the
    decode kernel).

    Launch options (each ``None``: ``prefill_launch``'s choice): ``rows``: query rows per
    program (rounded up to a power of two >= 16 and >= the group; a program takes
    ``rows // group`` queries of one sequence with all ``group`` heads of a KV head; by
    default no more than the mean chunk needs); ``tile_n``: keys per tile; ``num_warps``,
    ``num_stages``, ``maxnreg``: Triton's; ``one_loop``: one walk over the keys (else the
    unmasked tiles, then the diagonal ones); ``table_ahead``: block ids loaded a tile ahead;
    ``round_robin``: the grid's order (by default round-robin where the launch says so and its
    grid is no larger than the one by sequence); ``reread``: the output rows' offsets read
    again after the walk rather than kept through it (without a work list; with one, they are
    rebuilt from two scalars kept through it); ``lazy_rescale``: a row's running max
    moves only when a tile's passes it by more than 2^8, and the output is rescaled only then,
    skipped by whole warps where the GPU allows (by default where the launch says so and the
    skip is possible, ``_can_vote``);
    ``work_list``: each query tile's sequence and offsets listed by a small kernel launched
    first (``_work_list_kernel``), so that no program of the prefill scans the lengths (not
    with the round-robin grid, which needs no scan to find its sequence);
    ``scan``: query lengths a program reads per step while finding its sequence (a power of
    two; default ``_scan_width``'s). Nothing is read back to the host, so a call can be
    captured in a CUDA graph.
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
    mean_chunk = ceil_div(total, num_seqs)
    max_keys = tables.shape[1] * block_size
    fp8 = is_fp8(k_cache.dtype)
    chosen = prefill_launch(head_dim, q.dtype, q.device, mean_chunk=mean_chunk,
                            programs=_grid_size(total, num_seqs, _padded_rows(64, group) // group,
                                                kv_heads, max_keys),
                            max_keys=max_keys, sequences=num_seqs)
    if rows is None:  # no wider than the mean chunk needs: short chunks would waste rows
        rows = min(chosen.rows, mean_chunk * group)
    rows = _padded_rows(rows, group)
    tokens = rows // group
    tile_n = tile_n or chosen.tile_n
    maxnreg = maxnreg if maxnreg is not None else chosen.maxnreg
    q_lens = query_lens.to(torch.int32).contiguous()  # the kernel reads lengths at unit stride
    reread = chosen.reread if reread is None else bool(reread)
    by_sequence = _grid_size(total, num_seqs, tokens, kv_heads, max_keys)
    by_round = _round_grid_size(total, num_seqs, tokens, kv_heads, max_keys)
    work_list = chosen.work_list if work_list is None else bool(work_list)
    if round_robin is None:  # where its grid is no larger (chunks of about the table's width)
        round_robin = chosen.round_robin and by_round <= by_sequence and not work_list
    if round_robin and work_list:
        raise ValueError("work_list: the round-robin grid takes no work list")
    scan_width = next_pow2(scan or _scan_width(num_seqs, reread))
    work = q_lens  # (a placeholder pointer where there is no work list)
    if work_list:  # records for whole programs of the list's kernel (those past the last tile idle)
        programs = ceil_div(by_sequence // kv_heads, WORK_TILES)
        work = torch.empty(programs * WORK_TILES * WORK_FIELDS, device=q.device,
                           dtype=torch.int32)
        launch(_work_list_kernel, (programs,), (q_lens, seq_lens, work), (num_seqs,),
               dict(TOKENS=tokens, SCAN=min(scan_width, 64), BLOCK_T=WORK_TILES),
               dict(num_warps=WORK_WARPS))
    num_warps = num_warps or chosen.num_warps
    ieee_dot = q.dtype == torch.float32 or (INTERPRETED and q.dtype == torch.bfloat16)
    dim_pad = max(16, next_pow2(head_dim))
    vote = _can_vote(q, rows, num_warps, dim_pad, ieee_dot)
    lazy = chosen.lazy_rescale and vote if lazy_rescale is None else bool(lazy_rescale)
    constexprs = dict(
        KV_HEADS=kv_heads, GROUP=group, TOKENS=tokens, ROWS=rows, BLOCK_SIZE=block_size,
        TILE_N=tile_n, HEAD_DIM=head_dim, DIM_PAD=dim_pad,
        SCAN=scan_width,
        ONE_LOOP=chosen.one_loop if one_loop is None else bool(one_loop),
        TABLE_AHEAD=chosen.table_ahead if table_ahead is None else bool(table_ahead),
        IEEE_DOT=ieee_dot,
        FP8=fp8,
        WIDE_INDEX=max(element_span(k_cache), element_span(v_cache)) >= INT32_SPAN,
        ROUND_ROBIN=bool(round_robin),
        REREAD=reread, LAZY=lazy, VOTE=lazy and vote, WORK_LIST=work_list)
    options = dict(num_warps=num_warps, num_stages=num_stages or chosen.num_stages,
                   **({} if maxnreg is None or INTERPRETED else {"maxnreg": maxnreg}))
    launch(_prefill_kernel, (by_round if round_robin else by_sequence,),
           (q, k_cache, v_cache, tables, seq_lens, q_lens, out,
            q_lens if k_scale is None else k_scale, q_lens if v_scale is None else v_scale, work),
           (num_seqs, scale * LOG2E,
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            tables.stride(0), out.stride(0), out.stride(1)),
           constexprs, options)
    return out
