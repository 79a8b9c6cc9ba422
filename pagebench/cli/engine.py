"""`pagebench engine-bench`: engine measurements on a tiny random model (or a local model)."""

from __future__ import annotations

import argparse

from pagebench import defaults
from pagebench.cli.options import (
    add_output_options, allocating, check_bytes, check_device_memory, check_output_file, dumps,
    every_column, experiment_options, format_table, int_list, integer, name_list, number, progress,
    torch_device, write_results)

MODEL_DTYPES = ("float32", "bfloat16", "float16")

EXPERIMENTS = ("throughput", "cow", "prefix", "pool", "compare", "trace", "equality",
               "breakdown", "equal-memory", "fp8")
TRACE_OPTIONS = {"trace", "num_requests", "max_model_len", "max_output_len", "step_ms", "seed"}
# the options each experiment reads (besides --model/--preset/--device/--threads/--json/--out);
# any other given explicitly is refused rather than silently ignored
USES = {"throughput": {"batch_sizes", "block_sizes", "prompt_len", "max_tokens", "kernel",
                       "repeat", "modes", "bandwidth"},
        "cow": {"prompt_len", "max_tokens"},
        "prefix": {"max_tokens"},
        "pool": {"max_tokens"},
        "compare": {"batch_sizes", "prompt_len", "max_tokens", "kernel", "repeat", "methods"},
        "trace": {"kernel"} | TRACE_OPTIONS,
        "equality": {"num_requests", "prompt_len", "max_tokens", "block_sizes", "kernel",
                     "seed"},
        "breakdown": {"batch_sizes", "block_sizes", "prompt_len", "max_tokens", "kernel",
                      "modes", "profile_out"},
        "equal-memory": {"batch_sizes", "num_requests", "prompt_len", "max_tokens",
                         "block_sizes", "kernel", "repeat"},
        "fp8": {"num_requests", "prompt_len", "max_tokens", "kernel", "kv_cache_memory"}}
DEFAULTS = {"batch_sizes": [1, 4, 16, 64], "block_sizes": list(defaults.ENGINE_BLOCK_SIZES),
            "prompt_len": (64, 64), "max_tokens": 32, "kernel": "auto", "repeat": 1,
            "methods": "engine,padded_generate", "trace": "mooncake-conv", "num_requests": 32,
            "max_model_len": 1024, "max_output_len": 64, "step_ms": 20.0, "seed": 0,
            "modes": None, "bandwidth": False, "profile_out": None, "kv_cache_memory": "256MiB"}
# an experiment's own defaults, where they differ from DEFAULTS
EXPERIMENT_DEFAULTS = {
    "compare": {"batch_sizes": [64], "repeat": 3},  # interleaved repeats: a spread to judge
    "equality": {"num_requests": 8, "prompt_len": (1, 300), "max_tokens": 16,
                 "block_sizes": [16], "seed": 3},
    "breakdown": {"batch_sizes": [1], "block_sizes": [16], "prompt_len": (16, 400),
                  "max_tokens": 20},
    "equal-memory": {"batch_sizes": [8], "num_requests": 32, "prompt_len": (16, 128),
                     "max_tokens": 16, "block_sizes": [16], "repeat": 3},
    "fp8": {"prompt_len": (16, 256)}}
