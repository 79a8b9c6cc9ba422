"""`pagebench engine-bench`: engine measurements on a tiny random model (or a local model)."""

from __future__ import annotations

from pagebench import defaults
from pagebench.cli.options import (
    add_output_options, check_output_file, dumps, experiment_options, format_table, int_list,
    integer, number, progress, torch_device, write_results)

EXPERIMENTS = ("throughput", "cow", "prefix", "pool", "compare", "trace")
TRACE_OPTIONS = {"trace", "num_requests", "max_model_len", "max_output_len", "step_ms", "seed"}
# the options each experiment reads (besides --model/--preset/--device/--threads/--json/--out);
# any other given explicitly is refused rather than silently ignored
USES = {"throughput": {"batch_sizes", "block_sizes", "prompt_len", "max_tokens", "kernel",
                       "repeat"},
        "cow": {"prompt_len", "max_tokens"},
        "prefix": {"max_tokens"},
        "pool": {"max_tokens"},
        "compare": {"batch_sizes", "prompt_len", "max_tokens", "kernel", "repeat", "methods"},
        "trace": {"kernel"} | TRACE_OPTIONS}
DEFAULTS = {"batch_sizes": [1, 4, 16, 64], "block_sizes": list(defaults.ENGINE_BLOCK_SIZES),
            "prompt_len": 64, "max_tokens": 32, "kernel": "auto", "repeat": 1,
            "methods": "engine,padded_generate", "trace": "mooncake-conv", "num_requests": 32,
            "max_model_len": 1024, "max_output_len": 64, "step_ms": 20.0, "seed": 0}
TABLES = {
    "throughput": [("block_size", "block (tokens)", 0), ("batch", "batch", 0),
                   ("prompt_len", "prompt (tokens)", 0), ("kernel", "kernel", 0)],
    "cow": [("variant", "variant", 0), ("completions", "completions", 0)],
    "prefix": [("enable_prefix_caching", "prefix caching", 0),
               ("prefix_cache_hit_rate", "hit rate", 2),
               ("num_computed_prompt_tokens", "prompt tokens computed", 0)],
    "pool": [("pool_fraction", "pool / needed", 2), ("num_blocks", "blocks", 0),
             ("num_preemptions", "preemptions", 0), ("recomputed_tokens", "recomputed tokens", 0)],
    "compare": [("method", "method", 0), ("num_requests", "requests", 0),
                ("outputs_equal_engine", "outputs equal engine's", 0)],
    "trace": [("trace", "trace", 0), ("num_requests", "requests", 0),
              ("engine_prefix_cache_hit_rate", "hit rate engine", 3),
              ("sim_prefix_cache_hit_rate", "hit rate simulator", 3),
              ("engine_num_preemptions", "preemptions engine", 0),
              ("sim_num_preemptions", "preemptions simulator", 0),
              ("engine_peak_blocks", "peak blocks", 0)],
}
COMMON_TABLE = [("peak_blocks", "peak blocks", 0), ("tokens_per_s", "tokens/s", 1),
                ("time_s", "time (s)", 3)]


def compare_methods(text: str) -> tuple[str, ...]:
    """``--methods``: comma-separated, each the engine or one of bench.TRANSFORMERS_METHODS."""
    from pagebench.engine.bench import TRANSFORMERS_METHODS

    known = ("engine",) + TRANSFORMERS_METHODS
    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = sorted(set(methods) - set(known))
    if unknown or not methods:
        raise ValueError(f"--methods: unknown {', '.join(unknown) or repr(text)} "
                         f"(use {', '.join(known)})")
    return methods


def table_columns(experiment: str) -> list:
    """The printed table of an experiment: its own columns, then the common ones it has (a
    trace replay names its peak blocks and time after the engine and the simulator)."""
    if experiment == "trace":
        return TABLES["trace"] + [("tokens_per_s", "tokens/s", 1), ("elapsed_s", "time (s)", 3)]
    return TABLES[experiment] + COMMON_TABLE


