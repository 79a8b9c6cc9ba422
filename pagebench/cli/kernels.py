"""`pagebench bench`: time paged vs contiguous decode (or prefill) kernels."""

from __future__ import annotations

import argparse
import functools
import math
import sys

from pagebench import defaults
from pagebench.cli.options import (
    MAX_INT, add_output_options, check_device_memory, check_output_file, dumps, every_column,
    format_table,
    int_list, integer, progress, write_results)

DECODE_TABLE = [("model_shape", "shape", 0), ("batch", "batch", 0),
                ("context", "context (tokens)", 0), ("block_size", "block (tokens)", 0),
                ("backend", "backend", 0), ("cuda_graphs", "CUDA graph", 0),
                ("time_us", "time (us)", 1), ("gbps", "K/V read (GB/s)", 1)]
PREFILL_TABLE = [("model_shape", "shape", 0), ("batch", "batch", 0),
                 ("query_len", "query (tokens)", 0), ("cached", "cached (tokens)", 0),
                 ("block_size", "block (tokens)", 0), ("backend", "backend", 0),
                 ("cuda_graphs", "CUDA graph", 0), ("time_us", "time (us)", 1),
                 ("tflops", "TFLOP/s", 2)]
TUNE_TABLE = [("model_shape", "shape", 0), ("batch", "batch", 0), ("context", "context", 0),
              ("query_len", "query", 0), ("cached", "cached", 0), ("backend", "backend", 0),
              ("rows", "rows", 0, "query rows per program of the launch"), ("tile_n", "tile", 0), ("num_warps", "warps", 0),
              ("num_stages", "stages", 0), ("one_loop", "one walk", 0),
              ("table_ahead", "ids ahead", 0), ("maxnreg", "max regs", 0),
              ("lazy_rescale", "lazy rescale", 0),
              ("chosen", "chosen", 0), ("num_splits", "splits", 0), ("time_us", "time (us)", 1)]
FP8_TABLE = [("op", "op", 0), ("cache_dtype", "cache", 0), ("batch", "batch", 0),
             ("context", "context", 0), ("query_len", "query", 0), ("cached", "cached", 0),
             ("block_size", "block", 0),
             ("launch", "launch", 0), ("time_us", "time (us)", 1),
             ("copy_fraction", "of copy", 2), ("err_vs_bf16_cache", "err vs bf16", 4),
             ("err_vs_dequantised", "err vs dequantised", 4)]
LAYOUT_COLUMNS = [("table_layout", "table layout", 0), ("fits_l2", "fits L2", 0)]
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# columns of the tuning grids that count something (the datasets' own int columns are added)
TUNE_INT_COLUMNS = {"rows", "tile_n", "num_warps", "num_stages", "maxnreg", "num_splits",
                    "table_ahead", "rank"}


