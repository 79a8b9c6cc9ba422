"""fp8 KV caches: per-KV-head scales, quantisation with saturation, dequantisation.

A cache of dtype ``torch.float8_e4m3fn`` or ``torch.float8_e5m2`` stores K/V divided by a scale
per KV head: the real value of an element of head ``h`` is ``stored * k_scale[h]`` (K) or
``stored * v_scale[h]`` (V), as in vLLM and FlashInfer. A scale is a Python number (every head
the same) or a float32 tensor ``[num_kv_heads]`` on the cache's device. Queries and outputs keep
their own dtype (float32, float16, bfloat16); only the cache is fp8.

Quantising saturates: a value beyond the format's largest finite number (448 for e4m3, 57344
for e5m2) is stored as that number, so an outlier costs accuracy but never turns into inf or
NaN. ``calibrated_scales`` picks scales from sample K/V (the largest magnitude per head, with
headroom), the way vLLM's ``calculate_kv_scales`` does on the first forward pass.
"""

from __future__ import annotations

import functools

import math
from numbers import Real

import torch

from pagebench.config import dtype_name

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# names accepted where a cache dtype is given as text (engine, CLI)
KV_DTYPE_NAMES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8": torch.float8_e4m3fn,
                  "float8_e4m3fn": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
                  "float8_e5m2": torch.float8_e5m2}
# calibration headroom: a later token may be this many times larger than the calibration
# sample's largest before it saturates
CALIBRATION_HEADROOM = 2.0


def nvidia_fp8_hardware(device: torch.device) -> bool:
    """Whether ``device`` is an NVIDIA GPU of compute capability 8.9+ (Ada, Hopper and later):
    the ones with fp8 conversion instructions, and the only ones Triton compiles e4m3 for."""
    return (device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device) >= (8, 9))


# the positive float32 range (its smallest subnormal to its largest finite value): a scale
# outside it becomes 0 or inf in the kernels' float32 arithmetic
FLOAT32_RANGE = (float(torch.finfo(torch.float32).smallest_normal) * 2.0 ** -23,
                 float(torch.finfo(torch.float32).max))


def in_float32_range(value: float) -> bool:
    return FLOAT32_RANGE[0] <= value <= FLOAT32_RANGE[1]  # (False for NaN)


def as_float(x) -> float:
    """``float(x)``, with integers too large for a float as infinities."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def is_number(x) -> bool:
    """Whether ``x`` is a real number (``numbers.Real``: Python and NumPy ints and floats), not
    a bool (True would silently become 1.0), a string or a tensor."""
    return isinstance(x, Real) and not isinstance(x, bool)


def is_fp8(dtype) -> bool:
    return dtype in FP8_DTYPES


def fp8_max(dtype) -> float:
    return float(torch.finfo(dtype).max)


def kv_dtype_from_name(name, default: torch.dtype, arg: str = "kv_cache_dtype") -> torch.dtype:
    """A cache dtype from ``"auto"`` (``default``), an fp8 name (``"fp8_e4m3"``,
    ``"fp8_e5m2"``), a float name or a torch dtype; anything else is a ``ValueError`` naming
    ``arg``."""
    if isinstance(name, torch.dtype):
        dtype = name
    elif name in (None, "auto"):
        dtype = default
    elif isinstance(name, str) and name.lower() in KV_DTYPE_NAMES:
        dtype = KV_DTYPE_NAMES[name.lower()]
    elif isinstance(name, str) and isinstance(getattr(torch, name, None), torch.dtype):
        dtype = getattr(torch, name)
    else:
        raise ValueError(f"{arg}: unknown {name!r} (use 'auto', "
                         f"{', '.join(repr(n) for n in KV_DTYPE_NAMES)} or a float dtype)")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, *FP8_DTYPES):
        raise ValueError(f"{arg}: {dtype} is not a float or fp8 dtype")
    return dtype


def check_kv_scales(k_cache, k_scale, v_scale):
    """The scales as float32 tensors ``[num_kv_heads]`` on the cache's device, or (None, None)
    for a cache that is not fp8. An fp8 cache needs both; a non-fp8 cache takes neither.
    Numbers are checked to be finite and positive; a tensor's values only on the CPU (reading a
    GPU tensor's values back would synchronise every call)."""
    fp8 = is_fp8(k_cache.dtype)
    if not fp8:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None:
                raise ValueError(f"{name}: scales apply to fp8 caches only; the cache is "
                                 f"{dtype_name(k_cache.dtype)}")
        return None, None
    kv_heads = k_cache.shape[2]
    return (_scale_tensor("k_scale", k_scale, kv_heads, k_cache.device, k_cache.dtype),
            _scale_tensor("v_scale", v_scale, kv_heads, k_cache.device, k_cache.dtype))


