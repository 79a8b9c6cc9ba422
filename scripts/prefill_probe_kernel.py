"""Experimental copies of the Triton paged prefill for the H200 probe (scripts/h200_prefill_probe.py).

The kernel of ``pagebench/kernels/triton_prefill.py`` with two more switches, to be measured
before anything moves into the package:

- ``PAIR``: a program takes query tiles ``j`` and ``n - 1 - j`` of one sequence (the longest
  walk with the shortest), so every program of a sequence walks about the same number of key
  tiles and there are half as many programs;
- ``MERGE``: as ``PAIR``, both walks in one loop (the pipeline filled once per program);
- ``QREG``: the softmax scale folded into q once (the scores come out in the log2 domain), so
  q is a computed dot operand that Triton may keep in registers (wgmma A from registers: no
  re-read of the Q tile from shared memory for every key tile);
- ``DIAG`` (diagnostics, wrong results): 1 = no walk at all (the scan, the Q load and the output
  store only), 2 = only the first key tile of each walk.
"""

from __future__ import annotations

import torch

from pagebench.config import ceil_div
from pagebench.kernels.triton_decode import next_pow2

# isort: split
import triton
import triton.language as tl


@triton.jit
def _table_entries(table_row, pos, end, BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(table_row + pos // BLOCK_SIZE, mask=pos < end, other=0)
    return tl.load(table_row + pos // BLOCK_SIZE)


@triton.jit
def _kv_rows(K, V, block, pos, end, dims, k_head, v_head,
             stride_kb, stride_kt, stride_vb, stride_vt,
             BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr):
    slot = pos % BLOCK_SIZE
    k_ptr = K + (block * stride_kb + slot * stride_kt + k_head)[:, None] + dims[None, :]
    v_ptr = V + (block * stride_vb + slot * stride_vt + v_head)[:, None] + dims[None, :]
    if MASKED:
        kv_mask = (pos < end)[:, None]
        k = tl.load(k_ptr, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr, mask=kv_mask, other=0.0)
    else:
        k = tl.load(k_ptr)
        v = tl.load(v_ptr)
    return k, v


@triton.jit
def _walk(q, K, V, table_row, lo, hi, full_end, end, q_pos, m_i, l_i, acc, scale_log2e,
          offs, dims, k_head, v_head, stride_kb, stride_kt, stride_vb, stride_vt,
          BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, MASKED: tl.constexpr,
          TABLE_AHEAD: tl.constexpr, SCALED: tl.constexpr):
    if TABLE_AHEAD:
        block = _table_entries(table_row, lo + offs, end, BLOCK_SIZE, True)
    for start in range(lo, hi, TILE_N):
        pos = start + offs
        if TABLE_AHEAD:
            block_next = _table_entries(table_row, pos + TILE_N, end, BLOCK_SIZE, True)
        else:
            block = _table_entries(table_row, pos, end, BLOCK_SIZE, MASKED)
        k, v = _kv_rows(K, V, block, pos, end, dims, k_head, v_head,
                        stride_kb, stride_kt, stride_vb, stride_vt, BLOCK_SIZE, MASKED)
        s = tl.dot(q, tl.trans(k))
        if MASKED:
            if start + TILE_N > full_end:
                s = tl.where((pos < end)[None, :] & (pos[None, :] <= q_pos[:, None]), s,
                             float("-inf"))
        if SCALED:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2e)
            p = tl.exp2(s * scale_log2e - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
        if TABLE_AHEAD:
            block = block_next
    return m_i, l_i, acc


@triton.jit
def _attend(tile_in_seq, Q, K, V, OUT, table_row, q_start, q_len, seq_len, kv_head,
            scale_log2e, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
            stride_vb, stride_vt, stride_vh, stride_ot, stride_oh,
            GROUP: tl.constexpr, TOKENS: tl.constexpr, ROWS: tl.constexpr,
            BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr,
            ONE_LOOP: tl.constexpr, TABLE_AHEAD: tl.constexpr, DIAG: tl.constexpr,
            QREG: tl.constexpr):
    """Query tile ``tile_in_seq`` of its sequence, one KV head's group: load Q, walk, store."""
    first = tile_in_seq * TOKENS
    rows = tl.arange(0, ROWS)
    tok = first + rows // GROUP
    heads = kv_head * GROUP + rows % GROUP
    row_ok = (rows < TOKENS * GROUP) & (tok < q_len)
    q_pos = seq_len - q_len + tok
    dims = tl.arange(0, HEAD_DIM)
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(Q + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    if QREG:  # scale folded into q: a computed dot operand, which Triton may keep in registers
        q = (q.to(tl.float32) * scale_log2e).to(q.dtype)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    k_head = kv_head * stride_kh
    v_head = kv_head * stride_vh
    first_pos = seq_len - q_len + first
    full_end = (first_pos + 1) // TILE_N * TILE_N
    end = seq_len - q_len + tl.minimum(first + TOKENS, q_len)
    offs = tl.arange(0, TILE_N)
    if DIAG == 1:
        acc = q.to(tl.float32)
        l_i = l_i + 1.0
    else:
        hi = end
        if DIAG == 2:
            hi = tl.minimum(end, TILE_N)
        if ONE_LOOP:
            m_i, l_i, acc = _walk(q, K, V, table_row, 0, hi, full_end, end, q_pos, m_i, l_i,
                                  acc, scale_log2e, offs, dims, k_head, v_head,
                                  stride_kb, stride_kt, stride_vb, stride_vt,
                                  BLOCK_SIZE, TILE_N, True, TABLE_AHEAD, QREG)
        else:
            m_i, l_i, acc = _walk(q, K, V, table_row, 0, tl.minimum(full_end, hi), full_end,
                                  end, q_pos, m_i, l_i, acc, scale_log2e, offs, dims, k_head,
                                  v_head, stride_kb, stride_kt, stride_vb, stride_vt,
                                  BLOCK_SIZE, TILE_N, False, TABLE_AHEAD, QREG)
            m_i, l_i, acc = _walk(q, K, V, table_row, full_end, hi, full_end, end, q_pos, m_i,
                                  l_i, acc, scale_log2e, offs, dims, k_head, v_head,
                                  stride_kb, stride_kt, stride_vb, stride_vt,
                                  BLOCK_SIZE, TILE_N, True, TABLE_AHEAD, QREG)
    out = acc / l_i[:, None]
    tl.store(OUT + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
             out.to(OUT.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _merged_pair(tile_l, tile_s, Q, K, V, OUT, table_row, q_start, q_len, seq_len,
                 kv_head, scale_log2e, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                 stride_vb, stride_vt, stride_vh, stride_ot, stride_oh,
                 GROUP: tl.constexpr, TOKENS: tl.constexpr, ROWS: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Query tiles ``tile_l`` then ``tile_s`` (if it is another one) in ONE pipelined loop over both
    walks: the K/V pipeline does not drain between them; at the switch the long tile's output
    is stored and the running max reset (-inf: its alpha zeroes the sum and the output)."""
    has_s = tile_s < tile_l
    rows = tl.arange(0, ROWS)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + rows % GROUP
    first_l = tile_l * TOKENS
    first_s = tile_s * TOKENS
    tok_l = first_l + rows // GROUP
    tok_s = first_s + rows // GROUP
    ok_l = (rows < TOKENS * GROUP) & (tok_l < q_len)
    ok_s = (rows < TOKENS * GROUP) & (tok_s < tl.where(has_s, q_len, 0))
    rows_l = (q_start + tok_l).to(tl.int64)
    rows_s = (q_start + tok_s).to(tl.int64)
    q_l = tl.load(Q + rows_l[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                  mask=ok_l[:, None], other=0.0)
    q_s = tl.load(Q + rows_s[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                  mask=ok_s[:, None], other=0.0)
    base = seq_len - q_len
    end_l = base + tl.minimum(first_l + TOKENS, q_len)
    end_s = base + tl.minimum(first_s + TOKENS, q_len)
    full_l = (base + first_l + 1) // TILE_N * TILE_N
    full_s = (base + first_s + 1) // TILE_N * TILE_N
    n_l = (end_l + TILE_N - 1) // TILE_N
    n_s = tl.where(has_s, (end_s + TILE_N - 1) // TILE_N, 0)
    pos_l = base + tok_l
    pos_s = base + tok_s
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    k_head = kv_head * stride_kh
    v_head = kv_head * stride_vh
    offs = tl.arange(0, TILE_N)
    block = _table_entries(table_row, offs, end_l, BLOCK_SIZE, True)
    for it in range(0, n_l + n_s):
        second = it >= n_l
        start = tl.where(second, it - n_l, it) * TILE_N
        end = tl.where(second, end_s, end_l)
        full_end = tl.where(second, full_s, full_l)
        nxt = it + 1
        nxt_second = nxt >= n_l
        nxt_pos = tl.where(nxt_second, nxt - n_l, nxt) * TILE_N + offs
        block_next = _table_entries(table_row, nxt_pos, tl.where(nxt_second, end_s, end_l),
                                    BLOCK_SIZE, True)
        pos = start + offs
        k, v = _kv_rows(K, V, block, pos, end, dims, k_head, v_head,
                        stride_kb, stride_kt, stride_vb, stride_vt, BLOCK_SIZE, True)
        if second:
            s = tl.dot(q_s, tl.trans(k))
            if it == n_l:  # the long tile is done: store it, restart the softmax
                tl.store(OUT + rows_l[:, None] * stride_ot + heads[:, None] * stride_oh
                         + dims[None, :], (acc / l_i[:, None]).to(OUT.dtype.element_ty),
                         mask=ok_l[:, None])
                m_i = tl.full([ROWS], float("-inf"), tl.float32)
        else:
            s = tl.dot(q_l, tl.trans(k))
        if start + TILE_N > full_end:
            q_pos = tl.where(second, pos_s, pos_l)
            s = tl.where((pos < end)[None, :] & (pos[None, :] <= q_pos[:, None]), s,
                         float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2e)
        p = tl.exp2(s * scale_log2e - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
        block = block_next
    out = (acc / l_i[:, None]).to(OUT.dtype.element_ty)
    last_rows = tl.where(has_s, rows_s, rows_l)
    tl.store(OUT + last_rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
             out, mask=tl.where(has_s, ok_s, ok_l)[:, None])


@triton.jit
def _probe_kernel(
    Q, K, V, TABLES, SEQ_LENS, Q_LENS, OUT, num_seqs, scale_log2e,
    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_ts, stride_ot, stride_oh,
    KV_HEADS: tl.constexpr, GROUP: tl.constexpr, TOKENS: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    SCAN: tl.constexpr, ONE_LOOP: tl.constexpr, TABLE_AHEAD: tl.constexpr,
    PAIR: tl.constexpr, DIAG: tl.constexpr, MERGE: tl.constexpr, QREG: tl.constexpr,
):
    pid = tl.program_id(0)
    kv_head = pid % KV_HEADS
    unit = (tl.num_programs(0) - 1 - pid) // KV_HEADS
    seq = 0
    q_start = 0
    unit_start = 0
    units_before = 0
    q_len = 0
    seq_len = 0
    for chunk in range(0, num_seqs, SCAN):
        idx = chunk + tl.arange(0, SCAN)
        listed = idx < num_seqs
        lens = tl.load(Q_LENS + idx, mask=listed, other=0)
        totals = tl.load(SEQ_LENS + idx, mask=listed, other=0)
        units = (lens + (TOKENS - 1)) // TOKENS
        if PAIR:
            units = (units + 1) // 2
        through = units_before + tl.cumsum(units, 0)
        before = through <= unit
        mine = (through - units <= unit) & (unit < through)
        seq += tl.sum(before.to(tl.int32), 0)
        q_start += tl.sum(tl.where(before, lens, 0), 0)
        unit_start += tl.sum(tl.where(before, units, 0), 0)
        q_len += tl.sum(tl.where(mine, lens, 0), 0)
        seq_len += tl.sum(tl.where(mine, totals, 0), 0)
        units_before += tl.sum(units, 0)
    if seq < num_seqs:
        table_row = TABLES + seq * stride_ts
        j = unit - unit_start
        if MERGE:
            n = (q_len + (TOKENS - 1)) // TOKENS
            _merged_pair(n - 1 - j, j, Q, K, V, OUT, table_row, q_start, q_len,
                         seq_len, kv_head, scale_log2e, stride_qt, stride_qh, stride_kb,
                         stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_ot,
                         stride_oh, GROUP, TOKENS, ROWS, BLOCK_SIZE, TILE_N, HEAD_DIM)
        elif PAIR:
            n = (q_len + (TOKENS - 1)) // TOKENS
            _attend(n - 1 - j, Q, K, V, OUT, table_row, q_start, q_len, seq_len, kv_head,
                    scale_log2e, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                    stride_vb, stride_vt, stride_vh, stride_ot, stride_oh,
                    GROUP, TOKENS, ROWS, BLOCK_SIZE, TILE_N, HEAD_DIM, ONE_LOOP, TABLE_AHEAD,
                    DIAG, QREG)
            if j < n - 1 - j:
                _attend(j, Q, K, V, OUT, table_row, q_start, q_len, seq_len, kv_head,
                        scale_log2e, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                        stride_vb, stride_vt, stride_vh, stride_ot, stride_oh,
                        GROUP, TOKENS, ROWS, BLOCK_SIZE, TILE_N, HEAD_DIM, ONE_LOOP,
                        TABLE_AHEAD, DIAG, QREG)
        else:
            _attend(j, Q, K, V, OUT, table_row, q_start, q_len, seq_len, kv_head,
                    scale_log2e, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                    stride_vb, stride_vt, stride_vh, stride_ot, stride_oh,
                    GROUP, TOKENS, ROWS, BLOCK_SIZE, TILE_N, HEAD_DIM, ONE_LOOP, TABLE_AHEAD,
                    DIAG, QREG)


def probe_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_lens, scale, *,
                  rows=64, tile_n=32, num_warps=4, num_stages=3, one_loop=True,
                  table_ahead=True, maxnreg=None, pair=False, diag=0,
                  merge=False, qreg=False):
    """bf16/fp16, head dim a power of two, caches under 2^31 elements (the probe's cases)."""
    total, q_heads, head_dim = q.shape
    num_seqs = query_lens.shape[0]
    _, block_size, kv_heads, _ = k_cache.shape
    group = q_heads // kv_heads
    rows = max(16, next_pow2(min(rows, ceil_div(total, num_seqs) * group)))
    tokens = rows // group
    out = torch.empty_like(q)
    per_unit = 2 * tokens if pair or merge else tokens
    grid = ((total // per_unit + num_seqs) * kv_heads,)
    q_lens = query_lens.to(torch.int32).contiguous()
    compiled = _probe_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, q_lens, out, num_seqs,
        scale * 1.4426950408889634, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        KV_HEADS=kv_heads, GROUP=group, TOKENS=tokens, ROWS=rows, BLOCK_SIZE=block_size,
        TILE_N=tile_n, HEAD_DIM=head_dim, SCAN=next_pow2(min(num_seqs, 1024)),
        ONE_LOOP=one_loop, TABLE_AHEAD=table_ahead, PAIR=pair or merge, DIAG=diag, MERGE=merge, QREG=qreg,
        num_warps=num_warps, num_stages=num_stages,
        **({} if maxnreg is None else {"maxnreg": maxnreg}))
    COMPILED[(rows, tile_n, num_warps, num_stages, one_loop, table_ahead, maxnreg, pair, diag,
              merge, qreg)] = compiled
    return out


COMPILED: dict = {}  # the last compiled kernel of each launch (registers, spills, PTX)


def resources(compiled) -> dict:
    """Registers, spills, shared memory and how the wgmma instructions take their A operand."""
    out = dict(n_regs=getattr(compiled, "n_regs", None), n_spills=getattr(compiled, "n_spills", None),
               shared=getattr(compiled, "metadata", None) and compiled.metadata.shared)
    ptx = compiled.asm.get("ptx", "") if hasattr(compiled, "asm") else ""
    lines = [ln for ln in ptx.splitlines() if "wgmma.mma_async" in ln]
    out["wgmma"] = len(lines)
    # A from shared memory: the third operand is a 64-bit descriptor (%rd), else registers {..}
    out["wgmma_a_regs"] = sum(1 for ln in lines if ln.count("{") >= 2)
    return out
