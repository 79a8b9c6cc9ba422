"""Triton paged decode: GQA-packed, online softmax over KV tiles, split-KV + combine.

Grid of stage 1: (sequence, KV head, KV split). One program loads the whole group of query heads
that share its KV head (G = num_q_heads / num_kv_heads, padded to 16 rows for ``tl.dot``), so
each K/V row is read from memory once per group; an fp8 cache's programs take two KV heads
each where their groups fit the 16 rows (``KV_PER_PROGRAM``, ``kv_heads_pair``): the groups
stacked in the rows, the heads' tiles side by side in the columns, each row masked to its own
head's columns. It walks its split's token range in tiles of ``TILE_N`` tokens (per KV head);
each token's physical slot is ``block_tables[s, p // BLOCK_SIZE]`` *
BLOCK_SIZE + ``p % BLOCK_SIZE``, so the tile size is independent of the block size and any
block size >= 1 works. Scores and the running max / sum / output are fp32 whatever the input
dtype. An fp8 cache (``FP8``) is converted exactly as it is loaded (every e4m3 and e5m2 value
is an fp16, bf16 and fp32 value), to fp16 unless q is fp32: a bf16 q is rescaled per head to
fp16 (``rows_to_f16``) so the dots take the format fp8 converts to in one instruction, and V
converts in registers (``fp8_to_f16``). Its per-KV-head scales are applied where they cost
nothing: ``k_scale`` folds into the softmax scale, ``v_scale`` multiplies the fp32
accumulator once at the end. By default the split size follows the batch's own lengths,
read on the device (``split_tokens``): a ragged batch's long sequences take many splits, its
short ones one, and the grid is a list of work items (a sequence's splits one after another)
that each program finds its (sequence, split) in. A sequence of one split normalises and
writes ``out`` directly; with several (flash-decoding, so one long sequence still fills the GPU),
it writes its unnormalised partial output and (max, sum); up to ``FUSED_MERGE_SPLITS``
splits it also counts itself in a counter of its (sequence, KV head(s)), and the last of their
splits to arrive merges all their partials into ``out`` (``merge_splits``): one launch. With
more splits a second kernel merges them, a program per query head.

On a machine without a GPU the kernels run interpreted on CPU tensors
(:mod:`pagebench.kernels.triton_runtime`).
"""

from __future__ import annotations

import dataclasses

import torch

from pagebench.config import ceil_div
from pagebench.kernels.launch_common import unit_stride_rows, wave_splits
from pagebench.kernels.quant import is_fp8, nvidia_fp8_hardware
from pagebench.kernels.reference import LOG2E
from pagebench.kernels.triton_runtime import INTERPRETED, Launcher, next_pow2

# isort: split
# after triton_runtime, whose import set TRITON_INTERPRET where Triton needs it
import triton
import triton.language as tl

MAX_SPLITS = 512
MMA_ROWS = 16  # tl.dot's fewest rows: a program's query rows are padded to this
# A program's fixed cost (load q, write its partial, launch share) in KV tiles: it is what makes
# an extra wave of short programs cost more than a wave of long ones.
SPLIT_OVERHEAD_TILES = 2
INTERPRETED_SLOTS = 16  # CPU: pretend 4 SMs x 4 programs, so the split path runs
# Splits up to which the split kernel merges them itself (``fused_merge``): one program merges a
# (sequence, KV head)'s partials at the end of the launch, so with many splits the second
# kernel's program per query head is faster (docs/kernels.md, "Merging splits").
FUSED_MERGE_SPLITS = 4  # also the most it takes: it loads them all at once
COMBINE_CHUNK = 32  # splits the combine kernel merges per step
# Ragged batches (``ragged_split_room``): work items beyond the uniform choice's, in waves of
# the GPU's slots, and the most splits of one sequence beyond the split kernel's own merge
RAGGED_WAVES = 1
RAGGED_SPLITS = 16
SPLIT_CANDIDATES = tl.constexpr(16)  # tokens per split tried: the host's, its half, ...
OVERHEAD_TILES = tl.constexpr(SPLIT_OVERHEAD_TILES)
COMBINE_STEP = tl.constexpr(COMBINE_CHUNK)
# a ragged choice must beat the host's (exact for a batch that fills its table) by 1/8
LEAVE_HOST_CHOICE = tl.constexpr(8)
MAX_RAGGED_SEQS = 256  # batches up to this size split per sequence (lengths read at once)
# Uniform splits shorter than these (in tiles) take no ragged grid (``ragged_can_help``); the
# second where the split kernel merges the uniform choice's splits itself
RAGGED_MIN_SPLIT_TILES = 8
RAGGED_MIN_FUSED_SPLIT_TILES = 17


