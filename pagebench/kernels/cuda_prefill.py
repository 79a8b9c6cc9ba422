"""Paged prefill in CUDA C++ for Hopper (compiled at first use with NVRTC for sm_90a; backend
``cuda-prefill``): causal attention for a chunk of queries of each sequence over everything
cached before it, with ``wgmma`` and ``cp.async``, for bf16/fp16 caches.

Why a second prefill beside Triton's: on an H200 Triton's paged prefill stays ~1.4x SDPA on
many short prompts (8 x 512) however it is launched: Triton 3.6 issues each key tile's
``Q K^T``, softmax and ``P V`` one after another within a warpgroup and expresses no overlap
between them for this loop (docs/kernels.md, "The Triton paged prefill"). This kernel writes
the loop out, as FlashAttention-3 does within a warpgroup: the scores of tile ``t`` are
computed (``wgmma``, asynchronous) while the product of tile ``t - 1``'s probabilities with its
values is still running, so the softmax of one tile overlaps the tensor cores' work on the
other.

- A block of ``WGS`` warpgroups takes ``TOKENS`` consecutive queries of one sequence with every
  head of one KV head's group as its ``64 x WGS`` rows (each K/V tile read serves the group);
  each warpgroup owns 64 rows and keeps their online softmax (fp32, log2 domain) and output in
  registers. It walks the keys up to its last query's position in tiles of ``TILE_N`` through
  the block table (any block size); only tiles across the diagonal take the causal mask.
- Q and the K/V tiles are copied by ``cp.async`` (16 bytes a copy; rows beyond the sequence
  zero-filled, never read) into shared memory in the layout ``wgmma`` reads with 128-byte
  swizzling: 64-element column blocks of 128-byte rows, 16-byte chunk ``c`` of row ``r`` at
  ``c ^ (r % 8)``, in ``STAGES`` slots for K and as many for V: K is copied ``STAGES - 1``
  tiles ahead of the scores computed and V ``STAGES - 2`` (tile ``t - 1``'s V is still read
  by its ``P V`` while tile ``t``'s scores are computed), each tile's block ids a copy earlier.
- ``S = Q K^T`` takes both operands from shared memory (K-major); ``O += P V`` takes P from
  registers (the scores' accumulators converted in place) and V from shared memory as stored,
  MN-major (``wgmma``'s transposed B).
- The grid is one dimension, KV head fastest and query tiles numbered from the last, as in the
  Triton kernel; each block finds its sequence by scanning the query lengths itself (one round
  of loads for up to 1,024 sequences), so nothing is read back to the host and a call can be
  captured in a CUDA graph.

What it takes (``unsupported_reason`` names the argument otherwise): q and caches of one dtype,
fp16 or bf16, head dim 64 or 128, up to 64 query heads per KV head, any block size, int32/int64
tables and lengths, rows at 16-byte boundaries (every tensor's pointer and strides but the
last), on GPUs of compute capability 9.0 (``wgmma``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from pagebench.kernels.cuda_fp8_decode import compiler_available

HEAD_DIMS = (64, 128)
MAX_GROUP = 64  # query heads per KV head: at least one token a 64-row warpgroup
SCAN_SEQS = 1024  # query lengths a block reads in one round while finding its sequence


def _wgmma(name: str, n: int, a_registers: bool, trans_b: int) -> str:
    """An inline-PTX wrapper of ``wgmma.mma_async`` m64n``n``k16 with fp32 accumulators
    ``d[n / 2]``: A from a shared-memory descriptor, or (``a_registers``) four registers."""
    regs = n // 2
    outs = ",".join(f"%{i}" for i in range(regs))
    if a_registers:
        a_arg, a_ops, next_op = "u32 (&a)[4]", [f'"r"(a[{i}])' for i in range(4)], regs + 4
        a_text, trans = f"{{%{regs},%{regs + 1},%{regs + 2},%{regs + 3}}}", f"{trans_b}"
    else:
        a_arg, a_ops, next_op = "u64 a", ['"l"(a)'], regs + 1
        a_text, trans = f"%{regs}", f"0, {trans_b}"
    return f"""
