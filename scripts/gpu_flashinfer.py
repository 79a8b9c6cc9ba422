"""FlashInfer beside pagebench's kernels on one GPU, in one process (scripts/gpu_flashinfer.sh).

Stages, in this order, each appending tidy rows to its CSV under OUT as it goes, so a run cut
short by its deadline keeps what it measured:

1. decode, bf16: the Llama-3-8B and Qwen2.5-7B head shapes, blocks 1/16/128, uniform and
   ragged (``--lengths``) batches, every backend on the same tensors (Triton paged, FlashInfer
   CUDA-core and tensor-core, Triton and SDPA contiguous), through CUDA graphs, L2 flushed;
2. prefill: whole prompts and chunks after a cached prefix, Triton and FlashInfer paged
   prefill against SDPA without a mask (``prefill_sweep.sdpa_causal``) and SDPA with the
   boolean mask the old baseline used;
3. fp8 e4m3 decode: Triton, ``cuda-fp8`` and FlashInfer on the same fp8 caches with one scale
   for every head (what FlashInfer takes);
4. a mixed step (k prefill chunks + m decodes in one prefill call) on every prefill backend;
5. FlashInfer's plan cost (host us per ``plan``) per decode point.

Every timed call's output is first checked against the float64 reference on up to
``CHECK_SEQS`` of its sequences (the reference is per sequence); the check goes to
``*_checks`` rows and a failed check leaves the point's timing out.
Environment: DEVICE (default cuda), DEADLINE_S (seconds from start; stages stop there),
QUICK=1 (a tiny grid: the CPU dry run), OUT (output folder), STAGES (comma-separated stage
names to run, default all: poison, decode, prefill, fp8, mixed, ragged, decode-others,
prefill-others, ragged-others; "others": the shapes after the first).
"""

from __future__ import annotations

import csv
import math
import os
import sys
import time
from pathlib import Path

import torch

from pagebench.config import dtype_name
from pagebench.defaults import attention_shape
from pagebench.kernels import registry
from pagebench.measure.kernel_cases import make_paged_inputs, relative_error
from pagebench.measure.prefill_sweep import causal_flops, sdpa_causal
from pagebench.kernels.quant import fp8_max, quantize
from pagebench.kernels.ragged import batch_lengths
from pagebench.kernels.reference import cumulative_offsets, reference_prefill
from pagebench.measure.kernel_sweep import read_gbps
from pagebench.measure.timing import environment, measure

DEVICE = os.environ.get("DEVICE", "cuda")
ON_CUDA = DEVICE == "cuda"
QUICK = os.environ.get("QUICK") == "1" or not ON_CUDA
START = time.monotonic()
DEADLINE_S = float(os.environ.get("DEADLINE_S", "1e9"))
OUT = Path(os.environ.get("OUT", "/tmp/gpu_flashinfer"))
CHECK_SEQS = 4
TOLERANCE = {"bfloat16": 2e-2, "float16": 2e-2, "float32": 1e-4, "float8_e4m3fn": 4e-2,
             "float8_e5m2": 8e-2}
REPEAT = 5 if QUICK else 30

if QUICK:
    SHAPES = {"tiny": (4, 2, 64)}
    BLOCKS = (1, 16)
    DECODE_POINTS = [(1, 64), (3, 40)]
    LENGTHS = ("uniform", "lognormal:0,0.8")
    PREFILL_POINTS = [(1, 32, 0), (2, 16, 20)]
    MIXED = [(2, 16, 1, 40)]  # chunks, chunk tokens, decodes, context
    DTYPE = torch.float32 if not ON_CUDA else torch.bfloat16
else:
    SHAPES = {name: attention_shape(name) for name in ("llama-3-8b", "qwen2.5-7b")}
    BLOCKS = (1, 16, 128)
    DECODE_POINTS = [(1, 1024), (1, 4096), (1, 16384), (1, 65536), (8, 4096), (32, 4096),
                     (64, 4096), (128, 4096), (256, 4096), (32, 16384)]
    LENGTHS = ("uniform", "lognormal:0,0.8", "trace:azure-conv")
    PREFILL_POINTS = [(1, 2048, 0), (1, 8192, 0), (8, 1024, 0), (32, 512, 0), (128, 128, 0),
                      (1, 512, 3584), (1, 512, 15872), (8, 512, 3584), (16, 64, 1024)]
    MIXED = [(2, 512, 64, 2048), (2, 512, 64, 8192)]
    DTYPE = torch.bfloat16