# options that take exactly one value for these experiments
SINGLE = {"equal-memory": ("batch_sizes", "block_sizes"), "cow": ("prompt_len",)}
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
    "equality": [("check", "check", 0), ("block_size", "block (tokens)", 0),
                 ("enable_prefix_caching", "prefix caching", 0),
                 ("compiled_layers", "compiled layers", 0), ("cuda_graphs", "CUDA graphs", 0),
                 ("prompts_equal", "prompts equal", 0), ("num_prompts", "prompts", 0),
                 ("token_agreement", "token agreement", 3)],
    "breakdown": [("batch", "batch", 0), ("mode", "mode", 0), ("cuda_graphs", "CUDA graphs", 0),
                  ("decode_step_wall_ms", "step wall (ms)", 3),
                  ("gpu_busy_ms", "GPU busy (ms)", 3), ("host_ms", "host (ms)", 3),
                  ("graph_replay_ms", "graph replay (ms)", 3)],
    "equal-memory": [("method", "method", 0), ("kv_bytes", "KV bytes", 0),
                     ("concurrent_seqs", "sequences at once", 0)],
    "fp8": [("kv_cache_memory", "KV memory", 0), ("blocks_bf16", "blocks bf16", 0),
            ("blocks_fp8", "blocks fp8", 0), ("blocks_ratio", "ratio", 2),
            ("greedy_agreement", "greedy agreement", 3),
            ("first_token_agreement", "first tokens agree", 3),
            ("logit_rel_err_first_steps", "logit error", 4), ("seconds_bf16", "bf16 (s)", 2),
            ("seconds_fp8", "fp8 (s)", 2)],
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
    """``--methods``: comma-separated, each the engine or one of engine_bench.TRANSFORMERS_METHODS."""
    from pagebench.measure.engine_bench import TRANSFORMERS_METHODS

    known = ("engine",) + TRANSFORMERS_METHODS
    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = sorted(set(methods) - set(known))
    if unknown or not methods:
        raise ValueError(f"--methods: unknown {', '.join(unknown) or repr(text)} "
                         f"(use {', '.join(known)})")
    return methods


def length_range(text: str) -> tuple[int, int]:
    """``--prompt-len``: ``N`` or ``MIN-MAX`` tokens, 1 <= MIN <= MAX <= 1,000,000."""
    parse = integer(1, 1_000_000)
    lo, sep, hi = str(text).strip().partition("-")
    try:
        lo = parse(lo)
        hi = parse(hi) if sep else lo
    except argparse.ArgumentTypeError:  # name the whole value, not the part around the '-'
        raise argparse.ArgumentTypeError(f"expected N or MIN-MAX, integers in 1..1,000,000, "
                                         f"got {text!r}") from None
    if hi < lo:
        raise argparse.ArgumentTypeError(f"expected N or MIN-MAX with MIN <= MAX, got {text!r}")
    return lo, hi


def table_columns(experiment: str) -> list:
    """The printed table of an experiment: its own columns, then the common ones it has (a
    trace replay names its peak blocks and time after the engine and the simulator)."""
    if experiment == "trace":
        return TABLES["trace"] + [("tokens_per_s", "tokens/s", 1), ("elapsed_s", "time (s)", 3)]
    if experiment in ("equality", "breakdown", "fp8"):
        return TABLES[experiment]
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
        "real trace, engine against simulator; equality: greedy outputs against "
        "model.generate and eager steps; breakdown: a decode step's wall, GPU-busy and host "
        "time (torch.profiler); equal-memory: the engine against padded generate in the same "
        "KV memory; fp8: a cache in the model's dtype (bf16 by default here) and an fp8_e4m3 "
        "one in the same memory: pools, greedy agreement, logit error.")
    p.add_argument("experiment", choices=EXPERIMENTS, help="what to measure")
    p.add_argument("--model", default=None, help="local model directory (default: a tiny "
                   "random Qwen2 model, 2 layers, hidden 128)")
    p.add_argument("--preset", default=None, help="random weights in a preset's shape, e.g. "
                   "qwen2.5-0.5b (use on a GPU; not with --model)")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="default: cuda if present, else cpu")
    p.add_argument("--dtype", default=None, choices=list(MODEL_DTYPES),
                   help="model dtype (default: float32 for the tiny model and on a CPU, "
                   "bfloat16 for --preset on a GPU and for fp8; a --model loads its own)")
    p.add_argument("--batch-sizes", type=int_list, default=None,
                   help="throughput, breakdown: requests per run; compare: one comparison per "
                   "batch size (default 1,4,16,64; breakdown 1; compare 64); equal-memory: the batch "
                   "padded generate runs, whose reservation sets both sides' KV memory "
                   "(default 8)")
    p.add_argument("--block-sizes", type=int_list, default=None,
                   help="throughput, equality, breakdown: KV block sizes in tokens (default "
                   "8,16,32,128; equality and breakdown 16); equal-memory: one (default 16)")
    p.add_argument("--prompt-len", type=length_range, default=None,
                   help="prompt tokens, N or MIN-MAX (lengths drawn uniformly); compare: N "
                   "means prompts of 16..4N (default 64; equality 1-300, breakdown 16-400, "
                   "equal-memory 16-128, fp8 16-256)")
    p.add_argument("--max-tokens", type=integer(1, 1_000_000), default=None,
                   help="tokens generated per request (default 32; equality and "
                   "equal-memory 16, breakdown 20)")
    p.add_argument("--kernel", default=None,
                   help="throughput, compare, trace, equality, breakdown, equal-memory, fp8: "
                   "attention backend (default auto)")
    p.add_argument("--kv-cache-memory", default=None,
                   help="fp8: KV cache memory of each run, e.g. 4GiB (default 256MiB)")
    p.add_argument("--repeat", type=integer(1, 1000), default=None,
                   help="throughput, compare: timed runs after one warm-up, the median "
                   "reported (default 1)")
    p.add_argument("--modes", type=name_list, default=None,
                   help="throughput, breakdown: how decode steps run, one run per mode: "
                   "graphs (the default: on a GPU CUDA graphs of compiled layers), "
                   "graphs_uncompiled, eager; each row names its mode (default: the "
                   "engine's default, no mode column)")
    p.add_argument("--bandwidth", action="store_true", default=None,
                   help="throughput: also measure the device's copy bandwidth and give each "
                   "run's decode bytes per step and their share of it")
    p.add_argument("--profile-out", metavar="FILE", default=None,
                   help="breakdown: also write the profiler's top operators of each run to FILE")
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
                   help="sample size (default 32); equality, equal-memory, fp8: requests "
                   "(default 8, 32, 32)")
    t.add_argument("--max-model-len", type=integer(2, 1_000_000), default=None,
                   help="requests clipped to this many tokens (default 1024)")
    t.add_argument("--max-output-len", type=integer(1, 1_000_000), default=None,
                   help="outputs cut to this many tokens first (default 64)")
    t.add_argument("--step-ms", type=number(0, 1e6), default=None,
                   help="trace milliseconds per engine step (default 20)")
    t.add_argument("--seed", type=integer(0), default=None,
                   help="sample seed (default 0); equality: the prompts' seed (default 3)")
    p.table_columns = every_column(*TABLES.values(), COMMON_TABLE)
    p.set_defaults(func=run)