__device__ __forceinline__ void {name}(float (&d)[{regs}], {a_arg}, u64 b, int accumulate) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{next_op + 1}, 0;\\n"
               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32." DT "." DT " {{{outs}}}, {a_text}, "
               "%{next_op}, p, 1, 1, {trans};\\n}}\\n"
               : {", ".join(f'"+f"(d[{i}])' for i in range(regs))}
               : {", ".join(a_ops)}, "l"(b), "r"(accumulate));
}}
"""


SOURCE = r"""
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define THREADS (128 * WGS)
#define ROWS (64 * WGS)            /* query rows of a block: TOKENS x GROUP used */
#define CH (HEAD_DIM / 8)          /* 16-byte chunks of a row */
#define KT (HEAD_DIM / 16)         /* k-steps of S = Q K^T */
#define PK (TILE_N / 16)           /* k-steps of O += P V */
#define SN (TILE_N / 2)            /* S accumulators per thread */
#define ON (HEAD_DIM / 2)          /* O accumulators per thread */
#define ROWS_PER_THREAD (TILE_N * CH / THREADS)  /* K (and V) rows a thread copies per tile */
#define SCAN_ITEMS (SCAN_SEQS / THREADS)
#define Q_BYTES (64 * HEAD_DIM * 2)              /* one warpgroup's Q */
#define TILE_BYTES (TILE_N * HEAD_DIM * 2)       /* one K or V tile */
#define NEG_INF __int_as_float(0xff800000)

#if IS_BF16
#define DT "bf16"
#define CVT_PAIR "cvt.rn.bf16x2.f32"
#else
#define DT "f16"
#define CVT_PAIR "cvt.rn.f16x2.f32"
#endif

/* byte offset of 16-byte chunk `chunk` of row `row` in a tile of `rows` rows: column blocks of
   64 elements, 128-byte rows, chunks swizzled within each 8-row, 1 KB atom */
