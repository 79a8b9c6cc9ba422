"""`pagebench bench`: time paged vs contiguous decode (or prefill) kernels, write tidy CSV/JSON."""

from __future__ import annotations

import json
import os

from pagebench.cli import int_list


def register(sub) -> None:
    p = sub.add_parser(
        "bench", help="time paged vs contiguous decode kernels (tidy CSV/JSON)",
        description="Time every registered decode backend (paged and contiguous) over batch, "
        "context and block size. Default on CPU: a quick sweep (torch-paged vs sdpa-contiguous, "
        "small sizes, < 1 min). On CUDA: the full grid unless --quick. Under `torchrun "
        "--nproc-per-node N` the sweep's points are split over N GPUs (one per rank) and rank 0 "
        "writes the merged rows, each naming its rank and GPU.")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true", help="small grid (default on CPU)")
    p.add_argument("--shape", action="append", metavar="NAME=HQ/HKV/D",
                   help="attention shape, e.g. llama-3-8b=32/8/128 (repeatable; default: the "
                   "Llama-3-8B and Qwen2.5-0.5B shapes)")
    p.add_argument("--batches", type=int_list, help="with --contexts: the grid's batch sizes")
    p.add_argument("--contexts", type=int_list, help="context lengths (tokens)")
    p.add_argument("--block-sizes", type=int_list)
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                   help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--backends", help="comma-separated backend names (default: all that run here)")
    p.add_argument("--repeat", type=int, default=None, help="timed repeats per point")
    p.add_argument("--out", default=None, help="CSV path; a JSON with the same rows is written "
                   "beside it (default: print only)")
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
    p.add_argument("--list-backends", action="store_true",
                   help="print available backends and their capabilities, then exit")
    p.set_defaults(func=run_bench)


def _parse_shape(text: str) -> tuple[str, tuple[int, int, int]]:
    try:
        name, dims = text.split("=", 1)
        hq, hkv, d = (int(x) for x in dims.split("/"))
    except ValueError:
        raise ValueError(f"--shape: expected NAME=HQ/HKV/D, got {text!r}") from None
    if min(hq, hkv, d) < 1 or hq % hkv:
        raise ValueError(f"--shape: heads must be positive and HQ a multiple of HKV, got {text!r}")
    return name, (hq, hkv, d)


def run_bench(args) -> int:
    import torch

    from pagebench.distributed import SweepRanks
    from pagebench.kernels import available_backends
    from pagebench.kernels.prefill_sweep import run_prefill_sweep
    from pagebench.kernels.quant import kv_dtype_from_name
    from pagebench.kernels.sweep import run_sweep
    from pagebench.kernels.testing import TABLE_LAYOUTS

    if args.list_backends:
        print(json.dumps(available_backends(), indent=2))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda requested but no CUDA device is available")
    if args.repeat is not None and args.repeat < 1:
        raise ValueError(f"--repeat: must be >= 1, got {args.repeat}")
    shapes = dict(_parse_shape(s) for s in args.shape) if args.shape else None
    points = None
    if args.batches or args.contexts:
        if not (args.batches and args.contexts):
            raise ValueError("--batches/--contexts: give both (the grid is their product)")
        points = [(b, c) for b in args.batches for c in args.contexts]
    include = None
    if args.backends:
        include = [b.strip() for b in args.backends.split(",") if b.strip()]
        unknown = sorted(set(include) - set(available_backends()))
        if unknown:
            raise ValueError(f"--backends: not available here: {unknown} "
                             f"(available: {sorted(available_backends())})")
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    unknown = sorted(set(layouts) - set(TABLE_LAYOUTS))
    if unknown or not layouts:
        raise ValueError(f"--layouts: unknown {unknown or args.layouts!r} "
                         f"(use {', '.join(TABLE_LAYOUTS)})")
    quick = args.quick or args.device == "cpu"
    dtype = getattr(torch, args.dtype) if args.dtype else (
        torch.bfloat16 if args.device == "cuda" else torch.float32)
    kv_dtype = kv_dtype_from_name(args.kv_dtype, dtype, "--kv-dtype") if args.kv_dtype else None
    skipped: list = []
    ranks = SweepRanks(args.device)
    if args.prefill:
        if layouts != ["shuffled"] or args.kv_dtype:
            raise ValueError("--layouts/--kv-dtype: apply to the decode sweep, not --prefill")
        if points or (args.block_sizes and len(args.block_sizes) > 1):
            raise ValueError("--prefill: its points are fixed (batch, query_len, cached); "
                             "give no --batches/--contexts and at most one --block-sizes")
        df = run_prefill_sweep(args.device, quick=quick, shapes=shapes,
                               block_size=args.block_sizes[0] if args.block_sizes else 16,
                               dtype=dtype, include=include, repeat=args.repeat,
                               share=ranks.share)
        cols = ["model_shape", "batch", "query_len", "cached", "backend", "cuda_graph", "time_us",
                "tflops"]
    else:
        df = run_sweep(args.device, quick=quick, shapes=shapes, points=points,
                       block_sizes=args.block_sizes, dtype=dtype, include=include,
                       exclude=None if include is None else (), repeat=args.repeat,
                       skipped=skipped, share=ranks.share, layouts=layouts,
                       kv_dtype=kv_dtype)
        cols = ["model_shape", "batch", "context", "block_size", "backend", "cuda_graph",
                "time_us", "gbps"] + (["table_layout", "fits_l2"] if len(layouts) > 1 else []) \
            + (["kv_dtype"] if args.kv_dtype else [])
    df, skipped = ranks.merge(df, skipped)
    if df is None:  # not rank 0: its rows went to rank 0
        return 0
    if ranks.world > 1:
        cols.append("gpu")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        df.to_csv(args.out, index=False)
        json_path = os.path.splitext(args.out)[0] + ".json"
        with open(json_path, "w") as f:
            json.dump({"rows": df.to_dict("records"),
                       "skipped": [list(map(str, s)) for s in skipped]}, f, indent=1, default=str)
        print(f"wrote {len(df)} rows to {args.out} and {json_path}")
    print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    for s in skipped:
        print("skipped:", *s)
    return 0