def resolve_options(args) -> dict:
    """The options the experiment reads, with defaults; refuses those it would ignore, and
    more than one value where it takes one."""
    opts = experiment_options(args, "engine-bench", {
        experiment: {name: (DEFAULTS | EXPERIMENT_DEFAULTS.get(experiment, {}))[name]
                     for name in uses} for experiment, uses in USES.items()})
    for name in SINGLE.get(args.experiment, ()):
        if len(set(opts[name])) != 1:
            raise ValueError(f"--{name.replace('_', '-')}: engine-bench {args.experiment} "
                             f"takes one value, got {opts[name]}")
    return opts


def _model(args, device: str):
    import torch

    from pagebench.measure import engine_bench
    from pagebench.engine.engine import load_model

    dtype = getattr(torch, args.dtype) if args.dtype else None
    if dtype is None and args.experiment == "fp8":
        dtype = torch.bfloat16  # its baseline is a bf16 cache, on any device
    if args.model:
        return load_model(args.model, dtype=dtype, device=device)
    if args.preset:
        return engine_bench.preset_model(args.preset, device=device, dtype=dtype or (
            torch.bfloat16 if device != "cpu" else torch.float32))
    return engine_bench.tiny_model(device=device, dtype=dtype or torch.float32)


def _kernel(name: str) -> str:
    from pagebench.kernels import available_backends

    if name != "auto" and name not in available_backends():
        raise ValueError(f"--kernel: {name!r} is not available here "
                         f"(available: auto, {', '.join(sorted(available_backends()))})")
    return name


