"""`pagebench simulate` (static and `--dynamic`) and `pagebench capacity`."""

from __future__ import annotations

import argparse
import csv
import os
import sys

from pagebench import defaults
from pagebench.sim.columns import (DYNAMIC_LEGEND, LENGTHS_FILE_HELP, STATIC_LEGEND,
                                   TRACE_FILE_HELP, legend_lines)
from pagebench.cli.options import (
    MAX_INT, add_output_options, check_memory, check_output_file, dumps, int_list, integer,
    name_list, number, progress, write_results)

# Lengths up to 2**40 tokens: every per-sequence count fits int64 with room for a sum.
MAX_LEN = 2**40
# Memory per sequence of the static simulation (its lengths as Python ints and int64 arrays),
# and per simulated step of the dynamic one (a run's record of 12 Python ints while it runs, and
# the 12 int64 it keeps until all runs are done), on CPython 3.11 with some margin: used to
# refuse work that cannot fit.
STATIC_BYTES_PER_SEQ = 100
DYNAMIC_BYTES_PER_STEP = 600
DYNAMIC_BYTES_PER_KEPT_STEP = 100
DYNAMIC_BLOCK_SIZES = [defaults.BLOCK_SIZE]
# dynamic-only options (dest -> flag); given without --dynamic they are an error
DYNAMIC_ONLY = {"trace": "--trace", "num_requests": "--num-requests", "rate": "--rate",
                "prompt_fraction": "--prompt-fraction", "prompt_lengths": "--prompt-lengths",
                "output_lengths": "--output-lengths", "budget_tokens": "--budget-tokens",
                "allocators": "--allocators", "n": "--n", "max_num_seqs": "--max-num-seqs",
                "timeline_every": "--timeline-every", "timeline": "--timeline",
                "steps_per_unit": "--steps-per-unit", "step_ms": "--step-ms"}
DEFAULT_MAX_LEN = defaults.REFERENCE_MAX_LEN


def register(sub) -> None:
    register_simulate(sub)
    register_capacity(sub)


