"""Paged prefill in CUDA C++ (compiled at first use with NVRTC; backend ``cuda``): causal
attention for a chunk of queries of each sequence over everything cached before it, with
``mma.sync`` and ``cp.async``, for bf16/fp16 caches.

Why a second prefill beside Triton's: on an H200 Triton's paged prefill, whose loop is Hopper's
asynchronous ``wgmma``, stays ~1.4x FlashAttention on many short prompts (8 x 512) however it
is launched: its fixed cost per program is ~7 key tiles' time against FlashAttention-2's ~1.3,
and Triton 3.6 expresses neither the overlap inside a warpgroup nor warp roles for that loop
(docs/kernels.md, "The Triton paged prefill"). This kernel is written as FlashAttention-2 is,
with the paging and the GQA packing of pagebench's kernels:

- a block of ``WARPS`` warps takes ``TOKENS`` consecutive queries of one sequence with every
  head of one KV head's group as its ``16 x WARPS`` rows (so each K/V tile serves the group),
  and walks the keys up to its last query's position in tiles of ``TILE_N`` through the block
  table (any block size); each warp owns 16 rows and keeps them, their online softmax (fp32,
  log2 domain) and their output in registers;
- K/V tiles go from the cache to shared memory by ``cp.async`` (16 bytes a copy, rows beyond
  the sequence zero-filled, never read), ``STAGES - 1`` tiles ahead of the one computed, each
  tile's block ids loaded a tile earlier still; shared memory is swizzled (16-byte chunk
  ``c`` of row ``r`` at ``c ^ (r % 8)``) so that ``ldmatrix`` reads it without bank conflicts;
- ``S = Q K^T`` and ``O += P V`` are ``mma.m16n8k16`` with fp32 accumulators; P goes from the
  scores' accumulators to the second MMA's operand in registers; only tiles that cross the
  diagonal take the causal mask;
- the grid is one dimension, KV head fastest and query tiles numbered from the last, as in the
  Triton kernel: each block finds its sequence by scanning the query lengths itself (one round
  of loads for up to 1,024 sequences), so nothing is read back to the host and a call can be
  captured in a CUDA graph.

What it takes (``unsupported_reason`` names the argument otherwise): q and caches of one dtype,
fp16 or bf16, head dim 64 or 128, groups of up to 16 query heads per KV head, any block size,
int32/int64 tables and lengths, 16-byte aligned rows (every tensor's pointer and strides but
the last), on NVIDIA GPUs of compute capability 8.0+.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from pagebench.kernels.cuda_fp8_decode import compiler_available

LANES = 32
HEAD_DIMS = (64, 128)
MAX_GROUP = 16
SCAN_SEQS = 1024  # query lengths a block reads in one round while finding its sequence

SOURCE = r"""
typedef unsigned int u32;
typedef long long i64;

#define THREADS (32 * WARPS)
#define ROWS (16 * WARPS)          /* query rows of a block: TOKENS x GROUP used */
#define CH (HEAD_DIM / 8)          /* 16-byte chunks of a row */
#define KT (HEAD_DIM / 16)         /* MMA k-steps of S = Q K^T */
#define NS (TILE_N / 8)            /* n-tiles of S */
#define NO (HEAD_DIM / 8)          /* n-tiles of O */
#define ROWS_PER_THREAD (TILE_N * CH / THREADS)  /* K (and V) rows a thread copies per tile */
#define SCAN_ITEMS (SCAN_SEQS / THREADS)
#define NEG_INF __int_as_float(0xff800000)

#if IS_BF16
#define MMA "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#define CVT_PAIR "cvt.rn.bf16x2.f32"
#else
#define MMA "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#define CVT_PAIR "cvt.rn.f16x2.f32"
#endif

/* shared memory: Q (ROWS rows, later each warp's output), then STAGES x (K, V) tiles */
__device__ __forceinline__ u32 swizzled(int row, int chunk) {  /* byte offset in a tile */
  return (u32)(row * CH + (chunk ^ (row & 7))) * 16u;
}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

