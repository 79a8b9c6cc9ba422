"""The kernel timing sweep: paged vs contiguous decode over shapes, batch, context, block size.

One tidy row per measurement (columns ``COLUMNS``). Backends come from the registry: every
backend with a paged ``decode`` is timed as ``<name>-paged``, every ``contiguous`` one as
``<name>-contiguous``, so a registered third-party kernel is swept with no other change; what
a backend needs for timing (a CUDA graph or not, state prepared once per input, the block
sizes it is timed at, where it is a real kernel) it declares in the registry.
The timed body is the backend's ``prepared_call`` on inputs validated once beforehand (the
public functions validate on every call, which reads scalars back from the GPU).

The paged cases' block tables follow ``layouts`` (``measure.kernel_cases.TABLE_LAYOUTS``: contiguous,
shuffled, aged; column ``table_layout``). Every row records the unique K/V bytes the step
reads (``footprint_bytes``) and whether they fit in the GPU's L2 (``fits_l2``): such a point
measures the cache hierarchy more than the kernel, and is flagged rather than compared.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import torch

from pagebench import defaults
from pagebench.config import dtype_name
from pagebench.measure import sweep_runner
from pagebench.measure.distributed import take_share
from pagebench.kernels import registry
from pagebench.measure.kernel_cases import (adjacent_fraction, contiguous_case, make_paged_inputs,
                                        quantized_inputs)
from pagebench.kernels.ragged import batch_lengths
from pagebench.kernels.quant import check_kv_scales, is_fp8
from pagebench.kernels.validate import check_contiguous, check_decode
from pagebench.results.datasets import KERNELS
from pagebench.measure.timing import ENVIRONMENT_COLUMNS, cpu_threads, environment, measure

COLUMNS = [
    *ENVIRONMENT_COLUMNS,
    "dtype", "model_shape", "num_q_heads", "num_kv_heads", "head_dim", "batch", "context",
    "block_size", "backend", "kernel", "layout", "cuda_graphs", "time_us", "q20_us", "q80_us",
    "kv_bytes", "gbps", "copy_gbps", "table_layout", "adjacent_fraction", "footprint_bytes",
    "l2_bytes", "fits_l2", "kv_dtype", "lengths",
]
# L2 of the H200 where the device does not say (CPU runs: the flag is then about the H200)
DEFAULT_L2_BYTES = 60 * 10**6

FULL_POINTS = sorted({(1, c) for c in (1024, 4096, 16384, 65536)}
                     | {(b, 4096) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)})
QUICK_POINTS = [(1, 4096), (8, 4096), (1, 16384)]
# quick on CPU: small sizes, well under a minute on two cores
CPU_QUICK_POINTS = [(1, 256), (1, 1024), (4, 256), (8, 512)]


@dataclass(frozen=True)
class Variant:
    label: str  # e.g. "triton-paged"
    backend: str
    layout: str  # "paged" | "contiguous"


def variants(device: str, include=None, exclude=None) -> list[Variant]:
    """Timed variants from the registry, for backends that run on ``device``; ``exclude``
    (default: the backends that are no real kernel there, ``Backend.is_kernel_on``) names
    backends to leave out, ``include`` the only ones to time: a backend's name (all its
    variants) or a variant's label (``triton-paged``).

    Ordered as timed at each point: contiguous baselines, then paged kernels by the memory a
    call allocates, so the heavy gather runs last and cannot warm or throttle the GPU ahead of
    the kernels it is compared with."""
    out = []
    device_type = torch.device(device).type
    for name, b in registry.registered_backends().items():
        if name in (exclude or ()) or (exclude is None and not b.is_kernel_on(device)):
            continue
        if device_type not in b.devices or not registry.backend_available(b):
            continue
        for layout, kernel in (("contiguous", b.contiguous), ("paged", b.decode)):
            label = f"{name}-{layout}"
            if kernel is not None and (include is None or name in include or label in include):
                out.append(Variant(label, name, layout))
    ratio = {v.backend: registry.get_backend(v.backend).scratch_ratio for v in out}
    return sorted(out, key=lambda v: (v.layout == "paged", ratio[v.backend]))


def kv_bytes(batch: int, context: int, num_kv_heads: int, head_dim: int, dtype) -> int:
    """K and V bytes a decode step must read: every cached token of every sequence, once."""
    return 2 * batch * context * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def measure_copy_gbps(device: str, nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), in GB/s."""
    n = nbytes // 2
    src = torch.randn(n, device=device, dtype=torch.float32).to(torch.bfloat16)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), device=device, warmup=3, repeat=20, flush_l2=False)
    return 2 * nbytes / (t.median_us * 1e-6) / 1e9


