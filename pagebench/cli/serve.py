"""`pagebench serve-bench`: latency under load (TTFT, TPOT, ITL, goodput) on a real trace."""

from __future__ import annotations

import argparse
import math

from pagebench.defaults import SLO_ATTAINMENT, WARMUP_PASSES
from pagebench.cli.options import (add_output_options, allocating, check_bytes,
                                   check_output_file, dumps, format_table, int_list, integer,
                                   name_list, number, progress, torch_device, write_results)

TRACES = ("azure-code", "azure-conv", "mooncake-conv")
KV_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
MODEL_DTYPES = ("float32", "bfloat16", "float16")
MODES = ("graphs", "graphs_uncompiled", "eager")
TABLE = [("trace", "trace", 0), ("block_size", "block", 0), ("kv_cache_dtype", "KV dtype", 0),
         ("prefix_caching", "prefix cache", 0), ("request_rate", "rate (req/s)", 2),
         ("request_throughput", "done (req/s)", 2), ("goodput", "goodput (req/s)", 2),
         ("ttft_p50_ms", "TTFT p50 (ms)", 1), ("ttft_p99_ms", "TTFT p99 (ms)", 1),
         ("tpot_p50_ms", "TPOT p50 (ms)", 2), ("tpot_p99_ms", "TPOT p99 (ms)", 2),
         ("itl_p99_ms", "ITL p99 (ms)", 2), ("num_preemptions", "preempted", 0),
         ("peak_blocks", "peak blocks", 0), ("note", "note", 0)]


def rate_list(text: str) -> list[float]:
    """``--rates``: comma-separated positive requests/s; ``inf`` sends every request at once."""
    values = []
    for part in (x.strip() for x in str(text).split(",") if x.strip()):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not (value > 0):  # NaN fails too
            raise argparse.ArgumentTypeError(f"expected comma-separated positive request "
                                             f"rates (or inf), got {text!r}")
        values.append(value)
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated request rates, got {text!r}")
    return values


def on_off_list(text: str) -> list[bool]:
    """``--prefix-caching``: on, off or on,off."""
    names = name_list(text)
    if any(n not in ("on", "off") for n in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected on, off or on,off, got {text!r}")
    return [n == "on" for n in names]


def kv_dtype_list(text: str) -> list[str]:
    names = name_list(text)
    bad = [n for n in names if n not in KV_DTYPES]
    if bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected distinct names among {', '.join(KV_DTYPES)}, "
                                         f"got {text!r}")
    return names


def add_engine_options(p) -> None:
    """The model and engine options serve-bench and serve share."""
    p.add_argument("--model", default="tiny",
                   help="tiny (a random 2-layer Qwen2, the default), a preset name (random "
                   "weights in its shape, e.g. qwen2.5-0.5b) or a local model directory")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="default: cuda if present, else cpu")
    p.add_argument("--dtype", default=None, choices=list(MODEL_DTYPES),
                   help="model dtype (default: bfloat16 on a GPU, float32 on a CPU)")
    p.add_argument("--kv-cache-memory", default=None,
                   help="KV cache memory, e.g. 4GiB (default: 80%% of the free GPU memory, or "
                   "256MiB on a CPU)")
    p.add_argument("--max-num-seqs", type=integer(1, 1_000_000), default=256,
                   help="sequences running at once (default %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=integer(1, 10_000_000), default=2048,
                   help="tokens per step (default %(default)s)")
    p.add_argument("--mode", choices=MODES, default=None,
                   help="how decode steps run (default: the engine's, CUDA graphs of compiled "
                   "layers on a GPU, eager on a CPU)")
    p.add_argument("--threads", type=integer(1, 1024), default=1,
                   help="CPU threads (default %(default)s)")