def register_simulate(sub) -> None:
    p = sub.add_parser(
        "simulate", help="allocator utilisation on a length distribution (static or over time)",
        description="Compare KV-cache allocators (naive reserve-max, pow2, oracle, paged per "
        "block size) on a sequence-length distribution. With --dynamic, simulate requests "
        "arriving, growing a token per step and finishing within a fixed memory budget, and "
        "break memory down into token states, reserved-but-unused, internal and external "
        "fragmentation, and free.", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(["columns of the static table:", *legend_lines(STATIC_LEGEND),
                          "columns of the --dynamic table:", *legend_lines(DYNAMIC_LEGEND)]))
    p.add_argument("--lengths", default=None,
                   help="lognormal:MU,SIGMA | uniform:A,B | fixed:N | FILE (default "
                   f"{defaults.REFERENCE_LENGTHS}; with --dynamic: each request's final "
                   "length); integers, none above --max-len: a FILE's lengths are used as they "
                   "are, only a lognormal draw is clipped to --max-len; " + LENGTHS_FILE_HELP)
    p.add_argument("--num-seqs", type=integer(), default=None,
                   help=f"static: number of sequences (default {defaults.REFERENCE_NUM_SEQS}; "
                   "with --lengths FILE, the file's lengths, each once; given with a FILE, the "
                   "file's lengths are repeated in order or cut to this many)")
    p.add_argument("--seed", type=integer(0), default=None,
                   help=f"random seed of the drawn lengths and arrivals (default "
                   f"{defaults.REFERENCE_SEED}; not with --trace, nor, static, with --lengths "
                   "FILE: they draw nothing)")
    p.add_argument("--max-len", "--max-model-len", type=integer(2, MAX_LEN), default=None,
                   help=f"max_model_len in tokens (default {defaults.REFERENCE_MAX_LEN}; for a "
                   "named trace its own, which clips nothing; longer trace requests are "
                   "clipped and counted)")
    p.add_argument("--block-sizes", type=int_list, default=None,
                   help=f"paged block sizes (default {','.join(map(str, defaults.BLOCK_SIZES))}; "
                   f"with --dynamic {','.join(map(str, DYNAMIC_BLOCK_SIZES))})")
    add_output_options(p, "per-allocator results")
    d = p.add_argument_group("time-stepped simulation (--dynamic)")
    d.add_argument("--dynamic", action="store_true", help="simulate over time")
    d.add_argument("--trace", metavar="NAME|FILE", help="replay a trace instead of Poisson "
                   "arrivals: azure-code, azure-conv, mooncake-conv (shipped) or a FILE (.gz "
                   "allowed); " + TRACE_FILE_HELP)
    d.add_argument("--step-ms", type=number(0, 1e6), default=None,
                   help="Azure/Mooncake traces: milliseconds per decode step (default 20)")
    d.add_argument("--prefix-caching", action="store_true",
                   help="paged: share prompt blocks between requests by the trace's hash_ids "
                   "(Mooncake; refused on a workload without them), keep them cached, evict "
                   "least recently used")
    d.add_argument("--steps-per-unit", type=number(0, 1e9), default=None,
                   help="trace arrival units -> steps (e.g. 50 for seconds at 50 steps/s; "
                   "default 1: arrivals are steps)")
    d.add_argument("--num-requests", type=integer(), default=None,
                   help=f"Poisson: requests (default {defaults.REFERENCE_NUM_REQUESTS}; with "
                   "--lengths FILE, one per length in it; given with a FILE, its lengths are "
                   "repeated in order or cut to this many)")
    d.add_argument("--rate", type=number(0, 1e9), default=None,
                   help="Poisson: requests per step (default 20)")
    d.add_argument("--prompt-fraction", type=number(0, 1, inclusive=True, below=True),
                   default=None, help="share of each length that is prompt, in [0, 1) "
                   "(default 0.3)")
    d.add_argument("--prompt-lengths", metavar="SPEC", help="draw prompt lengths separately, "
                   "or a FILE's prompt column (a CSV of requests serves both options) "
                   "(with --output-lengths, instead of --lengths; a request longer than "
                   "--max-len loses the end of its output, counted as clipped; two files pair "
                   "line by line, one request a line unless --num-requests)")
    d.add_argument("--output-lengths", metavar="SPEC", help="draw output lengths separately, "
                   "or a FILE's output column")
    d.add_argument("--budget-tokens", type=integer(1, MAX_LEN), default=None,
                   help="KV budget in token slots (default: the article's 12.4 GB of "
                   "Qwen2.5-0.5B cache, 1,009,104 slots; see `pagebench capacity --article`)")
    d.add_argument("--allocators", type=name_list, default=None,
                   help="subset of naive,pow2,oracle,paged (default all)")
    d.add_argument("--n", type=integer(1, defaults.MAX_SAMPLES), default=None,
                   help="parallel samples per request (default 1)")
    d.add_argument("--cow", action="store_true",
                   help="paged: samples share prompt blocks (copy-on-write)")
    d.add_argument("--max-num-seqs", type=integer(), default=None,
                   help="cap on running sequences (default: none)")
    d.add_argument("--timeline-every", type=integer(), default=None,
                   help="with --timeline: record every k-th step (default: at most 2000 rows "
                   "per allocator)")
    d.add_argument("--timeline", metavar="CSV", help="write the per-step breakdown here")
    p.set_defaults(func=run_simulate)


def run_simulate(args) -> int:
    if args.dynamic:
        return run_dynamic_simulation(args)
    given = [flag for dest, flag in DYNAMIC_ONLY.items() if getattr(args, dest) is not None]
    given += ["--cow"] if args.cow else []
    given += ["--prefix-caching"] if args.prefix_caching else []
    if given:
        raise ValueError(f"{', '.join(given)}: only with --dynamic")
    from pagebench.sim.static import format_static_table, static_fragmentation
    from pagebench.sim.workloads import sample_lengths

    lengths_spec = defaults.REFERENCE_LENGTHS if args.lengths is None else args.lengths
    max_len = DEFAULT_MAX_LEN if args.max_len is None else args.max_len
    num_seqs = lengths_to_draw("--lengths", lengths_spec, args.num_seqs, max_len, "--max-len",
                               seed=args.seed)
    check_memory("--num-seqs", num_seqs * STATIC_BYTES_PER_SEQ, f"{num_seqs:,} sequences")
    check_output_file("--out", args.out)
    block_sizes = defaults.BLOCK_SIZES if args.block_sizes is None else args.block_sizes
    lengths = sample_lengths(lengths_spec, num_seqs, seed_of(args), max_len)
    result = static_fragmentation(lengths, max_len, block_sizes)
    write_results(args.out, result["results"], result)
    print(dumps(result) if args.json else format_static_table(result))
    return 0