def register(sub) -> None:
    p = sub.add_parser(
        "bench", help="time paged vs contiguous decode kernels (tidy CSV/JSON)",
        description="Time every registered decode backend (paged and contiguous) over batch, "
        "context and block size. Default on CPU: a quick sweep (torch-paged vs sdpa-contiguous, "
        "small sizes, < 1 min). On CUDA: the full grid unless --quick. Under `torchrun "
        "--nproc-per-node N` the sweep's points are split over N GPUs (one per rank) and rank 0 "
        "writes the merged rows, each naming its rank and GPU.")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where to time (default cpu)")
    p.add_argument("--quick", action="store_true", help="small grid (default on CPU)")
    p.add_argument("--shape", action="append", metavar="NAME=HQ/HKV/D",
                   help="attention shape, e.g. llama-3-8b=32/8/128 (repeatable; default: the "
                   "Llama-3-8B and Qwen2.5-0.5B shapes)")
    p.add_argument("--batches", type=int_list, help="with --contexts: the grid's batch sizes")
    p.add_argument("--contexts", type=int_list, help="context lengths in tokens (with --batches)")
    p.add_argument("--points", type=point_list, metavar="BxC,...",
                   help="decode points as BATCHxCONTEXT, e.g. 1x65536,64x4096 (instead of "
                   "--batches/--contexts, whose grid is their product)")
    p.add_argument("--block-sizes", type=int_list,
                   help="paged block sizes in tokens (default: "
                   f"{','.join(map(str, defaults.BLOCK_SIZES))}; {defaults.BLOCK_SIZE} for a "
                   "quick CUDA run and for --prefill)")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPE_BYTES),
                   help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--backends", help="comma-separated backend names, or variants such as "
                   "triton-paged (default: all that run here)")
    p.add_argument("--repeat", type=integer(1, 10_000), default=None,
                   help="timed repeats per point (default: decode 5 on CPU, 30 on CUDA; "
                   "--prefill 20 on CUDA, 5 with --quick and on CPU)")
    add_output_options(p, "timings (one row per measurement)")
    p.add_argument("--prefill", action="store_true",
                   help="time paged prefill instead (whole prompts, and chunks after a cached "
                   "prefix) against causal SDPA on a contiguous cache; one block size")
    p.add_argument("--kv-dtype", default=None,
                   help="paged caches' dtype, e.g. fp8_e4m3 or fp8_e5m2 (per-head scales; only "
                   "backends that read it are timed paged; baselines stay in --dtype); "
                   "default --dtype")
    p.add_argument("--layouts", default="shuffled",
                   help="block-table layouts of the paged cases, comma-separated: contiguous "
                   "(arange tables), shuffled (a random permutation of the pool), aged (tables "
                   "of a block manager that has served a trace with churn); default %(default)s")
    p.add_argument("--lengths", action="append", metavar="SPEC",
                   help="decode: the batches' lengths, repeatable, each a sweep axis value: "
                   "uniform (every sequence CONTEXT tokens), lognormal:MU,SIGMA or trace:NAME "
                   "(azure-conv, azure-code, mooncake-conv), rescaled to mean CONTEXT; "
                   "default uniform")
    p.add_argument("--cuda-graphs", choices=["both", "only", "off"], default="both",
                   help="CUDA: time the calls that can be captured eagerly and replayed from a "
                   "CUDA graph (both), from a graph alone (only; on the CPU, with a warning, "
                   "eagerly) or eagerly alone (off); default %(default)s")
    p.add_argument("--fp8", action="store_true",
                   help="Triton decode and prefill with a --dtype (default bfloat16) cache and "
                   "fp8 ones (e4m3; e5m2 at block 16) on the same inputs: time, fraction of "
                   "the copy bandwidth, and the fp8 output's error against the --dtype cache's "
                   "and against float32 on the dequantised cache, over its own grid "
                   "(pagebench.measure.fp8_sweep; the H200 grid on CUDA, a tiny one on a CPU; "
                   "--shape, --points, --block-sizes and --repeat override it)")
    p.add_argument("--kv-scales", choices=["head", "one"], default="head",
                   help="fp8 caches (--kv-dtype, --fp8): a scale per KV head (default), or one "
                   "for every head (the largest), which FlashInfer's fp8 kernels need")
    p.add_argument("--tune", action="store_true",
                   help="CUDA: time the Triton kernel's launch grid (tile, warps, stages, KV "
                   "splits; with --prefill: rows, tile, warps) through CUDA graphs instead of "
                   "the sweep (pagebench.measure.launch_tuning)")
    p.add_argument("--list-backends", action="store_true",
                   help="print available backends and their capabilities as JSON, then exit "
                   "(not with --out)")
    p.table_columns = every_column(DECODE_TABLE, PREFILL_TABLE, FP8_TABLE, TUNE_TABLE,
                                   LAYOUT_COLUMNS)
    p.set_defaults(func=run_bench)


def point_list(text: str) -> list[tuple[int, int]]:
    """argparse type for ``--points 1x65536,64x4096``: (batch, context) pairs in 1..MAX_INT."""
    try:
        points = [tuple(int(v) for v in p.lower().split("x")) for p in str(text).split(",")
                  if p.strip()]
    except ValueError:
        points = []
    if not points or any(len(p) != 2 or not 1 <= min(p) <= max(p) <= MAX_INT for p in points):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated BATCHxCONTEXT pairs, e.g. 1x65536,64x4096, got {text!r}")
    return points


def _parse_shape(text: str) -> tuple[str, tuple[int, int, int]]:
    try:
        name, dims = text.split("=", 1)
        hq, hkv, d = (int(x) for x in dims.split("/"))
    except ValueError:
        raise ValueError(f"--shape: expected NAME=HQ/HKV/D, got {text!r}") from None
    if min(hq, hkv, d) < 1 or hq % hkv or max(hq, d) > 1024:
        raise ValueError(f"--shape: heads and head dim must be 1..1024 and HQ a multiple of "
                         f"HKV, got {text!r}")
    return name, (hq, hkv, d)


def backend_choices(available: dict) -> list[str]:
    """What ``--backends`` accepts: each available backend's name and its variants' labels
    (``triton``, ``triton-paged``, ``triton-contiguous``)."""
    out = []
    for name, caps in sorted(available.items()):
        ops = caps["operations"]
        out += [name] + [f"{name}-{layout}" for op, layout in (("contiguous", "contiguous"),
                                                               ("decode", "paged")) if op in ops]
    return out


