/* fp8 paged decode (pagebench.kernels.cuda_fp8_decode, which documents the design and
   compiles this file with NVRTC). Compiled once per build: the host prepends a #define of
   each of HEAD_DIM, GROUP, BLOCK_SIZE, FP8_NAME, Q_BF16, TABLE_T, SEQ_T, QCHUNKS, WARPS,
   MIN_BLOCKS, ALIGNED, COMBINE_WARPS, MAX_SPLITS, WIDE_AHEAD and SPLIT_WARPS (CudaBuild). */
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;

#define KW (HEAD_DIM / 16)  /* 32-bit words of a K row per lane (HEAD_DIM / 4 bytes) */
#define VW (HEAD_DIM / 32)  /* words of a V row per lane (HEAD_DIM / 8 bytes) */
#define MT (HEAD_DIM / 16)  /* MMA k-steps of S^T, and output tiles of O^T */
#define STEP 16
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ u32 fp8x2_lo(u32 w) {  /* bytes 0, 1 of w -> f16x2 */
  u32 d;
  asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2." FP8_NAME "x2 %0, lo;}"
      : "=r"(d) : "r"(w));
  return d;
}
__device__ __forceinline__ u32 fp8x2_hi(u32 w) {  /* bytes 2, 3 of w -> f16x2 */
  u32 d;
  asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2." FP8_NAME "x2 %0, hi;}"
      : "=r"(d) : "r"(w));
  return d;
}
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
  u32 d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ u32 transpose8x8(u32 x) {
  u32 d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(x));
  return d;
}
__device__ __forceinline__ void mma16816(float* acc, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                         u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ float q_to_float(u16 x) {
#if Q_BF16
  return __uint_as_float(((u32)x) << 16);
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  return f;
#endif
}
__device__ __forceinline__ u16 float_to_out(float x) {
  u16 h;
#if Q_BF16
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
#else
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
#endif
  return h;
}
template <int N>
__device__ __forceinline__ void load_words(const u8* p, u32* w) {  /* N words */
#if !ALIGNED  /* a cache view whose rows are not 16-byte aligned: byte loads (slow, exact) */
#pragma unroll
  for (int i = 0; i < 4 * N; ++i) {
    const u32 byte = p[i];
    w[i / 4] = (i % 4 ? w[i / 4] : 0u) | (byte << (8 * (i % 4)));
  }
  return;
#endif
  if (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i / 4);
      w[i] = v.x; w[i + 1] = v.y; w[i + 2] = v.z; w[i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + i / 2);
      w[i] = v.x; w[i + 1] = v.y;
    }
  }
}

struct Step { u32 k[2][KW]; u32 v[4][VW]; };

/* The block ids a step needs, loaded a step ahead of its K/V loads: with blocks of 16k tokens
   the step's one block (every lane loads it), else lane i's is token t0 + i % 16's block. */
__device__ __forceinline__ int load_ids(const TABLE_T* trow, int t0, int end, int lane) {
#if BLOCK_SIZE % STEP == 0  /* the step's 16 tokens lie in one block (t0 % 16 == 0) */
  return t0 < end ? (int)trow[t0 / BLOCK_SIZE] : 0;
#else
  const int pos = t0 + (lane & 15);
  return pos < end ? (int)trow[pos / BLOCK_SIZE] : 0;
#endif
}

/* The step's K rows (tokens r, r + 8: lane c takes bytes 16c .. 16c + 16 of each 64) and V
   rows (tokens 2c, 2c+1, 2c+8, 2c+9: lane r's HEAD_DIM / 8 bytes) of this lane, with the
   step's block ids `ids` (load_ids); tokens at or past `end` are zeros and read nothing
   (their slots and table entries may hold anything). */
