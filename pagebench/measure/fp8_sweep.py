"""fp8 KV caches against bf16 on the same inputs (``pagebench bench --fp8``; dataset
``kernels_fp8``): the Triton paged decode and prefill timed with each cache, the CUDA fp8
decode (backend ``cuda-fp8``, where it runs) with each fp8 cache, and the fp8 output's error.

At each point K/V are drawn once in ``dtype`` (standard normal: no outlier channels) and
quantised with per-head scales, each head's largest value mapped to the format's largest
(``kernel_cases.quantized_inputs``). One row per (point, cache dtype, launch): the time, and for
decode the bytes a step reads (fp8 counted in fp8 bytes), GB/s and its fraction of the measured
copy bandwidth; for an fp8 cache, the output's relative error against the ``dtype`` cache's
output and, as a correctness check, against the torch backend in float32 on the dequantised
cache. Decode: e4m3 at every block size, e5m2 at ``defaults.BLOCK_SIZE`` only (a second format,
not a second grid), where e4m3 is also timed with the larger tile its one-byte elements allow
(``FP8_LAUNCHES``). Prefill: whole prompts and a chunk after a cached prefix, at
``defaults.BLOCK_SIZE``. On CUDA every call is timed replayed from a CUDA graph.
"""

from __future__ import annotations

import torch

from pagebench import defaults
from pagebench.config import dtype_name
from pagebench.measure.kernel_cases import paged_case, prefill_case, quantized_inputs, relative_error
from pagebench.kernels.registry import backend_available, get_backend, registered_backends
from pagebench.kernels.reference import torch_paged_decode, torch_paged_prefill
from pagebench.measure.kernel_sweep import kv_bytes, measure_copy_gbps
from pagebench.kernels.validate import check_decode, check_prefill
from pagebench.results.datasets import KERNELS_FP8
from pagebench.measure.sweep_runner import run_sweep
from pagebench.measure.timing import environment, measure

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# the H200 grid: long contexts, where a decode step is bound by the bytes it reads
SHAPE = ("llama-3-8b", defaults.SHAPES["llama-3-8b"])
DECODE_POINTS = [(32, 4096), (64, 4096), (128, 4096), (1, 65536)]
BLOCK_SIZES = defaults.SHORT_BLOCK_SIZES
PREFILL_POINTS = [(1, 2048, 0), (1, 8192, 0), (8, 512, 3584)]  # batch, query_len, cached
# the same steps at CPU sizes (Triton interpreted): a dry run
CPU_SHAPE = ("tiny", (4, 2, 16))
CPU_DECODE_POINTS = [(2, 64)]
CPU_BLOCK_SIZES = (1, defaults.BLOCK_SIZE)
CPU_PREFILL_POINTS = [(1, 32, 16)]
# launch options beside the default, for e4m3 at defaults.BLOCK_SIZE: an fp8 tile holds half
# the bytes of a bf16 one, so a tile of twice the tokens reads as much per load (the default
# goes the other way, triton_decode.FP8_LAUNCH: this row keeps the comparison measured)
FP8_LAUNCHES = {"tile128x8": dict(tile_n=128, num_warps=8)}  # DecodeLaunch fields
# fp8 decode kernels timed beside Triton's where they run and read the format
OTHER_FP8_DECODE = ("cuda-fp8",)


def other_fp8_decoders(device, dtype, block_size: int, head_dim: int, cache_dtype,
                       names=OTHER_FP8_DECODE) -> list[str]:
    """The backends of ``names`` (Triton aside: it is always timed) that run on ``device``
    and take this decode."""
    backends = registered_backends()
    return [name for name in names if name != "triton"
            if (b := backends.get(name)) is not None and backend_available(b)
            and b.is_kernel_on(device)
            and b.supports("decode", device, dtype, block_size, head_dim, cache_dtype)]


def cache_dtypes(block_size: int, dtype) -> list:
    """The caches timed at ``block_size``: ``dtype``, e4m3, and e5m2 at the default block."""
    return [dtype, E4M3] + ([E5M2] if block_size == defaults.BLOCK_SIZE else [])