def register(sub) -> None:
    p = sub.add_parser(
        "serve-bench", help="latency under load: TTFT, TPOT, ITL and goodput at request rates "
        "on a real trace, per block size, KV cache dtype and prefix caching",
        description="Serve a sample of a real trace through the engine in wall-clock time: "
        "requests arrive at the trace's times scaled to each --rates value (or Poisson), are "
        "admitted as they come, and each one's first token, every token and finish are timed. "
        "Latency as vLLM's serving benchmark defines it (docs/serving.md). One row per rate "
        "and configuration.")
    p.add_argument("--trace", type=name_list, default=["azure-code"],
                   help=f"{', '.join(TRACES)} or a trace file; several comma-separated, "
                   "served by the same engines (default azure-code)")
    p.add_argument("--rates", type=rate_list, default=None,
                   help="requests/s, comma-separated (inf: all at once); default: the trace's "
                   "own times divided by --time-scale")
    p.add_argument("--arrival", choices=("trace", "poisson"), default="trace",
                   help="trace: the trace's times stretched to each rate; poisson: exponential "
                   "gaps at each rate (default %(default)s)")
    p.add_argument("--time-scale", type=number(0, 1e9), default=1.0,
                   help="without --rates: trace times divided by this (default 1)")
    p.add_argument("--find-max-rate", action="store_true",
                   help="search for the largest rate meeting the SLO, starting at the first "
                   "of --rates and doubling, then bisecting")
    p.add_argument("--slo-ttft", type=number(0, 1e9), default=None, metavar="MS",
                   help="time-to-first-token SLO, milliseconds")
    p.add_argument("--slo-tpot", type=number(0, 1e9), default=None, metavar="MS",
                   help="time-per-output-token SLO, milliseconds")
    p.add_argument("--slo-attainment", type=number(0, 1), default=SLO_ATTAINMENT,
                   help="--find-max-rate: share of requests that must meet every SLO "
                   "(default %(default)s)")
    p.add_argument("--block-sizes", type=int_list, default=[16],
                   help="KV block sizes in tokens (default 16)")
    p.add_argument("--kv-cache-dtype", type=kv_dtype_list, default=["auto"],
                   help="auto (the model's dtype) and/or fp8_e4m3 (default auto)")
    p.add_argument("--prefix-caching", type=on_off_list, default=[True],
                   help="on, off or on,off (default on)")
    p.add_argument("--num-requests", type=integer(1, 1_000_000), default=32,
                   help="requests sampled from the trace (default %(default)s)")
    p.add_argument("--max-model-len", type=integer(2, 1_000_000), default=1024,
                   help="requests clipped to this many tokens (default %(default)s)")
    p.add_argument("--max-output-len", type=integer(1, 1_000_000), default=32,
                   help="outputs cut to this many tokens first (default %(default)s)")
    add_engine_options(p)
    p.add_argument("--seed", type=integer(0), default=0,
                   help="sample and Poisson seed (default 0)")
    p.add_argument("--warmup-passes", type=integer(0, 100), default=WARMUP_PASSES,
                   help="untimed all-at-once runs of each trace per engine before the timed "
                   "ones, so the first rate runs warm (default %(default)s)")
    p.add_argument("--repeats", type=integer(1, 100), default=1,
                   help="runs of each rate, one row each (column repeat; default 1)")
    p.add_argument("--replicas", type=integer(1, 64), default=1,
                   help="data-parallel engines, one process and GPU each (cuda:0..N-1), each "
                   "serving every N-th arrival; the requests' latencies merged into one run "
                   "(default 1; one --block-sizes/--kv-cache-dtype/--prefix-caching value)")
    p.add_argument("--endpoint", metavar="URL", default=None,
                   help="measure a running OpenAI-compatible server (pagebench serve, vLLM, "
                   "SGLang) at URL instead of an engine in this process: TTFT/TPOT/ITL from "
                   "its streamed chunks, KV usage and preemptions from its /metrics where it "
                   "has them (--model names the served model; token ids need "
                   "--vocab-size unless its /v1/models gives vocab_size)")
    p.add_argument("--vocab-size", type=integer(2), default=None,
                   help="--endpoint: the served model's vocabulary (token ids are drawn below)")
    p.add_argument("--step-cost", metavar="CSV", default=None,
                   help="predict instead of measure: the simulator with this step-cost model "
                   "(pagebench step-cost-fit --out) for --model and each block size and cache "
                   "dtype, on the CPU, no model run; the pool is --kv-cache-memory (default "
                   "256MiB) of --model's KV geometry")
    p.add_argument("--steps-out", metavar="FILE", default=None,
                   help="also write every engine step (prefill tokens, decode sequences, "
                   "context tokens, time) to FILE: the step-cost model's data")
    p.add_argument("--append", action="store_true",
                   help="in-process runs: keep the rows already in --out and --steps-out (CSV) "
                   "and add this run's after them (several runs, e.g. two models, one file)")
    add_output_options(p, "rows")
    p.set_defaults(func=run)

    v = sub.add_parser(
        "serve", help="the engine behind an OpenAI-compatible /v1/completions endpoint "
        "(streaming; token-id prompts) with Prometheus /metrics",
        description="Serve --model through the engine on HTTP: POST /v1/completions (prompt: "
        "token ids; stream: true for Server-Sent Events, one chunk per token), GET /v1/models, "
        "GET /metrics. Binds 127.0.0.1 unless --host says otherwise. Needs aiohttp (the "
        "'serve' extra). Ctrl-C stops it.")
    v.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    v.add_argument("--port", type=integer(0, 65535), default=8000,
                   help="port (default %(default)s; 0: any free one, printed)")
    v.add_argument("--block-size", type=integer(1, 1 << 20), default=16,
                   help="KV block size in tokens (default %(default)s)")
    v.add_argument("--kv-cache-dtype", choices=KV_DTYPES, default="auto",
                   help="auto (the model's dtype) or fp8 (default %(default)s)")
    v.add_argument("--prefix-caching", choices=("on", "off"), default="on",
                   help="default %(default)s")
    v.add_argument("--max-model-len", type=integer(2, 1_000_000), default=None,
                   help="longest prompt + output (default: the model's)")
    add_engine_options(v)
    v.set_defaults(func=serve)

    f = sub.add_parser(
        "step-cost-fit", help="fit the step-cost model on serve-bench steps; score the "
        "simulator it drives against measured serve-bench rows",
        description="Fit step_ms = base + per prefill token + per decoding sequence + per 1,000 "
        "context tokens + per step with prompt tokens + per prefilling sequence "
        "(non-negative least squares, one model per model x block size x cache "
        "dtype x mode) on the steps serve-bench --steps-out wrote. With --validate, every "
        "measured serve-bench row is re-run in the simulator (same requests, rate and engine "
        "limits) with its model, and the error of p50/p99 TTFT and TPOT is printed, beside "
        "the error with the run's own measured step times instead of the model, each plus the "
        "engine's host time between steps (what the scheduler and queueing model alone get "
        "wrong).")
    f.add_argument("steps", help="serve_steps CSV (serve-bench --steps-out)")
    f.add_argument("--validate", metavar="CSV", default=None,
                   help="serve_bench CSV of measured runs to predict and compare")
    f.add_argument("--predictions-out", metavar="FILE", default=None,
                   help="--validate: also write the predicted serve_bench rows to FILE")
    add_output_options(f, "fitted models")
    f.set_defaults(func=fit)