def lengths_to_draw(option: str, spec: str, num_seqs: int | None, max_len: int, limit: str,
                    default: int = defaults.REFERENCE_NUM_SEQS, *, seed: int | None = None) -> int:
    """How many lengths to take from ``spec``, checked first (well formed, none above
    ``max_len``; errors name ``option`` and ``limit``): ``num_seqs`` when given (a file's
    lengths repeated in order or cut to it); else a file's own lengths, each once; else
    ``default`` (a distribution's). A ``seed`` given for the lengths alone is refused with a
    file, which draws nothing."""
    from pagebench.sim.workloads import check_lengths

    kind, values = check_lengths(spec, max_len, option, limit)  # reads a file once
    if kind == "file" and seed is not None:
        raise ValueError(f"--seed: not with {option} FILE (its lengths are taken in order; "
                         "nothing is drawn)")
    if num_seqs is not None:
        return num_seqs
    return len(values) if kind == "file" else default


def requests_file(spec: str | None) -> bool:
    """Whether ``spec`` is a file whose rows give a prompt and an output column."""
    from pagebench.sim.workloads import lengths_file, read_requests_file

    if spec is None or not lengths_file(spec):
        return False
    _, prompts, outputs = read_requests_file(spec, "--lengths")
    return prompts is not None and outputs is not None


def seed_of(args) -> int:
    return defaults.REFERENCE_SEED if args.seed is None else args.seed


