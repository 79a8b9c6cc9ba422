"""fp8 paged decode in CUDA C++ (compiled at first use with NVRTC; backend ``cuda-fp8``): one
warp per (sequence, KV head, KV split), everything in registers.

Why a second fp8 decode beside Triton's: Triton's paged decode puts the query rows in the MMA's
M dimension (16 rows for 4-7 heads a group) and stages the converted K/V tiles through shared
memory, so its fp8 loop is bound by that per-tile chain, not by the bytes it reads
(docs/kernels.md, "fp8 KV caches"). This kernel swaps the operands,
as decode kernels with few query rows do: scores are computed transposed, ``S^T = K Q^T``, with
16 tokens in M and up to 8 query rows of the group in N of ``mma.m16n8k16`` (a larger group
takes one warp per 8 rows), and the output as ``O^T = V^T P^T``. The token and head-dim orders
inside the MMA fragments are chosen so that each lane loads whole 16-byte runs of fp8 straight
from the cache into the registers of its fragment: K needs only the ``cvt`` from fp8 pairs to
fp16 pairs; V, whose reduction axis is the token, needs a byte permute (``prmt``) to pair two
tokens of one dimension first; P goes from the scores' accumulator layout to the MMA operand
layout with one ``movmatrix`` per 8 tokens. No shared memory and no barrier in the loop: each
warp runs its own online softmax over its split, the next step's loads (and the block ids of
the one after) in flight while it computes, and writes a partial (output, max, sum) that a second kernel
merges: one block per (sequence, query head), or, from ``WIDE_COMBINE_SPLITS`` partials on, one
per (sequence, query head, 32 dims) with a warp per few partials. With many splits
(``MERGE_FROM_SPLITS``) a block's warps read consecutive splits of one KV head instead of
adjacent KV heads, and merge them through shared memory into one partial first (the only
barrier), so the second kernel reads a quarter of the partials.

The mapping, per warp and step of 16 tokens (lane = 4 r + c, head dim D):

- K: lane holds tokens ``r`` and ``r + 8`` of the step, bytes ``16c .. 16c + 16`` of each
  64-byte run of the row (4 lanes read a run whole); its word ``i`` is dims
  ``64 (i / 4) + 16 c + 4 (i % 4) ..`` + 4, whose low and high halves are the k indices
  ``2c, 2c + 1`` and ``2c + 8, 2c + 9`` of MMA step ``i`` (q's fragment takes the same order);
- scores ``S^T``: lane holds tokens ``r``, ``r + 8`` x query rows ``2c``, ``2c + 1``, so the
  softmax's reduction over tokens is over the lanes of one ``c`` (3 shuffles);
- V: lane holds tokens ``2c, 2c + 1, 2c + 8, 2c + 9``, dims ``r D/8 .. (r+1) D/8``; row
  ``r`` of output tile ``j`` is dim ``r D/8 + 2j``, row ``r + 8`` is ``r D/8 + 2j + 1``.

What it reads (``unsupported_reason`` names the argument otherwise): fp8 caches (e4m3, e5m2)
with unit stride in the head dim, q of fp16/bf16, head dim 64/128/256, any group size and
block size, int32/int64 tables and lengths, on NVIDIA GPUs of compute capability 8.9+ (the fp8
``cvt``). Caches whose pointer or strides are not multiples of 16 bytes take a build that
loads bytes (exact, slow). A bf16 q is rescaled per head to fp16 by a power of two as in
Triton's kernel (``rows_to_f16``); K's scale folds into the softmax scale and V's multiplies
the output once.

The source is ``cuda_fp8_decode.cu``, shipped as package data and read with
``importlib.resources``; each build (``CudaBuild``) prepends its constants as ``#define``s.
It is compiled with ``torch.cuda._compile_kernel``, a private function: torch 2.11 and 2.13
have no public runtime compiler (the function's own docstring calls it
``torch.cuda.compile_kernel``, a name neither version defines), ``cpp_extension.load_inline``
builds a whole extension with the host compiler and nvcc rather than one kernel with NVRTC,
and cuda-python's NVRTC bindings would be a new dependency for what torch already carries.
``compiler_available`` checks for the private name, so a torch without it leaves the backend
unregistered rather than broken.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
from typing import NamedTuple

import torch

from pagebench.config import ceil_div
from pagebench.kernels.launch_common import unit_stride_rows, wave_splits
from pagebench.kernels.quant import is_fp8, nvidia_fp8_hardware
from pagebench.kernels.reference import LOG2E

LANES = 32
STEP = 16  # tokens per MMA step (the M of S^T; the source's STEP)
MMA_N = 8  # query rows a warp reads: the N of the MMAs (larger groups: chunks of 8)
HEAD_DIMS = (64, 128, 256)
MAX_SPLITS = 512
COMBINE_WARPS = 8  # the block-per-head combine's
SPLIT_MERGE_FLOATS = 1536  # split_warps x warps x (head dim + 4) <= 48 KB / 32 B (the merge's)
MERGE_FROM_SPLITS = 32  # from this many splits on, a block's warps read splits of one KV head
MERGED_SPLIT_WARPS = 4  # ... this many, merged in the block
WIDE_AHEAD = 8  # partials a lane of the wide combine loads before the weights
SPLIT_OVERHEAD_STEPS = 4  # a split's fixed cost (q, its partial's writes) in 16-token steps
COMBINE_SPLITS_PER_STEP = 32  # the combine's cost: a step time per this many splits


def heads_per_block(kv_heads: int, most: int = 4) -> int:
    """Warps (KV heads) per block: the largest power of two up to ``most`` dividing
    ``kv_heads``."""
    warps = most
    while kv_heads % warps:
        warps //= 2
    return warps


SOURCE_FILE = "cuda_fp8_decode.cu"  # package data beside this module
_INDEX_TYPES = {torch.int32: "int", torch.int64: "long long"}
KERNELS = ("fp8_paged_decode", "fp8_decode_combine", "fp8_decode_combine_wide")
WIDE_COMBINE_SPLITS = 32  # from this many partials on, the wide combine (fewer: a block per head)
COMBINES = ("block", "wide")  # CudaDecodeLaunch.combine: a block per head, or the wide one


@dataclasses.dataclass(frozen=True, kw_only=True)
class CudaDecodeLaunch:
    """How ``cuda_fp8_paged_decode`` launches; None is the default's choice.

    ``num_splits``: KV splits of every sequence's table (default ``choose_splits``);
    ``warps_per_block``: warps of a block; ``split_warps``: how many of them read consecutive
    splits of one KV head and merge them in the block (one partial for the combine instead of
    ``split_warps``), the block's others taking adjacent KV heads (``heads_per_block``); by
    default ``MERGED_SPLIT_WARPS`` from ``MERGE_FROM_SPLITS`` splits on, else 1;
    ``min_blocks``: blocks per SM the compiler must fit (a register cap); ``combine``: the
    merge of the partials, ``"block"`` (a block per query head) or ``"wide"`` (a block per 32
    dims of a head), by default wide from ``WIDE_COMBINE_SPLITS`` partials on.
    """

    num_splits: int | None = None
    warps_per_block: int = 4
    split_warps: int | None = None
    min_blocks: int = 1
    combine: str | None = None

    def __post_init__(self):
        for name in ("num_splits", "warps_per_block", "split_warps", "min_blocks"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.combine not in (None, *COMBINES):
            raise ValueError(f"combine: expected one of {COMBINES} or None, got "
                             f"{self.combine!r}")


DEFAULT_LAUNCH = CudaDecodeLaunch()


class CudaBuild(NamedTuple):
    """The constants one compiled build of ``SOURCE_FILE`` is specialised for."""

    head_dim: int
    group: int  # query heads per KV head
    block_size: int
    fp8_name: str  # "e4m3" or "e5m2"
    q_bf16: bool  # q (and out) bf16, else fp16
    table_t: str  # C type of the block tables
    seq_t: str  # ... and of the lengths
    heads_per_block: int  # KV heads of a block (warps per split)
    min_blocks: int = 1  # blocks per SM the compiler must fit
    aligned: bool = True  # caches of 16-byte rows (else byte loads)
    split_warps: int = 1  # a block's warps on consecutive splits of one KV head

    @property
    def block_warps(self) -> int:
        return self.heads_per_block * self.split_warps


@functools.lru_cache(maxsize=1)
def _source() -> str:
    return importlib.resources.files(__package__).joinpath(SOURCE_FILE).read_text()


@functools.lru_cache(maxsize=1)
def compiler_available() -> bool:
    """Whether this process has a CUDA GPU and a torch that compiles CUDA with NVRTC."""
    return torch.cuda.is_available() and hasattr(torch.cuda, "_compile_kernel")


def available(device) -> bool:
    """Whether ``device`` runs the kernel: an NVIDIA GPU of compute capability 8.9+ and a torch
    that compiles CUDA with NVRTC."""
    return compiler_available() and nvidia_fp8_hardware(device)


def _aligned(x: torch.Tensor) -> bool:
    return x.data_ptr() % 16 == 0 and all(s % 16 == 0 for s in x.stride()[:3])


def unsupported_reason(q, k_cache, v_cache) -> str | None:
    """Why the kernel cannot take this call, naming the argument (None when it can): the
    registry's capabilities (fp8 caches, fp16/bf16 q, ``HEAD_DIMS``, NVIDIA 8.9+) and the
    layout (caches with unit stride in the head dim and strides below 2 GiB)."""
    if not is_fp8(k_cache.dtype) or v_cache.dtype != k_cache.dtype:
        return (f"k_cache: the cuda-fp8 backend reads fp8 caches (e4m3, e5m2), got "
                f"{k_cache.dtype} / {v_cache.dtype}")
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"q: the cuda-fp8 backend takes fp16 or bf16 queries, got {q.dtype}"
    if q.shape[-1] not in HEAD_DIMS:
        return f"q: the cuda-fp8 backend takes head dims {HEAD_DIMS}, got {q.shape[-1]}"
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.stride(-1) != 1:
            return f"{name}: the last dimension must have unit stride"
        if max(x.stride()) >= 2 ** 31:
            return f"{name}: strides of 2 GiB or more"
    if not available(q.device):
        return f"q: the cuda-fp8 backend runs on NVIDIA GPUs of compute capability 8.9+, " \
               f"not {q.device}"
    return None


def kernel_source(build: CudaBuild) -> str:
    """The CUDA source of one build: ``SOURCE_FILE`` after a ``#define`` of each constant."""
    defines = dict(HEAD_DIM=build.head_dim, GROUP=build.group, BLOCK_SIZE=build.block_size,
                   FP8_NAME=f'"{build.fp8_name}"', Q_BF16=int(build.q_bf16),
                   TABLE_T=build.table_t, SEQ_T=build.seq_t,
                   QCHUNKS=ceil_div(build.group, MMA_N), WARPS=build.heads_per_block,
                   MIN_BLOCKS=build.min_blocks, ALIGNED=int(build.aligned),
                   COMBINE_WARPS=COMBINE_WARPS, MAX_SPLITS=MAX_SPLITS, WIDE_AHEAD=WIDE_AHEAD,
                   SPLIT_WARPS=build.split_warps)
    return "".join(f"#define {k} {v}\n" for k, v in defines.items()) + _source()


