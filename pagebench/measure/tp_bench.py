"""Tensor-parallel measurements as functions returning tidy rows; one process per rank.

Run under ``torchrun --nproc-per-node N`` (``pagebench tp-bench``), every rank calling the same
function with the same arguments: a tp=N engine runs SPMD, so its rows are the same on every
rank. A timed tp=1 baseline (``throughput``) runs on rank 0 alone while the others wait; the
untimed ones (equality's reference, capacity) run on every rank at once, each on its own
device. Rank 0's rows are the ones written. Outside torchrun the world is one process and only
tp=1 runs. ``replica_throughput`` (one process) starts its own replica processes
(``pagebench.engine.replicas``); ``allreduce_bandwidth`` times the collective alone.

The rows are those of ``pagebench.results.datasets``' ``tp_*`` schemas. The defaults run in
seconds on a CPU (gloo) with the tiny random model; pass a preset's model for device runs.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from pagebench.config import KVGeometry, dtype_name, parse_bytes
from pagebench.defaults import BLOCK_SIZE, TINY_MODEL
from pagebench.engine.parallel import world_from_environment
from pagebench.measure import engine_bench
from pagebench.engine.engine import LLMEngine
from pagebench.engine.sampling import SamplingParams
from pagebench.errors import ConfigError
from pagebench.results import datasets
from pagebench.measure.timing import environment, measure

# the batch of the warm-up call before an engine's timed runs: kernels compiled, allocator grown
WARMUP_BATCH = 16
# torch.compile of the layers is left out unless asked (compile_model): it costs a minute per
# 8B engine, and the 8B decode step is weight-bound
ENGINE_OPTIONS = dict(block_size=BLOCK_SIZE, max_num_seqs=256, max_num_batched_tokens=8192,
                      compile_model=False)


def tp_sizes() -> tuple[int, ...]:
    """The tensor-parallel sizes this world runs: 1 and, under torchrun, the world size."""
    _, world = world_from_environment()
    return (1,) if world == 1 else (1, world)


def parallel_size(what: str) -> int:
    """The world size, for a measurement that needs tp > 1; ConfigError outside torchrun."""
    _, world = world_from_environment()
    if world < 2:
        raise ConfigError(f"{what}: needs tensor parallelism; run under `torchrun "
                          "--nproc-per-node 2`")
    return world


def random_model(preset: str | None, device, dtype=torch.bfloat16):
    """(model, name): random weights in ``preset``'s shape, or the tiny model (preset None)."""
    if preset is None:
        return engine_bench.tiny_model(dtype=dtype, device=device), "tiny-qwen2-random"
    return engine_bench.preset_model(preset, dtype=dtype, device=device), f"{preset}-random"


def model_dtype(model) -> str:
    return dtype_name(next(model.parameters()).dtype)


def _generate_seconds(engine: LLMEngine, prompts, params) -> float:
    return engine_bench.wall(lambda: engine.generate(prompts, params), engine.tp.device)[0]


