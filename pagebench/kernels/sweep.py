"""The kernel timing sweep: paged vs contiguous decode over shapes, batch, context, block size.

One tidy row per measurement (columns ``COLUMNS``). Backends come from the registry: every
backend with a paged ``decode`` is timed as ``<name>-paged``, every ``contiguous`` one as
``<name>-contiguous``, so a registered third-party kernel is swept with no other change.
The timed body calls the backend's kernel directly on inputs validated once beforehand (the
public functions validate on every call, which reads scalars back from the GPU).

The paged cases' block tables follow ``layouts`` (``kernels.testing.TABLE_LAYOUTS``: contiguous,
shuffled, aged; column ``table_layout``). Every row records the unique K/V bytes the step
reads (``footprint_bytes``) and whether they fit in the GPU's L2 (``fits_l2``): such a point
measures the cache hierarchy more than the kernel, and is flagged rather than compared.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from pagebench.distributed import take_share
from pagebench.kernels import registry
from pagebench.kernels.quant import calibrated_scales, check_kv_scales, is_fp8, quantize
from pagebench.kernels.reference import identity_tables
from pagebench.kernels.testing import adjacent_fraction, layout_tables
from pagebench.kernels.validate import check_contiguous, check_decode
from pagebench.timing import cpu_threads, environment, measure

COLUMNS = [
    "device", "device_name", "torch_version", "triton_version", "pagebench_version", "commit",
    "dtype", "model_shape", "num_q_heads", "num_kv_heads", "head_dim", "batch", "context",
    "block_size", "backend", "kernel", "layout", "cuda_graphs", "time_us", "q20_us", "q80_us",
    "kv_bytes", "gbps", "copy_gbps", "table_layout", "adjacent_fraction", "footprint_bytes",
    "l2_bytes", "fits_l2", "kv_dtype",
]
# L2 of the H200 where the device does not say (CPU runs: the flag is then about the H200)
DEFAULT_L2_BYTES = 60 * 10**6

# name -> (num_q_heads, num_kv_heads, head_dim)
SHAPES = {"llama-3-8b": (32, 8, 128), "qwen2.5-0.5b": (14, 2, 64)}
FULL_POINTS = sorted({(1, c) for c in (1024, 4096, 16384, 65536)}
                     | {(b, 4096) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)})
FULL_BLOCK_SIZES = (1, 8, 16, 32, 128)
QUICK_POINTS = [(1, 4096), (8, 4096), (1, 16384)]
# quick on CPU: small sizes, well under a minute on two cores
CPU_QUICK_POINTS = [(1, 256), (1, 1024), (4, 256), (8, 512)]
CPU_QUICK_BLOCK_SIZES = (1, 16, 128)
# CPU: interpreted Triton and eager FlexAttention are not meaningful to time there
CPU_EXCLUDED = ("triton", "flex")


@dataclass(frozen=True)
class Variant:
    label: str  # e.g. "triton-paged"
    backend: str
    layout: str  # "paged" | "contiguous"


# Timed in this order at each point: the heavy gather runs last, so it cannot warm or throttle
# the GPU ahead of the kernels it is compared with. Unlisted (third-party) backends come first.
ORDER = ("sdpa-contiguous", "triton-contiguous", "triton-paged", "flex-paged", "torch-paged")
# FlexAttention compiles once per shape and page size: sweep it at a few page sizes only
FLEX_BLOCK_SIZES = (16, 128)


def variants(device: str, include=None, exclude=()) -> list[Variant]:
    """Timed variants from the registry, for backends that run on ``device``."""
    out = []
    device_type = torch.device(device).type
    for name, b in registry.registered_backends().items():
        if name in exclude or (include is not None and name not in include):
            continue
        if device_type not in b.devices or not registry.backend_available(b):
            continue
        if b.decode is not None:
            out.append(Variant(f"{name}-paged", name, "paged"))
        if b.contiguous is not None:
            out.append(Variant(f"{name}-contiguous", name, "contiguous"))
    rank = {label: i for i, label in enumerate(ORDER)}
    return sorted(out, key=lambda v: rank.get(v.label, -1))


def kv_bytes(batch: int, context: int, num_kv_heads: int, head_dim: int, dtype) -> int:
    """K and V bytes a decode step must read: every cached token of every sequence, once."""
    return 2 * batch * context * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def measure_copy_gbps(device: str, nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), in GB/s."""
    n = nbytes // 2
    src = torch.randn(n, device=device, dtype=torch.float32).to(torch.bfloat16)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), device=device, warmup=3, repeat=20, flush_l2=False)
    del src, dst
    return 2 * nbytes / (t.median_us * 1e-6) / 1e9