@functools.lru_cache(maxsize=64)
def _compiled(build: CudaBuild):
    """(split kernel, combine kernels, warps the GPU holds at once) of ``build``."""
    source = kernel_source(build)
    split, *combines = (torch.cuda._compile_kernel(source, name) for name in KERNELS)
    return split, combines, _resident_warps(split, build.block_warps)


def _resident_warps(kernel, warps: int) -> int:
    """Warps of ``kernel`` in blocks of ``warps`` that the whole GPU runs at once (the CUDA
    driver's occupancy calculation, times the SM count)."""
    import ctypes

    blocks = ctypes.c_int(0)
    libcuda = ctypes.CDLL("libcuda.so.1")
    if libcuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), kernel.func,
                                                           LANES * warps, ctypes.c_size_t(0)):
        blocks.value = 1  # unknown: assume one block per SM
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return max(1, blocks.value) * warps * sms


def choose_splits(units: int, capacity: int, slots: int, merged: int = 1) -> tuple[int, int]:
    """(splits, tokens per split) of each of ``units`` (sequence, KV head) pairs' ``capacity``
    tokens: ``launch_common.wave_splits`` in 16-token steps, warps in blocks of ``merged``
    splits (a block's empty split warps take slots too), a warp's fixed cost
    ``SPLIT_OVERHEAD_STEPS``, the combine one step per ``COMBINE_SPLITS_PER_STEP``
    partials."""
    return wave_splits(units, capacity, STEP, slots, overhead_steps=SPLIT_OVERHEAD_STEPS,
                       merge_per_step=COMBINE_SPLITS_PER_STEP, max_splits=MAX_SPLITS,
                       merged=merged)