def check_args(args) -> None:
    if args.find_max_rate:
        if args.slo_ttft is None and args.slo_tpot is None:
            raise ValueError("--find-max-rate: give --slo-ttft and/or --slo-tpot")
        if not args.rates or math.isinf(args.rates[0]):
            raise ValueError("--find-max-rate: give a finite starting rate as --rates R")
        if args.repeats != 1:
            raise ValueError("--repeats: the --find-max-rate search runs each rate once")
    if args.arrival == "poisson" and not args.rates:
        raise ValueError("--arrival poisson: give --rates")
    if args.kv_cache_memory is not None:
        check_bytes("--kv-cache-memory", args.kv_cache_memory)
    check_output_file("--out", args.out)
    check_output_file("--steps-out", args.steps_out)


def load_serving_model(name: str, device: str, dtype_name: str | None):
    """(model, label): the tiny model, a preset's shape with random weights, or a directory."""
    import torch

    from pagebench.config import PRESETS
    from pagebench.measure import engine_bench
    from pagebench.engine.engine import load_model

    dtype = getattr(torch, dtype_name) if dtype_name else None
    default = torch.bfloat16 if device != "cpu" else torch.float32
    if name == "tiny":
        return engine_bench.tiny_model(device=device, dtype=dtype or torch.float32), "tiny"
    if name.lower() in PRESETS:
        return engine_bench.preset_model(name.lower(), device=device, dtype=dtype or default), \
            name.lower()
    return load_model(name, dtype=dtype, device=device), name


def earlier_rows(path: str | None, append: bool) -> list[dict]:
    """``--append``: the rows already in ``path`` (a CSV; none if it does not exist yet)."""
    import csv
    import os

    if not (append and path and os.path.exists(path)):
        return []
    if path.endswith(".json"):
        raise ValueError(f"--append: {path}: only CSV files are appended to")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def save(args, rows: list[dict], steps: list[dict], before=((), ())) -> None:
    """Write what is measured so far (after each configuration: a long run cut short keeps
    its finished configurations), after ``before``'s rows and steps (``--append``)."""
    write_results(args.out, [*before[0], *rows])
    if args.steps_out:
        write_results(args.steps_out, [*before[1], *steps])


