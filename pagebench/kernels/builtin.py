"""The built-in backends. Optional ones (Triton, FlexAttention) import lazily on first use."""

from __future__ import annotations

import functools
import importlib.util

import torch

from pagebench.kernels.cuda_fp8_decode import HEAD_DIMS, compiler_available, cuda_fp8_paged_decode
from pagebench.kernels.cuda_fp8_decode import available as cuda_fp8_available
from pagebench.kernels.quant import FP8_DTYPES, nvidia_fp8_hardware
from pagebench.kernels.reference import (sdpa_contiguous_decode, torch_paged_decode,
                                         torch_paged_prefill)
from pagebench.kernels.registry import register_backend
from pagebench.triton_setup import interprets


@functools.lru_cache(maxsize=1)  # asked on every call that resolves a backend
def _has_triton() -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    # Without CUDA, Triton runs only interpreted (pagebench.triton_setup).
    return torch.cuda.is_available() or interprets()


def _triton_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale=None,
                   v_scale=None):
    from pagebench.kernels.triton_decode import triton_paged_decode
    return triton_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale,
                               v_scale)


def _triton_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                    k_scale=None, v_scale=None):
    from pagebench.kernels.triton_prefill import triton_paged_prefill
    return triton_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                                scale, k_scale, v_scale)


def _triton_contiguous(q, k, v, seq_lens, scale):
    from pagebench.kernels.contiguous import triton_contiguous_decode
    return triton_contiguous_decode(q, k, v, seq_lens, scale)


def _prepare_triton_contiguous(q, k, v, seq_lens, scale):
    from pagebench.kernels.contiguous import prepare_triton_contiguous
    return prepare_triton_contiguous(q, k, v, seq_lens, scale)


@functools.lru_cache(maxsize=1)
def _flex_available() -> bool:
    from pagebench.kernels.flex import flex_available
    return flex_available()


def _flex_decode(q, k_cache, v_cache, block_tables, seq_lens, scale):
    from pagebench.kernels.flex import flex_paged_decode
    return flex_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale)


def _prepare_flex_decode(q, k_cache, v_cache, block_tables, seq_lens, scale):
    from pagebench.kernels.flex import prepare_flex_decode
    return prepare_flex_decode(q, k_cache, v_cache, block_tables, seq_lens, scale)


FLOAT_AND_FP8 = (torch.float32, torch.float16, torch.bfloat16, *FP8_DTYPES)


def triton_reads_cache(device: torch.device, cache_dtype: torch.dtype) -> bool:
    """Whether Triton's kernels can read a cache of ``cache_dtype`` on ``device``: Triton
    compiles e4m3 (its ``fp8e4nv``) for NVIDIA GPUs of compute capability 8.9+ only (an A100
    takes e5m2, or the torch backend); interpreted on a CPU, or on ROCm, both formats."""
    if cache_dtype != torch.float8_e4m3fn or device.type != "cuda" or torch.version.hip:
        return True
    return nvidia_fp8_hardware(device)

# graph_capturable: torch's prefill reads the lengths back to the host, so only its decode is.
# scratch_ratio: torch gathers a contiguous copy of K and V on every call.
register_backend(
    "torch", decode=torch_paged_decode, prefill=torch_paged_prefill, priority=10,
    cache_dtypes=FLOAT_AND_FP8, graph_capturable=("decode",), scratch_ratio=2.0,
    description="gather each sequence's K/V out of its blocks (an fp8 cache dequantised on the "
    "way), then dense attention (SDPA)")
register_backend(
    "sdpa", contiguous=sdpa_contiguous_decode, priority=10, nan_safe=False,
    graph_capturable=("contiguous",),
    description="torch.nn.functional.scaled_dot_product_attention on a contiguous cache")
# Triton runs CPU tensors only interpreted: on a GPU machine (not interpreting) a CPU tensor
# would reach Triton's driver, so "cpu" is then not among its devices (a clear ValueError).
register_backend(
    "triton", decode=_triton_decode, prefill=_triton_prefill, contiguous=_triton_contiguous,
    priority=20, cache_dtypes=FLOAT_AND_FP8, reads_cache_on=triton_reads_cache,
    devices=("cpu", "cuda") if interprets() else ("cuda",),
    auto_devices=("cuda",), is_available=_has_triton,
    graph_capturable=("decode", "prefill", "contiguous"),
    prepare={"contiguous": _prepare_triton_contiguous},
    head_dims="1..256 (padded to a power of two)", supports_head_dim=lambda d: 1 <= d <= 256,
    description="Triton paged decode (GQA-packed programs, online softmax over KV tiles, "
    "split-KV with a combine step) and causal paged prefill, both reading fp8 caches "
    "(CPU: interpreted, for tests)")