def register(sub) -> None:
    p = sub.add_parser(
        "engine-bench", help="engine tokens/s vs batch and block size, CoW, prefix caching, "
        "pool size; engine vs transformers' padded generate",
        description="Run the reference paged engine on a tiny random model and print a table "
        "(one row per run). throughput: tokens/s per batch and block size; cow: n=1, n=4 "
        "sharing the prompt (copy-on-write) and 4 separate requests; prefix: prefix caching off "
        "and on; pool: pool sizes below what all requests need; compare: the engine against "
        "transformers' padded generate on the same greedy requests; trace: replay a sample of a "
        "real trace, engine against simulator.")
    p.add_argument("experiment", choices=EXPERIMENTS, help="what to measure")
    p.add_argument("--model", default=None, help="local model directory (default: a tiny "
                   "random Qwen2 model, 2 layers, hidden 128)")
    p.add_argument("--preset", default=None, help="random weights in a preset's shape, e.g. "
                   "qwen2.5-0.5b (use on a GPU)")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="default: cuda if present, else cpu")
    p.add_argument("--batch-sizes", type=int_list, default=None,
                   help="throughput: requests per run; compare: the largest is the number of "
                   "requests (default 1,4,16,64)")
    p.add_argument("--block-sizes", type=int_list, default=None,
                   help="throughput: KV block sizes in tokens (default 8,16,32,128)")
    p.add_argument("--prompt-len", type=integer(1, 1_000_000), default=None,
                   help="throughput, cow: prompt tokens; compare: prompts of 16..4x this "
                   "(default 64)")
    p.add_argument("--max-tokens", type=integer(1, 1_000_000), default=None,
                   help="tokens generated per request (default 32)")
    p.add_argument("--kernel", default=None,
                   help="throughput, compare: attention backend (default auto)")
    p.add_argument("--repeat", type=integer(1, 1000), default=None,
                   help="throughput, compare: timed runs after one warm-up, the median "
                   "reported (default 1)")
    p.add_argument("--methods", default=None,
                   help="compare: comma-separated, the engine and transformers' "
                   "padded_generate, generate_batch or generate_static_compile (default "
                   "engine,padded_generate)")
    p.add_argument("--threads", type=integer(1, 1024), default=1,
                   help="CPU threads (default %(default)s)")
    add_output_options(p, "runs")
    t = p.add_argument_group("trace: replay a sample of a real trace (blocks of 16, prefix "
                             "caching on), engine vs simulator")
    t.add_argument("--trace", default=None,
                   help="azure-code, azure-conv, mooncake-conv or a file (default mooncake-conv)")
    t.add_argument("--num-requests", type=integer(1, 100_000), default=None,
                   help="sample size (default 32)")
    t.add_argument("--max-model-len", type=integer(2, 1_000_000), default=None,
                   help="requests clipped to this many tokens (default 1024)")
    t.add_argument("--max-output-len", type=integer(1, 1_000_000), default=None,
                   help="outputs cut to this many tokens first (default 64)")
    t.add_argument("--step-ms", type=number(0, 1e6), default=None,
                   help="trace milliseconds per engine step (default 20)")
    t.add_argument("--seed", type=integer(0), default=None, help="sample seed (default 0)")
    p.set_defaults(func=run)


def resolve_options(args) -> dict:
    """The options the experiment reads, with defaults; refuses those it would ignore."""
    return experiment_options(args, "engine-bench", {
        experiment: {name: DEFAULTS[name] for name in uses} for experiment, uses in USES.items()})


def _model(args, device: str):
    import torch

    from pagebench.engine import bench
    from pagebench.engine.engine import load_model

    if args.model:
        return load_model(args.model, device=device)
    if args.preset:
        return bench.preset_model(args.preset, device=device,
                                  dtype=torch.bfloat16 if device != "cpu" else torch.float32)
    return bench.tiny_model(device=device)


def _kernel(name: str) -> str:
    from pagebench.kernels import available_backends

    if name != "auto" and name not in available_backends():
        raise ValueError(f"--kernel: {name!r} is not available here "
                         f"(available: auto, {', '.join(sorted(available_backends()))})")
    return name


def run(args) -> int:
    from pagebench.engine import bench

    opts = resolve_options(args)
    check_output_file("--out", args.out)
    if "kernel" in opts:
        opts["kernel"] = _kernel(opts["kernel"])
    if "methods" in opts:
        opts["methods"] = compare_methods(opts["methods"])
    model = _model(args, torch_device(args.device))
    common = dict(threads=args.threads, max_tokens=opts.get("max_tokens"))
    if args.experiment == "throughput":
        rows = []
        points = [(bs, b) for bs in opts["block_sizes"] for b in opts["batch_sizes"]]
        with progress(len(points), "throughput runs") as bar:
            for bs, b in points:
                rows += bench.throughput_vs_batch(model, [b], [bs], opts["prompt_len"],
                                                  kernel=opts["kernel"], repeat=opts["repeat"],
                                                  **common)
                bar.update()
    elif args.experiment == "cow":
        rows = bench.cow_comparison(model, prompt_len=opts["prompt_len"], **common)
    elif args.experiment == "prefix":
        rows = bench.prefix_cache_comparison(model, **common)
    elif args.experiment == "pool":
        rows = bench.pool_size_sweep(model, **common)
    elif args.experiment == "trace":
        from pagebench.engine.trace_replay import replay_trace

        rows = [replay_trace(model, opts["trace"], opts["num_requests"],
                             max_model_len=opts["max_model_len"],
                             max_output_len=opts["max_output_len"], step_ms=opts["step_ms"],
                             kernel=opts["kernel"], seed=opts["seed"], threads=args.threads)]
    else:
        prompts = bench.random_prompts(max(opts["batch_sizes"]), 16, 4 * opts["prompt_len"],
                                       model.config.vocab_size, seed=1)
        rows = bench.compare_with_transformers(model, prompts, repeat=opts["repeat"],
                                               methods=opts["methods"],
                                               kernel=opts["kernel"], **common)
    write_results(args.out, rows)
    print(dumps(rows) if args.json else format_table(rows, table_columns(args.experiment)))
    return 0