def run(args) -> int:
    check_args(args)
    if args.endpoint:
        return run_endpoint(args)
    if args.step_cost:
        return run_predicted(args)
    from pagebench.measure.engine_bench import mode_options
    from pagebench.measure.serve_bench import ServeConfig, serve_bench, trace_requests
    from pagebench.measure.timing import cpu_threads, environment

    device = torch_device(args.device)
    # prefix caching outermost: a run cut short has every block size and dtype of the first
    configs = [ServeConfig(bs, dt, pc) for pc in args.prefix_caching
               for bs in args.block_sizes for dt in args.kv_cache_dtype]
    if args.replicas > 1:
        return run_replicas(args, device, configs)
    before = (earlier_rows(args.out, args.append), earlier_rows(args.steps_out, args.append))
    with allocating(f"serve-bench of {args.num_requests:,} requests"), \
            cpu_threads(args.threads if device == "cpu" else None):
        model, label = load_serving_model(args.model, device, args.dtype)
        traces = [trace_requests(trace, args.num_requests, model.config.vocab_size,
                                 max_model_len=args.max_model_len,
                                 max_output_len=args.max_output_len, seed=args.seed)
                  for trace in args.trace]
        options = dict(max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       kv_cache_memory=args.kv_cache_memory) | mode_options(args.mode)
        runs = len(configs) * len(traces) * (
            len(args.rates or [None]) * args.repeats if not args.find_max_rate else 1)
        bar = progress(runs * args.num_requests if not args.find_max_rate else None,
                       "requests served")
        try:
            rows, steps = serve_bench(
                model, traces, configs, args.rates or [None],
                poisson=args.arrival == "poisson", time_scale=args.time_scale,
                slo_ttft_ms=args.slo_ttft, slo_tpot_ms=args.slo_tpot,
                find_max_rate=args.find_max_rate, attainment=args.slo_attainment,
                engine_options=options, mode=args.mode, model_name=label,
                environment=environment(device) | dict(torch_threads=args.threads),
                progress=bar, warmup_passes=args.warmup_passes, repeats=args.repeats,
                on_config=lambda rows, steps: save(args, rows, steps, before))
        finally:
            bar.close()
    print(dumps(rows) if args.json else format_table(rows, TABLE))
    return 0


def run_replicas(args, device: str, configs) -> int:
    """serve-bench over ``--replicas`` engines (pagebench.measure.replica_serving)."""
    from pagebench.config import PRESETS
    from pagebench.measure.engine_bench import mode_options
    from pagebench.engine.replicas import check_replicas
    from pagebench.measure import replica_serving as rs
    from pagebench.measure.serve_bench import trace_requests
    from pagebench.measure.timing import environment

    rs.check_replica_run(args.replicas, configs, args.find_max_rate)
    check_replicas(args.replicas, device)
    if args.model == "tiny":
        from pagebench.defaults import TINY_MODEL
        vocab = TINY_MODEL["vocab_size"]
    elif args.model.lower() in PRESETS:
        vocab = PRESETS[args.model.lower()]["vocab_size"]
    else:
        from transformers import AutoConfig
        vocab = AutoConfig.from_pretrained(args.model).vocab_size
    traces = [trace_requests(trace, args.num_requests, vocab, max_model_len=args.max_model_len,
                             max_output_len=args.max_output_len, seed=args.seed)
              for trace in args.trace]
    options = dict(max_num_seqs=args.max_num_seqs,
                   max_num_batched_tokens=args.max_num_batched_tokens,
                   kv_cache_memory=args.kv_cache_memory) | mode_options(args.mode)
    first = "cuda:0" if device == "cuda" else device
    base = environment(first) | dict(
        model=args.model.lower() if args.model.lower() in PRESETS else args.model,
        mode=args.mode, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, torch_threads=args.threads)
    rows = rs.serve_bench_replicas(
        rs.model_builder(load_serving_model, args.model, args.dtype), args.replicas, device,
        traces, configs[0], args.rates or [None], poisson=args.arrival == "poisson",
        time_scale=args.time_scale, slo_ttft_ms=args.slo_ttft, slo_tpot_ms=args.slo_tpot,
        attainment=args.slo_attainment, engine_options=options, base=base,
        threads=args.threads if device == "cpu" else None)
    write_results(args.out, rows)
    print(dumps(rows) if args.json else format_table(rows, TABLE))
    return 0