__device__ __forceinline__ void ldsm_x4(u32 addr, u32 (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 addr, u32 (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm(MMA " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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

/* The block's sequence: the one whose query tiles (numbered one after another over the
   sequences) include ``tile``; sh[0..3] = sequence (-1: none), its first query, its first
   tile, its query count. */
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
    for (int w = 0; w < WARPS; ++w) {
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
  /* strides in elements of 2 bytes, except the tables' (entries) */
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int seq_info[4];
  __shared__ int warp_sums[2 * WARPS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kv_head = blockIdx.x % KV_HEADS;
  const int tile = (gridDim.x - 1 - blockIdx.x) / KV_HEADS;  /* the last tiles (longest walks) first */
  find_sequence(q_lens, num_seqs, tile, seq_info, warp_sums);
  const int seq = seq_info[0];
  if (seq < 0) return;  /* the grid is an upper bound on the tiles */
  const int q_start = seq_info[1], first = (tile - seq_info[2]) * TOKENS, q_len = seq_info[3];
  const int seq_len = (int)seq_lens[seq];
  const int cached = seq_len - q_len;
  const int last = min(first + TOKENS, q_len);      /* one past this block's last query */
  const int end = cached + last;                    /* keys it sees: 0 .. end - 1 */
  const int full_end = (cached + first + 1) / TILE_N * TILE_N;  /* tiles before: unmasked */
  const int n_tiles = (end + TILE_N - 1) / TILE_N;
  const float scale_log2e = (float)scale_log2e_d;
  const TABLE_T* table = tables + (i64)seq * stride_ts;
  const unsigned short* k_base = (const unsigned short*)K + (i64)kv_head * stride_kh;
  const unsigned short* v_base = (const unsigned short*)V + (i64)kv_head * stride_vh;

  const u32 smem_q = (u32)__cvta_generic_to_shared(smem);
  const u32 smem_kv = smem_q + ROWS * HEAD_DIM * 2;
  const u32 tile_bytes = TILE_N * HEAD_DIM * 2;

  /* Q: row r is query first + r / GROUP, head kv_head * GROUP + r % GROUP */
  for (int i = tid; i < ROWS * CH; i += THREADS) {
    int r = i / CH, c = i % CH, tok = first + r / GROUP;
    bool ok = r < TOKENS * GROUP && tok < q_len;
    const unsigned short* src = (const unsigned short*)Q;  /* not read when !ok */
    if (ok) src += (i64)(q_start + tok) * stride_qt + (i64)(kv_head * GROUP + r % GROUP) * stride_qh + c * 8;
    cp_async16(smem_q + swizzled(r, c), src, ok);
  }
  cp_commit();

  /* this thread's share of a K/V tile: chunk c of rows r0 + i * (THREADS / CH) */
  const int my_chunk = tid % CH, my_row = tid / CH;
  int blocks[ROWS_PER_THREAD];  /* block ids of the next tile to issue (-1: beyond the sequence) */
  auto load_ids = [&](int t) {
#pragma unroll
    for (int i = 0; i < ROWS_PER_THREAD; ++i) {
      int key = t * TILE_N + my_row + i * (THREADS / CH);
      blocks[i] = key < seq_len ? (int)table[key / BLOCK_SIZE] : -1;
    }
  };
  auto issue = [&](int t) {  /* the copies of tile t (block ids in ``blocks``) */
    const u32 k_dst = smem_kv + (t % STAGES) * 2 * tile_bytes, v_dst = k_dst + tile_bytes;
#pragma unroll
    for (int i = 0; i < ROWS_PER_THREAD; ++i) {
      int r = my_row + i * (THREADS / CH);
      int slot = (t * TILE_N + r) % BLOCK_SIZE;
      bool ok = blocks[i] >= 0;
      i64 b = ok ? blocks[i] : 0;
      cp_async16(k_dst + swizzled(r, my_chunk),
                 k_base + b * stride_kb + (i64)slot * stride_kt + my_chunk * 8, ok);
      cp_async16(v_dst + swizzled(r, my_chunk),
                 v_base + b * stride_vb + (i64)slot * stride_vt + my_chunk * 8, ok);
    }
  };
  load_ids(0);
#pragma unroll
  for (int t = 0; t < STAGES - 1; ++t) {
    if (t < n_tiles) { issue(t); load_ids(t + 1); }
    cp_commit();
  }

  /* this lane's rows of its warp: g and g + 8; positions of the queries they hold */
  const int g = lane >> 2, q4 = lane & 3;
  int pos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int r = warp * 16 + g + 8 * h, tok = first + r / GROUP;
    pos[h] = (r < TOKENS * GROUP && tok < q_len) ? cached + tok : cached + first;
  }
  u32 qf[KT][4];
  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};

  for (int t = 0; t < n_tiles; ++t) {
    cp_wait<STAGES - 2>();  /* tile t (and Q) landed, for this thread's copies */
    __syncthreads();        /* ... and everyone's; the stage refilled below is free */
    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < KT; ++kk)
        ldsm_x4(smem_q + swizzled(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)), qf[kk]);
    }
    if (t + STAGES - 1 < n_tiles) { issue(t + STAGES - 1); load_ids(t + STAGES); }
    cp_commit();
    const u32 k_tile = smem_kv + (t % STAGES) * 2 * tile_bytes, v_tile = k_tile + tile_bytes;

    float s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
#pragma unroll
      for (int np = 0; np < NS / 2; ++np) {
        u32 b[4];
        ldsm_x4(k_tile + swizzled(16 * np + (lane & 7) + ((lane >> 4) << 3),
                                  2 * kk + ((lane >> 3) & 1)), b);
        mma16816(s[2 * np], qf[kk], b[0], b[1]);
        mma16816(s[2 * np + 1], qf[kk], b[2], b[3]);
      }
    }
    const int k0 = t * TILE_N;
    if (k0 + TILE_N > full_end) {  /* across the diagonal: key k visible to rows at >= k */
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (k0 + 8 * n + 2 * q4 + (e & 1) > pos[e >> 1]) s[n][e] = NEG_INF;
    }
    float p_scale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = NEG_INF;
#pragma unroll
      for (int n = 0; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      float m_new = fmaxf(m[h], mx * scale_log2e);
      p_scale[h] = fast_exp2(m[h] - m_new);  /* 0 on the first tile (m = -inf) */
      m[h] = m_new;
      l[h] *= p_scale[h];
    }
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      o[n][0] *= p_scale[0]; o[n][1] *= p_scale[0];
      o[n][2] *= p_scale[1]; o[n][3] *= p_scale[1];
    }
    u32 p[NS / 2][4];  /* P as the A operand of O += P V, k-step by k-step */
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      float e0 = fast_exp2(fmaf(s[n][0], scale_log2e, -m[0]));
      float e1 = fast_exp2(fmaf(s[n][1], scale_log2e, -m[0]));
      float e2 = fast_exp2(fmaf(s[n][2], scale_log2e, -m[1]));
      float e3 = fast_exp2(fmaf(s[n][3], scale_log2e, -m[1]));
      l[0] += e0 + e1;
      l[1] += e2 + e3;
      p[n / 2][2 * (n & 1)] = pack(e0, e1);
      p[n / 2][2 * (n & 1) + 1] = pack(e2, e3);
    }