@functools.lru_cache(maxsize=1024)
def _plan(build: CudaBuild, num_seqs: int, q_heads: int, kv_heads: int, capacity: int,
          launch: CudaDecodeLaunch):
    """The launch of one call: (split kernel, combine kernels, build, splits, tokens per
    split). ``build``'s ``heads_per_block`` and ``split_warps`` are replaced by the launch's."""
    units = num_seqs * kv_heads * ceil_div(q_heads // kv_heads, MMA_N)  # warps per split
    split_warps, num_splits = launch.split_warps, launch.num_splits
    if split_warps is None:  # as many splits as the one-head-per-warp layout would take
        one = build._replace(heads_per_block=heads_per_block(kv_heads, launch.warps_per_block),
                             split_warps=1)
        slots = _compiled(one)[2]
        few = (num_splits or choose_splits(units, capacity, slots)[0]) < MERGE_FROM_SPLITS
        split_warps = 1 if few else MERGED_SPLIT_WARPS
    heads = heads_per_block(kv_heads, max(1, launch.warps_per_block // split_warps))
    if split_warps * heads * (build.head_dim + 4) > SPLIT_MERGE_FLOATS:
        raise ValueError(f"split_warps: {split_warps} x {heads} warps of head dim "
                         f"{build.head_dim} need more than 48 KB of shared memory")
    build = build._replace(heads_per_block=heads, split_warps=split_warps)
    split, combines, slots = _compiled(build)
    if num_splits is None:
        splits, per_split = choose_splits(units, capacity, slots, split_warps)
    else:
        per_split = ceil_div(ceil_div(capacity, min(num_splits, MAX_SPLITS)), STEP) * STEP
        splits = ceil_div(capacity, per_split)
    if splits > 1 and num_seqs * q_heads * splits * (build.head_dim + 2) >= 2 ** 31:
        # the kernel takes the partials' offsets as 32-bit ints: so many sequences fill the
        # GPU with one split each anyway
        per_split, splits = ceil_div(capacity, STEP) * STEP, 1
    return split, combines, build, splits, per_split


def cuda_fp8_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale,
                          launch: CudaDecodeLaunch | None = None) -> torch.Tensor:
    """Paged decode of an fp8 cache; arguments as ``triton_paged_decode`` (validated; scales
    float32 tensors ``[num_kv_heads]``), in a layout ``unsupported_reason`` accepts (else a
    ``ValueError``); ``launch``: a ``CudaDecodeLaunch`` (None: the defaults). No device sync:
    the call can be captured in a CUDA graph."""
    reason = unsupported_reason(q, k_cache, v_cache)
    if reason:
        raise ValueError(reason)
    launch = launch or DEFAULT_LAUNCH
    q, block_tables, seq_lens = unit_stride_rows(q, block_tables, seq_lens)
    num_seqs, q_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_seqs == 0:
        return out
    build = CudaBuild(head_dim, q_heads // kv_heads, block_size,
                      "e4m3" if k_cache.dtype == torch.float8_e4m3fn else "e5m2",
                      q.dtype == torch.bfloat16, _INDEX_TYPES[block_tables.dtype],
                      _INDEX_TYPES[seq_lens.dtype], heads_per_block=1,
                      min_blocks=launch.min_blocks,
                      aligned=_aligned(k_cache) and _aligned(v_cache))
    split, combines, build, splits, per_split = _plan(
        build, num_seqs, q_heads, kv_heads, block_tables.shape[1] * block_size, launch)
    groups = ceil_div(splits, build.split_warps)  # partials per head: a block's splits merged
    parts = num_seqs * q_heads * groups
    part = (torch.empty(parts * (head_dim + 2), device=q.device, dtype=torch.float32)
            if groups > 1 else out)  # with one partial the kernel writes out directly
    k8, v8 = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    qchunks = ceil_div(q_heads // kv_heads, MMA_N)
    split(grid=(num_seqs, kv_heads // build.heads_per_block * qchunks, groups),
          block=(LANES * build.block_warps, 1, 1),
          args=[q, k8, v8, block_tables, seq_lens, out, part, k_scale, v_scale,
                float(scale * LOG2E), per_split, groups,
                parts * head_dim if groups > 1 else 0,
                q.stride(0), q.stride(1), k8.stride(0), k8.stride(1), k8.stride(2),
                v8.stride(0), v8.stride(1), v8.stride(2), block_tables.stride(0), q_heads])
    if groups == 1:
        return out
    combine = launch.combine or ("wide" if groups >= WIDE_COMBINE_SPLITS else "block")
    if combine == "block":
        combines[0](grid=(num_seqs * q_heads, 1, 1), block=(LANES * COMBINE_WARPS, 1, 1),
                    args=[part, out, groups, parts * head_dim])
    else:  # a warp per few partials: all of a warp's loads in flight at once
        warps = min(32, ceil_div(groups, 4))
        combines[1](grid=(num_seqs * q_heads, head_dim // LANES, 1),
                    block=(LANES * warps, 1, 1), args=[part, out, groups, parts * head_dim])
    return out