FIT_TABLE = [("model", "model", 0), ("block_size", "block", 0), ("kv_cache_dtype", "KV dtype", 0),
             ("mode", "mode", 0), ("base_ms", "base (ms)", 3),
             ("prefill_token_ms", "per prefill token (ms)", 5),
             ("decode_seq_ms", "per decode seq (ms)", 4),
             ("context_ktoken_ms", "per 1k context (ms)", 4),
             ("prefill_step_ms", "per prefill step (ms)", 3),
             ("prefill_seq_ms", "per prefill seq (ms)", 3), ("num_steps", "steps", 0),
             ("rel_err_median_decode", "median error: decode", 3),
             ("rel_err_median_prefill", "prefill", 3), ("rel_err_median_mixed", "mixed", 3)]
ERROR_TABLE = [("machine", "machine", 0), ("model", "model", 0), ("trace", "trace", 0),
               ("metric", "metric", 0), ("median_abs_err", "median |error|", 3),
               ("max_abs_err", "largest |error|", 3), ("points", "points", 0),
               ("oracle_median_abs_err", "with measured steps", 3)]


def fit(args) -> int:
    import pandas as pd

    from pagebench.analysis.serving import error_summary, prediction_table
    from pagebench.measure.step_cost import (MeasuredSteps, cost_model, fit_step_cost,
                                             inter_step_gap_ms, predict_serve_bench, run_steps)
    from pagebench.results.datasets import SERVE_BENCH, SERVE_STEPS

    for option, path in (("--out", args.out), ("--predictions-out", args.predictions_out)):
        check_output_file(option, path)
    steps = pd.read_csv(args.steps)  # not validate(): identical steps are not duplicates
    missing = [n for n in SERVE_STEPS.required if n not in steps]
    if missing:
        raise ValueError(f"{args.steps}: not serve-bench steps (no {', '.join(missing)})")
    env = {k: steps[k].iloc[0] for k in ("device", "device_name", "torch_version",
                                         "pagebench_version", "commit") if k in steps}
    rows = fit_step_cost(steps, env)
    write_results(args.out, rows)
    print(dumps(rows) if args.json else format_table(rows, FIT_TABLE))
    if args.validate:
        measured = SERVE_BENCH.validate(pd.read_csv(args.validate), args.validate)
        if "predicted" in measured:
            measured = measured[measured["predicted"] != True]  # noqa: E712 -- NaN is measured
        models = {(r["model"], r["block_size"], r["kv_cache_dtype"], r["mode"] or None): r
                  for r in rows}
        pairs, oracle = [], []
        gap_ms = inter_step_gap_ms(steps, measured.to_dict("records"))
        for m in measured.to_dict("records"):
            mode = m.get("mode") if isinstance(m.get("mode"), str) else None
            model = models.get((m["model"], m["block_size"], m["kv_cache_dtype"], mode))
            if model is not None:
                cost = cost_model(model)
                pairs.append((m, predict_serve_bench(m, cost)))
                oracle.append(predict_serve_bench(m, MeasuredSteps(run_steps(steps, m), cost,
                                                                   gap_ms)))
        if not pairs:
            raise ValueError(f"--validate: no row of {args.validate} has a fitted model")
        write_results(args.predictions_out, [p for _, p in pairs])
        measured_rows = [m for m, _ in pairs]
        errors = error_summary(prediction_table(pd.DataFrame(
            measured_rows + [p for _, p in pairs])))
        replayed = error_summary(prediction_table(pd.DataFrame(measured_rows + oracle)))
        keys = ["machine", "model", "trace", "metric"]
        errors = errors.merge(replayed[keys + ["median_abs_err"]].rename(
            columns={"median_abs_err": "oracle_median_abs_err"}), on=keys, how="left")
        errors = errors.to_dict("records")
        print()
        if not args.json:
            print(f"with measured steps: each step plus {gap_ms:.3f} ms of host time between "
                  "steps (median over the runs with every request at once)")
        print(dumps(errors) if args.json else format_table(errors, ERROR_TABLE))
    return 0