__device__ __forceinline__ void load_step(Step& s, int t0, int end, int r, int c, int ids,
                                          const u8* kbase, const u8* vbase, int stride_kb,
                                          int stride_kt, int stride_vb, int stride_vt) {
  int kblk[2], vblk[4];  /* every lane shuffles (before any branch) */
#pragma unroll
  for (int h = 0; h < 2; ++h) kblk[h] = BLOCK_SIZE % STEP == 0 ? ids
                                        : __shfl_sync(0xffffffffu, ids, r + 8 * h);
#pragma unroll
  for (int h = 0; h < 4; ++h) vblk[h] = BLOCK_SIZE % STEP == 0 ? ids
                                        : __shfl_sync(0xffffffffu, ids, 2 * c + (h & 1) + 8 * (h >> 1));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int pos = t0 + r + 8 * h;
    if (pos < end) {
      const u8* row = kbase + (i64)kblk[h] * stride_kb + (i64)(pos % BLOCK_SIZE) * stride_kt;
#pragma unroll
      for (int j = 0; j < KW / 4; ++j) load_words<4>(row + 64 * j + 16 * c, &s.k[h][4 * j]);
    } else {
#pragma unroll
      for (int i = 0; i < KW; ++i) s.k[h][i] = 0u;
    }
  }
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const int pos = t0 + 2 * c + (h & 1) + 8 * (h >> 1);
    if (pos < end) {
      load_words<VW>(vbase + (i64)vblk[h] * stride_vb + (i64)(pos % BLOCK_SIZE) * stride_vt,
                     s.v[h]);
    } else {
#pragma unroll
      for (int i = 0; i < VW; ++i) s.v[h][i] = 0u;
    }
  }
}

struct Softmax { float m0, m1, l0, l1; float acc[MT][4]; };

/* One step of 16 tokens: scores S^T = K Q^T, the online softmax, O^T += V^T P^T. */
__device__ __forceinline__ void attend_step(Softmax& st, const Step& s, u32 (*qf)[2],
                                            float sc0, float sc1, int t0, int end, int r) {
  float sa[4] = {0.f, 0.f, 0.f, 0.f}, sb[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < MT; ++i) {  /* two accumulators: half the dependent chain */
    float* acc = (i & 1) ? sb : sa;
    mma16816(acc, fp8x2_lo(s.k[0][i]), fp8x2_lo(s.k[1][i]), fp8x2_hi(s.k[0][i]),
             fp8x2_hi(s.k[1][i]), qf[i][0], qf[i][1]);
  }
  float s0 = (sa[0] + sb[0]) * sc0, s1 = (sa[1] + sb[1]) * sc1;  /* token r */
  float s2 = (sa[2] + sb[2]) * sc0, s3 = (sa[3] + sb[3]) * sc1;  /* token r + 8 */
  if (t0 + STEP > end) {  /* the last, partial step (warp-uniform) */
    if (t0 + r >= end) { s0 = NEG_INF; s1 = NEG_INF; }
    if (t0 + r + 8 >= end) { s2 = NEG_INF; s3 = NEG_INF; }
  }
  float mt0 = fmaxf(s0, s2), mt1 = fmaxf(s1, s3);
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, o));
    mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, o));
  }
  float mn0 = fmaxf(st.m0, mt0), mn1 = fmaxf(st.m1, mt1);  /* finite: one token is valid */
  float alpha0 = exp2f(st.m0 - mn0), alpha1 = exp2f(st.m1 - mn1);
  float p0 = exp2f(s0 - mn0), p1 = exp2f(s1 - mn1), p2 = exp2f(s2 - mn0), p3 = exp2f(s3 - mn1);
  st.m0 = mn0; st.m1 = mn1;
  st.l0 = st.l0 * alpha0 + p0 + p2;
  st.l1 = st.l1 * alpha1 + p1 + p3;
  u32 b0 = transpose8x8(pack_f16x2(p0, p1)), b1 = transpose8x8(pack_f16x2(p2, p3));
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    st.acc[j][0] *= alpha0; st.acc[j][1] *= alpha1;
    st.acc[j][2] *= alpha0; st.acc[j][3] *= alpha1;
    const int u = j >> 1;
    const u32 sel = (j & 1) ? 0x7362u : 0x5140u;
    u32 d1 = __byte_perm(s.v[0][u], s.v[1][u], sel), d2 = __byte_perm(s.v[2][u], s.v[3][u], sel);
    mma16816(st.acc[j], fp8x2_lo(d1), fp8x2_hi(d1), fp8x2_lo(d2), fp8x2_hi(d2), b0, b1);
  }
}