__device__ __forceinline__ u32 tile_offset(int row, int chunk, int rows) {
  return (u32)((chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

/* a wgmma shared-memory descriptor with 128-byte swizzling (byte offsets) */
__device__ __forceinline__ u64 smem_desc(u32 addr, u32 leading, u32 stride) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(leading >> 4) << 16)
         | ((u64)(stride >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
__device__ __forceinline__ void proxy_fence() {  /* generic-proxy writes -> wgmma's reads */
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
/* keeps the compiler from moving accumulator registers across wgmma issue and wait */
__device__ __forceinline__ void fence_regs(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
__device__ __forceinline__ void fence_regs(u32& r) { asm volatile("" : "+r"(r) :: "memory"); }

__device__ __forceinline__ u32 pack(float lo, float hi) {  /* lo in the low half */
  u32 r;
  asm(CVT_PAIR " %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

WGMMA_WRAPPERS

/* The block's sequence: the one whose query tiles (numbered one after another over the
   sequences) include `tile`; sh[0..3] = sequence (-1: none), its first query, its first tile,
   its query count. */
__device__ void find_sequence(const QLEN_T* __restrict__ q_lens, int num_seqs, int tile,
                              int* sh, int* warp_sums) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) sh[0] = -1;
  int tiles_before = 0, queries_before = 0;
  for (int base = 0; base < num_seqs; base += SCAN_SEQS) {
    int lens[SCAN_ITEMS];
    int tiles = 0, queries = 0;
#pragma unroll
    for (int i = 0; i < SCAN_ITEMS; ++i) {
      int s = base + tid * SCAN_ITEMS + i;
      lens[i] = s < num_seqs ? (int)q_lens[s] : 0;
      tiles += (lens[i] + TOKENS - 1) / TOKENS;
      queries += lens[i];
    }
    int t_incl = tiles, q_incl = queries;  /* inclusive scan over the warp, then the warps */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int t = __shfl_up_sync(0xffffffffu, t_incl, o), q = __shfl_up_sync(0xffffffffu, q_incl, o);
      if (lane >= o) { t_incl += t; q_incl += q; }
    }
    if (lane == 31) { warp_sums[2 * warp] = t_incl; warp_sums[2 * warp + 1] = q_incl; }
    __syncthreads();
    int t0 = tiles_before + t_incl - tiles, q0 = queries_before + q_incl - queries;
    int round_tiles = 0, round_queries = 0;
    for (int w = 0; w < THREADS / 32; ++w) {
      if (w < warp) { t0 += warp_sums[2 * w]; q0 += warp_sums[2 * w + 1]; }
      round_tiles += warp_sums[2 * w];
      round_queries += warp_sums[2 * w + 1];
    }
#pragma unroll
    for (int i = 0; i < SCAN_ITEMS; ++i) {
      int n = (lens[i] + TOKENS - 1) / TOKENS;
      if (t0 <= tile && tile < t0 + n) {
        sh[0] = base + tid * SCAN_ITEMS + i; sh[1] = q0; sh[2] = t0; sh[3] = lens[i];
      }
      t0 += n;
      q0 += lens[i];
    }
    tiles_before += round_tiles;
    queries_before += round_queries;
    __syncthreads();
    if (sh[0] >= 0 || tiles_before > tile) break;
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
paged_prefill(const u32* __restrict__ Q, const u32* __restrict__ K, const u32* __restrict__ V,
              const TABLE_T* __restrict__ tables, const SEQ_T* __restrict__ seq_lens,
              const QLEN_T* __restrict__ q_lens, u32* __restrict__ OUT, int num_seqs,
              double scale_log2e_d, int stride_qt, int stride_qh, int stride_kb, int stride_kt,
              int stride_kh, int stride_vb, int stride_vt, int stride_vh, int stride_ts,
              int stride_ot, int stride_oh) {
  /* strides in 2-byte elements, except the tables' (entries). Shared memory: each warpgroup's
     Q (later its output), STAGES K tiles, STAGES V tiles, then the scan's scratch; no static shared
     memory, so the dynamic area starts 1 KB aligned, as the swizzled layout needs */
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 base = (u32)__cvta_generic_to_shared(smem);
  const u32 kv_base = base + WGS * Q_BYTES;
  int* seq_info = (int*)(smem + WGS * Q_BYTES + STAGES * 2 * TILE_BYTES);
  int* warp_sums = seq_info + 4;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
  if (base & 1023) __trap();  /* the swizzle needs 1 KB alignment */
  const int kv_head = blockIdx.x % KV_HEADS;
  const int tile = (gridDim.x - 1 - blockIdx.x) / KV_HEADS;  /* the last tiles (longest walks) first */
  find_sequence(q_lens, num_seqs, tile, seq_info, warp_sums);
  const int seq = seq_info[0];
  if (seq < 0) return;  /* the grid is an upper bound on the tiles */
  const int q_start = seq_info[1], first = (tile - seq_info[2]) * TOKENS, q_len = seq_info[3];
  const int seq_len = (int)seq_lens[seq];
  const int cached = seq_len - q_len;
  const int end = cached + min(first + TOKENS, q_len);          /* keys it sees: 0 .. end - 1 */
  const int full_end = (cached + first + 1) / TILE_N * TILE_N;  /* tiles before: unmasked */
  const int n_tiles = (end + TILE_N - 1) / TILE_N;
  const float scale_log2e = (float)scale_log2e_d;
  const TABLE_T* table = tables + (i64)seq * stride_ts;
  const unsigned short* k_head = (const unsigned short*)K + (i64)kv_head * stride_kh;
  const unsigned short* v_head = (const unsigned short*)V + (i64)kv_head * stride_vh;

  /* Q: row r is query first + r / GROUP, head kv_head * GROUP + r % GROUP */
  for (int i = tid; i < ROWS * CH; i += THREADS) {
    const int r = i / CH, c = i % CH, tok = first + r / GROUP;
    const bool ok = r < TOKENS * GROUP && tok < q_len;
    const unsigned short* src = (const unsigned short*)Q;  /* not read when !ok */
    if (ok) src += (i64)(q_start + tok) * stride_qt + (i64)(kv_head * GROUP + r % GROUP) * stride_qh + c * 8;
    cp_async16(base + (r >> 6) * Q_BYTES + tile_offset(r & 63, c, 64), src, ok);
  }
  cp_commit();

  /* this thread's share of a K or V tile: chunk c of rows my_row + i * (THREADS / CH). Copy
     group j holds K of tile j and V of tile j - 1: iteration t needs group t (K of t for its
     scores, V of t - 1 for the P V it issues) and commits group t + STAGES - 1, into the K slot
     of tile t - 1 (its scores are done) and the V slot of tile t - 2 (its P V is done). */
  const int my_chunk = tid % CH, my_row = tid / CH;
  int ids_k[ROWS_PER_THREAD], ids_v[ROWS_PER_THREAD];  /* block ids (-1: beyond the sequence) */
  auto load_ids = [&](int t, int (&ids)[ROWS_PER_THREAD]) {
#pragma unroll
    for (int i = 0; i < ROWS_PER_THREAD; ++i) {
      const int key = t * TILE_N + my_row + i * (THREADS / CH);
      ids[i] = key < seq_len ? (int)table[key / BLOCK_SIZE] : -1;
    }
  };
  auto copy_rows = [&](int t, const int (&ids)[ROWS_PER_THREAD], u32 dst,
                       const unsigned short* head, int stride_b, int stride_t) {
#pragma unroll
    for (int i = 0; i < ROWS_PER_THREAD; ++i) {
      const int r = my_row + i * (THREADS / CH);
      const bool ok = ids[i] >= 0;
      const i64 b = ok ? ids[i] : 0;
      cp_async16(dst + tile_offset(r, my_chunk, TILE_N),
                 head + b * stride_b + (i64)((t * TILE_N + r) % BLOCK_SIZE) * stride_t
                 + my_chunk * 8, ok);
    }
  };
  auto copy_group = [&](int j) {  /* K of tile j (ids_k), V of tile j - 1 (ids_v) */
    if (!COPY && j > STAGES) { cp_commit(); return; }  /* a timing probe: stale tiles */
    if (j < n_tiles)
      copy_rows(j, ids_k, kv_base + (j % STAGES) * TILE_BYTES, k_head, stride_kb, stride_kt);
    if (j >= 1 && j - 1 < n_tiles)
      copy_rows(j - 1, ids_v, kv_base + (STAGES + (j - 1) % STAGES) * TILE_BYTES, v_head,
                stride_vb, stride_vt);
    cp_commit();
#pragma unroll
    for (int i = 0; i < ROWS_PER_THREAD; ++i) ids_v[i] = ids_k[i];
    if (j + 1 < n_tiles) load_ids(j + 1, ids_k);
  };
  load_ids(0, ids_k);
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) copy_group(j);

  /* this thread's rows of its warpgroup's 64: g and g + 8 of its warp's 16 */
  const int g = lane >> 2, q4 = lane & 3, row0 = (warp & 3) * 16 + g;
  int pos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wg * 64 + row0 + 8 * h, tok = first + r / GROUP;
    pos[h] = (r < TOKENS * GROUP && tok < q_len) ? cached + tok : cached + first;
  }
  const u32 q_smem = base + wg * Q_BYTES;
  float o[ON], s[SN], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
  u32 p[PK][4];  /* P of the previous tile as the A operand of O += P V */
#pragma unroll
  for (int i = 0; i < ON; ++i) o[i] = 0.f;

  float rescale[2], sum[2];
  /* tile t's scores issued, once its K (copy group t) landed */
  auto issue_scores = [&](int t) {
    cp_wait<STAGES - 2>();  /* copy group t (and Q) landed, for this thread's copies */
    proxy_fence();
    __syncthreads();        /* ... and everyone's; every warpgroup is past the scores of t - 1
                               and the P V of t - 2 */
    copy_group(t + STAGES - 1);
    const u32 k_tile = kv_base + (t % STAGES) * TILE_BYTES;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
      wgmma_scores(s, smem_desc(q_smem + (kk >> 2) * 64 * 128 + (kk & 3) * 32, 16, 1024),
                   smem_desc(k_tile + (kk >> 2) * TILE_N * 128 + (kk & 3) * 32, 16, 1024), kk);
    wg_commit();
  };
  auto issue_values = [&](int t) {  /* O += P V of tile t */
    const u32 v_tile = kv_base + (STAGES + t % STAGES) * TILE_BYTES;
#pragma unroll
    for (int u = 0; u < PK; ++u)
      wgmma_values(o, p[u], smem_desc(v_tile + u * 16 * 128, TILE_N * 128, 1024), 1);
    wg_commit();
  };
  auto softmax = [&](int t) {  /* on the landed scores: the new maxima, s = exp2(...) */
#pragma unroll
    for (int i = 0; i < SN; ++i) fence_regs(s[i]);
    const int k0 = t * TILE_N;
    if (k0 + TILE_N > full_end) {  /* across the diagonal: key k visible to rows at >= k */
#pragma unroll
      for (int i = 0; i < SN; ++i)
        if (k0 + 8 * (i >> 2) + 2 * q4 + (i & 1) > pos[(i >> 1) & 1]) s[i] = NEG_INF;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = NEG_INF;
#pragma unroll
      for (int j = 0; j < SN / 4; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx * scale_log2e);
      rescale[h] = fast_exp2(m[h] - m_new);  /* 0 on the first tile (m = -inf) */
      m[h] = m_new;
      sum[h] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < SN; ++i) {
      s[i] = fast_exp2(fmaf(s[i], scale_log2e, -m[(i >> 1) & 1]));
      sum[(i >> 1) & 1] += s[i];
    }
  };
  auto update = [&]() {  /* with no P V in flight: O rescaled, the sums, P for the next P V */
#pragma unroll
    for (int i = 0; i < ON; ++i) { fence_regs(o[i]); o[i] *= rescale[(i >> 1) & 1]; }
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * rescale[h] + sum[h];
#pragma unroll
    for (int u = 0; u < PK; ++u) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        fence_regs(p[u][e]);
        p[u][e] = pack(s[8 * u + 2 * e], s[8 * u + 2 * e + 1]);
      }
    }
  };
  issue_scores(0);
  wg_wait<0>();
  softmax(0);
  update();
  for (int t = 1; t < n_tiles; ++t) {
    issue_scores(t);
    issue_values(t - 1);  /* runs on while this tile's softmax is computed */
    if (OVERLAP) wg_wait<1>(); else wg_wait<0>();
    softmax(t);
    wg_wait<0>();
    update();
  }
  cp_wait<STAGES - 2>();  /* copy group n_tiles: the last tile's V */
  proxy_fence();
  __syncthreads();
  wg_fence();
  issue_values(n_tiles - 1);
  wg_wait<0>();
#pragma unroll
  for (int i = 0; i < ON; ++i) fence_regs(o[i]);
  cp_wait<0>();
  /* the output: normalised, through this warp's own rows of its warpgroup's Q area (its
     reads by wgmma are complete), 16 bytes a store */
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    l[h] = 1.f / l[h];
  }
#pragma unroll
  for (int j = 0; j < ON / 4; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u32 v = pack(o[4 * j + 2 * h] * l[h], o[4 * j + 2 * h + 1] * l[h]);
      asm volatile("st.shared.b32 [%0], %1;\n"
                   :: "r"(q_smem + tile_offset(row0 + 8 * h, j, 64) + 4 * q4), "r"(v));
    }
  }
  __syncwarp();
  for (int i = lane; i < 16 * CH; i += 32) {
    const int rl = (warp & 3) * 16 + i / CH, c = i % CH, r = wg * 64 + rl, tok = first + r / GROUP;
    if (r < TOKENS * GROUP && tok < q_len) {
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(q_smem + tile_offset(rl, c, 64)));
      *(uint4*)((unsigned short*)OUT + (i64)(q_start + tok) * stride_ot
                + (i64)(kv_head * GROUP + r % GROUP) * stride_oh + c * 8) = v;
    }
  }
}
"""

_INDEX_TYPES = {torch.int32: "int", torch.int64: "long long"}


@dataclasses.dataclass(frozen=True, slots=True)
class CudaPrefillLaunch:
    """A launch of the kernel: ``wgs`` warpgroups of 64 query rows a block, ``tile_n`` keys a
    tile, ``stages`` K and as many V tiles in shared memory (K copied ``stages - 1`` tiles
    ahead), ``min_blocks`` blocks per SM the compiler must fit (a register cap)."""
    wgs: int = 1
    tile_n: int = 64
    stages: int = 3
    min_blocks: int = 2
    copy: bool = True  # False: a timing probe that stops copying K/V after the first tiles
    overlap: bool = True  # False: each tile's softmax waits for the previous P V


def default_launch(head_dim: int) -> CudaPrefillLaunch:
    return CudaPrefillLaunch()


def shared_bytes(head_dim: int, launch: CudaPrefillLaunch) -> int:
    """Dynamic shared memory of a block: Q, the K/V stages and the scan's scratch."""
    return ((64 * launch.wgs + 2 * launch.stages * launch.tile_n) * head_dim * 2
            + 4 * (4 + 2 * 4 * launch.wgs))