def kv_estimate(experiment: str, opts: dict) -> tuple[str, int, str] | None:
    """(options, token slots, what) of the largest KV cache an experiment sizes from its
    options (every request at its longest prompt plus its tokens, in whole blocks); None for
    the experiments of fixed size (cow, prefix, pool, trace: the engine sizes them) or sized in
    bytes (fp8)."""
    from pagebench.engine.block_manager import blocks_needed

    if experiment not in ("throughput", "breakdown", "equality", "equal-memory", "compare"):
        return None
    lo, hi = opts["prompt_len"]
    if experiment == "compare" and lo == hi:
        hi = 4 * hi  # one length N: prompts of 16..4N tokens
    per_request = hi + opts["max_tokens"]
    if experiment == "equality":  # equal-memory: its --batch-sizes set both sides' memory
        batches, option = [opts["num_requests"]], "--num-requests"
    else:
        batches, option = opts["batch_sizes"], "--batch-sizes"
    # compare (no --block-sizes): padded generate reserves the longest request in every row
    block_sizes = opts.get("block_sizes") or [1]
    slots, batch, block = max((b * blocks_needed(per_request, bs) * bs, b, bs)
                              for b in batches for bs in block_sizes)
    blocks = f" in blocks of {block}" if "block_sizes" in opts else ""
    return (f"{option}/--prompt-len/--max-tokens", slots,
            f"the KV cache of {batch:,} requests of up to {per_request:,} tokens{blocks}")


def check_engine_memory(experiment: str, opts: dict, model, device: str) -> None:
    """Refuse, before any prompt is drawn or pool allocated, a run whose KV cache alone cannot
    fit on ``device``."""
    from pagebench.config import KVGeometry, parse_bytes

    if experiment == "fp8":
        check_device_memory("--kv-cache-memory", parse_bytes(opts["kv_cache_memory"]),
                            "the KV cache of each run", device)
        return
    estimate = kv_estimate(experiment, opts)
    if estimate is None:
        return
    option, slots, what = estimate
    dtype = next(model.parameters()).dtype
    check_device_memory(option, slots * KVGeometry.from_config(model.config,
                                                               dtype=dtype).bytes_per_token,
                        what, device)


def check_model_options(args) -> None:
    """``--model`` and ``--preset``: at most one (``load_model`` says when a --model directory
    is missing)."""
    if args.model is not None and args.preset is not None:
        raise ValueError("--model, --preset: give one (a local model, or random weights in a "
                         "preset's shape)")


def run(args) -> int:
    check_model_options(args)
    opts = resolve_options(args)
    sizes = ", ".join(f"--{name.replace('_', '-')} {_shown(opts[name])}"
                      for name in ("batch_sizes", "num_requests", "prompt_len", "max_tokens",
                                   "block_sizes", "kv_cache_memory", "max_model_len")
                      if name in opts)
    with allocating(f"the {args.experiment} run" + (f" at {sizes}" if sizes else "")):
        return measure(args, opts)