#if SPLIT_WARPS > 1
/* The SPLIT_WARPS splits of a block merged in shared memory into one partial (or the output,
   with one partial per head): each warp rescales its state to the block's running max of its
   rows, then the block's threads sum the warps' states over (KV head, row, dim). */
__device__ __forceinline__ void merge_splits(const Softmax& st, u16* OUT, float* PART,
                                             const float* V_SCALE, int num_parts, int ml_offset,
                                             int q_heads, int seq, int row0, int hw, int r,
                                             int c) {
  __shared__ float ml[SPLIT_WARPS][WARPS][8][2];  /* (m, l) of each warp's 8 rows */
  /* row, dim r D/8 + t at row (D + 4) + 8 t + r: a warp's stores, and a thread's reads in
     phase 3, touch 32 banks */
  __shared__ float acc[SPLIT_WARPS][WARPS][8 * (HEAD_DIM + 4)];
  const int sw = (threadIdx.x >> 5) / WARPS;
  if (r == 0) {
    ml[sw][hw][2 * c][0] = st.m0; ml[sw][hw][2 * c + 1][0] = st.m1;
  }
  __syncthreads();
  float m0 = NEG_INF, m1 = NEG_INF;
#pragma unroll
  for (int s = 0; s < SPLIT_WARPS; ++s) {
    m0 = fmaxf(m0, ml[s][hw][2 * c][0]);
    m1 = fmaxf(m1, ml[s][hw][2 * c + 1][0]);
  }
  const float w0 = st.m0 > NEG_INF ? exp2f(st.m0 - m0) : 0.f;  /* an empty split weighs 0 */
  const float w1 = st.m1 > NEG_INF ? exp2f(st.m1 - m1) : 0.f;
  if (r == 0) {
    ml[sw][hw][2 * c][1] = st.l0 * w0; ml[sw][hw][2 * c + 1][1] = st.l1 * w1;
  }
#pragma unroll
  for (int t = 0; t < HEAD_DIM / 8; ++t) {  /* this lane's dims r D/8 + t */
    acc[sw][hw][2 * c * (HEAD_DIM + 4) + 8 * t + r] = st.acc[t >> 1][2 * (t & 1)] * w0;
    acc[sw][hw][(2 * c + 1) * (HEAD_DIM + 4) + 8 * t + r] = st.acc[t >> 1][2 * (t & 1) + 1] * w1;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < WARPS * 8 * HEAD_DIM; i += WARPS * SPLIT_WARPS * 32) {
    const int rr = i % 8, t = (i / 8) % (HEAD_DIM / 8), row = (i / HEAD_DIM) % 8;
    const int h = i / (8 * HEAD_DIM), d = rr * (HEAD_DIM / 8) + t;
    if (row0 + row >= GROUP) continue;
    const int kvh = (blockIdx.y / QCHUNKS) * WARPS + h;
    const int head = kvh * GROUP + row0 + row;
    float sum = 0.f, l = 0.f, m = NEG_INF;
#pragma unroll
    for (int s = 0; s < SPLIT_WARPS; ++s) {
      sum += acc[s][h][row * (HEAD_DIM + 4) + 8 * t + rr];
      l += ml[s][h][row][1];
      m = fmaxf(m, ml[s][h][row][0]);
    }
    const float vs = V_SCALE[kvh];
    if (num_parts == 1) {
      OUT[((i64)seq * q_heads + head) * HEAD_DIM + d] = float_to_out(sum * vs / l);
    } else {
      const i64 part = ((i64)seq * q_heads + head) * num_parts + blockIdx.z;
      PART[part * HEAD_DIM + d] = sum * vs;
      if (d == 0) {
        PART[ml_offset + part * 2] = m;
        PART[ml_offset + part * 2 + 1] = l;
      }
    }
  }
}
#endif

