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
``last - p // kv_heads``. The query tiles are numbered as in vLLM's unified attention: sequence
``s``'s start at ``query_start_loc[s] // TOKENS + s``, at least as many as its queries fill, so
the grid (``total // TOKENS + num_seqs`` tiles a KV head) is sized without reading anything
back to the host, and a program finds its sequence from the offsets (``_sequence_of``): up to
``VECTOR_SEARCH_SEQS`` sequences it counts the starts at or before its tile in one vector load
(one load to wait on, not a chain of them), above that by a binary search; tiles past a
sequence's queries do nothing. Numbering from the last tile means the programs with the most
keys to walk (the ends of long chunks) start first and the short ones fill in behind them,
rather than leaving a tail of long ones.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from pagebench.config import ceil_div
from pagebench.errors import ConfigError
from pagebench.kernels.launch_common import unit_stride_rows
from pagebench.kernels.quant import is_fp8
from pagebench.kernels.reference import LOG2E
from pagebench.kernels.triton_decode import default_tile_n
from pagebench.kernels.triton_runtime import INTERPRETED, launch as launch_kernel, next_pow2
from pagebench.kernels.validate import element_span

# isort: split
# after triton_runtime, whose import set TRITON_INTERPRET where Triton needs it
import triton
import triton.language as tl

INT32_SPAN = 2**31  # element offsets at or beyond this need 64-bit index arithmetic
LONG_CHUNK = 2048  # queries per sequence from which a program takes 128 query rows
LONG_CHUNKS = 1024  # ... where there are several sequences
SHORT_WALK_TILES = 16  # 32-key tiles in a table short enough for the many-program launch
SHORT_WALK_FP8_REGS = 144  # the register cap of the shortest walks from an fp8 cache (128 spill)
# keys a tile of the 128-row launch: 64 from a 16-bit cache, which spills a few bytes (at most
# LONG_CHUNK_SPILL_BYTES) within its 128 registers but is 1.2-1.4x faster on long prompts than
# 32-key tiles (docs/kernels.md, "Launch rules"); 32 from an fp8 cache, where 64 spill 56-76 bytes
LONG_CHUNK_TILE_N = 64
LONG_CHUNK_FP8_TILE_N = 32
LONG_CHUNK_SPILL_BYTES = 8
MAX_ROWS = 128  # query rows a program holds at most (its accumulator: rows x head dim fp32)
MAX_TILE_N = 128
# sequences up to which a program finds its own by one vector load of the offsets (the width of
# that load; 0: always the binary search). Read at each call: a script comparing the two searches
# sets it.
VECTOR_SEARCH_SEQS = 128


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
def _sequence_of(QUERY_START, stride_qs, tile, num_seqs, TOKENS: tl.constexpr,
                 SEARCH_WIDTH: tl.constexpr):
    """The sequence whose query tiles include ``tile``: sequence ``s``'s tiles start at
    ``query_start_loc[s] // TOKENS + s``, which grows with ``s``, so it is the last sequence
    whose start is at most ``tile``, one less than the number of such starts. ``SEARCH_WIDTH``
    (a power of two >= ``num_seqs``): all the starts in one vector load, counted by a
    reduction, so a program waits on one load; 0: a binary search (vLLM's ``find_seq_idx``), log2
    of ``num_seqs`` dependent loads, for any number of sequences."""
    if SEARCH_WIDTH > 0:
        s = tl.arange(0, SEARCH_WIDTH)
        starts = tl.load(QUERY_START + s * stride_qs, mask=s < num_seqs, other=0).to(tl.int32)
        before = (starts // TOKENS + s <= tile) & (s < num_seqs)
        return tl.sum(before.to(tl.int32), 0) - 1
    lo = tile * 0
    hi = lo + num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(QUERY_START + mid * stride_qs).to(tl.int32)
        if start // TOKENS + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _prefill_kernel(
    Q, K, V, TABLES, SEQ_LENS, QUERY_START, OUT, K_SCALE, V_SCALE,
    num_seqs, scale_log2e,
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ts, stride_sl, stride_qs, stride_ot, stride_oh,
    KV_HEADS: tl.constexpr, GROUP: tl.constexpr, TOKENS: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr, ONE_LOOP: tl.constexpr, TABLE_AHEAD: tl.constexpr,
    IEEE_DOT: tl.constexpr, FP8: tl.constexpr, WIDE_INDEX: tl.constexpr,
    LAZY: tl.constexpr, VOTE: tl.constexpr, SEARCH_WIDTH: tl.constexpr,
):
    pid = tl.program_id(0)
    kv_head = pid % KV_HEADS
    tile = (tl.num_programs(0) - 1 - pid) // KV_HEADS  # the last tiles (longest walks) first
    if FP8:  # as in the decode kernel: k_scale folds into the softmax scale
        scale_log2e = scale_log2e * tl.load(K_SCALE + kv_head)
    seq = _sequence_of(QUERY_START, stride_qs, tile, num_seqs, TOKENS, SEARCH_WIDTH)
    q_start = tl.load(QUERY_START + seq * stride_qs).to(tl.int32)
    q_len = tl.load(QUERY_START + (seq + 1) * stride_qs).to(tl.int32) - q_start
    seq_len = tl.load(SEQ_LENS + seq * stride_sl).to(tl.int32)
    first = (tile - q_start // TOKENS - seq) * TOKENS  # this tile's first query in the chunk
    if first < q_len:  # the grid is an upper bound on the tile count: the rest do nothing
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
        # the rows' offsets rebuilt from two scalars kept through the walk, in a form the
        # compiler does not merge with q_rows (which it would keep through the walk, in
        # registers the long-chunk launch does not have)
        out_tile = OUT + (q_start + first).to(tl.int64) * stride_ot
        in_tile = rows // GROUP
        row_ok = (rows < TOKENS * GROUP) & (in_tile < q_len - first)
        out_ptr = out_tile + in_tile.to(tl.int64)[:, None] * stride_ot
        tl.store(out_ptr + heads[:, None] * stride_oh + dims[None, :],
                 out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def _power_of_two(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and n & (n - 1) == 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PrefillLaunch:
    """How ``triton_paged_prefill`` launches its kernel; ``prefill_launch`` picks one per call
    unless the caller gives one (``launch=``)."""
    rows: int  # query rows a program (queries x the group's heads; raised to >= the group)
    tile_n: int  # keys a tile
    num_warps: int
    num_stages: int  # Triton's pipelining depth
    maxnreg: int | None = None  # registers a thread (None: the compiler's choice; NVIDIA only)
    one_loop: bool = False  # one walk over the keys, masking only the tiles across the diagonal
    table_ahead: bool = False  # each tile's block ids loaded a tile ahead of its K/V
    lazy_rescale: bool = False  # a row's running max moves by more than 2^8 or not at all

    def __post_init__(self):
        def bad(name, why):
            raise ConfigError(f"launch: {name}={getattr(self, name)!r} {why}")
        if not _power_of_two(self.rows) or not 16 <= self.rows <= MAX_ROWS:
            bad("rows", f"must be a power of two in 16..{MAX_ROWS}")
        if not _power_of_two(self.tile_n) or not 16 <= self.tile_n <= MAX_TILE_N:
            bad("tile_n", f"must be a power of two in 16..{MAX_TILE_N}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            bad("num_warps", "must be 1, 2, 4, 8 or 16")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            bad("num_stages", "must be an integer in 1..8")
        if self.maxnreg is not None and (not isinstance(self.maxnreg, int)
                                         or not 24 <= self.maxnreg <= 255):
            bad("maxnreg", "must be None or an integer in 24..255")
        if self.table_ahead and not self.one_loop:
            bad("table_ahead", "needs one_loop=True (the two walks load ids with their tile)")


def prefill_launch(head_dim: int, dtype: torch.dtype, device: torch.device, *, group: int,
                   kv_heads: int, total: int, sequences: int, max_keys: int,
                   fp8_cache: bool = False, sm_count: int | None = None,
                   hopper: bool | None = None) -> PrefillLaunch:
    """The launch for ``total`` queries of ``sequences`` chunks, heads grouped ``group`` query
    heads to each of ``kv_heads``, at most ``max_keys`` keys a sequence (the block table's
    capacity), from an fp8 cache or not, on a CUDA device of ``sm_count`` SMs (None:
    ``device``'s own), Hopper or not (None: ``device``'s).

    Three regimes, fitted on an H200 (docs/kernels.md, "Launch rules"): long chunks above head dim
    64 take 128 rows, so each K/V tile serves more queries, on 8 warps capped at 128 registers (two
    programs an SM), in 32-key tiles (64-key ones spill there); short tables with more than a wave
    of programs take 32-key tiles and capped registers, so more programs share an SM and hide each
    one's fixed cost (from an fp8 cache, whose conversion needs a few registers more, capped at 144
    rather than 128 in the shortest walks); the rest 64 rows, 64-key tiles, block ids a tile ahead
    and 3 stages, capped only where the programs fit one wave. Past a wave the rescale is lazy where
    a warp can vote (Hopper). A program never has more rows than the mean chunk fills. fp32 on CUDA
    takes 16 rows and 16-key tiles (its dots' operands are held in registers: larger ones spill);
    head dims over 128 and other devices one plain launch. Those are not tuned."""
    mean_chunk = ceil_div(total, sequences)
    tile_n = default_tile_n(head_dim, dtype)

    def fitted(rows, **fields):  # no more rows than the mean chunk fills, at least the group
        rows = max(16, next_pow2(max(min(rows, mean_chunk * group), group)))
        return PrefillLaunch(rows=rows, **fields)

    if device.type == "cuda" and dtype == torch.float32:  # exact fp32 dots: on FMA units
        return fitted(16, tile_n=16, num_warps=4, num_stages=2)
    if device.type != "cuda" or head_dim > 128 or dtype == torch.float32:
        return fitted(64, tile_n=tile_n, num_warps=4, num_stages=2)
    cap = torch.version.hip is None  # maxnreg is an NVIDIA option
    if mean_chunk >= (LONG_CHUNKS if sequences > 1 else LONG_CHUNK) and head_dim > 64:
        return fitted(128, tile_n=LONG_CHUNK_FP8_TILE_N if fp8_cache else LONG_CHUNK_TILE_N,
                      num_warps=8, num_stages=2,
                      maxnreg=128 if cap else None)
    tokens = _padded_rows(64, group) // group  # the estimate counts programs of 64 rows
    programs = min(total // tokens + sequences, sequences * ceil_div(max_keys, tokens)) * kv_heads
    many = programs > 2 * (sm_count or _sm_count(device))  # more than a wave, two an SM
    hopper = _hopper(device) if hopper is None else hopper
    rows = fitted(64, tile_n=tile_n, num_warps=4, num_stages=2).rows
    lazy = many and hopper and _votes(rows, 4, head_dim)
    if max_keys <= SHORT_WALK_TILES * 32 and many:
        if max_keys <= 4 * 32:
            regs = SHORT_WALK_FP8_REGS if fp8_cache else 128
            return fitted(64, tile_n=32, num_warps=4, num_stages=2, one_loop=True,
                          maxnreg=regs if cap else None, lazy_rescale=lazy)
        if head_dim > 64:
            return fitted(64, tile_n=32, num_warps=4, num_stages=3, one_loop=True,
                          table_ahead=True, maxnreg=168 if cap else None, lazy_rescale=lazy)
    return fitted(64, tile_n=64, num_warps=4, num_stages=3, one_loop=True, table_ahead=True,
                  maxnreg=255 if cap and not many else None, lazy_rescale=lazy)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _hopper(device: torch.device) -> bool:
    return torch.version.hip is None and torch.cuda.get_device_capability(device)[0] == 9


def _votes(rows: int, num_warps: int, head_dim: int) -> bool:
    """Whether the lazy rescale's warp vote (``_rescaled``) fits the accumulator's layout: a
    ``wgmma`` accumulator of 16 rows a warp and whole packs of ``LAZY_PACK`` a thread."""
    return rows == 16 * num_warps and (max(16, next_pow2(head_dim)) // 2) % LAZY_PACK == 0


def _can_vote(q: torch.Tensor, rows: int, num_warps: int, head_dim: int, ieee_dot: bool) -> bool:
    """Whether the warp vote holds for this call: compiled (not interpreted), bf16/fp16 dots,
    the accumulator's layout (``_votes``), on a Hopper GPU, or on the CPU, where a kernel is
    only compiled for one (``offline_compile``), never run."""
    if INTERPRETED or ieee_dot or not _votes(rows, num_warps, head_dim):
        return False
    return q.device.type == "cpu" or (q.device.type == "cuda" and _hopper(q.device))


def search_width(num_seqs: int) -> int:
    """The kernel's ``SEARCH_WIDTH`` for ``num_seqs`` sequences: ``VECTOR_SEARCH_SEQS`` where
    they fit it (one width, so one more compiled kernel at most), else 0 (the binary search)."""
    return VECTOR_SEARCH_SEQS if num_seqs <= VECTOR_SEARCH_SEQS else 0


def _padded_rows(rows: int, group: int) -> int:
    """Rows of a program: a power of two >= 16 (``tl.dot``) and >= the group."""
    return max(16, next_pow2(max(rows, group)))


def triton_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                         k_scale=None, v_scale=None, *, launch: PrefillLaunch | None = None):
    """Paged prefill; arguments as ``pagebench.kernels.paged_prefill`` (already validated; an
    fp8 cache's scales as float32 tensors ``[num_kv_heads]``, converted and applied as in the
    decode kernel). ``launch``: how to launch the kernel (None: ``prefill_launch``'s choice;
    its rows are raised to a power of two >= the group). Nothing is read back to the host, so
    a call can be captured in a CUDA graph."""
    total, q_heads, head_dim = q.shape
    num_seqs = query_start_loc.shape[0] - 1
    _, block_size, kv_heads, _ = k_cache.shape
    group = q_heads // kv_heads
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    if total == 0 or num_seqs <= 0:
        return out
    q, tables, seq_lens = unit_stride_rows(q, block_tables, seq_lens)
    if launch is None:
        launch = prefill_launch(head_dim, q.dtype, q.device, group=group, kv_heads=kv_heads,
                                total=total, sequences=num_seqs,
                                max_keys=tables.shape[1] * block_size,
                                fp8_cache=is_fp8(k_cache.dtype))
    rows = _padded_rows(launch.rows, group)
    tokens = rows // group
    ieee_dot = q.dtype == torch.float32 or (INTERPRETED and q.dtype == torch.bfloat16)
    lazy = launch.lazy_rescale
    constexprs = dict(
        KV_HEADS=kv_heads, GROUP=group, TOKENS=tokens, ROWS=rows, BLOCK_SIZE=block_size,
        TILE_N=launch.tile_n, HEAD_DIM=head_dim, DIM_PAD=max(16, next_pow2(head_dim)),
        ONE_LOOP=launch.one_loop, TABLE_AHEAD=launch.table_ahead, IEEE_DOT=ieee_dot,
        FP8=is_fp8(k_cache.dtype),
        WIDE_INDEX=max(element_span(k_cache), element_span(v_cache)) >= INT32_SPAN,
        LAZY=lazy, VOTE=lazy and _can_vote(q, rows, launch.num_warps, head_dim, ieee_dot),
        SEARCH_WIDTH=search_width(num_seqs))
    maxnreg = launch.maxnreg
    options = dict(num_warps=launch.num_warps, num_stages=launch.num_stages,
                   **({} if maxnreg is None or INTERPRETED else {"maxnreg": maxnreg}))
    launch_kernel(_prefill_kernel, ((total // tokens + num_seqs) * kv_heads,),
                  (q, k_cache, v_cache, tables, seq_lens, query_start_loc, out,
                   seq_lens if k_scale is None else k_scale,
                   seq_lens if v_scale is None else v_scale),
                  (num_seqs, scale * LOG2E,
                   q.stride(0), q.stride(1),
                   k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                   v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                   tables.stride(0), seq_lens.stride(0), query_start_loc.stride(0),
                   out.stride(0), out.stride(1)),
                  constexprs, options)
    return out