def sweep_bytes(shapes, points, block_sizes, dtype: str) -> int:
    """Largest memory one point of the decode sweep holds: a paged K/V cache rounded up to whole
    blocks, plus the contiguous copy that the gather-then-attend backend makes of it."""
    worst = 0
    for _, kv_heads, head_dim in shapes.values():
        for batch, context in points:
            for bs in block_sizes:
                slots = batch * math.ceil(context / bs) * bs
                worst = max(worst, 2 * (slots + batch * context) * kv_heads * head_dim)
    return worst * DTYPE_BYTES[dtype]


def _check_sweep_memory(args, shapes, points, quick: bool, dtype: str) -> None:
    from pagebench.measure import kernel_sweep

    if not (points or args.block_sizes):
        return  # the built-in grids are sized for the device
    on_cpu = args.device == "cpu"
    shapes = shapes or defaults.SHAPES
    points = points or (kernel_sweep.CPU_QUICK_POINTS if on_cpu else
                        kernel_sweep.QUICK_POINTS if quick else kernel_sweep.FULL_POINTS)
    block_sizes = args.block_sizes or defaults.BLOCK_SIZES
    check_device_memory("--contexts" if args.contexts else "--block-sizes",
                        sweep_bytes(shapes, points, block_sizes, dtype),
                        "the largest point of this sweep", args.device)