extern "C" __global__ void __launch_bounds__(WARPS * SPLIT_WARPS * 32, MIN_BLOCKS)
fp8_paged_decode(
    const u16* Q, const u8* K, const u8* V, const TABLE_T* TABLES, const SEQ_T* SEQ_LENS,
    u16* OUT, float* PART, const float* K_SCALE, const float* V_SCALE, double scale_log2e,
    int tokens_per_split, int num_parts, int ml_offset, int stride_qs, int stride_qh,
    int stride_kb, int stride_kt, int stride_kh, int stride_vb, int stride_vt, int stride_vh,
    int stride_ts, int q_heads) {
  const int lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
  /* grid y: (KV heads / WARPS) x QCHUNKS, grid z: the partials (groups of SPLIT_WARPS splits).
     Warp w of a block reads KV head w % WARPS (a block's WARPS heads are adjacent: the same
     tokens) of split SPLIT_WARPS z + w / WARPS; a group of more than 8 query heads is read in
     chunks of 8 rows, each chunk's warp reading its KV head's tokens again (mostly from L2). */
  const int qchunk = blockIdx.y % QCHUNKS, hw = (threadIdx.x >> 5) % WARPS;
  const int seq = blockIdx.x, kvh = (blockIdx.y / QCHUNKS) * WARPS + hw;
  const int split = blockIdx.z * SPLIT_WARPS + (threadIdx.x >> 5) / WARPS;
  const int row0 = 8 * qchunk;  /* the chunk's first row in the group */
  const int seq_len = (int)SEQ_LENS[seq];
  const int start = split * tokens_per_split;
  const int end = min(start + tokens_per_split, seq_len);

  /* the first step's loads go out before q's: its latency overlaps theirs */
  const TABLE_T* trow = TABLES + (i64)seq * stride_ts;
  const u8* kbase = K + (i64)kvh * stride_kh;
  const u8* vbase = V + (i64)kvh * stride_vh + r * (HEAD_DIM / 8);
  Step a, b;  /* ping-pong: the next step's loads are in flight while this one computes */
  if (start < end) load_step(a, start, end, r, c, load_ids(trow, start, end, lane), kbase,
                             vbase, stride_kb, stride_kt, stride_vb, stride_vt);
  int ids = load_ids(trow, start + STEP, end, lane);  /* the next step's */

  /* q row row0 + r of the group (zeros past it): the dims of this lane's K words, as fp16 MMA
     fragments (K word i is dims 64 (i / 4) + 16 c + 4 (i % 4) .. + 4) */
  float qv[HEAD_DIM / 4];
  float amax = 0.f;
  const u16* qrow = Q + (i64)seq * stride_qs + (i64)(kvh * GROUP + row0 + r) * stride_qh
                    + 16 * c;
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 4; ++d) {
    qv[d] = row0 + r < GROUP ? q_to_float(qrow[64 * (d >> 4) + (d & 15)]) : 0.f;
    amax = fmaxf(amax, fabsf(qv[d]));
  }
  float row_mul = 1.f, row_scale = 1.f;
#if Q_BF16  /* the row's largest magnitude into [2^14, 2^15): exact in fp16 */
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  if (amax > 0.f) {
    int e;
    frexpf(amax, &e);  /* amax in [2^(e-1), 2^e) */
    row_mul = exp2f((float)(15 - e));
    row_scale = exp2f((float)(e - 15));
  }
#endif
  u32 qf[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    qf[i][0] = pack_f16x2(qv[4 * i] * row_mul, qv[4 * i + 1] * row_mul);
    qf[i][1] = pack_f16x2(qv[4 * i + 2] * row_mul, qv[4 * i + 3] * row_mul);
  }
  /* the score scale of query rows 2c and 2c + 1 (lane 4 q holds row q's power of two) */
  const float base = (float)scale_log2e * K_SCALE[kvh];
  const float sc0 = base * __shfl_sync(0xffffffffu, row_scale, 8 * c);
  const float sc1 = base * __shfl_sync(0xffffffffu, row_scale, 8 * c + 4);

  Softmax st;
  st.m0 = NEG_INF; st.m1 = NEG_INF; st.l0 = 0.f; st.l1 = 0.f;