def run_endpoint(args) -> int:
    import asyncio

    from pagebench.measure.endpoint import server_info
    from pagebench.measure.serve_bench import serve_bench_endpoint, trace_requests
    from pagebench.measure.timing import environment

    if not args.endpoint.startswith(("http://", "https://")):
        raise ValueError(f"--endpoint: expected an http:// or https:// URL, got "
                         f"{args.endpoint!r}")
    try:
        info = asyncio.run(server_info(args.endpoint))
    except OSError as e:
        raise ValueError(f"--endpoint: {args.endpoint} does not answer ({e})") from None
    vocab = args.vocab_size or info.get("vocab_size")
    if not vocab:
        raise ValueError("--vocab-size: the server does not say its vocabulary: give it")
    model = info.get("id", "default") if args.model == "tiny" else args.model
    traces = [trace_requests(trace, args.num_requests, int(vocab),
                             max_model_len=args.max_model_len,
                             max_output_len=args.max_output_len, seed=args.seed)
              for trace in args.trace]
    env = environment("cpu") | dict(device="endpoint", device_name=args.endpoint)
    rows = serve_bench_endpoint(args.endpoint, traces, args.rates or [None], model_name=model,
                                poisson=args.arrival == "poisson", time_scale=args.time_scale,
                                slo_ttft_ms=args.slo_ttft, slo_tpot_ms=args.slo_tpot,
                                attainment=args.slo_attainment, environment=env)
    write_results(args.out, rows)
    print(dumps(rows) if args.json else format_table(rows, TABLE))
    return 0


def serve(args) -> int:
    from pagebench.measure.engine_bench import mode_options
    from pagebench.engine.engine import LLMEngine
    from pagebench.measure.timing import cpu_threads

    try:
        from aiohttp import web

        from pagebench.engine.serve import make_app
    except ImportError:
        raise ValueError("serve: needs aiohttp (pip install 'pagebench[serve]')") from None
    if args.kv_cache_memory is not None:
        check_bytes("--kv-cache-memory", args.kv_cache_memory)
    device = torch_device(args.device)
    with cpu_threads(args.threads if device == "cpu" else None):
        model, label = load_serving_model(args.model, device, args.dtype)
        engine = LLMEngine(model, block_size=args.block_size,
                           kv_cache_dtype=args.kv_cache_dtype,
                           enable_prefix_caching=args.prefix_caching == "on",
                           kv_cache_memory=args.kv_cache_memory,
                           max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                           max_num_batched_tokens=args.max_num_batched_tokens,
                           **mode_options(args.mode))
        web.run_app(make_app(engine, label), host=args.host, port=args.port,
                    print=lambda line: print(line, flush=True))
    return 0


def run_predicted(args) -> int:
    from pagebench.config import PRESETS, KVGeometry, parse_bytes
    from pagebench.defaults import TINY_MODEL
    from pagebench.measure.serve_bench import ServeConfig, predict_bench, trace_requests
    from pagebench.sim.step_cost import read_step_cost

    if args.find_max_rate or args.steps_out:
        raise ValueError("--step-cost: predicts a grid of --rates (no --find-max-rate, no "
                         "--steps-out)")
    name = args.model.lower()
    if name != "tiny" and name not in PRESETS:
        raise ValueError(f"--model: {args.model!r}: --step-cost takes tiny or a preset "
                         f"({', '.join(PRESETS)})")
    config = TINY_MODEL if name == "tiny" else PRESETS[name]
    dtype = args.dtype or ("float32" if name == "tiny" else "bfloat16")
    memory = parse_bytes(args.kv_cache_memory or "256MiB")
    configs = [ServeConfig(bs, dt, pc) for pc in args.prefix_caching
               for bs in args.block_sizes for dt in args.kv_cache_dtype]
    costs, blocks = {}, {}
    for c in configs:
        costs[c] = read_step_cost(args.step_cost, block_size=c.block_size,
                                  kv_cache_dtype=c.kv_cache_dtype, model=name)
        geometry = KVGeometry.from_config(config, dtype="float8_e4m3fn"
                                          if c.kv_cache_dtype.startswith("fp8") else dtype)
        blocks[c] = memory // geometry.bytes_per_block(c.block_size)
    traces = [trace_requests(trace, args.num_requests, int(config["vocab_size"]),
                             max_model_len=args.max_model_len,
                             max_output_len=args.max_output_len, seed=args.seed)
              for trace in args.trace]
    rows = predict_bench(traces, configs, args.rates or [None], costs=costs, num_blocks=blocks,
                         model_name=name, poisson=args.arrival == "poisson",
                         time_scale=args.time_scale, slo_ttft_ms=args.slo_ttft,
                         slo_tpot_ms=args.slo_tpot, attainment=args.slo_attainment,
                         max_num_seqs=args.max_num_seqs,
                         max_num_batched_tokens=args.max_num_batched_tokens)
    write_results(args.out, rows)
    print(dumps(rows) if args.json else format_table(rows, TABLE))
    return 0