def _shown(value) -> str:
    if isinstance(value, tuple):  # --prompt-len MIN-MAX
        return str(value[0]) if value[0] == value[1] else f"{value[0]}-{value[1]}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def measure(args, opts: dict) -> int:
    from pagebench.measure import engine_bench

    check_output_file("--out", args.out)
    check_output_file("--profile-out", opts.get("profile_out"))
    if "kernel" in opts:
        opts["kernel"] = _kernel(opts["kernel"])
    if "methods" in opts:
        opts["methods"] = compare_methods(opts["methods"])
    if "kv_cache_memory" in opts:
        check_bytes("--kv-cache-memory", opts["kv_cache_memory"])
    modes = opts.get("modes")
    for mode in modes or ():
        if mode not in engine_bench.MODES:
            raise ValueError(f"--modes: unknown {mode} (use {', '.join(engine_bench.MODES)})")
    device = torch_device(args.device)
    model = _model(args, device)
    check_engine_memory(args.experiment, opts, model, device)
    vocab = model.config.vocab_size
    common = dict(threads=args.threads, max_tokens=opts.get("max_tokens"))
    columns = table_columns(args.experiment)
    if args.experiment == "throughput":
        rows = []
        bandwidth = engine_bench.copy_bandwidth(device) if opts["bandwidth"] else None
        points = [(mode, bs, b) for mode in modes or [None] for bs in opts["block_sizes"]
                  for b in opts["batch_sizes"]]
        with progress(len(points), "throughput runs") as bar:
            for mode, bs, b in points:
                rows += engine_bench.throughput_vs_batch(model, [b], [bs], opts["prompt_len"],
                                                  kernel=opts["kernel"], repeat=opts["repeat"],
                                                  mode=mode, copy_bandwidth=bandwidth, **common)
                bar.update()
        if modes:
            columns = columns[:2] + [("mode", "mode", 0)] + columns[2:]
        if bandwidth is not None:
            columns = columns + [("decode_bytes_per_step", "decode bytes/step", 0),
                                 ("bandwidth_fraction", "of copy bw", 2)]
    elif args.experiment == "cow":
        rows = engine_bench.cow_comparison(model, prompt_len=opts["prompt_len"][0], **common)
    elif args.experiment == "prefix":
        rows = engine_bench.prefix_cache_comparison(model, **common)
    elif args.experiment == "pool":
        rows = engine_bench.pool_size_sweep(model, **common)
    elif args.experiment == "trace":
        from pagebench.measure.trace_replay import replay_trace

        rows = [replay_trace(model, opts["trace"], opts["num_requests"],
                             max_model_len=opts["max_model_len"],
                             max_output_len=opts["max_output_len"], step_ms=opts["step_ms"],
                             kernel=opts["kernel"], seed=opts["seed"], threads=args.threads)]
    elif args.experiment == "equality":
        prompts = engine_bench.random_prompts(opts["num_requests"], *opts["prompt_len"], vocab,
                                       seed=opts["seed"])
        rows = engine_bench.greedy_equality(model, prompts, opts["max_tokens"], opts["block_sizes"],
                                     kernel=opts["kernel"], threads=args.threads)
    elif args.experiment == "breakdown":
        rows = breakdown(model, opts, args.threads)
    elif args.experiment == "fp8":
        prompts = engine_bench.random_prompts(opts["num_requests"], *opts["prompt_len"], vocab, seed=11)
        rows = engine_bench.fp8_comparison(model, prompts, kv_cache_memory=opts["kv_cache_memory"],
                                    kernel=opts["kernel"], **common)
    elif args.experiment == "equal-memory":
        lo, hi = opts["prompt_len"]
        prompts = engine_bench.random_prompts(opts["num_requests"], lo, hi, vocab, seed=7)
        kv_bytes = engine_bench.padded_reservation_bytes(model, opts["batch_sizes"][0],
                                                  hi + opts["max_tokens"])
        rows = engine_bench.equal_memory_comparison(model, kv_bytes, prompts,
                                             block_size=opts["block_sizes"][0],
                                             kernel=opts["kernel"], repeat=opts["repeat"],
                                             **common)
    else:
        lo, hi = opts["prompt_len"]
        if lo == hi:  # one length N: prompts of 16..4N tokens
            lo, hi = 16, 4 * lo
        rows = []
        for b in opts["batch_sizes"]:
            prompts = engine_bench.random_prompts(b, lo, hi, vocab, seed=1)
            rows += engine_bench.compare_with_transformers(model, prompts, repeat=opts["repeat"],
                                                    methods=opts["methods"],
                                                    kernel=opts["kernel"], **common)
    write_results(args.out, rows)
    # a common column none of the rows has (compare's peers keep no blocks) is left out
    common_keys = {key for key, _, _ in COMMON_TABLE}
    columns = [c for c in columns if c[0] not in common_keys or any(c[0] in r for r in rows)]
    print(dumps(rows) if args.json else format_table(rows, columns, legend=True))
    return 0


def breakdown(model, opts: dict, threads: int) -> list[dict]:
    """``engine-bench breakdown``: one profiled run per (mode, block size, batch)."""
    from pagebench.atomic import atomic_write_text
    from pagebench.measure import engine_bench
    from pagebench.measure.step_profile import step_breakdown

    rows, tables = [], []
    points = [(mode, bs, b) for mode in opts["modes"] or [None] for bs in opts["block_sizes"]
              for b in opts["batch_sizes"]]
    with progress(len(points), "profiled runs") as bar:
        for mode, bs, b in points:
            prompts = engine_bench.random_prompts(b, *opts["prompt_len"], model.config.vocab_size,
                                           seed=11)
            table = []
            rows.append(step_breakdown(model, prompts, opts["max_tokens"], block_size=bs,
                                       kernel=opts["kernel"], mode=mode, profile_table=table,
                                       threads=threads))
            tables.append(f"=== batch {b}, block {bs}, mode {mode or 'default'} ===\n{table[0]}")
            bar.update()
    if opts["profile_out"]:
        atomic_write_text(opts["profile_out"], "\n\n".join(tables) + "\n")
    return rows