register_backend(
    "flex", decode=_flex_decode, priority=0, is_available=_flex_available,
    auto_devices=("cuda",),  # on a CPU flex_attention runs eagerly: a dense reference
    graph_capturable=("decode",), prepare={"decode": _prepare_flex_decode},
    sweep_block_sizes=(16, 128),  # it compiles once per shape and page size
    block_sizes="multiples of 16 (FlexAttention's KV block = page size)",
    supports_block_size=lambda bs: bs >= 16 and bs % 16 == 0, nan_safe=False,
    description="FlexAttention (torch.nn.attention.flex_attention) with a page-table block mask")
# Opt-in (priority below Triton's): "auto" keeps Triton, whose fp8 decode the engine's GPU tests
# cover; the sweeps and `backend="cuda-fp8"` time this one (docs/kernels.md).
register_backend(
    "cuda-fp8", decode=cuda_fp8_paged_decode, devices=("cuda",),
    dtypes=(torch.float16, torch.bfloat16), priority=15, cache_dtypes=FP8_DTYPES,
    reads_own_dtype=False, reads_cache_on=lambda device, _: cuda_fp8_available(device),
    is_available=compiler_available, graph_capturable=("decode",),
    head_dims=", ".join(map(str, HEAD_DIMS)), supports_head_dim=lambda d: d in HEAD_DIMS,
    scratch_ratio=1.0,
    description="fp8 paged decode in CUDA C++ compiled at first use (NVRTC): scores computed "
    "transposed (16 tokens x the group's query rows per MMA), fp8 loaded from the cache "
    "straight into MMA registers, one warp per KV split (NVIDIA compute capability 8.9+)")


def _flashinfer_variant(tensor_cores: bool):
    """Decode, its ``prepare`` hook and (CUDA cores only) prefill of one FlashInfer variant."""
    from pagebench.kernels import flashinfer as fi

    decode = functools.partial(fi.decode, tensor_cores=tensor_cores)
    prepare = {"decode": functools.partial(fi.prepare_decode, tensor_cores=tensor_cores)}
    if tensor_cores:
        return {"decode": decode, "prepare": prepare}
    return {"decode": decode, "prefill": fi.prefill,
            "prepare": {**prepare, "prefill": fi.prepare_prefill}}


# Registered only where the package is installed (pagebench[flashinfer]); `is_available` then
# imports it. Opt-in, like cuda-fp8: "auto" keeps Triton; the sweeps time it by name.
if importlib.util.find_spec("flashinfer") is not None:
    from pagebench.kernels.flashinfer import CUDA_CORE_GROUPS
    from pagebench.kernels.flashinfer import HEAD_DIMS as FI_HEAD_DIMS
    from pagebench.kernels.flashinfer import flashinfer_available

    for _name, _tc in (("flashinfer", False), ("flashinfer-tc", True)):
        register_backend(
            _name, **_flashinfer_variant(_tc), devices=("cuda",),
            dtypes=(torch.float16, torch.bfloat16), priority=5, cache_dtypes=FP8_DTYPES,
            reads_cache_on=lambda device, _: nvidia_fp8_hardware(device),
            is_available=flashinfer_available,
            graph_capturable=("decode",) if _tc else ("decode", "prefill"),
            head_dims=", ".join(map(str, FI_HEAD_DIMS)),
            supports_head_dim=lambda d: d in FI_HEAD_DIMS, scratch_ratio=0.0,
            supports_group=(lambda g: g >= 1) if _tc else (lambda g: g in CUDA_CORE_GROUPS),
            description="FlashInfer's paged " + ("decode on tensor cores (its prefill kernel, "
                        "one query row per sequence)" if _tc else "decode (CUDA cores) and "
                        "causal prefill") + ", FA2 kernels JIT-compiled, planned once per "
                        "table; fp8 caches with one scale for every head")