def check_triton_takes(shape_name: str, shape, block_sizes, dtype, device) -> None:
    """ValueError naming ``shape`` unless Triton's decode and prefill declare that they take
    it at every block size (e.g. head dims up to 256): before the first point is timed."""
    triton, device = get_backend("triton"), torch.device(device)
    for op in ("decode", "prefill"):
        for block_size in block_sizes:
            if not triton.supports(op, device, dtype, block_size, shape[2]):
                raise ValueError(
                    f"shape: Triton's {op} does not take {shape_name} (head dim {shape[2]}) "
                    f"at block size {block_size}, {dtype_name(dtype)} on {device.type}; it "
                    f"takes head dims {triton.head_dims}")


def run_fp8_sweep(device: str = "cpu", *, shape=None, points=None, block_sizes=None,
                  prefill_points=None, dtype=torch.bfloat16, repeat: int | None = None,
                  copy_gbps: float | None = None, progress=None, backends=None,
                  one_scale: bool = False) -> list[dict]:
    """Rows of ``kernels_fp8``: decode at ``points`` x ``block_sizes`` and prefill at
    ``prefill_points`` (batch, query_len, cached), each with a ``dtype`` cache and fp8 ones.
    ``shape`` is (name, (num_q_heads, num_kv_heads, head_dim)). Defaults: the H200 grid on
    CUDA (``DECODE_POINTS`` ...), the CPU one elsewhere (``CPU_DECODE_POINTS`` ...); ``repeat``
    20 on CUDA, 1 on a CPU. ``progress`` is called with each row. ``backends``: the fp8
    decode kernels timed beside Triton's (default ``OTHER_FP8_DECODE``, where they run);
    ``one_scale``: quantise every head with one scale (``kernel_cases.quantized_inputs``), which
    kernels taking one scale per cache need (FlashInfer)."""
    from pagebench.kernels import triton_decode, triton_prefill

    on_cuda = torch.device(device).type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        raise ValueError("device: CUDA requested but torch.cuda.is_available() is False")
    shape_name, shape = shape or (SHAPE if on_cuda else CPU_SHAPE)
    points = points or (DECODE_POINTS if on_cuda else CPU_DECODE_POINTS)
    block_sizes = block_sizes or (BLOCK_SIZES if on_cuda else CPU_BLOCK_SIZES)
    if prefill_points is None:
        prefill_points = PREFILL_POINTS if on_cuda else CPU_PREFILL_POINTS
    repeat = repeat or (20 if on_cuda else 1)
    if copy_gbps is None:
        copy_gbps = measure_copy_gbps(device) if on_cuda else float("nan")
    check_triton_takes(shape_name, shape, block_sizes, dtype, device)
    scale = shape[2] ** -0.5
    env = environment(device)

    def timed(fn) -> float:
        # the warm-up calls compile the kernel outside the timed (and captured) calls
        return measure(fn, device=device, warmup=3 if on_cuda else 1, repeat=repeat,
                       cuda_graph=on_cuda).median_us

    def make_row(point, case, cache_dtype, fields) -> dict:
        return KERNELS_FP8.row(**env, model_shape=shape_name, num_q_heads=shape[0],
                               num_kv_heads=shape[1], head_dim=shape[2], **fields)

    def on_cache(case, cache_dtype):
        """``case`` with its cache in ``cache_dtype``: itself, or quantised (per-head scales)."""
        return case if cache_dtype == dtype else quantized_inputs(
            case, cache_dtype, spread=1.0, one_scale=one_scale)

    def decode_case(point):
        """The point's ``dtype`` inputs and Triton's output on them (what fp8 is compared to)."""
        batch, context, block_size = point
        case = paged_case(batch, context, shape, block_size, dtype, device, seed=batch)
        check_decode(*case.args(), scale)
        return case, triton_decode.triton_paged_decode(*case.args(), scale)

    def time_decode(point, case_base, cache_dtype):
        """The fields of a row per kernel and launch timed on a ``cache_dtype`` cache."""
        batch, context, block_size = point
        case, base = case_base
        inputs = on_cache(case, cache_dtype)
        exact = None if cache_dtype == dtype else dequantised_output(
            torch_paged_decode, inputs, scale)  # once for every kernel timed on it
        # (backend, launch, call): Triton's default and other launches, then the
        # other fp8 kernels
        calls = [("triton", "default", {})]
        if cache_dtype == E4M3 and block_size == defaults.BLOCK_SIZE:
            calls += [("triton", launch, o) for launch, o in FP8_LAUNCHES.items()]
        if cache_dtype != dtype:
            calls += [(name, "default", None) for name in other_fp8_decoders(
                device, dtype, block_size, shape[2], cache_dtype,
                OTHER_FP8_DECODE if backends is None else backends)]
        for backend, launch, options in calls:
            if backend == "triton":
                fields = triton_decode.DecodeLaunch(**options)

                def call(inputs=inputs, fields=fields):
                    return triton_decode.triton_paged_decode(
                        *inputs.args(), scale, **inputs.scales(), launch=fields)
            else:  # as the decode sweep times a backend
                call = get_backend(backend).prepared_call(
                    "decode", *inputs.args(), scale, **inputs.scales())
            errors = {} if exact is None else fp8_errors(call(), base, exact)
            t = timed(call)
            nbytes = kv_bytes(batch, context, shape[1], shape[2], cache_dtype)
            gbps = nbytes / t / 1e3
            yield dict(op="decode", cache_dtype=dtype_name(cache_dtype), batch=batch,
                       context=context, block_size=block_size, backend=backend,
                       launch=launch, time_us=t, kv_bytes=nbytes, gbps=gbps,
                       copy_gbps=copy_gbps, copy_fraction=gbps / copy_gbps, **errors)

    def prefill_case_and_base(point):
        batch, query_len, cached = point
        case = prefill_case(batch, query_len, cached, shape, defaults.BLOCK_SIZE, dtype, device,
                            seed=query_len)
        check_prefill(*case.args(), scale)
        return case, triton_prefill.triton_paged_prefill(*case.args(), scale)

    def time_prefill(point, case_base, cache_dtype):
        batch, query_len, cached = point
        case, base = case_base
        inputs = on_cache(case, cache_dtype)

        def call(inputs=inputs):
            return triton_prefill.triton_paged_prefill(*inputs.args(), scale, **inputs.scales())
        errors = {} if cache_dtype == dtype else fp8_errors(
            call(), base, dequantised_output(torch_paged_prefill, inputs, scale))
        yield dict(op="prefill", cache_dtype=dtype_name(cache_dtype), backend="triton",
                   batch=batch, query_len=query_len, cached=cached, context=query_len + cached,
                   block_size=defaults.BLOCK_SIZE, time_us=timed(call), **errors)

    release = torch.cuda.empty_cache if on_cuda else None
    decode_points = [(b, c, bs) for b, c in points for bs in block_sizes]
    rows = run_sweep(decode_points, lambda p: cache_dtypes(p[2], dtype), decode_case, time_decode,
                     make_row, progress=progress, release=release)
    rows += run_sweep(prefill_points, lambda p: [dtype, E4M3], prefill_case_and_base,
                      time_prefill, make_row, progress=progress, release=release)
    return rows


def dequantised_output(reference, inputs, scale) -> torch.Tensor:
    """``reference`` (the torch backend) on fp8 ``inputs`` in float32: what an fp8 kernel
    computes exactly, on the dequantised cache."""
    return reference(inputs.q.float(), *inputs.args()[1:], scale, **inputs.scales())


def fp8_errors(out, base, exact) -> dict:
    """An fp8 output's relative error against the unquantised cache's output ``base`` and
    against ``exact`` (``dequantised_output``)."""
    return dict(err_vs_dequantised=relative_error(out, exact),
                err_vs_bf16_cache=relative_error(out, base))