@functools.cache
def scale_range(dtype) -> tuple[float, float]:
    """The scales an fp8 ``dtype`` cache takes: from float32's smallest subnormal to the
    largest float32 whose product with the format's largest number is finite in float32 and
    in bf16 (the torch backend dequantises to a bf16 q's dtype): a larger one makes stored
    values infinite once dequantised, and the torch backend's output NaN."""
    top = torch.tensor(fp8_max(dtype), dtype=torch.float32)
    largest = torch.tensor(float(torch.finfo(torch.bfloat16).max) / float(top),
                           dtype=torch.float32)
    while not torch.isfinite((largest * top).to(torch.bfloat16)):
        largest = torch.nextafter(largest, torch.zeros_like(largest))
    return FLOAT32_RANGE[0], float(largest)


def _scale_tensor(name, s, kv_heads: int, device, dtype) -> torch.Tensor:
    if s is None:
        raise ValueError(f"{name}: required for an fp8 cache (stored value x scale = real value)")
    largest = scale_range(dtype)[1]
    if isinstance(s, torch.Tensor):
        if s.dtype != torch.float32:
            raise ValueError(f"{name}: expected a float32 tensor, got {s.dtype}")
        if s.dim() > 1 or (s.dim() == 1 and s.shape[0] != kv_heads):
            raise ValueError(f"{name}: expected shape [num_kv_heads] = [{kv_heads}] or a "
                             f"scalar, got {tuple(s.shape)}")
        if s.device != torch.device(device):
            raise ValueError(f"{name}: is on {s.device} but the cache is on {device}")
        if s.device.type == "cpu" and not bool(torch.isfinite(s).all() & (s > 0).all()):
            raise ValueError(f"{name}: every scale must be finite and positive, got {s.tolist()}")
        if s.device.type == "cpu" and bool((s > largest).any()):
            raise ValueError(f"{name}: every scale must be at most {largest:.6g} (the "
                             f"largest {dtype_name(dtype)} value times it overflows float32), "
                             f"got {s.tolist()}")
        return s.expand(kv_heads).contiguous() if s.dim() == 0 else s.contiguous()
    if not is_number(s):
        raise ValueError(f"{name}: expected a number or a float32 tensor, got {type(s).__name__}")
    if not in_float32_range(as_float(s)):
        raise ValueError(f"{name}: must be a positive number that float32 holds, got "
                         f"{as_float(s):.6g}")
    if as_float(s) > largest:
        raise ValueError(f"{name}: must be at most {largest:.6g} (the largest "
                         f"{dtype_name(dtype)} value times it overflows float32), got "
                         f"{as_float(s):.6g}")
    return torch.full((kv_heads,), float(s), dtype=torch.float32, device=device)


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    """``x`` ``[..., num_kv_heads, head_dim]`` divided by its head's scale, saturated to the
    format's finite range and cast to ``dtype`` (NaN stays NaN)."""
    limit = fp8_max(dtype)
    y = x.to(torch.float32) / scale[:, None]
    return y.clamp(-limit, limit).to(dtype)


def dequantize(x: torch.Tensor, scale: torch.Tensor, dtype, head_axis: int = -2) -> torch.Tensor:
    """The real values of fp8 ``x`` in ``dtype``: ``x * scale[h]`` for KV head ``h`` on axis
    ``head_axis`` (``-2`` for ``[..., Hkv, D]``)."""
    shape = [1] * x.dim()
    shape[head_axis] = scale.shape[0]
    return (x.to(torch.float32) * scale.view(shape)).to(dtype)


def calibrated_scales(x: torch.Tensor, dtype, headroom: float = CALIBRATION_HEADROOM):
    """Per-head scales for fp8 ``dtype`` from sample values ``x`` ``[num_tokens, Hkv, D]``:
    the head's largest finite magnitude x ``headroom`` maps to the format's largest number.
    NaN and infinities in a sample are ignored (one of them would otherwise decide its head's
    scale); a head with no finite non-zero value gets the scale of magnitude 1. The scales are
    clamped to :func:`scale_range`, which :func:`check_kv_scales` accepts: an all-tiny head
    gets the smallest scale (its values stay tiny, not 0/0), a huge one the largest. Stays on
    x's device (no sync)."""
    magnitude = x.detach().abs().to(torch.float32)
    magnitude = torch.where(torch.isfinite(magnitude), magnitude, torch.zeros_like(magnitude))
    amax = magnitude.amax(dim=(0, 2))
    amax = torch.where(amax > 0, amax, torch.ones_like(amax))
    low, high = scale_range(dtype)
    return (amax * (headroom / fp8_max(dtype))).clamp(low, high)