READ_BYTES = 2 * 2**30  # the read-only ceiling's buffer: far beyond any L2


def read_gbps(device: str, nbytes: int = READ_BYTES) -> float:
    """Read-only bandwidth (bytes read per second), in GB/s: a reduction over a buffer that
    only reads it, the ceiling of a decode kernel (which reads K/V and writes almost nothing;
    against a copy's read + write bandwidth it could score above 100%)."""
    buf = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    t = measure(lambda: buf.sum(), device=device, warmup=3, repeat=20, flush_l2=False)
    return nbytes / (t.median_us * 1e-6) / 1e9


def l2_bytes(device) -> int:
    if torch.device(device).type == "cuda":
        return int(torch.cuda.get_device_properties(torch.device(device)).L2_cache_size)
    return DEFAULT_L2_BYTES


def footprint_bytes(tables, block_size: int, num_kv_heads: int, head_dim: int, dtype) -> int:
    """Unique K and V bytes behind ``tables`` (every entry used): what a step reads at least."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * int(torch.unique(tables).numel()) * block_size * num_kv_heads * head_dim * element


def _fits(device: str, need_bytes: int) -> bool:
    if torch.device(device).type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info()
    return need_bytes < 0.85 * free


def _scratch_bytes(variant: Variant, batch, context, shape, dtype) -> int:
    """Memory one call of a variant allocates (``Backend.scratch_ratio``)."""
    ratio = registry.get_backend(variant.backend).scratch_ratio
    return int(ratio * kv_bytes(batch, context, shape[1], shape[2], dtype))


CUDA_GRAPH_MODES = ("both", "only", "off")


def graph_modes(cuda_graphs: str, capturable: bool, on_cuda: bool) -> tuple[bool, ...]:
    """The ``cuda_graphs`` values a call is timed with: eagerly and replayed from a CUDA graph
    (``both``), from a graph alone (``only``) or eagerly alone (``off``); eagerly wherever a
    graph cannot be used (a CPU, a call that cannot be captured)."""
    if cuda_graphs not in CUDA_GRAPH_MODES:
        raise ValueError(f"cuda_graphs: expected one of {', '.join(CUDA_GRAPH_MODES)}, got "
                         f"{cuda_graphs!r}")
    if not (on_cuda and capturable) or cuda_graphs == "off":
        return (False,)
    return (True,) if cuda_graphs == "only" else (False, True)


@dataclass(frozen=True)
class Point:
    """One case of the decode sweep: a batch of ``lens`` at ``(batch, context)`` of one shape,
    on a contiguous cache (``block_size`` None) or paged with ``table_layout``."""
    shape_name: str
    shape: tuple
    batch: int
    context: int
    spec: str  # the lengths spec (``kernels.ragged``)
    lens: tuple
    block_size: int | None = None
    table_layout: str | None = None

    @property
    def uniform(self) -> bool:
        return len(set(self.lens)) == 1

    @property
    def scale(self) -> float:
        return self.shape[2] ** -0.5


def decode_points(shapes, points, lengths, block_sizes, layouts, share=(0, 1)):
    """The decode sweep's cases in the order they are timed: per shape, (batch, context) and
    lengths spec (this rank's share of them), the contiguous case, then each block size's paged
    cases, one per table layout."""
    units = itertools.count()
    for shape_name, shape in shapes.items():
        for (batch, context), spec in itertools.product(points, lengths):
            if not take_share(next(units), share):
                continue
            lens = tuple(batch_lengths(spec, batch, context, seed=batch))
            unit = Point(shape_name, shape, batch, context, spec, lens)
            yield unit
            for block_size in block_sizes:
                for table_layout in layouts:
                    yield replace(unit, block_size=block_size, table_layout=table_layout)


def run_sweep(device="cpu", quick=True, *, shapes=None, points=None, block_sizes=None,
              dtype=None, include=None, exclude=None, repeat=None, copy_gbps=None,
              progress=None, skipped=None, cuda_graphs="both", share=(0, 1),
              layouts=("shuffled",), kv_dtype=None, lengths=("uniform",),
              one_scale: bool = False):
    """Time every variant at every point; returns a pandas DataFrame with ``COLUMNS``.

    ``dtype`` defaults to bfloat16 on CUDA, float32 on CPU. ``layouts``: the paged cases'
    block-table layouts (``measure.kernel_cases.TABLE_LAYOUTS``); contiguous variants ignore it.
    ``kv_dtype`` (default ``dtype``): the paged caches' dtype, e.g. ``torch.float8_e4m3fn``
    (scales: each head's largest value maps to the format's); only backends that declare it
    are timed paged, and the contiguous baselines stay in ``dtype``. ``lengths``: the batches'
    length specs (``kernels.ragged``: ``uniform``, ``lognormal:MU,SIGMA``, ``trace:NAME``; the
    point's context is their mean; column ``lengths``); a ragged batch's contiguous baseline
    is a cache padded to its longest sequence, read up to each length. ``one_scale``: an fp8
    cache with one scale for every head (``kernel_cases.quantized_inputs``).
    ``quick`` on CPU: two small shapes, a handful of points, the backends that are real
    kernels there (torch-paged vs sdpa-contiguous), about a minute on two cores. On CUDA
    (quick=False) the full H200 grid of the issue. ``block_sizes`` default to
    ``defaults.BLOCK_SIZES`` (16 alone for a quick CUDA run); a backend that declares
    ``sweep_block_sizes`` is timed at those of them only. ``exclude`` defaults to the backends
    that are no real kernel on ``device`` (``Backend.is_kernel_on``).
    ``skipped`` (a list) collects (point, variant, reason) for combinations not measured.
    On CUDA, the backends that declare the operation ``graph_capturable`` are timed as
    ``cuda_graphs`` says (:func:`graph_modes`: by default with and without a CUDA graph, as a
    serving engine runs decode with one: without it, a Triton call's Python launch overhead,
    tens of us, hides small kernels).
    ``share=(rank, world)`` times only this rank's (shape, point) pairs
    (``pagebench.measure.distributed.take_share``), for a sweep split over GPUs.
    """
    import pandas as pd

    device = str(device)
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        raise ValueError("device: CUDA requested but torch.cuda.is_available() is False")
    if quick and not on_cuda:
        points = points or CPU_QUICK_POINTS
        repeat = repeat or 5
    dtype = dtype or (torch.bfloat16 if on_cuda else torch.float32)
    shapes = shapes or defaults.SHAPES
    points = points or (FULL_POINTS if not quick else QUICK_POINTS)
    block_sizes = block_sizes or ((defaults.BLOCK_SIZE,) if quick and on_cuda
                                  else defaults.BLOCK_SIZES)
    repeat = repeat or 30
    graph_modes(cuda_graphs, False, on_cuda)  # a bad mode fails before any work
    vs = variants(device, include, exclude)
    env = environment(device)
    if copy_gbps is None:
        copy_gbps = measure_copy_gbps(device) if on_cuda else float("nan")
    skipped = skipped if skipped is not None else []
    l2 = l2_bytes(device)

    kv_dtype = kv_dtype or dtype

    def graphs(variant):
        op = "decode" if variant.layout == "paged" else "contiguous"
        return graph_modes(cuda_graphs, op in registry.get_backend(variant.backend).graph_capturable,
                           on_cuda)

    def point_variants(p: Point) -> list[Variant]:
        if p.block_size is None:
            return [v for v in vs if v.layout == "contiguous"]
        # what the backend accepts, at the block sizes it asks to be timed at
        return [v for v in vs if v.layout == "paged"
                and (b := registry.get_backend(v.backend)).supports(
                    "decode", device, dtype, p.block_size, p.shape[2], kv_dtype)
                and (b.sweep_block_sizes is None or p.block_size in b.sweep_block_sizes)]

    def build_case(p: Point):
        shape, batch, lens = p.shape, p.batch, p.lens
        need = 2 * kv_bytes(batch, max(lens), shape[1], shape[2], dtype)
        if p.block_size is None:
            if not _fits(device, need):
                skipped.append(((p.shape_name, batch, p.context, None), "contiguous", "memory"))
                return None
            case = contiguous_case(batch, max(lens), shape, dtype, device, seed=batch)
            case.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
            check_contiguous(*case.args(), p.scale)
            return case
        where = (p.shape_name, batch, p.context, p.block_size, p.table_layout)
        if p.table_layout == "aged" and not p.uniform:
            skipped.append((where, "paged", f"aged tables need equal lengths ({p.spec})"))
            return None
        # an aged pool holds other requests' blocks too
        pool = need * (5 if p.table_layout == "aged" else 4) // 4
        if not _fits(device, pool + need // p.block_size):
            skipped.append((where, "paged", "memory"))
            return None
        case = make_paged_inputs(lens, *shape, p.block_size, dtype, device, seed=batch,
                                 layout=p.table_layout, extra_blocks=0, extra_table_cols=0,
                                 poison=False)
        if is_fp8(kv_dtype):  # each head's largest value maps to the format's
            case = quantized_inputs(case, kv_dtype, spread=1.0, one_scale=one_scale)
        check_decode(*case.args(), p.scale)
        check_kv_scales(case.k_cache, case.k_scale, case.v_scale)
        return case

    def time_variant(p: Point, case, var: Variant):
        """(cuda_graphs, Timing) per graph mode of ``var`` that could be timed."""
        backend = registry.get_backend(var.backend)
        if p.block_size is None:
            # None: every sequence fills the cache
            fn = backend.prepared_call("contiguous", case.q, case.k, case.v,
                                       None if p.uniform else case.seq_lens, p.scale)
        else:
            where = (p.shape_name, p.batch, p.context, p.block_size, p.table_layout)
            if not _fits(device, _scratch_bytes(var, p.batch, p.context, p.shape, dtype)):
                skipped.append((where, var.label, "memory"))
                return
            try:
                fn = backend.prepared_call("decode", *case.args(), p.scale, **case.scales())
            except Exception as e:  # noqa: BLE001 (recorded as skipped)
                skipped.append((where, var.label, f"{type(e).__name__}: {str(e)[:160]}"))
                return
        for graph in graphs(var):
            try:
                with cpu_threads(None if on_cuda else 1):  # one thread: steadier on a shared CPU
                    t = measure(fn, device=device, warmup=3, repeat=repeat, cuda_graph=graph)
            except Exception as e:  # noqa: BLE001 -- one failing combination must not end the sweep
                skipped.append(((p.shape_name, p.batch, p.context, p.block_size, graph), var.label,
                                f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"))
                if on_cuda:
                    torch.cuda.synchronize()
                continue
            yield graph, t

    def make_row(p: Point, case, v: Variant, measured) -> dict:
        graph, t = measured
        shape = p.shape
        cache_dtype = dtype if v.layout == "contiguous" else kv_dtype
        tables = None if p.block_size is None else case.block_tables
        nbytes = kv_bytes(1, sum(p.lens), shape[1], shape[2], cache_dtype)
        footprint = nbytes if tables is None else footprint_bytes(
            tables, p.block_size, shape[1], shape[2], cache_dtype)
        return KERNELS.row(**env,
                           dtype=dtype_name(dtype), model_shape=p.shape_name,
                           num_q_heads=shape[0], num_kv_heads=shape[1], head_dim=shape[2],
                           batch=p.batch, context=p.context, block_size=p.block_size,
                           backend=v.label, kernel=v.backend, layout=v.layout,
                           cuda_graphs=graph, time_us=t.median_us, q20_us=t.q20_us,
                           q80_us=t.q80_us, kv_bytes=nbytes,
                           gbps=nbytes / (t.median_us * 1e-6) / 1e9, copy_gbps=copy_gbps,
                           table_layout=p.table_layout,
                           adjacent_fraction=None if tables is None
                           else adjacent_fraction(tables),
                           footprint_bytes=footprint, l2_bytes=l2, fits_l2=footprint <= l2,
                           kv_dtype=dtype_name(cache_dtype), lengths=p.spec)

    rows = sweep_runner.run_sweep(
        decode_points(shapes, points, lengths, block_sizes, layouts, share), point_variants,
        build_case, time_variant, make_row, progress=progress,
        release=torch.cuda.empty_cache if on_cuda else None)
    return pd.DataFrame(rows, columns=COLUMNS)