def greedy_equality(device, kernel: str = "auto", num_prompts: int = 16, max_prompt_len: int = 40,
                    max_tokens: int = 24, seed: int = 3, preset: str | None = None) -> list[dict]:
    """Greedy tokens of the tp=N engine against the single-device engine on the same fp32
    model (the tiny one, or random weights in ``preset``'s shape), block tables checked on
    every rank each step, prefix caching off and on; whether every rank returned the same
    outputs. On CUDA both engines decode through CUDA graphs (``cuda_graphs`` says whether
    the tp=N one did)."""
    tp = parallel_size("equality")
    device = torch.device(device)

    def model():
        if preset is None:
            return engine_bench.tiny_model(device=device)
        return engine_bench.preset_model(preset, dtype=torch.float32, device=device)

    prompts = engine_bench.random_prompts(num_prompts, 1, max_prompt_len, model_vocab(preset),
                                   seed=seed)
    rows = []
    for prefix in (False, True):
        options = dict(block_size=BLOCK_SIZE, num_blocks=512, kernel=kernel,
                       enable_prefix_caching=prefix, max_num_seqs=num_prompts,
                       compile_model=False)
        single = LLMEngine(model(), **options)
        want = engine_bench.greedy_tokens(single, prompts, max_tokens)
        del single
        engine = LLMEngine(model(), tensor_parallel_size=tp, **options)
        engine.tp.check_tables = True
        got = engine_bench.greedy_tokens(engine, prompts, max_tokens)
        every = [None] * tp
        dist.all_gather_object(every, got, group=engine.tp.group)
        rows.append(datasets.TP_EQUALITY.row(**environment(device) | dict(
            experiment="tp_greedy_equality",
            model=f"{preset}-random-fp32" if preset else "tiny-qwen2-fp32", dtype="float32",
            tp=tp, prefix_caching=prefix, kernel=engine.runner.decode_backend.name,
            cuda_graphs=bool(engine.graphs()["cuda_graphs"]),
            num_prompts=len(prompts), prompts_equal=engine_bench.agreement(got, want)[0],
            ranks_agree=all(e == every[0] for e in every),
            kv_heads_per_gpu=engine.kv_heads_per_rank)))
        del engine
        engine_bench.release_memory(device)
    return rows


def model_vocab(preset: str | None) -> int:
    """The vocabulary of ``preset``'s shape (None: the tiny model's)."""
    if preset is None:
        return TINY_MODEL["vocab_size"]
    from pagebench.config import preset_config

    return preset_config(preset).vocab_size


def capacity(model, name: str, kv_memory) -> list[dict]:
    """KV blocks per device at each tensor-parallel size, the same KV memory per device.
    ``model`` is sharded in place by the tp > 1 engine."""
    geometry = KVGeometry.from_config(model.config, dtype=next(model.parameters()).dtype)
    device = next(model.parameters()).device
    rows = []
    for tp in tp_sizes():
        engine = LLMEngine(model, kv_cache_memory=kv_memory, tensor_parallel_size=tp,
                           enforce_eager=True, **ENGINE_OPTIONS)
        rows.append(datasets.TP_CAPACITY.row(**environment(device) | dict(
            model=name, dtype=model_dtype(model), block_size=BLOCK_SIZE, tp=tp,
            kv_heads_per_gpu=engine.kv_heads_per_rank,
            kv_cache_bytes_per_gpu=engine.runner.kv_cache_bytes,
            kv_memory_budget_bytes=parse_bytes(kv_memory),
            bytes_per_block_per_gpu=geometry.per_rank(tp).bytes_per_block(BLOCK_SIZE),
            num_blocks_per_gpu=engine.num_blocks)))
        del engine
        engine_bench.release_memory(device)
    return rows


def _prompts(vocab: int, batch_sizes, prompt_len: int) -> dict[int, list]:
    return {b: engine_bench.random_prompts(b, prompt_len, prompt_len, vocab, seed=b)
            for b in (*batch_sizes, WARMUP_BATCH)}


def mode_label(tp: int, eager: bool, graphs: bool, replicas: int = 1,
               compiled: bool = False) -> str:
    """How decode ran: ``tp=2, CUDA graphs``, ``tp=1, eager``, ``2 replicas, CUDA graphs``, or
    ``tp=2, default (no graphs)`` where the engine asked for graphs and has none (a CPU, a
    failed capture); ``, compiled`` after a graph run of ``torch.compile``'d layers."""
    who = f"{replicas} replicas, " if replicas > 1 else f"tp={tp}, "
    how = "eager" if eager else "CUDA graphs" if graphs else "default (no graphs)"
    return who + how + (", compiled" if compiled and graphs and not eager else "")


def baseline_barrier():
    """A barrier over the world for ranks that wait while rank 0 measures alone: gloo, with
    an hour's timeout (an NCCL barrier would time out under a long baseline). None: one
    process."""
    _, world = world_from_environment()
    if world == 1:
        return None
    from datetime import timedelta

    group = dist.new_group(backend="gloo", timeout=timedelta(hours=1))
    return lambda: dist.barrier(group=group)


