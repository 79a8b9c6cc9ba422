"""`pagebench engine-bench`: engine measurements on a tiny random model (or a local model)."""

from __future__ import annotations

import sys

from pagebench.cli import int_list

EXPERIMENTS = ("throughput", "cow", "prefix", "pool", "compare", "trace")


def register(sub) -> None:
    p = sub.add_parser(
        "engine-bench", help="engine tokens/s vs batch and block size, CoW, prefix caching, "
        "pool size; engine vs transformers generate",
        description="Run the reference paged engine and write tidy CSV (one row per run).")
    p.add_argument("experiment", choices=EXPERIMENTS, help="what to measure")
    p.add_argument("--model", default=None, help="local model directory (default: a tiny "
                   "random Qwen2 model, 2 layers, hidden 128)")
    p.add_argument("--preset", default=None, help="random weights in a preset's shape, e.g. "
                   "qwen2.5-0.5b (use on a GPU)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    p.add_argument("--batch-sizes", type=int_list, default="1,4,16,64", help="for throughput (default %(default)s)")
    p.add_argument("--block-sizes", type=int_list, default="8,16,32,128", help="for throughput (default %(default)s)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--kernel", default="auto", help="attention backend (default %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (default %(default)s)")
    p.add_argument("--out", default="-", help="CSV path, '-' for stdout (default)")
    t = p.add_argument_group("trace: replay a sample of a real trace (blocks of 16, prefix "
                             "caching on), engine vs simulator")
    t.add_argument("--trace", default="mooncake-conv",
                   help="azure-code, azure-conv, mooncake-conv or a file (default %(default)s)")
    t.add_argument("--num-requests", type=int, default=32, help="sample size (default %(default)s)")
    t.add_argument("--max-model-len", type=int, default=1024,
                   help="requests clipped to this many tokens (default %(default)s)")
    t.add_argument("--max-output-len", type=int, default=64,
                   help="outputs cut to this many tokens first (default %(default)s)")
    t.add_argument("--step-ms", type=float, default=20.0,
                   help="trace milliseconds per engine step (default %(default)s)")
    t.add_argument("--seed", type=int, default=0, help="sample seed (default %(default)s)")
    p.set_defaults(func=run)


def _model(args):
    import torch

    from pagebench.engine import bench
    from pagebench.engine.engine import load_model

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.model:
        return load_model(args.model, device=device)
    if args.preset:
        return bench.preset_model(args.preset, device=device,
                                  dtype=torch.bfloat16 if device != "cpu" else torch.float32)
    return bench.tiny_model(device=device)


def run(args) -> int:
    import pandas as pd

    from pagebench.engine import bench

    for name in ("prompt_len", "max_tokens", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be >= 1")
    batch_sizes, block_sizes = args.batch_sizes, args.block_sizes
    model = _model(args)
    common = dict(threads=args.threads)
    if args.experiment == "throughput":
        rows = bench.throughput_vs_batch(model, batch_sizes, block_sizes, args.prompt_len,
                                         args.max_tokens, kernel=args.kernel, **common)
    elif args.experiment == "cow":
        rows = bench.cow_comparison(model, max_tokens=args.max_tokens, **common)
    elif args.experiment == "prefix":
        rows = bench.prefix_cache_comparison(model, max_tokens=args.max_tokens, **common)
    elif args.experiment == "trace":
        from pagebench.engine.trace_replay import replay_trace

        rows = [replay_trace(model, args.trace, args.num_requests,
                             max_model_len=args.max_model_len,
                             max_output_len=args.max_output_len, step_ms=args.step_ms,
                             kernel=args.kernel, seed=args.seed, **common)]
    elif args.experiment == "pool":
        rows = bench.pool_size_sweep(model, max_tokens=args.max_tokens, **common)
    else:
        prompts = bench.random_prompts(max(batch_sizes), 16, 4 * args.prompt_len,
                                       model.config.vocab_size, seed=1)
        rows = bench.compare_with_transformers(model, prompts, args.max_tokens, repeat=1,
                                               methods=("engine", "padded_generate"),
                                               kernel=args.kernel, **common)
    df = pd.DataFrame(rows)
    if args.out == "-":
        df.to_csv(sys.stdout, index=False)
    else:
        df.to_csv(args.out, index=False)
        print(f"wrote {args.out} ({len(df)} rows)", file=sys.stderr)
    return 0