def kernel_source(head_dim: int, group: int, block_size: int, kv_heads: int, bf16: bool,
                  table_t: str, seq_t: str, qlen_t: str, launch: CudaPrefillLaunch) -> str:
    """The CUDA source of one build: ``SOURCE`` after the constants it is compiled for."""
    defines = dict(HEAD_DIM=head_dim, GROUP=group, TOKENS=64 * launch.wgs // group,
                   BLOCK_SIZE=block_size, KV_HEADS=kv_heads, IS_BF16=int(bf16),
                   TABLE_T=table_t, SEQ_T=seq_t, QLEN_T=qlen_t, WGS=launch.wgs,
                   TILE_N=launch.tile_n, STAGES=launch.stages, MIN_BLOCKS=launch.min_blocks,
                   COPY=int(launch.copy), OVERLAP=int(launch.overlap),
                   SCAN_SEQS=SCAN_SEQS)
    wrappers = (_wgmma("wgmma_scores", launch.tile_n, False, 0)
                + _wgmma("wgmma_values", head_dim, True, 1))
    return ("".join(f"#define {k} {v}\n" for k, v in defines.items())
            + SOURCE.replace("WGMMA_WRAPPERS", wrappers))


@functools.lru_cache(maxsize=64)
def _compiled(*build):
    kernel = torch.cuda._compile_kernel(kernel_source(*build), "paged_prefill",
                                        compute_capability="90a")
    kernel.set_shared_memory_config(shared_bytes(build[0], build[-1]))
    return kernel