def throughput(model, name: str, kv_memory, batch_sizes=(1, 4), prompt_len: int = 16,
               max_tokens: int = 8, compile_model: bool = False) -> list[dict]:
    """Engine tokens/s per batch at tp=1 and, under torchrun, tp=N; eager and by default (CUDA
    graphs for decode on CUDA): ``batch`` prompts of ``prompt_len`` tokens, ``max_tokens``
    each, after one warm-up call. tp=1 runs first and on rank 0 alone while the other ranks
    wait (a baseline never shares the host with another rank's); tp > 1 then shards ``model``
    in place. Rank 0's rows hold both. ``compile_model``: the graph runs ``torch.compile``
    the layers first (mode ``..., compiled``)."""
    device = next(model.parameters()).device
    prompts = _prompts(model.config.vocab_size, batch_sizes, prompt_len)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    rank, _ = world_from_environment()
    wait = baseline_barrier()
    base = environment(device) | dict(model=name, dtype=model_dtype(model),
                                      block_size=BLOCK_SIZE, prompt_len=prompt_len,
                                      max_tokens=max_tokens)
    rows = []
    for tp in tp_sizes():
        if tp == 1 and rank != 0:
            wait()  # rank 0 measures the baseline alone
            continue
        for eager in (True, False):
            rows += _engine_rows(model, kv_memory, tp, eager, prompts,
                                 batch_sizes, params,
                                 base | dict(baseline_alone=True) if tp == 1 else base,
                                 compile_model and not eager)
        if tp == 1 and wait is not None:
            wait()
    return rows


def _engine_rows(model, kv_memory, tp: int, eager: bool, prompts, batch_sizes, params,
                 base: dict, compile_model: bool = False) -> list[dict]:
    device = next(model.parameters()).device
    engine = LLMEngine(model, kv_cache_memory=kv_memory, tensor_parallel_size=tp,
                       enforce_eager=eager, **ENGINE_OPTIONS | dict(compile_model=compile_model))
    graphs = bool(engine.stats.cuda_graphs)
    _generate_seconds(engine, prompts[WARMUP_BATCH], params)
    rows = []
    for b in batch_sizes:
        seconds = _generate_seconds(engine, prompts[b], params)
        stats = engine.stats
        rows.append(datasets.TP_THROUGHPUT.row(**base | dict(
            tp=tp, mode=mode_label(tp, eager, graphs, compiled=compile_model),
            cuda_graphs=graphs, batch=b,
            time_s=seconds, num_steps=len(stats.steps),
            tokens_per_s=b * params.max_tokens / seconds,
            decode_tokens_per_s=stats.decode_tokens_per_s, num_blocks_per_gpu=engine.num_blocks,
            num_preemptions=stats.num_preemptions)))
    del engine
    engine_bench.release_memory(device)
    return rows


def replica_model(preset: str | None, device):
    """Replica processes' model builder (picklable through ``functools.partial``)."""
    return random_model(preset, device)[0]