#pragma unroll
  for (int j = 0; j < MT; ++j) st.acc[j][0] = st.acc[j][1] = st.acc[j][2] = st.acc[j][3] = 0.f;

  for (int t0 = start; t0 < end; t0 += 2 * STEP) {
    if (t0 + STEP < end) {
      load_step(b, t0 + STEP, end, r, c, ids, kbase, vbase, stride_kb, stride_kt, stride_vb,
                stride_vt);
      ids = load_ids(trow, t0 + 2 * STEP, end, lane);
    }
    attend_step(st, a, qf, sc0, sc1, t0, end, r);
    if (t0 + STEP >= end) break;
    if (t0 + 2 * STEP < end) {
      load_step(a, t0 + 2 * STEP, end, r, c, ids, kbase, vbase, stride_kb, stride_kt,
                stride_vb, stride_vt);
      ids = load_ids(trow, t0 + 3 * STEP, end, lane);
    }
    attend_step(st, b, qf, sc0, sc1, t0 + STEP, end, r);
  }
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, o);
    st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, o);
  }
#if SPLIT_WARPS > 1
  merge_splits(st, OUT, PART, V_SCALE, num_parts, ml_offset, q_heads, seq, row0, hw, r, c);
#else
  const float vs = V_SCALE[kvh];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  /* query rows 2c and 2c + 1 */
    const int row = row0 + 2 * c + h;
    if (row >= GROUP) continue;
    const int head = kvh * GROUP + row;
    const float m = h ? st.m1 : st.m0, l = h ? st.l1 : st.l0;
    const int dim0 = r * (HEAD_DIM / 8);
    if (num_parts == 1) {
      u16* o = OUT + ((i64)seq * q_heads + head) * HEAD_DIM + dim0;
      const float f = vs / l;
#pragma unroll
      for (int t = 0; t < HEAD_DIM / 8; ++t) o[t] = float_to_out(st.acc[t >> 1][2 * (t & 1) + h] * f);
    } else {
      const i64 part = ((i64)seq * q_heads + head) * num_parts + blockIdx.z;
      float4* o = reinterpret_cast<float4*>(PART + part * HEAD_DIM + dim0);
#pragma unroll
      for (int t = 0; t < HEAD_DIM / 8; t += 2)  /* dims t, t + 1: tile t / 2, rows r, r + 8 */
        if (t % 4 == 0) o[t / 4] = make_float4(st.acc[t >> 1][h] * vs, st.acc[t >> 1][2 + h] * vs,
                                               st.acc[(t >> 1) + 1][h] * vs,
                                               st.acc[(t >> 1) + 1][2 + h] * vs);
      if (r == 0) {
        PART[ml_offset + part * 2] = m;
        PART[ml_offset + part * 2 + 1] = l;
      }
    }
  }
#endif
}

/* The partial outputs of one (sequence, query head) merged: block x = seq * q_heads +
   head; the weights exp2(m_i - max m) first, then COMBINE_WARPS warps each summing a share of
   the splits (lane: dims lane + 32 k), then the warps' sums added. */
