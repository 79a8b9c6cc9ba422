"""`pagebench tp-bench`: the tensor-parallel engine and the kernel sweep past one GPU.

Run the engine experiments under ``torchrun --nproc-per-node 2``: every rank runs the same
measurement (pagebench.measure.tp_bench) and rank 0 prints and writes the rows.
"""

from __future__ import annotations

import shlex

from pagebench.cli.options import (
    add_output_options, check_bytes, check_device_memory, check_output_file, dumps,
    every_column, experiment_options, format_table, int_list, integer, torch_device, write_results)

# experiment -> the options it reads, with their defaults (CPU-sized: the tiny random model);
# any other option given is refused rather than silently ignored
OPTIONS = {
    "equality": {"preset": None, "kernel": "auto", "prompt_len": 40, "max_tokens": 24},
    "capacity": {"preset": None, "kv_memory": "2MiB"},
    "throughput": {"preset": None, "kv_memory": "2MiB", "batch_sizes": [1, 4],
                   "prompt_len": 16, "max_tokens": 8, "compile": False},
    "allreduce": {"preset": None, "kv_memory": "2MiB", "batch_sizes": [1, 4],
                  "prompt_len": 16, "max_tokens": 8, "repeat": 50},
    "allreduce-bw": {"preset": None, "batch_sizes": [1, 4], "repeat": 5},
    "replicas": {"preset": None, "kv_memory": "2MiB", "batch_sizes": [1, 4], "prompt_len": 16,
                 "max_tokens": 8, "replicas": 2, "compile": False},
    "attention": {"preset": None, "batch_sizes": [1, 4], "context": 64, "repeat": 30},
    "sweep-wall": {"gpus": [1, 2], "bench_args": "--device cpu", "rows_out": None},
}
TABLES = {
    "equality": [("prefix_caching", "prefix caching", 0), ("kernel", "kernel", 0),
                 ("prompts_equal", "prompts equal", 0), ("num_prompts", "prompts", 0),
                 ("ranks_agree", "ranks agree", 0)],
    "capacity": [("tp", "tp", 0), ("kv_heads_per_gpu", "KV heads per GPU", 0),
                 ("bytes_per_block_per_gpu", "bytes per block per GPU", 0),
                 ("num_blocks_per_gpu", "blocks per GPU", 0)],
    "throughput": [("mode", "run", 0), ("batch", "batch", 0), ("tokens_per_s", "tokens/s", 1),
                   ("decode_tokens_per_s", "decode tokens/s", 1), ("time_s", "time (s)", 3)],
    "allreduce": [("batch", "batch", 0), ("step_ms", "step (ms)", 2),
                  ("allreduce_ms_per_step", "all-reduce per step (ms)", 2),
                  ("allreduce_share", "share", 3),
                  ("isolated_allreduce_us", "one alone (us)", 1),
                  ("isolated_allreduce_share", "share alone", 3)],
    "allreduce-bw": [("batch", "batch", 0), ("bytes", "bytes", 0),
                     ("time_us", "one all-reduce (us)", 1), ("algbw_gbps", "algbw (GB/s)", 2),
                     ("busbw_gbps", "busbw (GB/s)", 2)],
    "replicas": [("mode", "run", 0), ("batch", "batch", 0), ("tokens_per_s", "tokens/s", 1),
                 ("decode_tokens_per_s", "decode tokens/s", 1), ("time_s", "time (s)", 3)],
    "attention": [("tp", "tp", 0), ("num_q_heads", "query heads", 0),
                  ("num_kv_heads", "KV heads", 0), ("batch", "batch", 0),
                  ("context", "context (tokens)", 0), ("time_us", "one layer (us)", 1),
                  ("per_step_us", "per step (us)", 1)],
    "sweep-wall": [("gpus", "GPUs", 0), ("wall_s", "wall (s)", 1),
                   ("startup_s", "startup (s)", 1), ("points", "points", 0),
                   ("rows", "rows", 0, "rows written")],
}