PAGED_DECODE = ("triton", "flashinfer", "flashinfer-tc")
FP8_DECODE = ("triton", "cuda-fp8", "flashinfer", "flashinfer-tc")
PREFILL = ("triton", "flashinfer")
CONTIGUOUS = ("sdpa", "triton")


def left_s() -> float:
    return DEADLINE_S - (time.monotonic() - START)


class Sink:
    """Rows of OUT/<name>.csv, the file rewritten on every row (a run cut short keeps all it
    measured; the columns are the union of the rows')."""

    def __init__(self, name: str):
        self.path = OUT / f"{name}.csv"
        self.rows: list[dict] = []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        columns = list(dict.fromkeys(k for r in self.rows for k in r))
        with self.path.open("w", newline="") as f:
            w = csv.DictWriter(f, columns)
            w.writeheader()
            w.writerows(self.rows)


def available(name: str, op: str, cache_dtype=None, block_size=None, head_dim=None) -> bool:
    b = registry.registered_backends().get(name)
    return (b is not None and registry.backend_available(b)
            and b.supports(op, DEVICE, DTYPE, block_size, head_dim, cache_dtype))


def short(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def check(out, inp, scale, n: int) -> float:
    """Relative error of ``out``'s first ``n`` sequences against the float64 reference, which
    reads only their blocks (copied out of the cache first: the whole cache in float64 on the
    host would not fit)."""
    starts = inp.query_start_loc
    starts = torch.arange(n + 1) if starts is None else starts[:n + 1].cpu()
    rows = int(starts[-1])
    block_size = inp.k_cache.shape[1]
    width = max(math.ceil(int(x) / block_size) for x in inp.seq_lens[:n])
    ids = inp.block_tables[:n, :width].long().clamp(0, inp.k_cache.shape[0] - 1).flatten()
    tables = torch.arange(ids.numel(), dtype=torch.int32).view(n, width)
    ref = reference_prefill(inp.q[:rows], inp.k_cache[ids], inp.v_cache[ids], tables,
                            inp.seq_lens[:n].cpu(), starts, scale,
                            k_scale=inp.k_scale, v_scale=inp.v_scale)
    return relative_error(out[:rows], ref)


def timed(fn, graph: bool = True):
    return measure(fn, device=DEVICE, warmup=2, repeat=REPEAT, cuda_graph=graph and ON_CUDA)


def checked_timing(point: dict, make_call, error_of, tolerance: float, checks: Sink,
                   graph: bool = True):
    """``make_call()``'s call, checked first (``error_of(its output)`` below ``tolerance``; a
    row of ``checks`` either way), then timed; None where it failed or raised."""
    try:
        fn = make_call()
        err = error_of(fn())
    except Exception as e:  # noqa: BLE001 -- recorded, the sweep goes on
        checks.add(dict(point, ok=False, rel_err=None, error=short(e)))
        return None
    ok = err < tolerance
    checks.add(dict(point, ok=ok, rel_err=err, tolerance=tolerance))
    return timed(fn, graph) if ok else None


def timing_fields(t) -> dict:
    return dict(time_us=t.median_us, q20_us=t.q20_us, q80_us=t.q80_us)


def per_tensor_fp8(inp, cache_dtype):
    """``inp``'s caches in fp8 with one scale for every head (K's and V's own)."""
    import dataclasses

    out = {}
    for name in ("k", "v"):
        cache = getattr(inp, f"{name}_cache").float()
        # the largest finite magnitude: a poisoned (NaN) slot must not make the scale NaN
        amax = torch.where(cache.isfinite(), cache.abs(), 0).amax().clamp_min(1e-6)
        s = (amax / fp8_max(cache_dtype)).expand(cache.shape[2]).contiguous()
        out[f"{name}_cache"] = quantize(cache, s, cache_dtype)
        out[f"{name}_scale"] = s.float()
    return dataclasses.replace(inp, **out)


def decode_stage(env, rows: Sink, checks: Sink, plans: Sink, ceiling: float, shapes,
                 lengths, kv_dtype=None) -> None:
    backends = FP8_DECODE if kv_dtype is not None else PAGED_DECODE
    for shape_name in shapes:
        hq, hkv, d = shape = SHAPES[shape_name]
        scale = d ** -0.5
        for lengths_spec in lengths:
            for batch, context in DECODE_POINTS:
                if kv_dtype is not None and (batch, context) not in DECODE_POINTS[-4:]:
                    continue
                if batch == 1 and lengths_spec != "uniform":
                    continue
                if left_s() < 20:
                    return
                lens = batch_lengths(lengths_spec, batch, context, seed=batch)
                base = dict(env, dtype=dtype_name(DTYPE), model_shape=shape_name,
                            num_q_heads=hq, num_kv_heads=hkv, head_dim=d, batch=batch,
                            context=context, lengths=lengths_spec, read_gbps=ceiling)
                kv_bytes_bf16 = 2 * sum(lens) * hkv * d * 2
                if kv_dtype is None:
                    contiguous_rows(base, shape, lens, scale, rows, checks, kv_bytes_bf16)
                for block_size in BLOCKS:
                    inp = make_paged_inputs(lens, hq, hkv, d, block_size, DTYPE, DEVICE,
                                            seed=batch, extra_blocks=0, extra_table_cols=0,
                                            poison=False)
                    if kv_dtype is not None:
                        inp = per_tensor_fp8(inp, kv_dtype)
                    cache_dtype = kv_dtype or DTYPE
                    nbytes = kv_bytes_bf16 * inp.k_cache.element_size() // 2
                    for name in backends:
                        if not available(name, "decode", cache_dtype, block_size, d):
                            continue
                        label = f"{name}-paged"
                        point = dict(base, block_size=block_size, backend=label, kernel=name,
                                     layout="paged", kv_dtype=dtype_name(cache_dtype))
                        t = checked_timing(
                            point, lambda name=name, inp=inp: registry.get_backend(
                                name).prepared_call("decode", *inp.args(), scale, **inp.scales()),
                            lambda out, inp=inp: check(out, inp, scale, min(batch, CHECK_SEQS)),
                            TOLERANCE[dtype_name(cache_dtype)], checks)
                        if t is None:
                            continue
                        rows.add(dict(point, cuda_graphs=ON_CUDA, **timing_fields(t),
                                      kv_bytes=nbytes, gbps=nbytes / t.median_us / 1e3))
                        if name.startswith("flashinfer") and kv_dtype is None:
                            plan_row(point, inp, scale, name.endswith("-tc"), plans)
                    del inp
                if ON_CUDA:
                    torch.cuda.empty_cache()


def contiguous_rows(base, shape, lens, scale, rows: Sink, checks: Sink, nbytes: int) -> None:
    """The contiguous baselines at a decode point (a ragged batch: padded to its longest)."""
    from pagebench.measure.kernel_cases import ContiguousInputs
    from pagebench.kernels.reference import reference_contiguous

    hq, hkv, d = shape
    batch, max_len = len(lens), max(lens)
    if ON_CUDA and 4 * batch * max_len * hkv * d * 2 > 0.5 * torch.cuda.mem_get_info()[0]:
        return
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    k = torch.randn(batch, max_len, hkv, d, device=DEVICE, dtype=DTYPE, generator=gen)
    v = torch.randn_like(k)
    q = torch.randn(batch, hq, d, device=DEVICE, dtype=DTYPE, generator=gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    inp = ContiguousInputs(q, k, v, seq_lens)
    uniform = len(set(lens)) == 1
    n = min(batch, CHECK_SEQS)
    ref = reference_contiguous(q[:n], k[:n], v[:n], seq_lens[:n], scale)
    for name in CONTIGUOUS:
        if not available(name, "contiguous", head_dim=d):
            continue
        point = dict(base, block_size=None, backend=f"{name}-contiguous", kernel=name,
                     layout="contiguous", kv_dtype=dtype_name(DTYPE))
        t = checked_timing(
            point, lambda name=name: registry.get_backend(name).prepared_call(
                "contiguous", *inp.args()[:3], None if uniform else seq_lens, scale),
            lambda out: relative_error(out[:n], ref), TOLERANCE[dtype_name(DTYPE)], checks)
        if t is not None:
            rows.add(dict(point, cuda_graphs=ON_CUDA, **timing_fields(t), kv_bytes=nbytes,
                          gbps=nbytes / t.median_us / 1e3))


def plan_row(point, inp, scale, tensor_cores: bool, plans: Sink) -> None:
    """FlashInfer's host cost per plan at this point: a new wrapper's first plan (``plan_us``),
    and the layout converted and planned again on it (``replan_us``: a serving step's cost)."""
    from pagebench.kernels import flashinfer as fi

    hq, d = inp.q.shape[1], inp.q.shape[2]
    samples = []
    for _ in range(5 if QUICK else 10):
        t0 = time.perf_counter()
        plan = fi.plan_decode(inp.block_tables, inp.seq_lens, None, None,
                              tensor_cores=tensor_cores, num_q_heads=hq,
                              num_kv_heads=inp.k_cache.shape[2], head_dim=d,
                              block_size=inp.k_cache.shape[1], q_dtype=inp.q.dtype,
                              kv_dtype=inp.k_cache.dtype, scale=scale)
        samples.append((time.perf_counter() - t0) * 1e6)
    replans = []
    for _ in range(5 if QUICK else 10):
        t0 = time.perf_counter()
        plan.replan()
        replans.append((time.perf_counter() - t0) * 1e6)
    plans.add(dict(point, plan_us=sorted(samples)[len(samples) // 2],
                   replan_us=sorted(replans)[len(replans) // 2]))


def prefill_point_rows(env, shape_name, shape, batch, query_lens, seq_lens, rows, checks,
                       label_extra: dict) -> None:
    """Every prefill backend on one batch (query_lens/seq_lens per sequence), bf16, block 16."""
    hq, hkv, d = shape
    scale = d ** -0.5
    inp = make_paged_inputs(seq_lens, hq, hkv, d, 16, DTYPE, DEVICE, seed=3, extra_blocks=0,
                            extra_table_cols=0, poison=False)
    gen = torch.Generator(device=DEVICE).manual_seed(4)
    import dataclasses

    inp = dataclasses.replace(
        inp, q=torch.randn(sum(query_lens), hq, d, device=DEVICE, dtype=DTYPE, generator=gen),
        query_start_loc=cumulative_offsets(query_lens, DEVICE))
    flops = sum(causal_flops(1, ql, n - ql, hq, d) for ql, n in zip(query_lens, seq_lens))
    base = dict(env, dtype=dtype_name(DTYPE), model_shape=shape_name, num_q_heads=hq,
                num_kv_heads=hkv, head_dim=d, batch=len(query_lens), **label_extra)
    for name in PREFILL:
        if not available(name, "prefill", DTYPE, 16, d):
            continue
        point = dict(base, block_size=16, backend=f"{name}-paged", kernel=name, layout="paged",
                     kv_dtype=dtype_name(DTYPE))
        graph = "prefill" in registry.get_backend(name).graph_capturable
        t = checked_timing(
            point, lambda name=name: registry.get_backend(name).prepared_call(
                "prefill", *inp.args(), scale),
            lambda out: check(out, inp, scale, min(len(query_lens), CHECK_SEQS)),
            TOLERANCE[dtype_name(DTYPE)], checks, graph)
        if t is not None:
            rows.add(dict(point, cuda_graphs=graph and ON_CUDA, **timing_fields(t),
                          tflops=flops / t.median_us / 1e6))
    return flops


def prefill_stage(env, rows: Sink, checks: Sink, shapes) -> None:
    for shape_name in shapes:
        hq, hkv, d = shape = SHAPES[shape_name]
        for batch, query_len, cached in PREFILL_POINTS:
            if left_s() < 20:
                return
            extra = dict(query_len=query_len, cached=cached, lengths="uniform")
            flops = prefill_point_rows(env, shape_name, shape, batch, [query_len] * batch,
                                       [cached + query_len] * batch, rows, checks, extra)
            base = dict(env, dtype=dtype_name(DTYPE), model_shape=shape_name, num_q_heads=hq,
                        num_kv_heads=hkv, head_dim=d, batch=batch, block_size=None,
                        layout="contiguous", kernel=None, kv_dtype=dtype_name(DTYPE), **extra)
            for label, masked in (("sdpa-contiguous", False), ("sdpa-masked-contiguous", True)):
                if masked and cached == 0:
                    continue
                fn = sdpa_causal(batch, query_len, cached, shape, DTYPE, DEVICE, seed=3,
                                 masked=masked)
                t = timed(fn)
                rows.add(dict(base, backend=label, cuda_graphs=ON_CUDA, **timing_fields(t),
                              tflops=flops / t.median_us / 1e6))
            if ON_CUDA:
                torch.cuda.empty_cache()


POISON_CASES = 12 if not QUICK else 4
LONGEST = 3000 if not QUICK else 40


def poison_stage(checks: Sink, prefill_checks: Sink) -> None:
    """Random small cases through the public ``paged_decode`` / ``paged_prefill`` (validation
    and the plan cache included) on every paged backend, every slot and table entry a kernel
    must not read poisoned with NaN (``make_paged_inputs``), as the property tests do:
    ragged lengths, odd block sizes, grouped heads, bf16/fp16, fp8 with one scale."""
    import random

    from pagebench.kernels import paged_decode, paged_prefill

    r = random.Random(0)
    for i in range(POISON_CASES):
        if left_s() < 20:
            return
        block_size = r.choice([1, 2, 3, 16, 17, 32, 128] if not QUICK else [1, 3, 16])
        kv_heads, group = r.choice([(1, 8), (2, 7), (8, 4), (4, 7)] if not QUICK else [(2, 2)])
        head_dim = r.choice([64, 128]) if ON_CUDA else 64
        dtype = r.choice([torch.bfloat16, torch.float16]) if ON_CUDA else torch.float32
        lens = [r.choice([1, block_size, block_size + 1, r.randint(1, LONGEST)])
                for _ in range(r.randint(1, 9))]
        fp8 = ON_CUDA and i % 4 == 3
        inp = make_paged_inputs(lens, kv_heads * group, kv_heads, head_dim, block_size, dtype,
                                DEVICE, seed=i)
        if fp8:
            inp = per_tensor_fp8(inp, torch.float8_e4m3fn)
        qlens = [r.randint(1, n) for n in lens]
        base = dict(case=i, dtype=dtype_name(dtype), block_size=block_size,
                    shape=f"{kv_heads * group}/{kv_heads}/{head_dim}", lengths=str(lens),
                    kv_dtype=dtype_name(inp.k_cache.dtype), poisoned=True)
        for op, sink, names in (("decode", checks, PAGED_DECODE), ("prefill", prefill_checks,
                                                                     PREFILL)):
            case = inp
            if op == "prefill":
                import dataclasses

                gen = torch.Generator(device=DEVICE).manual_seed(i)
                case = dataclasses.replace(
                    inp, q=torch.randn(sum(qlens), kv_heads * group, head_dim, device=DEVICE,
                                       dtype=dtype, generator=gen),
                    query_start_loc=cumulative_offsets(qlens, DEVICE))
            run = paged_decode if op == "decode" else paged_prefill
            for name in names:
                if not available(name, op, inp.k_cache.dtype, block_size, head_dim):
                    continue
                point = dict(base, backend=f"{name}-paged", kernel=name, op=op)
                tolerance = TOLERANCE[dtype_name(inp.k_cache.dtype)]
                try:
                    out = run(*case.args(), backend=name, **case.scales())
                    nan = bool(torch.isnan(out).any())
                    err = check(out, case, head_dim ** -0.5, len(lens))
                except Exception as e:  # noqa: BLE001 -- recorded
                    sink.add(dict(point, ok=False, rel_err=None, error=short(e)))
                    continue
                sink.add(dict(point, ok=err < tolerance and not nan, rel_err=err,
                              tolerance=tolerance, nan=nan))


def mixed_stage(env, rows: Sink, checks: Sink) -> None:
    """vLLM-v1-shaped steps: ``chunks`` prefill chunks (of a prompt starting at 0 cached
    tokens) and ``decodes`` decodes at ``context`` tokens, in one prefill call."""
    shape_name = next(iter(SHAPES))
    for chunks, chunk, decodes, context in MIXED:
        if left_s() < 20:
            return
        query_lens = [chunk] * chunks + [1] * decodes
        seq_lens = [chunk] * chunks + [context] * decodes
        extra = dict(query_len=chunk, cached=context,
                     lengths=f"mixed:{chunks}x{chunk}+{decodes}x1@{context}")
        prefill_point_rows(env, shape_name, SHAPES[shape_name], len(query_lens), query_lens,
                           seq_lens, rows, checks, extra)


def flashinfer_version() -> str | None:
    b = registry.registered_backends().get("flashinfer")
    if b is None or not registry.backend_available(b):
        return None
    import flashinfer

    return flashinfer.__version__


def jit_one(op: str, cache: str) -> int:
    """One small call of ``op`` (decode, decode-tc, prefill) with a ``cache`` (bf16, e4m3)
    cache: what makes FlashInfer JIT-compile that kernel (``gpu_flashinfer.sh`` runs the six
    in parallel and times each)."""
    hq, hkv, d = attention_shape("llama-3-8b")
    inp = make_paged_inputs([64, 100], hq, hkv, d, 16, torch.bfloat16, DEVICE, poison=False)
    if cache == "e4m3":
        inp = per_tensor_fp8(inp, torch.float8_e4m3fn)
    name = "flashinfer-tc" if op == "decode-tc" else "flashinfer"
    operation = "prefill" if op == "prefill" else "decode"
    if operation == "prefill":
        import dataclasses

        inp = dataclasses.replace(inp, q=inp.q.repeat(4, 1, 1)[:8],
                                  query_start_loc=cumulative_offsets([4, 4], DEVICE))
    fn = registry.get_backend(name).prepared_call(operation, *inp.args(), d ** -0.5,
                                                  **inp.scales())
    err = check(fn(), inp, d ** -0.5, 2)
    torch.cuda.synchronize()
    print(f"jit {op} {cache}: rel_err {err:.2e}", flush=True)
    return 0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "jit":
        return jit_one(sys.argv[2], sys.argv[3])
    OUT.mkdir(parents=True, exist_ok=True)
    env = dict(environment(DEVICE), flashinfer_version=flashinfer_version())
    ceiling = read_gbps(DEVICE) if ON_CUDA else float("nan")
    print(f"read-only ceiling: {ceiling:.0f} GB/s", flush=True)
    decode, decode_checks = Sink("kernels_flashinfer"), Sink("kernels_equivalence_flashinfer")
    plans = Sink("kernels_plan_flashinfer")
    prefill, prefill_checks = (Sink("kernels_prefill_flashinfer"),
                               Sink("kernels_prefill_equivalence_flashinfer"))
    fp8, fp8_checks = Sink("kernels_flashinfer_fp8"), Sink(
        "kernels_equivalence_fp8_flashinfer")
    first, *others = SHAPES
    ragged = LENGTHS[1:]
    stages = [
        ("poison", lambda: poison_stage(decode_checks, prefill_checks)),
        ("decode", lambda: decode_stage(env, decode, decode_checks, plans, ceiling, [first],
                                        ["uniform"])),
        ("prefill", lambda: prefill_stage(env, prefill, prefill_checks, [first])),
        ("fp8", lambda: decode_stage(env, fp8, fp8_checks, plans, ceiling, [first],
                                     ["uniform"], kv_dtype=torch.float8_e4m3fn)),
        ("mixed", lambda: mixed_stage(env, prefill, prefill_checks)),
        ("ragged", lambda: decode_stage(env, decode, decode_checks, plans, ceiling, [first],
                                        ragged)),
        ("decode-others", lambda: decode_stage(env, decode, decode_checks, plans, ceiling,
                                               others, ["uniform"])),
        ("prefill-others", lambda: prefill_stage(env, prefill, prefill_checks, others)),
        ("ragged-others", lambda: decode_stage(env, decode, decode_checks, plans, ceiling,
                                               others, ragged)),
    ]
    only = os.environ.get("STAGES")
    for name, run in stages:
        if only and name not in only.split(","):
            continue
        t0 = time.monotonic()
        run()
        print(f"stage {name}: {time.monotonic() - t0:.1f} s ({max(left_s(), 0):.0f} s left)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