extern "C" __global__ void __launch_bounds__(COMBINE_WARPS * 32) fp8_decode_combine(
    const float* PART, u16* OUT, int num_splits, int ml_offset) {
  __shared__ float weight[MAX_SPLITS];
  __shared__ float partial[COMBINE_WARPS][HEAD_DIM];
  __shared__ float reduce[COMBINE_WARPS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const i64 base = (i64)blockIdx.x * num_splits;
  const float* ML = PART + ml_offset;
  float m = NEG_INF;
  for (int i = tid; i < num_splits; i += COMBINE_WARPS * 32) m = fmaxf(m, ML[(base + i) * 2]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) reduce[warp] = m;
  __syncthreads();
  m = reduce[0];
#pragma unroll
  for (int w = 1; w < COMBINE_WARPS; ++w) m = fmaxf(m, reduce[w]);
  __syncthreads();
  float den = 0.f;
  for (int i = tid; i < num_splits; i += COMBINE_WARPS * 32) {
    const float mi = ML[(base + i) * 2];
    const float w = mi > NEG_INF ? exp2f(mi - m) : 0.f;  /* empty splits weigh 0 */
    weight[i] = w;
    den += w * ML[(base + i) * 2 + 1];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
  if (lane == 0) reduce[warp] = den;
  __syncthreads();
  den = 0.f;
#pragma unroll
  for (int w = 0; w < COMBINE_WARPS; ++w) den += reduce[w];
  float acc[HEAD_DIM / 32];
#pragma unroll
  for (int k = 0; k < HEAD_DIM / 32; ++k) acc[k] = 0.f;
#pragma unroll 8
  for (int i = warp; i < num_splits; i += COMBINE_WARPS) {
    const float w = weight[i];
    const float* p = PART + (base + i) * HEAD_DIM + lane;
#pragma unroll
    for (int k = 0; k < HEAD_DIM / 32; ++k) acc[k] += w * p[32 * k];
  }
#pragma unroll
  for (int k = 0; k < HEAD_DIM / 32; ++k) partial[warp][lane + 32 * k] = acc[k];
  __syncthreads();
  for (int d = tid; d < HEAD_DIM; d += COMBINE_WARPS * 32) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < COMBINE_WARPS; ++w) sum += partial[w][d];
    OUT[(i64)blockIdx.x * HEAD_DIM + d] = float_to_out(sum / den);
  }
}
/* The wide merge: block (x, y) = (seq * q_heads + head, dims 32 y .. 32 y + 31), blockDim.x / 32
   warps (up to 32). Warp w sums splits w, w + warps, ... for its lane's dim: a warp holds few
   splits, and loads its first WIDE_AHEAD partials at once, before the splits' (m, l) are read
   into shared memory (one per thread) and turned into weights. */
extern "C" __global__ void __launch_bounds__(1024) fp8_decode_combine_wide(
    const float* PART, u16* OUT, int num_splits, int ml_offset) {
  __shared__ float weight[MAX_SPLITS];
  __shared__ float reduce[2][32];
  __shared__ float partial[32][33];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  const i64 base = (i64)blockIdx.x * num_splits;
  const float2* ML = reinterpret_cast<const float2*>(PART + ml_offset);
  /* this lane's first partials, loaded before the weights are known: one round of loads */
  const float* p = PART + base * HEAD_DIM + 32 * blockIdx.y + lane;
  float ahead[WIDE_AHEAD];
#pragma unroll
  for (int k = 0; k < WIDE_AHEAD; ++k) {
    const int i = warp + k * warps;
    ahead[k] = i < num_splits ? p[(i64)i * HEAD_DIM] : 0.f;
  }
  float m = NEG_INF;
  for (int i = tid; i < num_splits; i += blockDim.x) {
    const float2 ml = ML[base + i];
    weight[i] = ml.x;
    m = fmaxf(m, ml.x);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) reduce[0][warp] = m;
  __syncthreads();
  m = reduce[0][0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, reduce[0][w]);
  float den = 0.f;
  for (int i = tid; i < num_splits; i += blockDim.x) {
    const float mi = weight[i];
    const float w = mi > NEG_INF ? exp2f(mi - m) : 0.f;  /* empty splits weigh 0 */
    weight[i] = w;
    den += w * ML[base + i].y;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
  if (lane == 0) reduce[1][warp] = den;
  __syncthreads();
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < WIDE_AHEAD; ++k) {
    const int i = warp + k * warps;
    if (i < num_splits) acc += weight[i] * ahead[k];
  }
  for (int i = warp + WIDE_AHEAD * warps; i < num_splits; i += warps)
    acc += weight[i] * p[(i64)i * HEAD_DIM];
  partial[warp][lane] = acc;
  __syncthreads();
  if (warp == 0) {
    float sum = 0.f, total = 0.f;
    for (int w = 0; w < warps; ++w) { sum += partial[w][lane]; total += reduce[1][w]; }
    OUT[(i64)blockIdx.x * HEAD_DIM + 32 * blockIdx.y + lane] = float_to_out(sum / total);
  }
}