@triton.jit
def attend_tile(q, k, v, visible, m_i, l_i, acc, scale_log2e, IEEE_DOT: tl.constexpr):
    """One KV tile of the online softmax: scores of the rows of ``q`` against ``k`` where
    ``visible`` (log2 domain, fp32), then the running max ``m_i``, sum ``l_i`` and output
    ``acc`` updated with ``v``. ``IEEE_DOT``: fp32 inputs (or bf16 upcast when interpreted)
    take exact fp32 products."""
    if IEEE_DOT:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(visible, s * scale_log2e, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE_DOT:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def rows_to_f16(x):
    """``x`` ``[rows, cols]`` as fp16 divided by a power of two per row, and those powers
    ``[rows]``: each row's largest magnitude lands in [2^14, 2^16), so no row overflows fp16
    and a bf16 row converts exactly (elements down to 2^-28 of the row's largest; smaller
    ones round, far below the row's bf16 rounding). The power stops at 2^-126 (float32's
    smallest normal; its inverse 2^126 is finite): a row below 2^-112 lands lower, still
    well inside fp16."""
    xf = x.to(tl.float32)
    amax = tl.max(tl.abs(xf), 1)
    shift = tl.floor(tl.log2(tl.where(amax > 0, amax, 1.0))) - 14.0  # zero rows stay zero
    shift = tl.maximum(shift, -126.0)
    return (xf * tl.exp2(-shift)[:, None]).to(tl.float16), tl.exp2(shift)


@triton.jit
def fp8_to_f16(x):
    """fp8 (e4m3 or e5m2) to fp16, exactly, with the ``cvt`` instruction (sm_89+) four values
    at a time, for V. The assembly is declared impure on purpose: Triton then cannot move the
    conversion past the shared-memory load of the ``p @ v`` operand, where V's rows (tokens)
    are the reduction axis and fp8 would be read from shared memory one byte at a time; V
    converts in registers instead and reaches the dot as fp16, through ``ldmatrix``."""
    if x.dtype == tl.float8e5:
        return tl.inline_asm_elementwise(
            "{.reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
            "cvt.rn.f16x2.e5m2x2 $0, lo; cvt.rn.f16x2.e5m2x2 $1, hi;}",
            "=r,=r,r", [x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False,
            pack=4)
    else:
        return tl.inline_asm_elementwise(
            "{.reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
            "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi;}",
            "=r,=r,r", [x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False,
            pack=4)


@triton.jit
def batch_lengths(SEQ_LENS, num_seqs, LENS_PAD: tl.constexpr):
    """(index, valid, lengths as int32) of the batch's sequences, ``LENS_PAD`` >= num_seqs."""
    idx = tl.arange(0, LENS_PAD)
    valid = idx < num_seqs
    return idx, valid, tl.load(SEQ_LENS + idx, mask=valid, other=0).to(tl.int32)


@triton.jit
def split_tokens(lens, valid, tokens_per_split, split_budget, max_splits, units_per_seq,
                 slots, TILE_N: tl.constexpr):
    """Tokens per split of a ragged batch (lengths ``lens`` where ``valid``), the same in every
    program of both kernels: of ``tokens_per_split`` (the host's choice for a batch that fills
    the table), its half, quarter, ... (whole tiles), the one of least cost, kept only if it
    beats the host's by ``1 / LEAVE_HOST_CHOICE``. A chunk's cost is the larger of the
    average load of a slot (every sequence's tiles and ``OVERHEAD_TILES`` per work item, over
    ``slots`` programs at once, ``units_per_seq`` per sequence) and its longest work item
    (list scheduling ends within their sum, and near the larger when items are many and
    short), plus a tile time per ``COMBINE_CHUNK`` splits of the longest sequence merged.
    A chunk qualifies with at most ``split_budget`` work items (one at least per sequence) and
    ``max_splits`` per sequence. A batch of equal lengths keeps the host's choice."""
    halvings = tl.arange(0, SPLIT_CANDIDATES)
    cand = tl.cdiv(tokens_per_split // TILE_N, 1 << halvings) * TILE_N  # non-increasing
    per_seq = tl.where(valid[None, :], tl.maximum(tl.cdiv(lens[None, :], cand[:, None]), 1), 0)
    items = tl.sum(per_seq, 1)
    longest = tl.max(lens, 0)
    tiles = tl.sum(tl.cdiv(lens, TILE_N), 0)
    # costs in tile times x slots (integers: every program computes the same)
    load = (tiles + OVERHEAD_TILES * items).to(tl.int64) * units_per_seq
    path = (tl.cdiv(tl.minimum(cand, longest), TILE_N) + OVERHEAD_TILES).to(tl.int64) * slots
    most = tl.cdiv(longest, cand)
    merge = tl.where(most > 1, tl.cdiv(most, COMBINE_STEP), 0).to(tl.int64) * slots
    cost = tl.maximum(load, path) + merge
    fits = (items <= split_budget) & (most <= max_splits)
    cost = tl.where(fits, cost, tl.max(cost, 0) + 1)
    host = tl.sum(tl.where(halvings == 0, cost, 0), 0)
    best = tl.min(cost, 0)
    chosen = tl.max(tl.where(fits & (cost == best), cand, 0), 0)  # ties: fewer items
    # a batch of equal lengths is not ragged: the host's wave model (which counts the waves
    # this one does not) chose for it
    uniform = tl.min(tl.where(valid, lens, longest), 0) == longest
    better = best * LEAVE_HOST_CHOICE < host * (LEAVE_HOST_CHOICE - 1)
    return tl.where(better & ~uniform, chosen, tokens_per_split)


@triton.jit
def _decode_split_kernel(
    Q, K, V, TABLES, SEQ_LENS, OUT, PART, K_SCALE, V_SCALE, COUNTERS,
    scale_log2e, tokens_per_split, split_budget, max_splits, num_seqs, units_per_seq, slots,
    ml_offset,
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ts,
    stride_os, stride_oh,
    stride_ps, stride_ph, stride_pk,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    DIRECT: tl.constexpr, IEEE_DOT: tl.constexpr, FP8: tl.constexpr,
    Q_TO_F16: tl.constexpr, FP8_CVT_ASM: tl.constexpr, KV_PER_PROGRAM: tl.constexpr,
    MERGE: tl.constexpr, MERGE_ROWS: tl.constexpr, SPLITS_PAD: tl.constexpr,
    ADAPTIVE: tl.constexpr, LENS_PAD: tl.constexpr,
):
    """Grid ``(sequence, KV program, split)``: ``DIRECT``, one split, which writes ``out``;
    else a sequence takes ``ceil(seq_len / tokens_per_split)`` of the splits (its others exit
    at once). ``ADAPTIVE`` (a ragged batch): grid ``(work item, KV program, 1)``, the splits
    per sequence chosen from the lengths on the device (``split_tokens``, at most
    ``split_budget`` work items in all), the items beyond them exiting at once. A sequence of
    one split writes ``out``, else each split writes its partial; with ``MERGE`` the last of a
    (sequence, ``tl.program_id(1)``)'s splits to count itself in ``COUNTERS`` (int32, zero
    between launches) sets the counter back and merges them, without it ``_combine_kernel``
    does in a second launch."""
    kv_head = tl.program_id(1) * KV_PER_PROGRAM  # the first of the program's KV heads
    if ADAPTIVE:
        idx, valid, lens = batch_lengths(SEQ_LENS, num_seqs, LENS_PAD)
        chunk = split_tokens(lens, valid, tokens_per_split, split_budget, max_splits,
                             units_per_seq, slots, TILE_N)
        per_seq = tl.where(valid, tl.maximum(tl.cdiv(lens, chunk), 1), 0)
        ends = tl.cumsum(per_seq, 0)  # work items of sequences 0..i
        work = tl.program_id(0)
        seq = tl.sum((ends <= work).to(tl.int32), 0)  # the sequence the work item falls in
        if seq >= num_seqs:  # beyond the batch's splits
            return
        mine = idx == seq
        num_splits = tl.sum(tl.where(mine, per_seq, 0), 0)
        split = work - tl.sum(tl.where(mine, ends, 0), 0) + num_splits
        seq_len = tl.sum(tl.where(mine, lens, 0), 0)
    else:  # the uniform grid: every sequence takes the grid's splits (empty ones too)
        seq = tl.program_id(0)
        split = tl.program_id(2)
        seq_len = tl.load(SEQ_LENS + seq)
        chunk = tokens_per_split
        num_splits = tl.num_programs(2)
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    # rows: the query groups of the program's KV heads, one after another; each row's KV head
    # (padding rows take the last one's)
    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, DIM_PAD)
    row_ok = rows < GROUP * KV_PER_PROGRAM
    dim_ok = dims < HEAD_DIM
    heads = kv_head * GROUP + rows
    row_kv = kv_head + tl.minimum(rows // GROUP, KV_PER_PROGRAM - 1)
    # columns: the KV heads' tiles side by side, column c is token c % TILE_N of KV head
    # kv_head + c // TILE_N; a row attends to its own head's columns only
    cols = tl.arange(0, KV_PER_PROGRAM * TILE_N)
    col_kv = kv_head + cols // TILE_N
    # load q for the whole group: it stays in registers throughout
    q = tl.load(Q + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if FP8:  # scores of the stored K times k_scale are the real scores
        scale_log2e = scale_log2e * tl.load(K_SCALE + row_kv)[:, None]
    if Q_TO_F16:  # fp8 converts to fp16 in one instruction per pair, to bf16 in three
        q, q_shift = rows_to_f16(q)
        scale_log2e = scale_log2e * q_shift[:, None]

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    table_row = TABLES + seq * stride_ts
    for tile_start in range(start, end, TILE_N):
        pos = tile_start + cols % TILE_N
        pos_ok = pos < end
        # each token's page from the table: tile and page sizes are independent
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
        k_row = block * stride_kb + (pos % BLOCK_SIZE) * stride_kt + col_kv * stride_kh
        v_row = block * stride_vb + (pos % BLOCK_SIZE) * stride_vt + col_kv * stride_vh
        kv_mask = pos_ok[:, None] & dim_ok[None, :]
        k = tl.load(K + k_row[:, None] + dims[None, :], mask=kv_mask,
                    other=0.0)  # [KV_PER_PROGRAM * TILE_N, DIM_PAD]
        v = tl.load(V + v_row[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        visible = pos_ok[None, :]
        if KV_PER_PROGRAM > 1:
            visible = visible & (row_kv[:, None] == col_kv[None, :])
        if FP8_CVT_ASM:  # K converts well where Triton puts it (in the dot operand's layout)
            k, v = k.to(q.dtype), fp8_to_f16(v)
        else:
            k, v = k.to(q.dtype), v.to(q.dtype)
        m_i, l_i, acc = attend_tile(q, k, v, visible, m_i, l_i, acc, scale_log2e, IEEE_DOT)
    if FP8:  # the output is linear in V: one multiply instead of one per element loaded
        acc = acc * tl.load(V_SCALE + row_kv)[:, None]

    out_mask = row_ok[:, None] & dim_ok[None, :]
    out_at = OUT + seq * stride_os + heads[:, None] * stride_oh + dims[None, :]
    part = seq * stride_ps + heads * stride_ph + split * stride_pk
    # the uniform grid's branches are constexpr (its code is the pre-ragged kernel's); a
    # ragged grid's depend on the sequence's split count
    if DIRECT:
        tl.store(out_at, (acc / l_i[:, None]).to(OUT.dtype.element_ty), mask=out_mask)
    elif ADAPTIVE:
        if num_splits == 1:
            tl.store(out_at, (acc / l_i[:, None]).to(OUT.dtype.element_ty), mask=out_mask)
        else:
            store_partial(PART, part, acc, m_i, l_i, ml_offset, out_mask, row_ok, dims,
                          DIM_PAD)
            if MERGE and num_splits <= SPLITS_PAD:  # more: the combine kernel merges them
                count_and_merge(PART, OUT, COUNTERS, seq, kv_head * GROUP, num_splits,
                                ml_offset, stride_ps, stride_ph, stride_pk, stride_os,
                                stride_oh, GROUP * KV_PER_PROGRAM, MERGE_ROWS, SPLITS_PAD,
                                HEAD_DIM, DIM_PAD)
    else:
        store_partial(PART, part, acc, m_i, l_i, ml_offset, out_mask, row_ok, dims, DIM_PAD)
        if MERGE:
            count_and_merge(PART, OUT, COUNTERS, seq, kv_head * GROUP, num_splits, ml_offset,
                            stride_ps, stride_ph, stride_pk, stride_os, stride_oh,
                            GROUP * KV_PER_PROGRAM, MERGE_ROWS, SPLITS_PAD, HEAD_DIM, DIM_PAD)


@triton.jit
def store_partial(PART, part, acc, m_i, l_i, ml_offset, out_mask, row_ok, dims,
                  DIM_PAD: tl.constexpr):
    """A split's unnormalised output and (max, sum) of its rows at ``part`` (row indices)."""
    tl.store(PART + part[:, None] * DIM_PAD + dims[None, :], acc, mask=out_mask)
    tl.store(PART + ml_offset + part * 2, m_i, mask=row_ok)
    tl.store(PART + ml_offset + part * 2 + 1, l_i, mask=row_ok)


@triton.jit
def count_and_merge(PART, OUT, COUNTERS, seq, first_head, num_splits, ml_offset,
                    stride_ps, stride_ph, stride_pk, stride_os, stride_oh,
                    ROWS: tl.constexpr, MERGE_ROWS: tl.constexpr, SPLITS_PAD: tl.constexpr,
                    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr):
    """Counts the split in its (sequence, ``tl.program_id(1)``)'s counter; the last of the
    ``num_splits`` to arrive sets it back to zero and merges them (``merge_splits``)."""
    # the barrier orders every thread's stores before the count (one thread's atomic, its old
    # value broadcast), which releases them to the last split's count
    tl.debug_barrier()
    counter = COUNTERS + seq * tl.num_programs(1) + tl.program_id(1)
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if arrived == num_splits - 1:
        # every split has counted: nothing else touches the counter in this launch, and the
        # next launch starts after this one ends (a plain store will do)
        tl.store(counter, 0)
        tl.debug_barrier()  # what the counting thread acquired, to all threads
        merge_splits(PART, OUT, seq, first_head, num_splits, ml_offset, stride_ps, stride_ph,
                     stride_pk, stride_os, stride_oh, ROWS, MERGE_ROWS, SPLITS_PAD, HEAD_DIM,
                     DIM_PAD)


# noinline: allocated registers apart from the main loop (inlined, it raised some kernels' count
# above the two-kernel split kernel's, compiled for sm_90 on the CPU)
@triton.jit(noinline=True)
def merge_splits(PART, OUT, seq, first_head, num_splits, ml_offset,
                 stride_ps, stride_ph, stride_pk, stride_os, stride_oh,
                 ROWS: tl.constexpr, MERGE_ROWS: tl.constexpr, SPLITS_PAD: tl.constexpr,
                 HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr):
    """``out`` of query heads ``first_head`` .. ``first_head + ROWS - 1`` of ``seq`` from the
    ``num_splits`` (<= ``SPLITS_PAD``) partials, all loaded at once: weights ``exp2(m_split -
    m_max)``, empty splits (max -inf) 0, the same sums whichever program merges. Partials are
    loaded from L2 (``.cg``), where other SMs stored them. (No loop: Triton 3.6's
    OptimizeThreadLocality pass failed an assertion on the fp8 kernel's loop of maxima.)"""
    rows = tl.arange(0, MERGE_ROWS)
    row_ok = rows < ROWS
    heads = first_head + rows
    dims = tl.arange(0, DIM_PAD)
    splits = tl.arange(0, SPLITS_PAD)
    at = (seq * stride_ps + heads * stride_ph)[:, None] + splits[None, :] * stride_pk
    ok = row_ok[:, None] & (splits < num_splits)[None, :]
    m = tl.load(PART + ml_offset + at * 2, mask=ok, other=float("-inf"), cache_modifier=".cg")
    l_s = tl.load(PART + ml_offset + at * 2 + 1, mask=ok, other=0.0, cache_modifier=".cg")
    o = tl.load(PART + at[:, :, None] * DIM_PAD + dims[None, None, :], mask=ok[:, :, None],
                other=0.0, cache_modifier=".cg")
    m_max = tl.max(m, 1)
    w = tl.where(m > float("-inf"), tl.exp2(m - m_max[:, None]), 0.0)
    acc = tl.sum(o * w[:, :, None], 1)
    denom = tl.sum(l_s * w, 1)
    tl.store(OUT + seq * stride_os + heads[:, None] * stride_oh + dims[None, :],
             (acc / denom[:, None]).to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & (dims < HEAD_DIM)[None, :])


@triton.jit
def _combine_kernel(
    PART, OUT, SEQ_LENS, grid_splits, tokens_per_split, split_budget, units_per_seq, slots,
    ml_offset, stride_ps, stride_ph, stride_os, stride_oh,
    SPLITS_PAD: tl.constexpr, CHUNK: tl.constexpr, HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr, TILE_N: tl.constexpr, ADAPTIVE: tl.constexpr,
    LENS_PAD: tl.constexpr, MERGED_UP_TO: tl.constexpr,
):
    """The merge as a second launch, one program per (sequence, query head), ``CHUNK`` splits
    a step: where the split kernel does not merge (more than ``FUSED_MERGE_SPLITS`` splits, or
    a plan first called while a CUDA graph is captured, before it has counters:
    ``DecodePlan``). A sequence of up to ``MERGED_UP_TO`` splits has its output already (one
    split writes it, and the split kernel merges up to ``FUSED_MERGE_SPLITS`` where it
    merges)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    if ADAPTIVE:
        _, valid, lens = batch_lengths(SEQ_LENS, tl.num_programs(0), LENS_PAD)
        per_split = split_tokens(lens, valid, tokens_per_split, split_budget, grid_splits,
                                 units_per_seq, slots, TILE_N)
        num_splits = tl.cdiv(tl.load(SEQ_LENS + seq), per_split)
        if num_splits <= MERGED_UP_TO:
            return
    else:  # the uniform grid: every sequence has all its splits' partials
        num_splits = grid_splits
    base = seq * stride_ps + head * stride_ph  # stride over splits is 1
    PART_ML = PART + ml_offset
    splits = tl.arange(0, SPLITS_PAD)
    m = tl.load(PART_ML + (base + splits) * 2, mask=splits < num_splits, other=float("-inf"))
    m_max = tl.max(m, 0)
    dims = tl.arange(0, DIM_PAD)
    acc = tl.zeros([DIM_PAD], tl.float32)
    denom = 0.0
    for first in range(0, num_splits, CHUNK):  # partial outputs a chunk of splits at a time
        chunk = first + tl.arange(0, CHUNK)
        ok = chunk < num_splits
        m_c = tl.load(PART_ML + (base + chunk) * 2, mask=ok, other=float("-inf"))
        l_c = tl.load(PART_ML + (base + chunk) * 2 + 1, mask=ok, other=0.0)
        w = tl.where(m_c > float("-inf"), tl.exp2(m_c - m_max), 0.0)  # empty splits weigh 0
        o = tl.load(PART + (base + chunk)[:, None] * DIM_PAD + dims[None, :], mask=ok[:, None],
                    other=0.0)
        acc += tl.sum(o * w[:, None], 0)
        denom += tl.sum(l_c * w, 0)
    tl.store(OUT + seq * stride_os + head * stride_oh + dims, (acc / denom).to(OUT.dtype.element_ty),
             mask=dims < HEAD_DIM)


def choose_num_splits(units: int, capacity: int, tile_n: int, slots: int) -> int:
    """Splits of each of ``units`` (sequence, KV head) pairs' ``capacity`` tokens for a batch
    that fills its table: ``launch_common.wave_splits`` in KV tiles, a program's fixed cost
    ``SPLIT_OVERHEAD_TILES``, the merge one tile time per ``COMBINE_CHUNK`` splits (up to
    ``FUSED_MERGE_SPLITS`` the split kernel's last programs merge them instead, counted the
    same). It avoids a split count that spills a few programs into a second wave, and
    splitting one sequence into hundreds of slivers (docs/kernels.md, "Splits")."""
    return wave_splits(units, capacity, tile_n, slots, overhead_steps=SPLIT_OVERHEAD_TILES,
                       merge_per_step=COMBINE_CHUNK, max_splits=MAX_SPLITS)[0]


def ragged_can_help(num_seqs: int, splits: int, tokens_per_split: int, tile_n: int,
                    fp8: bool) -> bool:
    """Whether a call whose uniform choice is ``splits`` of ``tokens_per_split`` may take the
    ragged grid (``split_tokens``), decided from what the host knows: not for one sequence
    (never ragged), nor more than ``MAX_RAGGED_SEQS`` (lengths read at once), nor where that
    split is under ``RAGGED_MIN_SPLIT_TILES`` tiles: the most a ragged choice saves is part
    of one split's time, less than what its grid costs every call (each program's choice,
    programs that exit). Where the split kernel merges the uniform choice's splits itself (up
    to ``FUSED_MERGE_SPLITS``) the ragged grid adds a second merge launch too: the split must
    then reach ``RAGGED_MIN_FUSED_SPLIT_TILES`` (a table of 1,024 tokens in tiles of 64, all
    of it one split, does not: its uniform batches ran 1.15x slower there). Nor for an
    ``fp8`` cache: its kernel's registers grow most on the ragged grid (sm_90: 211 against
    168 for Qwen2.5-7B's pairs of KV heads) and its uniform batches ran 1.3-1.5x slower there
    on an H100, while no ragged fp8 batch was measured to gain (docs/kernels.md, "Ragged
    batches")."""
    least = (RAGGED_MIN_FUSED_SPLIT_TILES if splits <= FUSED_MERGE_SPLITS
             else RAGGED_MIN_SPLIT_TILES)
    return not fp8 and 1 < num_seqs <= MAX_RAGGED_SEQS and tokens_per_split >= least * tile_n


def ragged_split_room(num_seqs: int, units_per_seq: int, splits: int, slots: int,
                      capacity_tiles: int) -> tuple[int, int]:
    """(split budget, most splits of a sequence) of a call whose uniform choice is ``splits``
    per sequence: the batch may take as many work items (splits) in all as fill the waves of
    programs that choice pays for and ``RAGGED_WAVES`` more (the ``split_budget`` of
    ``split_tokens``, and the ragged grid's size), and one sequence as many as that budget
    leaves it when every other takes one, at most ``RAGGED_SPLITS`` times ``splits``."""
    waves = ceil_div(num_seqs * units_per_seq * splits, slots) + RAGGED_WAVES
    budget = max(num_seqs * splits, waves * slots // units_per_seq)
    most = min(budget - num_seqs + 1, RAGGED_SPLITS * splits, capacity_tiles, MAX_SPLITS)
    return budget, max(splits, most)


_SLOTS: dict = {}  # launch configuration -> slots, filled on first use


def _slots(kernel, device_index: int) -> int:
    """Programs of a compiled kernel that the whole GPU holds at once (the CUDA occupancy
    limit from its registers, shared memory and warps, times the SM count)."""
    kernel.run  # noqa: B018 -- loads the binary, which is when Triton learns n_regs
    props = torch.cuda.get_device_properties(device_index)
    warps = kernel.metadata.num_warps
    regs_per_warp = max(256, ceil_div((kernel.n_regs or 0) * 32, 256) * 256)  # 256 at a time
    per_sm = min(getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * warps),
                 getattr(props, "shared_memory_per_multiprocessor", 233472)
                 // (kernel.metadata.shared + 1024),  # CUDA reserves 1 KB per block
                 props.max_threads_per_multi_processor // (32 * warps), 32)
    return max(1, per_sm) * props.multi_processor_count


# A long context over very few (sequence, KV head) pairs: larger tiles with more warps move more
# per loop step there (docs/kernels.md, "Long contexts with few pairs").
LONG_CONTEXT, FEW_PAIRS = 16384, 4


def default_tile_n(head_dim: int, dtype: torch.dtype) -> int:
    """Tokens per KV tile in general (the prefill kernel's key tile too)."""
    return 32 if head_dim > 128 or dtype == torch.float32 else 64


# An fp8 cache read through blocks of 2+ tokens, or whose KV heads pair up: half-size tiles on 2
# warps. The fp8 loop is bound by the latency of its per-tile chain on the SM (shared-memory
# loads and stores, cross-warp reductions, barriers), not by its loads, and fewer warps per
# program wait less at each barrier; two KV heads per program (``kv_heads_pair``) then give
# each step of that chain twice the bytes (docs/kernels.md, "fp8 KV caches").
FP8_LAUNCH = (32, 2)


def kv_heads_pair(group: int, kv_heads: int, fp8: bool) -> bool:
    """Whether the decode of an ``fp8`` cache can take two KV heads per program: their query
    groups of ``group`` rows fit the ``MMA_ROWS`` padded rows together."""
    return fp8 and kv_heads % 2 == 0 and 2 * group <= MMA_ROWS


def default_launch(head_dim: int, dtype: torch.dtype, pairs: int, capacity: int,
                   fp8: bool = False, block_size: int = 16, heads_pair: bool = False):
    """(tile_n, num_warps) for ``pairs`` (sequence, KV head) pairs over ``capacity`` tokens;
    ``fp8``: the cache is fp8, in blocks of ``block_size`` tokens; ``heads_pair``: its KV
    heads pair up (``kv_heads_pair``)."""
    tile_n = default_tile_n(head_dim, dtype)
    if tile_n == 64 and capacity >= LONG_CONTEXT and pairs <= FEW_PAIRS:
        return 128, 8
    if fp8 and tile_n == 64 and (block_size > 1 or heads_pair):
        return FP8_LAUNCH
    return tile_n, 4


def default_num_stages(block_size: int, fp8: bool, kv_per_program: int = 1) -> int:
    """Triton's pipelining depth. Through a block table each tile's K/V addresses come from a
    load, and Triton 3.6 splits ``num_stages - 1`` stages between the two levels of loads
    (rounding down): 2 stages keep one tile of K/V in flight with its table entries loaded
    just before it, 3 load the table a tile ahead, 5 also keep two K/V tiles in flight. With
    one-token blocks every token's entry is its own load, and prefetching them pays. With
    larger blocks the extra stages cost shared memory and occupancy for nothing, except for an
    fp8 cache read two KV heads per program, whose loop waits on its per-tile chain and gains
    from two K/V tiles in flight (docs/kernels.md, "Pipelining")."""
    if block_size > 1:
        return 5 if fp8 and kv_per_program > 1 else 2
    return 5 if fp8 else 3


def hardware_fp8_convert(device: torch.device) -> bool:
    """Whether compiled kernels on ``device`` can convert fp8 with the ``cvt`` instruction
    (NVIDIA compute capability 8.9+); interpreted Triton cannot run inline assembly."""
    return not INTERPRETED and nvidia_fp8_hardware(device)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeLaunch:
    """How ``triton_paged_decode`` launches; each field None is the default's choice.

    ``num_splits``: KV splits of every sequence's table (default ``choose_num_splits`` for a
    batch that fills the table, from the kernel's occupancy, and as many more for the long
    sequences of a ragged batch as ``split_tokens`` finds room for); ``tile_n``: tokens per
    KV tile (a power of two) and ``num_warps`` Triton's, both from ``default_launch``;
    ``num_stages``: Triton's (``default_num_stages``); ``kv_per_program``: KV heads each
    program reads (a divisor of num_kv_heads; default 2 where ``kv_heads_pair`` and the
    default launch is ``FP8_LAUNCH``, else 1); ``fused_merge``: whether the split kernel's last
    program of each (sequence, KV head) merges the splits (default: up to
    ``FUSED_MERGE_SPLITS`` splits) or a second kernel does.
    """

    num_splits: int | None = None
    tile_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    kv_per_program: int | None = None
    fused_merge: bool | None = None

    def __post_init__(self):
        for name in ("num_splits", "tile_n", "num_warps", "num_stages", "kv_per_program"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name}: expected a positive int or None, got {value!r}")
        for name in ("tile_n", "num_warps"):
            value = getattr(self, name)
            if value is not None and value & (value - 1):
                raise ValueError(f"{name}: expected a power of two, got {value}")
        if not (self.fused_merge is None or isinstance(self.fused_merge, bool)):
            raise ValueError(f"fused_merge: expected a bool or None, got {self.fused_merge!r}")


DEFAULT_LAUNCH = DecodeLaunch()


class DecodePlan:
    """Everything about a decode call that its shapes fix: split count, grids, constexprs and
    strides, built once per shape (``decode_plan``) so a call only allocates and launches.
    ``num_splits``: the splits of a sequence that fills the table; ``max_splits``: the most
    any sequence of the batch may take (more on a ragged batch, ``ragged_split_room``).

    With several splits, up to ``FUSED_MERGE_SPLITS`` of them unless ``fused_merge`` says
    otherwise, the split kernel merges them itself; with more, ``_combine_kernel`` does, a
    second launch. A merging plan holds the kernel's ``counters`` (int32, one per sequence and
    program column), zero between calls: the program that merges a column sets its counter
    back, so neither calls nor CUDA-graph replays need a memset. They are made on the plan's
    first call that is not being captured (``torch.zeros`` in a capture would be a node of the
    graph, run by its replays only); a call captured before then launches the split kernel
    without the merge and ``_combine_kernel`` after it, and so do its graph's replays. Calls
    share the counters, replays of graphs that captured the plan too: a plan must not run on
    two streams at once.
    """

    def __init__(self, q, k_cache, v_cache, tables, seq_lens, scale, launch: DecodeLaunch):
        check_plan_layout(q, k_cache, v_cache, tables, seq_lens)
        num_splits, tile_n, num_warps = launch.num_splits, launch.tile_n, launch.num_warps
        kv_per_program, fused_merge = launch.kv_per_program, launch.fused_merge
        num_seqs, q_heads, head_dim = q.shape
        _, block_size, kv_heads, _ = k_cache.shape
        group = q_heads // kv_heads
        capacity = tables.shape[1] * block_size
        fp8 = is_fp8(k_cache.dtype)
        if kv_per_program is not None and (kv_per_program < 1 or kv_heads % kv_per_program):
            raise ValueError(f"kv_per_program: must divide the {kv_heads} KV heads, got "
                             f"{kv_per_program}")
        if tile_n is None and num_warps is None:
            pair = kv_per_program in (None, 2) and kv_heads_pair(group, kv_heads, fp8)
            tile_n, num_warps = default_launch(head_dim, q.dtype, num_seqs * kv_heads, capacity,
                                               fp8, block_size, pair)
            if kv_per_program is None and pair and (tile_n, num_warps) == FP8_LAUNCH:
                kv_per_program = 2
        else:  # partly given: the general defaults for the rest
            tile_n, num_warps = tile_n or default_tile_n(head_dim, q.dtype), num_warps or 4
        kv_per_program = kv_per_program or 1
        dim_pad = max(16, next_pow2(head_dim))
        num_stages = launch.num_stages or default_num_stages(block_size, fp8, kv_per_program)
        self.out_shape, self.num_seqs = tuple(q.shape), num_seqs
        constexprs = dict(
            GROUP=group, GROUP_PAD=max(MMA_ROWS, next_pow2(group * kv_per_program)),
            BLOCK_SIZE=block_size, TILE_N=tile_n, HEAD_DIM=head_dim, DIM_PAD=dim_pad,
            DIRECT=False,
            IEEE_DOT=q.dtype == torch.float32 or (INTERPRETED and q.dtype == torch.bfloat16),
            FP8=fp8, Q_TO_F16=fp8 and q.dtype == torch.bfloat16,
            FP8_CVT_ASM=fp8 and q.dtype != torch.float32 and hardware_fp8_convert(q.device),
            KV_PER_PROGRAM=kv_per_program, MERGE=True)
        # the merge's rows unpadded (it has no tl.dot), its splits loaded all at once
        constexprs.update(MERGE_ROWS=next_pow2(group * kv_per_program),
                          SPLITS_PAD=FUSED_MERGE_SPLITS, ADAPTIVE=False,
                          LENS_PAD=max(16, next_pow2(min(num_seqs, MAX_RAGGED_SEQS))))
        options = dict(num_warps=num_warps, num_stages=num_stages)

        units = kv_heads // kv_per_program

        def scalars(splits, tokens_per_split, budget, ml_offset):
            return (scale * LOG2E, tokens_per_split, budget, splits, num_seqs, units, slots,
                    ml_offset,
                    q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
                    tables.stride(0), q_heads * head_dim, head_dim,  # out is contiguous
                    q_heads * splits, splits, 1)

        def occupancy(adaptive: bool) -> int:
            """Programs of the split kernel on the grid ``adaptive`` names the GPU holds."""
            if INTERPRETED or q.device.type != "cuda":
                return INTERPRETED_SLOTS
            variant = {**constexprs, "ADAPTIVE": adaptive}
            key = (q.device.index, q.dtype, k_cache.dtype, v_cache.dtype, tables.dtype,
                   seq_lens.dtype, *variant.values(), *options.values())
            # compile without running: occupancy needs the binary. The merging variant stands
            # for the plan's others (they differ outside the main loop); the ragged grid's
            # choice of splits takes registers of its own (more programs per SM may not fit)
            if key not in _SLOTS:
                part = torch.empty(16, device=q.device, dtype=torch.float32)
                counters = torch.empty(16, device=q.device, dtype=torch.int32)
                compiled = _decode_split_kernel.warmup(
                    q, k_cache, v_cache, tables, seq_lens, q, part, part, part, counters,
                    *scalars(2, tile_n, 2, 16), grid=(1,), **variant, **options)
                _SLOTS[key] = _slots(compiled, q.device.index or 0)
            return _SLOTS[key]

        slots = INTERPRETED_SLOTS
        if num_splits is None or launch.num_splits is None:
            slots = occupancy(False)
            num_splits = choose_num_splits(num_seqs * kv_heads // kv_per_program, capacity,
                                           tile_n, slots)
        num_splits = max(1, min(num_splits, ceil_div(capacity, tile_n)))
        tokens_per_split = ceil_div(ceil_div(capacity, num_splits), tile_n) * tile_n
        num_splits = ceil_div(capacity, tokens_per_split)
        # a given count is every sequence's (those shorter than the table take fewer); the
        # default's may grow for the long sequences of a ragged batch, as far as the room
        # the uniform choice leaves (a grid of work items then, not of splits)
        budget = most = num_splits
        if launch.num_splits is None and ragged_can_help(num_seqs, num_splits, tokens_per_split,
                                                         tile_n, fp8):
            slots = occupancy(True)  # the ragged grid's waves are of its own kernel's programs
            budget, most = ragged_split_room(num_seqs, kv_heads // kv_per_program, num_splits,
                                             slots, ceil_div(capacity, tile_n))
        adaptive = most > num_splits  # else the uniform grid, the pre-ragged kernel's path
        # num_splits: a sequence's that fills the table; max_splits: the most any one takes
        self.num_splits, self.max_splits = num_splits, most
        num_splits = most
        parts = num_seqs * q_heads * num_splits
        self.part_numel = parts * (dim_pad + 2) if num_splits > 1 else 0
        grid = ((budget, kv_heads // kv_per_program, 1) if adaptive
                else (num_seqs, kv_heads // kv_per_program, num_splits))
        split_scalars = scalars(num_splits, tokens_per_split, budget, parts * dim_pad)
        if fused_merge and self.num_splits > FUSED_MERGE_SPLITS:
            raise ValueError(f"fused_merge: the split kernel merges at most "
                             f"{FUSED_MERGE_SPLITS} splits, this plan has {self.num_splits}")
        # fused: the split kernel merges the sequences of up to FUSED_MERGE_SPLITS splits; a
        # ragged plan's longer ones (and every sequence of an unfused plan) the combine kernel
        self.fused = num_splits > 1 and (self.num_splits <= FUSED_MERGE_SPLITS
                                         if fused_merge is None else fused_merge)
        self.combine_after_merge = self.fused and num_splits > FUSED_MERGE_SPLITS
        constexprs["ADAPTIVE"] = adaptive
        self.split = Launcher(_decode_split_kernel, grid, split_scalars,
                               {**constexprs, "DIRECT": num_splits == 1, "MERGE": self.fused},
                               options, num_tensors=10)
        self.num_counters, self.counters = num_seqs * units, None
        if num_splits > 1:  # unfused, or a call captured before the plan has counters
            self.unmerged = self.split if not self.fused else Launcher(
                _decode_split_kernel, grid, split_scalars, {**constexprs, "MERGE": False},
                options, num_tensors=10)
            combine_scalars = (num_splits, tokens_per_split, budget, units, slots,
                               parts * dim_pad, q_heads * num_splits, num_splits,
                               q_heads * head_dim, head_dim)
            combine_constexprs = dict(
                SPLITS_PAD=max(2, next_pow2(num_splits)),
                CHUNK=min(COMBINE_CHUNK, max(2, next_pow2(num_splits))), HEAD_DIM=head_dim,
                DIM_PAD=dim_pad, TILE_N=tile_n, ADAPTIVE=adaptive,
                LENS_PAD=constexprs["LENS_PAD"], MERGED_UP_TO=1)
            self.combine, self.combine_rest = (Launcher(
                _combine_kernel, (num_seqs, q_heads), combine_scalars,
                {**combine_constexprs, "MERGED_UP_TO": merged}, dict(num_warps=4),
                num_tensors=3) for merged in (1, FUSED_MERGE_SPLITS))

    def __call__(self, q, k_cache, v_cache, tables, seq_lens, k_scale=None, v_scale=None):
        out = torch.empty(self.out_shape, device=q.device, dtype=q.dtype)
        if self.num_seqs == 0:
            return out
        if k_scale is None:  # not read (FP8 is off): any pointer will do
            k_scale = v_scale = seq_lens
        if self.max_splits == 1:  # writes out directly (reads no counters)
            self.split(q, k_cache, v_cache, tables, seq_lens, out, out, k_scale, v_scale,
                       seq_lens)
            return out
        part = torch.empty(self.part_numel, device=q.device, dtype=torch.float32)
        if self.fused and self.counters is None and not _capturing(q.device):
            self.counters = _zeroed_counters(self.num_counters, q.device)
        if self.counters is None:
            self.unmerged(q, k_cache, v_cache, tables, seq_lens, out, part, k_scale, v_scale,
                          seq_lens)
            self.combine(part, out, seq_lens)
        else:
            self.split(q, k_cache, v_cache, tables, seq_lens, out, part, k_scale, v_scale,
                       self.counters)
            if self.combine_after_merge:
                self.combine_rest(part, out, seq_lens)
        return out


def _capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream is capturing a CUDA graph."""
    if device.type != "cuda":
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


# Counters of plans that decode_plan evicted: a CUDA graph that captured such a plan still counts
# in them, so they are never freed, only handed to a later plan (zero between calls, they serve
# it as they are; that plan and the graph then must not run at once, like one plan's calls).
_SPARE_COUNTERS: list = []


def _zeroed_counters(n: int, device: torch.device) -> torch.Tensor:
    """``n`` int32 counters at zero, an evicted plan's where one has enough."""
    for i, spare in enumerate(_SPARE_COUNTERS):
        if spare.device == device and spare.numel() >= n:
            return _SPARE_COUNTERS.pop(i)[:n]
    return torch.zeros(n, device=device, dtype=torch.int32)


def check_plan_layout(q, k_cache, v_cache, tables, seq_lens) -> None:
    """The layouts the kernel reads: it takes the strides of q's first two dimensions, of the
    caches' first three and of the table's rows, and assumes unit stride elsewhere (a last
    dimension of size 1 has no stride to speak of: ``.contiguous()`` keeps any)."""
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("block_tables", tables)):
        if x.stride(-1) != 1 and x.shape[-1] > 1:
            raise ValueError(f"{name}: the last dimension must have unit stride")
    if not seq_lens.is_contiguous():
        raise ValueError("seq_lens: must be contiguous")


_PLANS: dict = {}
MAX_PLANS = 1024  # an engine sees one shape per batch size and table width


def decode_plan(q, k_cache, v_cache, block_tables, seq_lens, scale,
                launch: DecodeLaunch | None = None) -> DecodePlan:
    """The cached plan for a call with these shapes, strides, dtypes and ``launch`` (built on
    the first such call). Arguments as ``triton_paged_decode``, in the layouts
    ``check_plan_layout`` accepts (a plan for any other raises ``ValueError``)."""
    launch = launch or DEFAULT_LAUNCH
    # Everything the plan bakes in: its grids, scalars (strides) and the kernels' dtype
    # specialisations, which its launchers do not re-derive per call (``Launcher``).
    key = (q.device, scale, launch, *((x.shape, x.stride(), x.dtype)
                                      for x in (q, k_cache, v_cache, block_tables, seq_lens)))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= MAX_PLANS:
            _SPARE_COUNTERS.extend(p.counters for p in _PLANS.values() if p.counters is not None)
            _PLANS.clear()
        plan = _PLANS[key] = DecodePlan(q, k_cache, v_cache, block_tables, seq_lens, scale,
                                        launch)
    return plan


def triton_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale=None,
                        v_scale=None, launch: DecodeLaunch | None = None):
    """Paged decode; arguments as ``pagebench.kernels.paged_decode`` (already validated; an
    fp8 cache's scales as float32 tensors ``[num_kv_heads]``). ``launch``: the launch
    (``DecodeLaunch``; None: every field the default's choice). No device sync: the call can
    be captured in a CUDA graph."""
    q, tables, seq_lens = unit_stride_rows(q, block_tables, seq_lens)
    plan = decode_plan(q, k_cache, v_cache, tables, seq_lens, scale, launch)
    return plan(q, k_cache, v_cache, tables, seq_lens, k_scale, v_scale)