def run_dynamic_simulation(args) -> int:
    from pagebench.sim.capacity import article_budget_tokens
    from pagebench.sim.dynamic import ALLOCATORS, REFERENCE, format_dynamic_table, run_dynamic
    from pagebench.sim.real_traces import load_workload
    from pagebench.sim.trace import poisson_workload
    from pagebench.sim.workloads import check_lengths

    if args.num_seqs is not None:
        raise ValueError("--num-seqs: static only; with --dynamic use --num-requests")
    for option, path in (("--out", args.out), ("--timeline", args.timeline)):
        check_output_file(option, path)
    if args.timeline_every is not None and args.timeline is None:
        raise ValueError("--timeline-every: only with --timeline (the steps it keeps go there)")
    allocators = args.allocators or ALLOCATORS
    check_paged_options(args, allocators)
    if args.trace:
        clashes = [flag for dest, flag in DYNAMIC_ONLY.items()
                   if dest in ("num_requests", "rate", "prompt_fraction", "prompt_lengths",
                               "output_lengths", "n") and getattr(args, dest) is not None]
        clashes = (["--lengths"] if args.lengths is not None else []) + clashes
        clashes += ["--seed"] if args.seed is not None else []
        if clashes:
            raise ValueError(f"{', '.join(clashes)}: not with --trace (the trace gives them)")
        check_trace_units(args)
        workload = load_workload(args.trace, step_ms=args.step_ms, max_model_len=args.max_len,
                                 steps_per_unit=args.steps_per_unit)
        max_len = args.max_len or workload.max_model_len or DEFAULT_MAX_LEN
    else:
        for flag, value in (("--steps-per-unit", args.steps_per_unit),
                            ("--step-ms", args.step_ms)):
            if value is not None:
                raise ValueError(f"{flag}: only with --trace")
        if args.prefix_caching:
            raise ValueError("--prefix-caching: Poisson arrivals have no hash_ids, so no prompt "
                             "block could be shared; give a --trace that has them (e.g. "
                             "mooncake-conv)")
        max_len = DEFAULT_MAX_LEN if args.max_len is None else args.max_len
        lengths_spec = defaults.REFERENCE_LENGTHS if args.lengths is None else args.lengths
        if requests_file(args.lengths) and args.prompt_lengths is None \
                and args.output_lengths is None:
            # a file of requests gives each one's prompt and output: no split to invent
            if args.prompt_fraction is not None:
                raise ValueError(f"--prompt-fraction: {args.lengths} gives each request's "
                                 "prompt and output; nothing to split")
            args.prompt_lengths = args.output_lengths = args.lengths
            args.lengths = None
        if args.prompt_lengths is None and args.output_lengths is None:
            # a --lengths FILE: its lengths, each once, as without --dynamic
            num_requests = lengths_to_draw("--lengths", lengths_spec, args.num_requests,
                                           max_len, "--max-len",
                                           default=defaults.REFERENCE_NUM_REQUESTS)
        else:
            if args.prompt_lengths is None or args.output_lengths is None:
                raise ValueError("--prompt-lengths, --output-lengths: give both or neither")
            ignored = [flag for flag, value in (("--lengths", args.lengths),
                                                ("--prompt-fraction", args.prompt_fraction))
                       if value is not None]
            if ignored:
                raise ValueError(f"{', '.join(ignored)}: not with --prompt-lengths and "
                                 "--output-lengths (they give the lengths)")
            in_files = []  # a request takes line i of each file: their lengths pair up
            for option, spec, part in (("--prompt-lengths", args.prompt_lengths, "prompt"),
                                       ("--output-lengths", args.output_lengths, "output")):
                kind, values = check_lengths(spec, max_len - 1, option, "--max-len - 1", part)
                in_files += [len(values)] if kind == "file" else []
            if len(set(in_files)) > 1:
                raise ValueError(f"--prompt-lengths, --output-lengths: the files hold "
                                 f"{in_files[0]:,} and {in_files[1]:,} lengths; request i takes "
                                 "line i of each, so they must hold as many")
            num_requests = args.num_requests or (in_files[0] if in_files else
                                                 defaults.REFERENCE_NUM_REQUESTS)
        workload = poisson_workload(
            num_requests,
            REFERENCE["rate"] if args.rate is None else args.rate, lengths_spec,
            prompt_fraction=(REFERENCE["prompt_fraction"] if args.prompt_fraction is None
                             else args.prompt_fraction),
            prompt_lengths=args.prompt_lengths, output_lengths=args.output_lengths,
            n=1 if args.n is None else args.n, seed=seed_of(args), max_len=max_len)
    check_workload_options(args, workload)
    budget = article_budget_tokens() if args.budget_tokens is None else args.budget_tokens
    block_sizes = args.block_sizes or DYNAMIC_BLOCK_SIZES
    runs = len([a for a in allocators if a != "paged"]) + ("paged" in allocators) * len(block_sizes)
    check_dynamic_memory(workload, runs, "--trace" if args.trace else "--rate/--num-requests")
    with progress(runs, "allocator runs") as bar:
        result = run_dynamic(
            workload, budget, allocators=allocators, block_sizes=block_sizes, max_len=max_len,
            cow=args.cow, max_num_seqs=args.max_num_seqs, timeline_every=args.timeline_every,
            prefix_caching=args.prefix_caching, progress=lambda label: bar.update())
    if args.timeline:
        write_timeline_csv(result, args.timeline)
    write_results(args.out, result.summary, result.to_dict())
    print(dumps(result.to_dict()) if args.json else format_dynamic_table(result))
    return 0


def check_paged_options(args, allocators) -> None:
    """Options that only paged allocation reads, refused when --allocators has no paged."""
    if "paged" in allocators:
        return
    given = [flag for flag, on in (("--block-sizes", args.block_sizes is not None),
                                   ("--cow", args.cow), ("--prefix-caching", args.prefix_caching))
             if on]
    if given:
        raise ValueError(f"{', '.join(given)}: only for paged allocation, and --allocators "
                         f"{','.join(allocators)} has none")