def register(sub) -> None:
    p = sub.add_parser(
        "tp-bench", help="past one GPU: tp=2 vs one device vs two replicas (equality, KV "
        "capacity, tokens/s, all-reduce share and bandwidth, attention per step); the kernel "
        "sweep on 1 vs 2 GPUs",
        description="Measure the tensor-parallel engine. Run equality, capacity, throughput, "
        "allreduce and allreduce-bw under `torchrun --nproc-per-node 2` (NCCL on CUDA, gloo on "
        "the CPU): tp=2 runs over both ranks, and rank 0 writes the rows. equality: greedy "
        "tokens at tp=2 against one device (fp32: the tiny model or --preset's shape; block "
        "tables checked each step; CUDA graphs on a GPU). "
        "capacity: KV blocks per device at the same KV memory per device. throughput: tokens/s "
        "per batch, eager and with CUDA graphs (on CUDA), tp=1 on rank 0 alone while the other "
        "ranks wait, then tp=2. allreduce: the all-reduce share of a tp=2 eager step. "
        "allreduce-bw: one all-reduce of a decode step's hidden states [batch, hidden], bf16, "
        "its time and bus bandwidth (nccl-tests' 2(n-1)/n; set NCCL_NVLS_ENABLE=0). "
        "replicas (one process; it starts one process per replica, on GPUs 0..N-1): aggregate "
        "tokens/s of N independent tp=1 engines, each batch dealt round robin. "
        "attention (one process): the paged decode kernel on one device's heads at tp=1 and 2, "
        "times the layers. sweep-wall (one process; it starts torchrun itself): wall time of "
        "`pagebench bench BENCH_ARGS` on each number of --gpus, each with a cold Triton cache.")
    p.add_argument("experiment", choices=OPTIONS, help="what to measure")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="default: cuda if present, else cpu; under torchrun, cuda is the GPU of "
                   "the rank (LOCAL_RANK)")
    p.add_argument("--preset", default=None, help="random weights in a preset's shape, e.g. "
                   "llama-3-8b: bf16, fp32 for equality (default: the tiny random Qwen2 model)")
    p.add_argument("--kernel", default=None, help="equality: attention backend (default auto)")
    p.add_argument("--kv-memory", default=None, help="capacity, throughput, allreduce, "
                   "replicas: KV cache memory per device, e.g. 16GiB (default 2MiB)")
    p.add_argument("--batch-sizes", type=int_list, default=None,
                   help="throughput, allreduce, allreduce-bw, replicas, attention: sequences "
                   "per run (default 1,4)")
    p.add_argument("--prompt-len", type=integer(1, 1_000_000), default=None,
                   help="throughput, allreduce, replicas: prompt tokens (default 16); "
                   "equality: the longest prompt, prompts of 1..N tokens (default 40)")
    p.add_argument("--max-tokens", type=integer(1, 1_000_000), default=None,
                   help="tokens generated per request (default 8; equality 24)")
    p.add_argument("--context", type=integer(1, 1_000_000), default=None,
                   help="attention: cached tokens per sequence (default 64)")
    p.add_argument("--repeat", type=integer(1, 10_000), default=None,
                   help="attention: timed calls per point (default 30); allreduce: timed "
                   "all-reduces alone (default 50); allreduce-bw: timed loops of 20 "
                   "all-reduces per size (default 5)")
    p.add_argument("--compile", action="store_const", const=True, default=None,
                   help="throughput, replicas: torch.compile the decoder layers before the "
                   "CUDA graphs are captured (mode '..., compiled'; about a minute per 8B "
                   "engine)")
    p.add_argument("--replicas", type=integer(1, 64), default=None,
                   help="replicas: independent engines, one process and GPU each (default 2)")
    p.add_argument("--gpus", type=int_list, default=None,
                   help="sweep-wall: processes (GPUs) per run (default 1,2)")
    p.add_argument("--bench-args", default=None,
                   help="sweep-wall: the `pagebench bench` arguments, one quoted string, e.g. "
                   "'--device cuda --batches 1,16 --contexts 4096' (default '--device cpu')")
    p.add_argument("--rows-out", metavar="FILE", default=None,
                   help="sweep-wall: also write the sweeps' rows (each naming its gpus) to FILE")
    add_output_options(p, "rows")
    p.table_columns = every_column(*TABLES.values())
    p.set_defaults(func=run)


