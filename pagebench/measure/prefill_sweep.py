"""Prefill timing: every paged-prefill backend against causal SDPA on a contiguous cache.

A point is (batch, query_len, cached): ``batch`` sequences, each with ``cached`` tokens already
in the cache and a chunk of ``query_len`` new ones (a whole prompt when ``cached`` is 0; chunked
prefill or a prefix-cache hit otherwise). One tidy row per measurement (``PREFILL_COLUMNS``).
Every variant is timed without a CUDA graph; on CUDA, the ones that can be captured (the SDPA
baseline, and the backends that declare prefill ``graph_capturable`` in the registry because
they read nothing back to the host) are also timed replayed from a graph, which leaves out the
host's launch work. Backends come from the registry as in the decode sweep: on a CPU only
those that are real kernels there (``Backend.is_kernel_on``), unless ``include`` names them.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from pagebench import defaults
from pagebench.config import dtype_name
from pagebench.measure import sweep_runner
from pagebench.measure.distributed import take_share
from pagebench.kernels import registry
from pagebench.measure.kernel_cases import prefill_case, quantized_inputs
from pagebench.kernels.quant import is_fp8
from pagebench.measure.kernel_sweep import graph_modes
from pagebench.kernels.validate import check_prefill
from pagebench.results.datasets import KERNELS_PREFILL
from pagebench.measure.timing import ENVIRONMENT_COLUMNS, cpu_threads, environment, measure

PREFILL_COLUMNS = [
    *ENVIRONMENT_COLUMNS,
    "dtype", "model_shape", "num_q_heads", "num_kv_heads", "head_dim", "batch", "query_len",
    "cached", "block_size", "backend", "kernel", "layout", "cuda_graphs", "time_us", "q20_us",
    "q80_us", "tflops", "kv_dtype",
]
# (batch, query_len, cached): whole prompts (one, then several at once), then chunks after a
# cached prefix
FULL_PREFILL_POINTS = [(1, 512, 0), (1, 2048, 0), (1, 8192, 0), (8, 512, 0), (16, 512, 0),
                       (64, 512, 0), (4, 2048, 0), (32, 128, 0), (128, 128, 0), (1, 512, 3584),
                       (1, 512, 15872), (16, 64, 1024), (64, 16, 2048)]
QUICK_PREFILL_POINTS = [(1, 32, 0), (2, 16, 48)]


def causal_flops(batch: int, query_len: int, cached: int, num_q_heads: int,
                 head_dim: int) -> float:
    """Multiply-adds x 2 of QK^T and PV over the visible (query, key) pairs."""
    pairs = query_len * cached + query_len * (query_len + 1) // 2
    return 4.0 * batch * num_q_heads * head_dim * pairs


def sdpa_causal(batch, query_len, cached, shape, dtype, device, seed, *, masked: bool = False):
    """Causal SDPA on a contiguous cache, queries at the end of the context: the baseline.

    Without ``masked``, no explicit mask reaches SDPA, so its fused kernels stay eligible:
    ``is_causal`` for a whole prompt, a bottom-right causal bias
    (``torch.nn.attention.bias.causal_lower_right``) for a chunk after a cached prefix (with
    grouped heads, where the kernel SDPA picks for the bias refuses or ignores them, K/V are
    expanded to the query heads once, here, outside the timed call). ``masked``: the boolean
    mask the earlier baseline passed (it leaves only the math and cuDNN paths), kept to show
    what it cost."""
    from torch.nn.attention.bias import causal_lower_right

    num_q, num_kv, head_dim = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    context = cached + query_len
    q = torch.randn(batch, num_q, query_len, head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(batch, num_kv, context, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(k.shape, device=device, dtype=dtype, generator=gen)
    scale = head_dim ** -0.5
    gqa = num_q != num_kv
    if cached == 0:
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                      enable_gqa=gqa)
    mask = (torch.arange(context, device=device)[None, :]
            <= torch.arange(cached, context, device=device)[:, None])
    if masked:
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                      enable_gqa=gqa)
    bias = causal_lower_right(query_len, context)
    if gqa and not _same_result(q, k, v, bias, mask, scale):
        # a fused kernel reached through the bias that ignores enable_gqa (torch's CPU flash
        # kernel does): K/V expanded to the query heads once, here, outside the timed call
        k, v = (x.repeat_interleave(num_q // num_kv, dim=1) for x in (k, v))
        gqa = False
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale,
                                                  enable_gqa=gqa)


def _same_result(q, k, v, bias, mask, scale) -> bool:
    """Whether SDPA with the bottom-right causal ``bias`` and grouped heads computes what the
    boolean ``mask`` does (one call of each)."""
    try:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale,
                                             enable_gqa=True)
    except RuntimeError:
        return False
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return bool(torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2))


def run_prefill_sweep(device="cpu", quick=True, *, shapes=None, points=None,
                      block_size=defaults.BLOCK_SIZE, dtype=None, include=None, repeat=None,
                      progress=None, share=(0, 1), kv_dtype=None, cuda_graphs="both",
                      one_scale: bool = False):
    """Time every available paged-prefill backend and the SDPA baseline at every point;
    returns a pandas DataFrame with ``PREFILL_COLUMNS``. ``share=(rank, world)`` times only
    this rank's (shape, point) pairs (``pagebench.measure.distributed.take_share``). ``kv_dtype``
    (default ``dtype``): the paged caches' dtype, e.g. ``torch.float8_e4m3fn`` (per-head
    scales; only backends that read it are timed; the SDPA baseline stays in ``dtype``).
    ``include``: backend names or paged variants' labels (``triton-paged``) to time.
    ``cuda_graphs``: as the decode sweep's (``kernel_sweep.graph_modes``). ``one_scale``: an fp8
    cache with one scale for every head (``kernel_cases.quantized_inputs``)."""
    import pandas as pd

    on_cuda = torch.device(device).type == "cuda"
    dtype = dtype or (torch.bfloat16 if on_cuda else torch.float32)
    kv_dtype = kv_dtype or dtype
    shapes = shapes or ({"llama-3-8b": defaults.SHAPES["llama-3-8b"]} if quick or not on_cuda
                        else defaults.SHAPES)
    points = points or (QUICK_PREFILL_POINTS if quick or not on_cuda else FULL_PREFILL_POINTS)
    repeat = repeat or (5 if quick else 20)
    graph_modes(cuda_graphs, False, on_cuda)  # a bad mode fails before any work
    env = environment(device)

    def timed_backends(head_dim: int) -> list[str]:
        """The backends timed at this head size: those that accept the input (device, dtypes,
        block size, head size), named in ``include`` or else real kernels on ``device``."""
        return [name for name, b in registry.registered_backends().items()
                if b.supports("prefill", device, dtype, block_size, head_dim, kv_dtype)
                and registry.backend_available(b)
                and (name in include or f"{name}-paged" in include if include is not None
                     else b.is_kernel_on(device))]

    def sweep_points():
        """(shape name, shape, (batch, query_len, cached), backends timed) of this rank."""
        units = itertools.count()
        for shape_name, shape in shapes.items():
            backends = timed_backends(shape[2])
            for point in points:
                if take_share(next(units), share):
                    yield shape_name, shape, point, backends

    def point_variants(p) -> list[str | None]:
        # None: the bar, causal SDPA on a contiguous cache (not a registry backend)
        return [None, *p[3]]

    def build_case(p):
        _, shape, point, _ = p
        case = prefill_case(*point, shape, block_size, dtype, device, seed=3)
        check_prefill(*case.args(), shape[2] ** -0.5)  # once: the timed calls go to the kernels
        if is_fp8(kv_dtype):  # each head's largest value maps to the format's
            case = quantized_inputs(case, kv_dtype, spread=1.0, one_scale=one_scale)
        return case

    def time_variant(p, case, name):
        """(cuda_graphs, Timing) per graph mode of backend ``name`` (None: SDPA)."""
        _, shape, point, _ = p
        if name is None:
            fn, capturable = sdpa_causal(*point, shape, dtype, device, seed=3), True
        else:
            backend = registry.get_backend(name)
            fn = backend.prepared_call("prefill", *case.args(), shape[2] ** -0.5, **case.scales())
            capturable = "prefill" in backend.graph_capturable
        for graph in graph_modes(cuda_graphs, capturable, on_cuda):
            with cpu_threads(None if on_cuda else 1):  # as the decode sweep: one CPU thread
                t = measure(fn, device=device, warmup=2, repeat=repeat, cuda_graph=graph)
            yield graph, t

    def make_row(p, case, name, measured) -> dict:
        shape_name, shape, point, _ = p
        graph, t = measured
        layout = "contiguous" if name is None else "paged"
        return KERNELS_PREFILL.row(
            **env, dtype=dtype_name(dtype), model_shape=shape_name,
            num_q_heads=shape[0], num_kv_heads=shape[1], head_dim=shape[2],
            batch=point[0], query_len=point[1], cached=point[2],
            block_size=block_size if layout == "paged" else None,
            backend="sdpa-contiguous" if name is None else f"{name}-paged",
            kernel=name, layout=layout, cuda_graphs=graph, time_us=t.median_us,
            q20_us=t.q20_us, q80_us=t.q80_us,
            tflops=causal_flops(*point, shape[0], shape[2]) / t.median_us / 1e6,
            kv_dtype=dtype_name(kv_dtype if layout == "paged" else dtype))

    rows = sweep_runner.run_sweep(sweep_points(), point_variants, build_case, time_variant,
                                  make_row, progress=progress,
                                  release=torch.cuda.empty_cache if on_cuda else None)
    return pd.DataFrame(rows, columns=PREFILL_COLUMNS)