def check_trace_units(args) -> None:
    """--step-ms for traces timed in seconds, --steps-per-unit for those in steps."""
    from pagebench.sim.real_traces import trace_format, trace_path

    if args.step_ms is None and args.steps_per_unit is None:
        return
    path, _ = trace_path(args.trace)
    in_steps = trace_format(path) == "steps"
    if in_steps and args.step_ms is not None:
        raise ValueError(f"--step-ms: {args.trace} gives arrivals in steps, not seconds; use "
                         "--steps-per-unit to scale them")
    if not in_steps and args.steps_per_unit is not None:
        raise ValueError(f"--steps-per-unit: {args.trace} gives arrivals in seconds; use "
                         "--step-ms")


def check_workload_options(args, workload) -> None:
    """--prefix-caching and --cow, refused where the workload leaves them nothing to do."""
    many = int((workload.n > 1).sum())
    if args.prefix_caching:
        if args.cow:
            raise ValueError("--prefix-caching, --cow: not together (prefix caching models one "
                             "sample per request)")
        if workload.hash_ids is None:
            raise ValueError(f"--prefix-caching: {args.trace} has no hash_ids, so no prompt "
                             "block could be shared (a Mooncake trace, e.g. mooncake-conv, "
                             "has them)")
        if many:
            raise ValueError(f"--prefix-caching: models one sample per request, and "
                             f"{args.trace} asks for n > 1 on {many:,} requests")
    if args.cow and not many:
        raise ValueError("--cow: every request has one sample here, so no block could be "
                         "shared; give --n 2 or more, or a trace with an n column")


def check_dynamic_memory(workload, runs: int, arrivals: str = "--trace") -> None:
    """Refuse a workload whose step-by-step records cannot fit: every request decodes one token
    a step after it arrives, so the run lasts at least max(arrival + output_len) steps. The
    error names ``arrivals`` (the option that spreads them) when the last arrival makes most of
    that, else --max-len (long outputs)."""
    ends = workload.arrival + workload.output_len
    last = int(ends.argmax())
    steps = int(ends[last])
    option = arrivals if workload.arrival[last] >= workload.output_len[last] else "--max-len"
    check_memory(option, steps * (DYNAMIC_BYTES_PER_STEP + runs * DYNAMIC_BYTES_PER_KEPT_STEP),
                 f"a simulation of at least {steps:,} steps ({runs} allocator runs)")


def write_timeline_csv(result, path: str) -> None:
    cols = result.timeline_columns
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(cols)
            writer.writerows(zip(*(c.tolist() for c in cols.values())))
    except OSError as e:
        raise ValueError(f"--timeline: cannot write {path}: {e}") from e
    print(f"timeline: {len(cols['step']):,} rows -> {path}", file=sys.stderr)


def register_capacity(sub) -> None:
    p = sub.add_parser(
        "capacity", help="KV blocks, cacheable tokens and concurrency for a model on a GPU",
        description="Size the KV cache of a model on a GPU as vLLM does (memory x utilisation "
        "- weights - overhead, cut into blocks) and compare how many sequences fit under naive "
        "reservation, pow2, exact contiguous and paged allocation for a length distribution. "
        "--article reproduces the article's arithmetic (16 GB card, 0.9, 1 GB weights, 1 GB "
        "overhead: 12.4 GB of cache, about 250 sequences of 4,096 tokens); with another "
        "--model or --dtype the weights are estimated for it, not the article's 1 GB.")
    p.add_argument("--model", default=None,
                   help="preset (qwen2.5-0.5b, qwen2.5-7b, llama-3-8b, llama-3-70b, mistral-7b) "
                   "or path to a config.json (default qwen2.5-0.5b)")
    p.add_argument("--dtype", default="bfloat16", help="weight dtype (and the KV cache's "
                   "unless --kv-dtype)")
    p.add_argument("--kv-dtype", default=None,
                   help="KV cache dtype, e.g. fp8_e4m3 or fp8_e5m2 (one byte: twice the tokens "
                   "of bf16); default --dtype")
    p.add_argument("--gpu-memory", default=None, help="e.g. 16GiB or 80GB (default 16GiB)")
    p.add_argument("--gpu-memory-utilization", type=number(0, 1), default=None,
                   help="share of GPU memory vLLM may use (default 0.9)")
    p.add_argument("--max-model-len", type=integer(1, MAX_LEN), default=None,
                   help="tokens a sequence may reach (default 4096)")
    p.add_argument("--block-size", type=integer(1, MAX_INT), default=None,
                   help="tokens per KV block (default 16)")
    p.add_argument("--weights-bytes", default=None,
                   help="default: estimated as parameters (from the config) x dtype bytes")
    p.add_argument("--overhead-bytes", default=None,
                   help="activations, CUDA graphs, allocator slack (default 0)")
    p.add_argument("--kv-cache-bytes", default=None,
                   help="size the KV cache directly (skips the memory arithmetic: not with "
                   "--gpu-memory, --gpu-memory-utilization, --weights-bytes, --overhead-bytes)")
    p.add_argument("--lengths", default=defaults.REFERENCE_LENGTHS,
                   help="length distribution for the concurrency estimate (default %(default)s; "
                   "as for simulate: none above --max-model-len; " + LENGTHS_FILE_HELP + ")")
    p.add_argument("--num-seqs", type=integer(), default=None,
                   help=f"lengths drawn (default {defaults.REFERENCE_NUM_SEQS}; with --lengths "
                   "FILE, the file's lengths, each once; given with a FILE, the file's lengths "
                   "are repeated in order or cut to this many)")
    p.add_argument("--seed", type=integer(0), default=None,
                   help=f"random seed of the drawn lengths (default {defaults.REFERENCE_SEED}; "
                   "not with --lengths FILE: it draws nothing)")
    p.add_argument("--tensor-parallel-size", type=integer(1, 4096), default=1,
                   help="GPUs the model is split over by attention heads; sizes are then per "
                   "GPU (default 1)")
    p.add_argument("--article", action="store_true",
                   help="start from the article's case (explicit options override it)")
    add_output_options(p, "capacity plan")
    p.set_defaults(func=run_capacity)