def measure(experiment: str, opts: dict, device) -> list[dict]:
    from types import SimpleNamespace

    import torch

    from pagebench.config import KVGeometry, preset_config
    from pagebench.measure import tp_bench as tp

    if experiment == "equality":
        return tp.greedy_equality(device, opts["kernel"], max_prompt_len=opts["prompt_len"],
                                  max_tokens=opts["max_tokens"], preset=opts["preset"])
    if experiment == "attention":
        from pagebench.defaults import TINY_MODEL

        config = preset_config(opts["preset"]) if opts["preset"] else TINY_MODEL
        return tp.attention_per_step(device, KVGeometry.from_config(config),
                                     opts["batch_sizes"], opts["context"], (1, 2),
                                     opts["repeat"])
    if experiment == "allreduce-bw":
        from pagebench.defaults import TINY_MODEL

        config = preset_config(opts["preset"]) if opts["preset"] else \
            SimpleNamespace(**TINY_MODEL)
        return tp.allreduce_bandwidth(device, config, opts["batch_sizes"],
                                      repeat=opts["repeat"], model=opts["preset"] or "tiny")
    if experiment == "replicas":
        return tp.replica_throughput(opts["preset"], opts["kv_memory"], opts["replicas"],
                                     torch.device(device).type, opts["batch_sizes"],
                                     opts["prompt_len"], opts["max_tokens"],
                                     compile_model=opts["compile"])
    model, name = tp.random_model(opts["preset"], device)
    if experiment == "capacity":
        return tp.capacity(model, name, opts["kv_memory"])
    run = dict(batch_sizes=opts["batch_sizes"], prompt_len=opts["prompt_len"],
               max_tokens=opts["max_tokens"])
    if experiment == "throughput":
        return tp.throughput(model, name, opts["kv_memory"], compile_model=opts["compile"],
                             **run)
    return tp.allreduce_share(model, name, opts["kv_memory"], repeat=opts["repeat"], **run)


def check_model_options(opts: dict) -> None:
    """``--preset`` and ``--kv-memory`` checked before any model is built."""
    from pagebench.config import PRESETS, preset_key

    if opts.get("preset") is not None and preset_key(opts["preset"]) not in PRESETS:
        raise ValueError(f"--preset: unknown {opts['preset']!r} (presets: {', '.join(PRESETS)})")
    if "kv_memory" in opts:
        check_bytes("--kv-memory", opts["kv_memory"])


def check_kv_memory(opts: dict, device) -> None:
    """Refuse a KV cache larger than the memory free on ``device`` before allocating it."""
    from pagebench.config import parse_bytes

    if "kv_memory" not in opts:
        return
    check_device_memory("--kv-memory", parse_bytes(opts["kv_memory"]),
                        "the KV cache of one device", device)


def run(args) -> int:
    from pagebench.measure import distributed

    opts = experiment_options(args, "tp-bench", OPTIONS)
    check_output_file("--out", args.out)
    check_model_options(opts)
    if args.experiment == "sweep-wall":
        check_output_file("--rows-out", opts["rows_out"])
        if distributed.world_from_environment()[1] > 1:
            raise ValueError("tp-bench sweep-wall: run it as one process; it starts torchrun")
        try:
            bench_args = shlex.split(opts["bench_args"])
        except ValueError as e:
            raise ValueError(f"--bench-args: {e}") from None
        if "--out" in bench_args or any(a.startswith("--out=") for a in bench_args):
            raise ValueError("--bench-args: leave out --out; each run's rows go to --rows-out")
        rows, sweep_rows = distributed.sweep_wall(opts["gpus"], bench_args)
        write_results(opts["rows_out"], sweep_rows)
    else:
        device = distributed.rank_device(torch_device(args.device))
        check_kv_memory(opts, device)
        started = distributed.join_group(device)
        rows = measure(args.experiment, opts, device)
        distributed.leave_group(started)
        if distributed.world_from_environment()[0] != 0:
            return 0  # rank 0 writes the rows: tp=2 rows are the same on every rank
    write_results(args.out, rows)
    print(dumps(rows) if args.json else format_table(rows, TABLES[args.experiment], legend=True))
    return 0