def l2_bytes(device) -> int:
    if torch.device(device).type == "cuda":
        return int(torch.cuda.get_device_properties(torch.device(device)).L2_cache_size)
    return DEFAULT_L2_BYTES


def footprint_bytes(tables, block_size: int, num_kv_heads: int, head_dim: int, dtype) -> int:
    """Unique K and V bytes behind ``tables`` (every entry used): what a step reads at least."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * int(torch.unique(tables).numel()) * block_size * num_kv_heads * head_dim * element


def paged_case(batch, context, shape, block_size, dtype, device, seed, layout="shuffled"):
    num_q, num_kv, head_dim = shape
    tables, num_blocks = layout_tables(layout, batch, context, block_size, seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    k_cache = torch.randn(num_blocks, block_size, num_kv, head_dim, device=device, dtype=dtype,
                          generator=gen)
    v_cache = torch.randn_like(k_cache)
    tables = tables.to(device)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, num_q, head_dim, device=device, dtype=dtype, generator=gen)
    return q, k_cache, v_cache, tables, lens


def quantized_case(case, kv_dtype):
    """A paged case with its caches in fp8 ``kv_dtype`` (each head's largest value mapped to
    the format's largest), and the scales as keywords; unchanged (and ``{}``) otherwise."""
    q, k_cache, v_cache, tables, lens = case
    if not is_fp8(kv_dtype):
        return case, {}
    heads = k_cache.shape[2:]
    ks = calibrated_scales(k_cache.view(-1, *heads), kv_dtype, 1.0)
    vs = calibrated_scales(v_cache.view(-1, *heads), kv_dtype, 1.0)
    case = (q, quantize(k_cache, ks, kv_dtype), quantize(v_cache, vs, kv_dtype), tables, lens)
    return case, {"k_scale": ks, "v_scale": vs}


def contiguous_case(batch, context, shape, dtype, device, seed):
    num_q, num_kv, head_dim = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    k = torch.randn(batch, context, num_kv, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn_like(k)
    q = torch.randn(batch, num_q, head_dim, device=device, dtype=dtype, generator=gen)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return q, k, v, lens


def paged_callable(variant: Variant, q, k_cache, v_cache, tables, lens, scale, scales=None):
    b = registry.get_backend(variant.backend)
    if scales:
        return lambda: b.decode(q, k_cache, v_cache, tables, lens, scale, **scales)
    if variant.backend == "flex":
        from pagebench.kernels.flex import flex_block_mask, flex_paged_decode
        mask = flex_block_mask(tables, lens, k_cache.shape[0], k_cache.shape[1])
        return lambda: flex_paged_decode(q, k_cache, v_cache, tables, lens, scale, block_mask=mask)
    return lambda: b.decode(q, k_cache, v_cache, tables, lens, scale)


def contiguous_callable(variant: Variant, q, k, v, scale):
    b = registry.get_backend(variant.backend)
    if variant.backend == "triton":
        from pagebench.kernels.contiguous import triton_contiguous_decode
        tables = identity_tables(q.shape[0], q.device)
        lens = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=q.device)
        return lambda: triton_contiguous_decode(q, k, v, lens, scale, tables=tables)
    return lambda: b.contiguous(q, k, v, None, scale)


def _fits(device: str, need_bytes: int) -> bool:
    if torch.device(device).type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info()
    return need_bytes < 0.85 * free


def _gather_bytes(variant: Variant, batch, context, shape, dtype) -> int:
    """Extra memory a variant allocates per call (torch-paged gathers a contiguous copy)."""
    if variant.backend == "torch":
        return 2 * kv_bytes(batch, context, shape[1], shape[2], dtype)
    return kv_bytes(batch, context, shape[1], shape[2], dtype) // 8


def run_sweep(device="cpu", quick=True, *, shapes=None, points=None, block_sizes=None,
              dtype=None, include=None, exclude=None, graph_batch1=None,
              repeat=None, copy_gbps=None, progress=None, skipped=None,
              flex_block_sizes=FLEX_BLOCK_SIZES, graph_all=True, share=(0, 1),
              layouts=("shuffled",), kv_dtype=None):
    """Time every variant at every point; returns a pandas DataFrame with ``COLUMNS``.

    ``dtype`` defaults to bfloat16 on CUDA, float32 on CPU. ``layouts``: the paged cases'
    block-table layouts (``kernels.testing.layout_tables``); contiguous variants ignore it.
    ``kv_dtype`` (default ``dtype``): the paged caches' dtype, e.g. ``torch.float8_e4m3fn``
    (scales: each head's largest value maps to the format's); only backends that declare it
    are timed paged, and the contiguous baselines stay in ``dtype``.
    ``quick`` on CPU: two small shapes, a handful of points, torch-paged vs sdpa-contiguous,
    well under a minute on two cores. On CUDA (quick=False) the full H200 grid of the issue.
    ``skipped`` (a list) collects (point, variant, reason) for combinations not measured.
    On CUDA, ``graph_all`` times every point with and without a CUDA graph (else batch 1 only,
    ``graph_batch1``). ``share=(rank, world)`` times only this rank's (shape, point) pairs
    (``pagebench.distributed.take_share``), for a sweep split over GPUs.
    """
    import pandas as pd

    device = str(device)
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        raise ValueError("device: CUDA requested but torch.cuda.is_available() is False")
    if quick and not on_cuda:
        shapes = shapes or {"llama-3-8b": (32, 8, 128), "qwen2.5-0.5b": (14, 2, 64)}
        points = points or CPU_QUICK_POINTS
        block_sizes = block_sizes or CPU_QUICK_BLOCK_SIZES
        repeat = repeat or 5
    dtype = dtype or (torch.bfloat16 if on_cuda else torch.float32)
    shapes = shapes or SHAPES
    points = points or (FULL_POINTS if not quick else QUICK_POINTS)
    block_sizes = block_sizes or (FULL_BLOCK_SIZES if not quick else (16,))
    repeat = repeat or 30
    exclude = exclude if exclude is not None else (() if on_cuda else CPU_EXCLUDED)
    # On CUDA every point is also timed through a CUDA graph (as a serving engine runs decode):
    # without one, a Triton call's Python launch overhead (tens of us) hides small kernels.
    graph_batch1 = on_cuda if graph_batch1 is None else graph_batch1
    vs = variants(device, include, exclude)
    env = environment(device)
    if copy_gbps is None:
        copy_gbps = measure_copy_gbps(device) if on_cuda else float("nan")
    skipped = skipped if skipped is not None else []
    rows = []
    l2 = l2_bytes(device)

    kv_dtype = kv_dtype or dtype

    def record(v, shape_name, shape, batch, context, block_size, fn, graph, table_layout=None,
               tables=None):
        cache_dtype = dtype if v.layout == "contiguous" else kv_dtype
        try:
            with cpu_threads(None if on_cuda else 1):  # one thread: steadier on a shared CPU
                t = measure(fn, device=device, warmup=3, repeat=repeat, cuda_graph=graph)
        except Exception as e:  # noqa: BLE001 -- one failing combination must not end the sweep
            skipped.append(((shape_name, batch, context, block_size, graph), v.label,
                            f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"))
            if on_cuda:
                torch.cuda.synchronize()
            return
        nbytes = kv_bytes(batch, context, shape[1], shape[2], cache_dtype)
        footprint = nbytes if tables is None else footprint_bytes(
            tables, block_size, shape[1], shape[2], cache_dtype)
        rows.append({**{k: env[k] for k in COLUMNS[:6]},
                     "dtype": str(dtype).replace("torch.", ""), "model_shape": shape_name,
                     "num_q_heads": shape[0], "num_kv_heads": shape[1], "head_dim": shape[2],
                     "batch": batch, "context": context, "block_size": block_size,
                     "backend": v.label, "kernel": v.backend, "layout": v.layout,
                     "cuda_graphs": graph,
                     "time_us": t.median_us, "q20_us": t.q20_us, "q80_us": t.q80_us,
                     "kv_bytes": nbytes, "gbps": nbytes / (t.median_us * 1e-6) / 1e9,
                     "copy_gbps": copy_gbps, "table_layout": table_layout,
                     "adjacent_fraction": None if tables is None else adjacent_fraction(tables),
                     "footprint_bytes": footprint, "l2_bytes": l2, "fits_l2": footprint <= l2,
                     "kv_dtype": str(cache_dtype).replace("torch.", "")})
        if progress:
            progress(rows[-1])

    def graphs(batch):
        if graph_all and on_cuda:
            return (False, True)
        return (False, True) if graph_batch1 and batch == 1 else (False,)

    units = itertools.count()
    for shape_name, shape in shapes.items():
        scale = shape[2] ** -0.5
        for batch, context in points:
            if not take_share(next(units), share):
                continue
            contiguous = [v for v in vs if v.layout == "contiguous"]
            need = 2 * kv_bytes(batch, context, shape[1], shape[2], dtype)
            if contiguous and _fits(device, need):
                q, k, v_, lens = contiguous_case(batch, context, shape, dtype, device, seed=batch)
                check_contiguous(q, k, v_, lens, scale)
                for var in contiguous:
                    fn = contiguous_callable(var, q, k, v_, scale)
                    for graph in graphs(batch):
                        record(var, shape_name, shape, batch, context, None, fn, graph)
                del q, k, v_, lens
            elif contiguous:
                skipped.append(((shape_name, batch, context, None), "contiguous", "memory"))
            for block_size in block_sizes:
                paged = [v for v in vs if v.layout == "paged"
                         and registry.get_backend(v.backend).supports_block_size(block_size)
                         and registry.get_backend(v.backend).supports_cache_dtype(kv_dtype, dtype)
                         and (v.backend != "flex" or block_size in flex_block_sizes)]
                if not paged:
                    continue
                for table_layout in layouts:
                    # an aged pool holds other requests' blocks too
                    pool = need * (5 if table_layout == "aged" else 4) // 4
                    if not _fits(device, pool + need // block_size):
                        skipped.append(((shape_name, batch, context, block_size, table_layout),
                                        "paged", "memory"))
                        continue
                    case, scales = quantized_case(
                        paged_case(batch, context, shape, block_size, dtype, device,
                                    seed=batch, layout=table_layout), kv_dtype)
                    check_decode(*case, scale)
                    check_kv_scales(case[1], scales.get("k_scale"), scales.get("v_scale"))
                    for var in paged:
                        if not _fits(device, _gather_bytes(var, batch, context, shape, dtype)):
                            skipped.append(((shape_name, batch, context, block_size,
                                             table_layout), var.label, "memory"))
                            continue
                        try:
                            fn = paged_callable(var, *case, scale, scales)
                        except Exception as e:  # noqa: BLE001
                            skipped.append(((shape_name, batch, context, block_size,
                                             table_layout), var.label,
                                            f"{type(e).__name__}: {str(e)[:160]}"))
                            continue
                        for graph in graphs(batch):
                            record(var, shape_name, shape, batch, context, block_size, fn, graph,
                                   table_layout, case[3])
                    del case
                if on_cuda:
                    torch.cuda.empty_cache()
    return pd.DataFrame(rows, columns=COLUMNS)