def article_weights(model: str | None, dtype: str) -> bool:
    """Whether the article's 1 GB of weights holds: its model (by any of its names) at two bytes
    a parameter, as its bf16."""
    from pagebench.config import dtype_bytes, preset_key
    from pagebench.sim.capacity import ARTICLE_CASE

    return ((model is None or preset_key(model) == ARTICLE_CASE["model"])
            and dtype_bytes(dtype) == dtype_bytes("bfloat16"))


def run_capacity(args) -> int:
    from pagebench.sim.capacity import ARTICLE_CASE, capacity_plan, format_capacity

    if args.kv_cache_bytes is not None:
        unused = [flag for flag, value in (
            ("--gpu-memory", args.gpu_memory),
            ("--gpu-memory-utilization", args.gpu_memory_utilization),
            ("--weights-bytes", args.weights_bytes), ("--overhead-bytes", args.overhead_bytes))
            if value is not None]
        if unused:
            raise ValueError(f"{', '.join(unused)}: not with --kv-cache-bytes (it sizes the KV "
                             "cache directly, skipping the memory arithmetic)")
    base = dict(ARTICLE_CASE) if args.article else {}  # else capacity_plan's defaults
    if args.article and not article_weights(args.model, args.dtype):
        del base["weights_bytes"]  # the article's 1 GB is its model's, in bf16: estimate anew
    for key in ("model", "gpu_memory", "gpu_memory_utilization", "max_model_len", "block_size",
                "weights_bytes", "overhead_bytes"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    max_model_len = base.get("max_model_len", defaults.REFERENCE_MAX_LEN)  # capacity_plan's
    num_seqs = lengths_to_draw("--lengths", args.lengths, args.num_seqs, max_model_len,
                               "--max-model-len", seed=args.seed)
    check_memory("--num-seqs", num_seqs * STATIC_BYTES_PER_SEQ, f"{num_seqs:,} lengths")
    check_output_file("--out", args.out)
    plan = capacity_plan(**base, dtype=args.dtype, kv_dtype=args.kv_dtype,
                         kv_cache_bytes=args.kv_cache_bytes,
                         lengths=args.lengths, num_seqs=num_seqs, seed=seed_of(args),
                         tensor_parallel_size=args.tensor_parallel_size)
    write_results(args.out, [{k: v for k, v in plan.items() if not isinstance(v, (list, dict))}],
                  plan)
    print(dumps(plan) if args.json else format_capacity(plan))
    return 0