def available(device) -> bool:
    """Whether ``device`` runs the kernel: a GPU of compute capability 9.0 (``wgmma``) and a
    torch that compiles CUDA with NVRTC."""
    device = torch.device(device)
    return (compiler_available() and device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device) == (9, 0))


def _aligned(x: torch.Tensor) -> bool:
    return x.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in x.stride()[:-1])


def unsupported_reason(q, k_cache, v_cache) -> str | None:
    """Why the kernel cannot take this call, naming the argument (None when it can)."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"q: the cuda-prefill backend takes fp16 or bf16, got {q.dtype}"
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return (f"k_cache: the cuda-prefill backend reads caches of q's dtype ({q.dtype}), "
                f"got {k_cache.dtype} / {v_cache.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        return f"q: the cuda-prefill backend takes head dims {HEAD_DIMS}, got {q.shape[-1]}"
    if q.shape[1] // k_cache.shape[2] > MAX_GROUP:
        return (f"q: the cuda-prefill backend takes up to {MAX_GROUP} query heads per KV "
                f"head, got {q.shape[1] // k_cache.shape[2]}")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.stride(-1) != 1 or not _aligned(x):
            return f"{name}: rows must have unit stride and start at 16-byte boundaries"
        if max(x.stride()) >= 2 ** 31:
            return f"{name}: strides of 2 GiB or more"
    if not available(q.device):
        return f"q: the cuda-prefill backend runs on GPUs of compute capability 9.0, " \
               f"not {q.device}"
    return None


def cuda_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_lens, scale, *,
                       launch: CudaPrefillLaunch | None = None) -> torch.Tensor:
    """Paged prefill; arguments as ``pagebench.kernels.paged_prefill`` (already validated), in
    a layout ``unsupported_reason`` accepts (else a ``ValueError``). ``launch`` overrides
    ``default_launch``. No device sync: the call can be captured in a CUDA graph."""
    reason = unsupported_reason(q, k_cache, v_cache)
    if reason:
        raise ValueError(reason)
    if q.stride(-1) != 1 or not _aligned(q):
        q = q.contiguous()
    tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    seq_lens = seq_lens if seq_lens.is_contiguous() else seq_lens.contiguous()
    query_lens = query_lens if query_lens.is_contiguous() else query_lens.contiguous()
    total, q_heads, head_dim = q.shape
    num_seqs = query_lens.shape[0]
    _, block_size, kv_heads, _ = k_cache.shape
    group = q_heads // kv_heads
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    if total == 0 or num_seqs == 0:
        return out
    launch = launch or default_launch(head_dim)
    kernel = _compiled(head_dim, group, block_size, kv_heads, q.dtype == torch.bfloat16,
                       _INDEX_TYPES[tables.dtype], _INDEX_TYPES[seq_lens.dtype],
                       _INDEX_TYPES[query_lens.dtype], launch)
    tokens = 64 * launch.wgs // group
    grid = (total // tokens + num_seqs) * kv_heads  # an upper bound on the query tiles
    kernel(grid=(grid, 1, 1), block=(128 * launch.wgs, 1, 1),
           shared_mem=shared_bytes(head_dim, launch),
           args=[q, k_cache, v_cache, tables, seq_lens, query_lens, out, num_seqs,
                 float(scale * 1.4426950408889634), q.stride(0), q.stride(1),
                 k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                 v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), tables.stride(0),
                 out.stride(0), out.stride(1)])
    return out