def replica_throughput(preset: str | None, kv_memory, replicas: int = 2, device: str = "cpu",
                       batch_sizes=(1, 4), prompt_len: int = 16, max_tokens: int = 8,
                       eager: bool = False, compile_model: bool = False) -> list[dict]:
    """Aggregate tokens/s of ``replicas`` independent tp=1 engines (one process and device
    each, ``pagebench.engine.replicas``) per batch: the batch's prompts dealt round robin,
    every replica starting each batch together; the slowest replica's time. One process:
    it starts the replicas itself."""
    from functools import partial

    from pagebench.engine import replicas as dp

    if world_from_environment()[1] > 1:
        raise ConfigError("replicas: run as one process; it starts one process per replica")
    replicas = dp.check_replicas(replicas, device)
    prompts = _prompts(model_vocab(preset), batch_sizes, prompt_len)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    warm = [prompts[WARMUP_BATCH][i::replicas] for i in range(replicas)]
    jobs = [[] for _ in range(replicas)]
    for b in batch_sizes:
        for i, share in enumerate(dp.split_round_robin(b, replicas)):
            jobs[i].append((share, [prompts[b][j] for j in share], params))
    setup = dp.ReplicaSetup(
        partial(replica_model, preset), device,
        dict(ENGINE_OPTIONS, kv_cache_memory=kv_memory, enforce_eager=eager,
             compile_model=compile_model),
        threads=max(1, torch.get_num_threads() // replicas) if device == "cpu" else None)
    per_replica = dp.run_replicas(setup, dp.timed_generate,
                                  [[(range(len(w)), w, params)] + j for w, j in zip(warm, jobs)])
    first = torch.device(device, 0) if device == "cuda" else torch.device(device)
    name = f"{preset}-random" if preset else "tiny-qwen2-random"
    rows = []
    for job, b in enumerate(batch_sizes, start=1):  # job 0: the warm-up
        run = dp.merge_generations(per_replica, job, b)
        graphs = run["cuda_graphs"]
        rows.append(datasets.TP_THROUGHPUT.row(**environment(first) | dict(
            model=name, dtype=dtype_name(torch.bfloat16), block_size=BLOCK_SIZE,
            prompt_len=prompt_len, max_tokens=max_tokens, tp=1, replicas=replicas,
            mode=mode_label(1, eager, graphs, replicas, compile_model), cuda_graphs=graphs,
            batch=b,
            time_s=run["seconds"], num_steps=run["num_steps"],
            tokens_per_s=run["num_tokens"] / run["seconds"],
            decode_tokens_per_s=run["decode_tokens_per_s"])))
    return rows


def allreduce_share(model, name: str, kv_memory, batch_sizes=(1, 4), prompt_len: int = 16,
                    max_tokens: int = 8, repeat: int = 50) -> list[dict]:
    """The all-reduce share of a tp=N eager step, per batch: the seconds of every all-reduce
    of a ``generate`` call (CUDA events, or the clock on a CPU) over the call's wall time; and
    one all-reduce of a decode step's hidden states ``[batch, hidden]`` timed alone (median of
    ``repeat``) times the calls per step, over the mean step."""
    tp = parallel_size("allreduce")
    device = next(model.parameters()).device
    engine = LLMEngine(model, kv_cache_memory=kv_memory, tensor_parallel_size=tp,
                       enforce_eager=True, **ENGINE_OPTIONS)
    prompts = _prompts(model.config.vocab_size, batch_sizes, prompt_len)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    _generate_seconds(engine, prompts[WARMUP_BATCH], params)
    hidden, layers = model.config.hidden_size, model.config.num_hidden_layers
    calls = 2 * layers  # after o_proj and down_proj
    rows = []
    for b in batch_sizes:
        engine.tp.collective_times = []
        seconds = _generate_seconds(engine, prompts[b], params)
        reduce_s = engine.tp.collective_seconds()
        engine.tp.collective_times = None
        steps = len(engine.stats.steps)
        x = torch.randn(b, hidden, dtype=next(model.parameters()).dtype, device=device)
        alone = measure(lambda: dist.all_reduce(x, group=engine.tp.group), device=device.type,
                        warmup=5, repeat=repeat, flush_l2=False)
        step_us = seconds / steps * 1e6
        rows.append(datasets.TP_ALLREDUCE.row(**environment(device) | dict(
            model=name, dtype=model_dtype(model), block_size=BLOCK_SIZE, prompt_len=prompt_len,
            max_tokens=max_tokens, tp=tp, batch=b, eager=True, time_s=seconds,
            num_steps=steps, step_ms=step_us / 1e3, allreduce_calls_per_step=calls,
            allreduce_ms_per_step=reduce_s / steps * 1e3, allreduce_share=reduce_s / seconds,
            isolated_allreduce_us=alone.median_us,
            isolated_allreduce_share=calls * alone.median_us / step_us)))
    return rows


def attention_per_step(device, geometry: KVGeometry, batch_sizes=(1, 4), context: int = 64,
                       tensor_parallel_sizes=(1, 2), repeat: int = 30,
                       dtype=torch.bfloat16) -> list[dict]:
    """The paged decode kernel (the best for this device) on one device's heads at each
    tensor-parallel size (``geometry.per_rank(tp)``), ``batch`` sequences of ``context``
    tokens, times the layers: attention per decode step. No collective: one process."""
    from pagebench.kernels import resolve

    device = torch.device(device)
    d = geometry.head_dim
    backend = resolve("decode", "auto", device, dtype, BLOCK_SIZE, d)
    cuda = device.type == "cuda"
    per_seq = -(-context // BLOCK_SIZE)
    rows = []
    for b in batch_sizes:
        for tp in tensor_parallel_sizes:
            heads = geometry.per_rank(tp)
            k = torch.randn(b * per_seq, BLOCK_SIZE, heads.num_kv_heads, d, dtype=dtype,
                            device=device)
            v = torch.randn_like(k)
            q = torch.randn(b, heads.num_q_heads, d, dtype=dtype, device=device)
            tables = torch.arange(b * per_seq, dtype=torch.int32, device=device).view(b, per_seq)
            lens = torch.full((b,), context, dtype=torch.int32, device=device)
            t = measure(lambda: backend.decode(q, k, v, tables, lens, d ** -0.5),
                        device=device.type, repeat=repeat, cuda_graph=cuda)
            rows.append(datasets.TP_ATTENTION.row(**environment(device) | dict(
                backend=backend.name, dtype=dtype_name(dtype), tp=tp,
                num_q_heads=heads.num_q_heads, num_kv_heads=heads.num_kv_heads, head_dim=d,
                batch=b, context=context, block_size=BLOCK_SIZE, time_us=t.median_us,
                layers=geometry.num_layers, per_step_us=t.median_us * geometry.num_layers)))
    return rows


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """All-reduce bus bandwidth, bytes/s, as nccl-tests defines it: the algorithm bandwidth
    (``nbytes / seconds``) times ``2 (n - 1) / n``, the share of the data each link carries
    in a ring; comparable with the link's peak whatever ``n``."""
    return nbytes / seconds * 2 * (world - 1) / world


def _timed_loop(fn, iters: int, device: torch.device) -> float:
    """Seconds per call of ``iters`` back-to-back calls of ``fn`` (as nccl-tests times them),
    after the ranks line up at a barrier."""
    import time

    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / iters


def allreduce_bandwidth(device, config, batch_sizes=(1, 4), dtype=torch.bfloat16,
                        iters: int = 20, repeat: int = 5, model: str = "") -> list[dict]:
    """All-reduce time and bandwidth at the sizes a decode step reduces: ``[batch, hidden]``
    of ``dtype`` (``config.hidden_size``), over the whole world (NCCL on CUDA, gloo on the
    CPU). Per size: the median of ``repeat`` loops of ``iters`` back-to-back all-reduces,
    after 5 untimed ones. Rows ascend by size; every rank returns the same sizes (rank 0's
    times are the ones written)."""
    world = parallel_size("allreduce-bw")
    device = torch.device(device)
    hidden = config.hidden_size
    item = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for b in sorted(set(batch_sizes)):
        x = torch.randn(b, hidden, device=device).to(dtype)
        for _ in range(5):
            dist.all_reduce(x)
        loops = sorted(_timed_loop(lambda: dist.all_reduce(x), iters, device)
                       for _ in range(repeat))
        seconds = loops[len(loops) // 2]
        nbytes = b * hidden * item
        rows.append(datasets.TP_ALLREDUCE_BW.row(**environment(device) | dict(
            model=model, dtype=dtype_name(dtype), world=world, backend=dist.get_backend(),
            nvls=os.environ.get("NCCL_NVLS_ENABLE", ""), batch=b, hidden=hidden,
            bytes=nbytes, time_us=seconds * 1e6, algbw_gbps=nbytes / seconds / 1e9,
            busbw_gbps=bus_bandwidth(nbytes, seconds, world) / 1e9, iters=iters,
            repeat=repeat)))
    return rows