def run_bench(args) -> int:
    import json

    import pandas as pd
    import torch

    from pagebench.measure.distributed import SweepRanks
    from pagebench.kernels import available_backends
    from pagebench.kernels.quant import kv_dtype_from_name
    from pagebench.measure.kernel_cases import TABLE_LAYOUTS

    if args.list_backends:
        if args.out is not None:
            raise ValueError("--out: not with --list-backends (it prints the backends as JSON "
                             "and writes nothing)")
        print(json.dumps(available_backends(), indent=2))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda requested but no CUDA device is available")
    if args.device == "cpu" and args.cuda_graphs == "only":
        # not refused: a runbook's CPU dry run (DEVICE=cpu) passes its GPU options as they are
        print("pagebench bench: warning: --cuda-graphs only: the CPU has no CUDA graphs; every "
              "call is timed eagerly (its rows say cuda_graphs false)", file=sys.stderr)
    check_output_file("--out", args.out)
    shapes = dict(_parse_shape(s) for s in args.shape) if args.shape else None
    points = args.points
    if args.batches or args.contexts:
        if not (args.batches and args.contexts) or args.points:
            raise ValueError("--batches/--contexts: give both (the grid is their product), "
                             "and not with --points")
        points = [(b, c) for b in args.batches for c in args.contexts]
    include = None
    if args.backends:
        include = [b.strip() for b in args.backends.split(",") if b.strip()]
        known = backend_choices(available_backends())
        unknown = sorted(set(include) - set(known))
        if unknown or not include:
            raise ValueError(f"--backends: not available here: {unknown or args.backends!r} "
                             f"(available: {', '.join(known)})")
    from pagebench.kernels.ragged import check_lengths_spec

    lengths = [check_lengths_spec(spec) for spec in args.lengths or ["uniform"]]
    if lengths != ["uniform"] and (args.fp8 or args.tune or args.prefill):
        raise ValueError("--lengths: applies to the decode sweep, not --fp8, --tune or "
                         "--prefill")
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    unknown = sorted(set(layouts) - set(TABLE_LAYOUTS))
    if unknown or not layouts:
        raise ValueError(f"--layouts: unknown {unknown or args.layouts!r} "
                         f"(use {', '.join(TABLE_LAYOUTS)})")
    quick = args.quick or args.device == "cpu"
    dtype_name = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    kv_dtype = kv_dtype_from_name(args.kv_dtype, dtype, "--kv-dtype") if args.kv_dtype else None
    skipped: list = []
    ranks = SweepRanks(args.device)
    if args.fp8:
        from pagebench.measure.fp8_sweep import run_fp8_sweep

        if args.tune or args.prefill or args.kv_dtype \
                or layouts != ["shuffled"] or args.cuda_graphs != "both" or ranks.world > 1:
            raise ValueError("--fp8: times Triton decode and prefill with every cache dtype "
                             "over its own grid, on one GPU; give at most --device, --dtype, "
                             "one --shape, --points (or --batches/--contexts), --block-sizes, "
                             "--backends (the fp8 decoders beside Triton), --kv-scales "
                             "and --repeat")
        if shapes and len(shapes) > 1:
            raise ValueError("--shape: --fp8 times one attention shape")
        with progress(None, "fp8 points") as bar:
            rows = run_fp8_sweep(args.device, shape=next(iter(shapes.items())) if shapes else None,
                                 points=points, block_sizes=args.block_sizes,
                                 dtype=getattr(torch, args.dtype or "bfloat16"),
                                 repeat=args.repeat, progress=lambda row: bar.update(),
                                 backends=None if include is None else [
                                     b.removesuffix("-paged") for b in include],
                                 one_scale=args.kv_scales == "one")
        df = pd.DataFrame(rows)
        table = FP8_TABLE
    elif args.tune:
        from pagebench.measure import launch_tuning

        if args.device != "cuda" or shapes or points or args.block_sizes or args.backends \
                or args.kv_dtype or layouts != ["shuffled"] or args.cuda_graphs != "both":
            raise ValueError("--tune: CUDA only, over its own grid (pagebench.measure.launch_tuning): "
                             "give --device cuda and at most --prefill and --repeat")
        grid = launch_tuning.prefill_launch_grid if args.prefill else launch_tuning.decode_launch_grid
        df = pd.DataFrame(grid(args.device, **({"repeat": args.repeat} if args.repeat else {}),
                               skipped=skipped))
        table = [column for column in TUNE_TABLE if column[0] in df.columns]
    elif args.prefill:
        from pagebench.measure.prefill_sweep import run_prefill_sweep

        if layouts != ["shuffled"]:
            raise ValueError("--layouts: applies to the decode sweep, not --prefill")
        if points or (args.block_sizes and len(args.block_sizes) > 1):
            raise ValueError("--prefill: its points are fixed (batch, query_len, cached); "
                             "give no --points or --batches/--contexts and at most one "
                             "--block-sizes")
        block_size = args.block_sizes[0] if args.block_sizes else defaults.BLOCK_SIZE
        if block_size > 16384:
            raise ValueError(f"--block-sizes: at most 16,384 tokens for --prefill, got "
                             f"{block_size:,}")
        with progress(None, "prefill points") as bar:
            df = run_prefill_sweep(args.device, quick=quick, shapes=shapes,
                                   block_size=block_size, dtype=dtype, include=include,
                                   repeat=args.repeat, progress=lambda row: bar.update(),
                                   share=ranks.share, kv_dtype=kv_dtype,
                                   cuda_graphs=args.cuda_graphs,
                                   one_scale=args.kv_scales == "one")
        table = PREFILL_TABLE + ([("kv_dtype", "KV dtype", 0)] if args.kv_dtype else [])
    else:
        from pagebench.measure.kernel_sweep import run_sweep

        _check_sweep_memory(args, shapes, points, quick, dtype_name)
        with progress(None, "decode points") as bar:
            df = run_sweep(args.device, quick=quick, shapes=shapes, points=points,
                           block_sizes=args.block_sizes, dtype=dtype, include=include,
                           exclude=None if include is None else (), repeat=args.repeat,
                           skipped=skipped, progress=lambda row: bar.update(),
                           share=ranks.share, layouts=layouts, kv_dtype=kv_dtype,
                           cuda_graphs=args.cuda_graphs, lengths=lengths,
                           one_scale=args.kv_scales == "one")
        table = DECODE_TABLE + (LAYOUT_COLUMNS if len(layouts) > 1 else []) \
            + ([("lengths", "lengths", 0)] if len(lengths) > 1 else []) \
            + ([("kv_dtype", "KV dtype", 0)] if args.kv_dtype else [])
    df, skipped = ranks.merge(df, skipped)
    if df is None:  # not rank 0: its rows went to rank 0
        return 0
    if ranks.world > 1:
        table = table + [("gpu", "GPU", 0)]
    skipped_text = [" ".join(map(str, s)) for s in skipped]
    if df.empty:
        why = "; ".join(skipped_text[:3]) or "no backend supports these options here"
        raise ValueError(f"--backends/--block-sizes: nothing was measured ({why})")
    records = [{k: tidy_value(k, v) for k, v in r.items()} for r in df.to_dict("records")]
    doc = {"rows": records, "skipped": skipped_text}
    write_results(args.out, records, doc)
    if args.json:
        print(dumps(doc))
        return 0
    print(format_table(records, table, legend=True))
    for s in skipped_text:
        print("skipped:", s)
    return 0


@functools.cache
def int_columns() -> frozenset[str]:
    """Columns of the kernel datasets that hold integers (pandas makes a column with a missing
    value, such as a contiguous row's ``block_size``, float)."""
    from pagebench.results.datasets import KERNELS, KERNELS_FP8, KERNELS_PREFILL

    return frozenset(TUNE_INT_COLUMNS | {c.name for schema in (KERNELS, KERNELS_PREFILL,
                                                                KERNELS_FP8)
                                         for c in schema.columns if c.dtype == "int"})


def tidy_value(column: str, value):
    """A row's value as written: NaN as missing, a count held as a float (16.0) as an int."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer() and column in int_columns():
            return int(value)
    return value