#pragma unroll
    for (int kk = 0; kk < NS / 2; ++kk) {
#pragma unroll
      for (int np = 0; np < NO / 2; ++np) {
        u32 b[4];
        ldsm_x4_t(v_tile + swizzled(16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3),
                                    2 * np + (lane >> 4)), b);
        mma16816(o[2 * np], p[kk], b[0], b[1]);
        mma16816(o[2 * np + 1], p[kk], b[2], b[3]);
      }
    }
  }
  cp_wait<0>();

  /* the output: normalised, through this warp's own rows of the Q area, 16 bytes a store */
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    l[h] = 1.f / l[h];
  }
#pragma unroll
  for (int n = 0; n < NO; ++n) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int r = warp * 16 + g + 8 * h;
      u32 v = pack(o[n][2 * h] * l[h], o[n][2 * h + 1] * l[h]);
      asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(smem_q + swizzled(r, n) + 4 * q4), "r"(v));
    }
  }
  __syncwarp();
#pragma unroll
  for (int i = lane; i < 16 * CH; i += 32) {
    int r = warp * 16 + i / CH, c = i % CH, tok = first + r / GROUP;
    if (r < TOKENS * GROUP && tok < q_len) {
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(smem_q + swizzled(r, c)));
      *(uint4*)((unsigned short*)OUT + (i64)(q_start + tok) * stride_ot
                + (i64)(kv_head * GROUP + r % GROUP) * stride_oh + c * 8) = v;
    }
  }
}
"""

_INDEX_TYPES = {torch.int32: "int", torch.int64: "long long"}


@dataclasses.dataclass(frozen=True, slots=True)
class CudaPrefillLaunch:
    """A launch of the kernel: ``warps`` x 16 query rows a block, ``tile_n`` keys a tile,
    ``stages`` tiles in shared memory (``stages - 1`` in flight), ``min_blocks`` blocks per SM
    the compiler must fit (a register cap)."""
    warps: int = 4
    tile_n: int = 64
    stages: int = 2
    min_blocks: int = 2


def default_launch(head_dim: int) -> CudaPrefillLaunch:
    return CudaPrefillLaunch()


def shared_bytes(head_dim: int, launch: CudaPrefillLaunch) -> int:
    return (16 * launch.warps + 2 * launch.stages * launch.tile_n) * head_dim * 2


def kernel_source(head_dim: int, group: int, block_size: int, kv_heads: int, bf16: bool,
                  table_t: str, seq_t: str, qlen_t: str, launch: CudaPrefillLaunch) -> str:
    """The CUDA source of one build: ``SOURCE`` after the constants it is compiled for."""
    defines = dict(HEAD_DIM=head_dim, GROUP=group, TOKENS=16 * launch.warps // group,
                   BLOCK_SIZE=block_size, KV_HEADS=kv_heads, IS_BF16=int(bf16),
                   TABLE_T=table_t, SEQ_T=seq_t, QLEN_T=qlen_t, WARPS=launch.warps,
                   TILE_N=launch.tile_n, STAGES=launch.stages, MIN_BLOCKS=launch.min_blocks,
                   SCAN_SEQS=SCAN_SEQS)
    return "".join(f"#define {k} {v}\n" for k, v in defines.items()) + SOURCE


@functools.lru_cache(maxsize=64)
def _compiled(*build):
    kernel = torch.cuda._compile_kernel(kernel_source(*build), "paged_prefill")
    kernel.set_shared_memory_config(shared_bytes(build[0], build[-1]))
    return kernel


def available(device) -> bool:
    """Whether ``device`` runs the kernel: an NVIDIA GPU of compute capability 8.0+ (``mma``
    on bf16, ``cp.async``) and a torch that compiles CUDA with NVRTC."""
    device = torch.device(device)
    return (compiler_available() and device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device) >= (8, 0))


def _aligned(x: torch.Tensor) -> bool:
    return x.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in x.stride()[:-1])


def unsupported_reason(q, k_cache, v_cache, block_tables) -> str | None:
    """Why the kernel cannot take this call, naming the argument (None when it can)."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"q: the cuda backend's prefill takes fp16 or bf16, got {q.dtype}"
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return (f"k_cache: the cuda backend's prefill reads caches of q's dtype ({q.dtype}), "
                f"got {k_cache.dtype} / {v_cache.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        return f"q: the cuda backend's prefill takes head dims {HEAD_DIMS}, got {q.shape[-1]}"
    group = q.shape[1] // k_cache.shape[2]
    if group > MAX_GROUP:
        return f"q: the cuda backend's prefill takes up to {MAX_GROUP} query heads per KV " \
               f"head, got {group}"
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.stride(-1) != 1 or not _aligned(x):
            return f"{name}: rows must have unit stride and start at 16-byte boundaries"
        if max(x.stride()[1:]) >= 2 ** 31:
            return f"{name}: strides of 2 GiB or more within a block"
    if not available(q.device):
        return f"q: the cuda backend runs on NVIDIA GPUs of compute capability 8.0+, " \
               f"not {q.device}"
    return None


def cuda_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_lens, scale, *,
                       launch: CudaPrefillLaunch | None = None) -> torch.Tensor:
    """Paged prefill; arguments as ``pagebench.kernels.paged_prefill`` (already validated), in
    a layout ``unsupported_reason`` accepts (else a ``ValueError``). ``launch`` overrides
    ``default_launch``. No device sync: the call can be captured in a CUDA graph."""
    reason = unsupported_reason(q, k_cache, v_cache, block_tables)
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
    tokens = 16 * launch.warps // group
    kernel = _compiled(head_dim, group, block_size, kv_heads, q.dtype == torch.bfloat16,
                       _INDEX_TYPES[tables.dtype], _INDEX_TYPES[seq_lens.dtype],
                       _INDEX_TYPES[query_lens.dtype], launch)
    grid = (total // tokens + num_seqs) * kv_heads  # an upper bound on the query tiles
    kernel(grid=(grid, 1, 1), block=(LANES * launch.warps, 1, 1),
           shared_mem=shared_bytes(head_dim, launch),
           args=[q, k_cache, v_cache, tables, seq_lens, query_lens, out, num_seqs,
                 float(scale * 1.4426950408889634), q.stride(0), q.stride(1),
                 k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                 v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), tables.stride(0),
                 out.stride(0), out.stride(1)])
    return out
