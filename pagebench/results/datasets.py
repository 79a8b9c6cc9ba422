"""Every dataset the report reads: one :class:`~pagebench.results.schema.Schema` each.

Conventions shared by all of them:
- ``block_size`` is the paged block size in tokens; a row that does not page (a contiguous
  kernel, a naive allocator, transformers' generate) leaves it empty. That is its one encoding
  of "contiguous"; ``layout`` says the same in words where a dataset mixes both.
- ``backend`` is the timed kernel variant, ``<kernel>-<layout>`` (``triton-paged``);
  ``kernel`` is the registry's backend name (``triton``), the same column engine rows carry;
  the prefill sweep's baseline, causal SDPA (``sdpa-contiguous``), is not a registry backend
  and has no ``kernel``.
- ``batch`` is the number of sequences decoded (or requests) together.
- Engine rows carry ``experiment`` = their dataset's name.
"""

from __future__ import annotations

from pathlib import Path

from pagebench.results.schema import Column, Schema, nullable, optional

C = Column

ENVIRONMENT = optional(
    C("device", "str", "cpu or cuda[:n]"),
    C("device_name", "str", "GPU name, or the CPU's architecture"),
    C("torch_version", "str", "torch version"), C("triton_version", "str", "Triton version"),
    C("pagebench_version", "str", "pagebench version"),
    C("python_version", "str", "Python version"), C("commit", "str", "pagebench git commit"),
    C("cpu_count", "int", "logical CPUs"), C("torch_threads", "int", "torch intra-op threads"),
    C("machine", "str", "device label (pagebench.results.devices)"),
    C("source", "str", "file or function the row came from"), C("note", "str", "free text"),
    C("timing_harness", "int", "pagebench.measure.timing.HARNESS the row was timed with; empty: 1"),
    C("timestamp", "str", "UTC start (ISO 8601) of the run that measured the row (rows "
                          "committed before rows carried one: their commit's date); it orders "
                          "commits (pagebench.results.commits)"),
)
BLOCK_SIZE = nullable(C("block_size", "int", "paged block size in tokens; empty: not paged"))
KERNEL = nullable(C("kernel", "str", "registry backend name (triton, torch, flex, sdpa); empty: "
                           "not a registry backend (the prefill sweep's SDPA baseline)"))
LAYOUT = C("layout", "str", "paged or contiguous KV cache")
BACKEND = C("backend", "str", "timed variant, <kernel>-<layout>")
CUDA_GRAPHS = C("cuda_graphs", "bool", "replayed from CUDA graphs")
TIME_US = C("time_us", "float", "median time per call, microseconds")
TOKENS_PER_S = C("tokens_per_s", "float", "generated tokens per second, end to end")
MODEL = C("model", "str", "model name or <type>-L<layers>-H<hidden>")
DTYPE = C("dtype", "str", "element type of the model or K/V cache")
MODEL_SHAPE = C("model_shape", "str", "preset whose attention shape was used")
LENGTHS = C("lengths", "str", "the batch's lengths: uniform, lognormal:MU,SIGMA or trace:NAME "
            "(mean = context), or mixed:KxQ+Mx1@C (K chunks of Q tokens and M decodes at C)")
READ_GBPS = C("read_gbps", "float", "read-only bandwidth of the device (a reduction), GB/s")
HEADS = optional(C("num_q_heads", "int", "query heads"), C("num_kv_heads", "int", "KV heads"),
                 C("head_dim", "int", "head dimension"))


def schema(name: str, meaning: str, *columns: Column, environment: bool = True) -> Schema:
    """A schema of ``columns`` (+ the environment columns); a column named twice keeps its
    first declaration (a dataset's own ``block_size`` over the shared optional one)."""
    first: dict[str, Column] = {}
    for c in columns + (ENVIRONMENT if environment else ()):
        first.setdefault(c.name, c)
    return Schema(name, meaning, tuple(first.values()))


# ---- kernels -----------------------------------------------------------------------------

KERNELS = schema(
    "kernels", "one timed decode step of one kernel variant (measure.kernel_sweep.run_sweep)",
    C("device", "str", "cpu or cuda[:n]"), DTYPE, MODEL_SHAPE, C("batch", "int", "sequences"),
    C("context", "int", "cached tokens per sequence"), BLOCK_SIZE, BACKEND, KERNEL, LAYOUT,
    CUDA_GRAPHS, TIME_US,
    *optional(C("q20_us", "float", "20th percentile"), C("q80_us", "float", "80th percentile"),
              C("kv_bytes", "int", "K/V bytes a step reads"),
              C("gbps", "float", "kv_bytes / time, GB/s"),
              C("copy_gbps", "float", "device copy bandwidth, GB/s"),
              C("table_layout", "str", "block-table layout: contiguous, shuffled, aged"),
              C("adjacent_fraction", "float", "share of consecutive table entries adjacent"),
              C("footprint_bytes", "int", "unique K/V bytes touched"),
              C("l2_bytes", "int", "L2 size"), C("fits_l2", "bool", "footprint <= L2"),
              C("kv_dtype", "str", "K/V cache element type"), LENGTHS, READ_GBPS),
    *HEADS)
EQUIVALENCE_COLUMNS = (
    C("backend", "str", "variant checked"), C("ok", "bool", "within tolerance"),
    *optional(DTYPE, C("shape", "str", "(q heads, kv heads, head dim)"), BLOCK_SIZE,
              C("rel_err", "float", "relative error against float64"),
              C("tolerance", "float", "allowed relative error"),
              C("error", "str", "exception raised, if any")))
KERNELS_EQUIVALENCE = schema(
    "kernels_equivalence", "one decode case against the float64 reference",
    *EQUIVALENCE_COLUMNS, environment=False)
KERNELS_PREFILL = schema(
    "kernels_prefill", "one timed prefill call (measure.prefill_sweep.run_prefill_sweep)",
    MODEL_SHAPE, C("batch", "int", "sequences"),
    C("query_len", "int", "new tokens per sequence"),
    C("cached", "int", "tokens already cached per sequence"), BLOCK_SIZE, BACKEND, KERNEL,
    LAYOUT, CUDA_GRAPHS, TIME_US,
    *optional(DTYPE, C("q20_us", "float", "20th percentile"),
              C("q80_us", "float", "80th percentile"), C("tflops", "float", "achieved TFLOP/s"),
              C("kv_dtype", "str", "K/V cache element type"), LENGTHS),
    *HEADS)
KERNELS_PREFILL_EQUIVALENCE = schema(
    "kernels_prefill_equivalence", "one prefill case against the float64 reference",
    *EQUIVALENCE_COLUMNS, environment=False)
KERNELS_FP8 = schema(
    "kernels_fp8", "one timed decode (Triton, or the CUDA fp8 kernel) or Triton prefill call "
    "with a bf16 or fp8 cache (measure.fp8_sweep.run_fp8_sweep)",
    C("op", "str", "decode or prefill"), C("cache_dtype", "str", "K/V cache element type"),
    C("batch", "int", "sequences"), C("context", "int", "cached tokens"), BLOCK_SIZE, TIME_US,
    *optional(C("backend", "str", "kernel backend (missing: triton)"),
              C("launch", "str", "launch configuration"), C("kv_bytes", "float", "bytes read"),
              C("gbps", "float", "GB/s"), C("copy_gbps", "float", "copy GB/s"),
              C("copy_fraction", "float", "gbps / copy_gbps"),
              C("err_vs_dequantised", "float", "error against the dequantised cache"),
              C("err_vs_bf16_cache", "float", "error against a bf16 cache"),
              C("query_len", "int", "prefill chunk"), C("cached", "int", "cached tokens"),
              MODEL_SHAPE),
    *HEADS)
KERNELS_LAYOUT = schema(
    "kernels_layout", "one timed paged decode step over a given block-table layout: a row of "
    "the decode sweep over several layouts (measure.kernel_sweep.run_sweep, "
    "`pagebench bench --layouts ...`)",
    C("batch", "int", "sequences"), C("context", "int", "cached tokens"), BLOCK_SIZE,
    C("table_layout", "str", "contiguous, shuffled or aged"), TIME_US,
    *optional(*KERNELS.columns))

KERNELS_PLAN = schema(
    "kernels_plan", "host time of one FlashInfer plan at one decode point "
    "(scripts/gpu_flashinfer.py)",
    MODEL_SHAPE, C("batch", "int", "sequences"), C("context", "int", "mean cached tokens"),
    BLOCK_SIZE, BACKEND,
    C("plan_us", "float", "a new wrapper's first plan (buffers made, table converted), us"),
    *optional(C("replan_us", "float", "the table converted and planned again on the same "
                "wrapper (a serving step's cost), us"), LENGTHS))

# ---- engine ------------------------------------------------------------------------------

ENGINE_RUN = optional(
    MODEL, DTYPE, BLOCK_SIZE, KERNEL, TOKENS_PER_S, CUDA_GRAPHS,
    C("time_s", "float", "wall seconds"),
    C("decode_tokens_per_s", "float", "tokens/s in decode steps"),
    C("num_generated_tokens", "int", "tokens generated"),
    C("peak_blocks", "int", "most KV blocks in use at once"),
    C("mean_blocks", "float", "mean KV blocks in use"), C("num_blocks", "int", "pool size"),
    C("num_preemptions", "int", "sequences preempted"),
    C("prefill_kernel", "str", "prefill backend"), C("max_batch", "int", "largest step batch"),
    C("num_requests", "int", "requests"), C("max_tokens", "int", "tokens per request"),
    C("method", "str", "engine or a transformers generation method"))


EXPERIMENT = C("experiment", "str", "the dataset's name; in ``engine``, the measurement's")


def engine_schema(name: str, meaning: str, *columns: Column) -> Schema:
    return schema(name, meaning, *columns, *optional(EXPERIMENT), *ENGINE_RUN)


ENGINE_BATCH = engine_schema(
    "engine_batch", "engine throughput at one (block size, batch) (measure.engine_bench."
    "throughput_vs_batch)", C("batch", "int", "requests admitted at once"), BLOCK_SIZE,
    TOKENS_PER_S, *optional(C("mode", "str", "graphs, eager, ...: how decode steps ran")))
ENGINE_COW = engine_schema(
    "engine_cow", "blocks used by one request with n completions (measure.engine_bench.cow_comparison)",
    C("variant", "str", "n=1, n=4 shared, or 4 separate requests"),
    nullable(C("n", "int", "completions sharing one prompt; empty for separate requests")),
    C("peak_blocks", "int", "most KV blocks in use at once"))
ENGINE_PREFIX = engine_schema(
    "engine_prefix", "one run with prefix caching on or off (measure.engine_bench."
    "prefix_cache_comparison)", C("enable_prefix_caching", "bool", "prefix caching on"),
    C("prefix_cache_hit_rate", "float", "prompt tokens served from the cache / prompt tokens"),
    C("num_computed_prompt_tokens", "int", "prompt tokens computed"),
    C("peak_blocks", "int", "most KV blocks in use at once"))
ENGINE_POOL = engine_schema(
    "engine_pool", "one run at a pool size (measure.engine_bench.pool_size_sweep)",
    C("num_blocks", "int", "pool size in blocks"), C("num_preemptions", "int", "preemptions"),
    TOKENS_PER_S, C("recomputed_tokens", "int", "prompt tokens computed again after preemption"))
# the equal-memory control: the engine with max_num_seqs capped at padded generate's batch
EQUAL_MEMORY_CONTROL = "engine_contiguous_batch"
ENGINE_EQUAL_MEMORY = engine_schema(
    "engine_equal_memory", "the engine, the engine capped at padded generate's concurrency, or "
    "padded generate, in the same KV bytes (measure.engine_bench.equal_memory_comparison)",
    C("method", "str", f"engine, {EQUAL_MEMORY_CONTROL} or padded_generate"), TOKENS_PER_S,
    C("concurrent_seqs", "int", "sequences at once"),
    *optional(C("tokens_per_s_min", "float", "slowest of the interleaved repeats"),
              C("tokens_per_s_max", "float", "fastest of the interleaved repeats"),
              C("repeats", "int", "timed repeats after one warm-up"),
              C("max_num_seqs", "int", "the engine's cap on sequences at once")))
ENGINE_COMPARE = engine_schema(
    "engine_compare", "the engine or a transformers method on the same requests",
    C("method", "str", "engine, padded_generate, generate_batch, ..."),
    C("batch", "int", "requests"),
    nullable(C("tokens_per_s", "float", "tokens/s; empty if it failed")))
ENGINE = engine_schema("engine", "other engine measurements, one table per experiment",
                       EXPERIMENT)

# ---- memory and capacity (pagebench.sim) -------------------------------------------------

ALLOCATOR = C("allocator", "str", "naive, pow2, oracle or paged")
UTILISATION = C("utilisation", "float", "tokens stored / slots reserved")
MEMORY_STATIC = schema(
    "memory_static", "one allocator's reservation for a sampled workload (sim.static)",
    ALLOCATOR, BLOCK_SIZE, UTILISATION, C("allocated_slots", "int", "slots reserved"),
    C("wasted_slots_per_seq", "float", "reserved but unused slots per sequence"),
    C("workload", "str", "length distribution"), C("num_seqs", "int", "sequences"),
    C("max_len", "int", "max_model_len"), C("tokens_stored", "int", "tokens of all sequences"),
    C("seed", "int", "sampling seed"))
WORKLOAD_STATIC = schema(
    "workload_static", "one allocator's reservation for the workload `pagebench report "
    "--lengths/--trace` was given (sim.static), which the recommendation then uses",
    nullable(C("seed", "int", "sampling seed; empty: a file or trace, nothing drawn")),
    *MEMORY_STATIC.columns)
MEMORY_MAX_LEN = schema(
    "memory_max_len", "utilisation at one max_model_len", C("max_len", "int", "max_model_len"),
    C("label", "str", "allocator, or paged <block size>"), ALLOCATOR, BLOCK_SIZE, UTILISATION,
    *optional(C("wasted_slots_per_seq", "float", "unused slots per sequence")))
DYNAMIC_COLUMNS = (
    ALLOCATOR, BLOCK_SIZE, C("label", "str", "allocator, or paged <block size>"),
    C("token_state_fraction", "float", "mean share of the budget holding tokens"),
    nullable(C("token_state_fraction_saturated", "float", "the same while requests wait for "
               "memory; empty: the pool never ran out")),
    C("num_preemptions", "int", "preemptions"))
MEMORY_DYNAMIC_SUMMARY = schema(
    "memory_dynamic_summary", "one allocator over a time-stepped run (sim.dynamic)",
    *DYNAMIC_COLUMNS, *optional(
        C("article_reference", "bool", "the article's reference run (sim.dynamic.reference_run: "
          "its workload and budget), the one its claims judge; empty: another run")))
MEMORY_DYNAMIC_TIMELINE = schema(
    "memory_dynamic_timeline", "the budget's breakdown at one step", C("step", "int", "step"),
    ALLOCATOR, BLOCK_SIZE, C("token_state", "int", "tokens stored"))
BLOCK_WASTE = schema(
    "block_waste", "tail waste per sequence as the BlockManager allocates", BLOCK_SIZE,
    C("max_waste_slots", "int", "worst sequence"), C("bound_slots", "int", "block_size - 1"),
    C("mean_waste_slots", "float", "mean over sequences"))
KV_GEOMETRY = schema(
    "kv_geometry", "KV bytes of one preset", MODEL, DTYPE,
    C("bytes_per_token", "int", "K and V bytes per token, all layers"))
CAPACITY_CASE = (
    MODEL, C("max_model_len", "int", "longest sequence"), BLOCK_SIZE,
    C("kv_cache_bytes", "int", "bytes left for the KV cache"),
    C("num_blocks", "int", "blocks in that memory"),
    C("max_concurrency_naive", "int", "sequences with a max_model_len reservation each"),
    C("max_concurrency_paged", "int", "sequences paged (mean length)"))
CAPACITY = schema("capacity", "one capacity-planner case (sim.capacity.capacity_plan)",
                  C("gpu_memory", "str", "GPU memory, e.g. 80GiB"), *CAPACITY_CASE)
CAPACITY_ARTICLE = schema("capacity_article", "the article's 250-request arithmetic",
                          *CAPACITY_CASE, C("bytes_per_token", "int", "KV bytes per token"))
CAPACITY_FP8 = schema(
    "capacity_fp8", "the planner with a bf16 and an fp8 (e4m3) KV cache (sim.capacity.fp8_rows)",
    MODEL, C("gpu_memory", "str", "GPU memory, e.g. 141GB"),
    C("max_model_len", "int", "longest sequence"),
    C("blocks_bf16", "int", "blocks with a bf16 cache"),
    C("blocks_fp8", "int", "blocks with an fp8 cache"),
    C("blocks_ratio", "float", "blocks_fp8 / blocks_bf16"),
    C("concurrency_bf16", "int", "sequences with a max_model_len reservation, bf16"),
    C("concurrency_fp8", "int", "the same, fp8"))
CAPACITY_TP = schema(
    "capacity_tp", "the planner per GPU at a tensor-parallel size "
    "(sim.capacity.tensor_parallel_rows)", MODEL,
    C("tensor_parallel_size", "int", "GPUs the model is split over"),
    *optional(C("kv_heads_per_rank", "int", "KV heads each GPU holds"),
              C("kv_replication", "int", "GPUs holding each KV head"),
              C("bytes_per_token_per_rank", "int", "KV bytes per token on one GPU"),
              C("weights_bytes_per_rank", "int", "weight bytes on one GPU"),
              C("kv_cache_bytes", "int", "bytes left for the KV cache on one GPU"),
              C("num_blocks", "int", "blocks in that memory"),
              C("blocks_vs_tp1", "float", "num_blocks / the tp=1 case's"),
              C("max_concurrency_paged", "int", "sequences paged (mean length), all GPUs"),
              C("max_concurrency_paged_per_gpu", "float", "the same per GPU")))

# ---- real traces (report/real_traces.py over pagebench/data/traces) ----------------------

TRACE = C("trace", "str", "azure-code, azure-conv, mooncake-conv or a file")
REAL_TRACES_STATIC = schema("real_traces_static", "sim.static on one trace", TRACE, ALLOCATOR,
                            BLOCK_SIZE, UTILISATION)
REAL_TRACES_DYNAMIC = schema(
    "real_traces_dynamic", "one allocator serving a trace sample at a real KV budget, at the "
    "rate where memory binds (sim.real_load)", TRACE, *DYNAMIC_COLUMNS, *optional(
        C("budget_tokens", "int", "KV tokens of the real budget"),
        C("time_scale", "float", "arrivals compressed by this factor"),
        C("request_rate", "float", "requests/s at that scale"),
        C("saturated_step_fraction", "float", "share of the run's time memory-bound"),
        C("step_cost", "str", "the step-cost model's origin")))
REAL_TRACES_GOODPUT = schema(
    "real_traces_goodput", "paged or reserve-max serving a trace sample at one rate in the same "
    "KV memory: goodput under the SLOs (sim.real_load)", TRACE, ALLOCATOR,
    C("request_rate", "float", "requests/s"), C("goodput", "float", "requests/s meeting every SLO"),
    C("meets_slo", "bool", "at least slo_attainment of the requests meet every SLO"),
    *optional(C("time_scale", "float", "arrivals compressed by this factor"),
              C("slo_ttft_ms", "float", "TTFT SLO"), C("slo_tpot_ms", "float", "TPOT SLO")))
REAL_TRACES_TIMELINE = schema("real_traces_timeline", "one step of a trace's run", TRACE,
                              C("step", "int", "step"), ALLOCATOR, BLOCK_SIZE)
REAL_TRACES_PREFIX = schema("real_traces_prefix", "prefix-cache hit rate at one budget",
                            TRACE, C("prefix_cache_hit_rate", "float", "hit rate"))
REAL_TRACES_ENGINE = schema("real_traces_engine", "the engine replaying a trace sample", TRACE,
                            BLOCK_SIZE)

# ---- fp8 engine and two GPUs (scripts/h200_fp8.sh; pagebench tp-bench, scripts/h200x2_tp.sh) -

FP8_ENGINE = engine_schema(
    "fp8_engine", "engine pool and agreement with a bf16 and an fp8 cache in the same memory "
    "(measure.engine_bench.fp8_comparison)",
    C("blocks_bf16", "int", "pool with a cache in the model's dtype (bf16)"),
    C("blocks_fp8", "int", "pool with fp8"), C("blocks_ratio", "float", "blocks_fp8 / blocks_bf16"),
    *optional(C("kv_cache_memory", "str", "KV cache memory of each run, e.g. 4GiB"),
              C("num_prompts", "int", "requests"),
              C("greedy_agreement", "float", "tokens up to each sequence's first difference / "
                "all"),
              C("first_token_agreement", "float", "share of sequences whose first token agrees"),
              C("logit_rel_err_first_steps", "float", "largest logit error, first steps"),
              C("seconds_bf16", "float", "wall seconds, bf16 cache"),
              C("seconds_fp8", "float", "wall seconds, fp8 cache")))
KV_ACCURACY = schema(
    "kv_accuracy", "held-out perplexity and top-1 agreement of the shipped trained model with "
    "one KV cache dtype against a reference dtype, at one block size "
    "(measure.kv_accuracy.accuracy_rows)",
    MODEL, C("kv_dtype", "str", "K/V cache dtype measured (bfloat16: model and cache in bf16)"),
    C("reference_dtype", "str", "the dtype it is compared with"), BLOCK_SIZE,
    C("perplexity", "float", "exp(mean next-byte cross-entropy) with kv_dtype"),
    C("perplexity_reference", "float", "the same with reference_dtype"),
    C("top1_agreement", "float", "share of positions whose argmax equals the reference's"),
    C("tokens", "int", "positions scored"),
    *optional(C("windows", "int", "held-out windows"),
              C("window_len", "int", "tokens per window")))
TP = C("tp", "int", "tensor-parallel size")
TP_EQUALITY = schema("tp_equality", "greedy outputs at tp=2 against tp=1",
                     C("num_prompts", "int", "prompts"), C("prompts_equal", "int", "equal"),
                     *optional(TP))
TP_CAPACITY = schema("tp_capacity", "KV blocks per GPU at a tensor-parallel size", TP,
                     C("num_blocks_per_gpu", "int", "blocks per GPU"),
                     *optional(C("kv_heads_per_gpu", "int", "KV heads per GPU")))
TP_THROUGHPUT = schema(
    "tp_throughput", "engine tokens/s at a tensor-parallel size, or of data-parallel replicas "
    "(tp=1 each)", TP, C("batch", "int", "requests (over all replicas)"), TOKENS_PER_S,
    *optional(C("mode", "str", "how it ran: 'tp=N, CUDA graphs', 'tp=N, eager' or "
                "'N replicas, CUDA graphs' (parallel_bench.mode_label)"),
              C("decode_tokens_per_s", "float", "decode tokens/s"),
              C("replicas", "int", "independent engines, one per GPU; empty: 1"),
              C("baseline_alone", "bool", "a tp=1 run made while no other rank measured")))
TP_ALLREDUCE = schema("tp_allreduce", "all-reduce share of a tp=2 decode step",
                      C("batch", "int", "requests"),
                      *optional(TP, C("allreduce_calls_per_step", "int", "all-reduces per step"),
                                C("isolated_allreduce_us", "float", "one all-reduce alone")))
TP_ALLREDUCE_BW = schema(
    "tp_allreduce_bw", "all-reduce time and bus bandwidth at decode-step sizes",
    C("world", "int", "ranks reducing"), C("backend", "str", "nccl or gloo"),
    C("bytes", "int", "bytes reduced: batch × hidden × dtype size"),
    C("time_us", "float", "one all-reduce, microseconds (a loop of back-to-back calls)"),
    C("busbw_gbps", "float", "bus bandwidth, GB/s: bytes / time × 2(n-1)/n (nccl-tests)"),
    *optional(C("batch", "int", "sequences"), C("hidden", "int", "hidden size"), DTYPE,
              C("algbw_gbps", "float", "bytes / time, GB/s"),
              C("nvls", "str", "NCCL_NVLS_ENABLE as set (0: NVLink multicast off)")))
TP_ATTENTION = schema("tp_attention", "paged attention per decode step, one GPU's heads", TP,
                      C("batch", "int", "sequences"), C("per_step_us", "float", "all layers"))
SWEEP_WALL = schema("sweep_wall", "wall time of the kernel sweep on 1 or 2 GPUs",
                    C("gpus", "int", "GPUs"), C("wall_s", "float", "seconds"))

# ---- serving under load (pagebench serve-bench; pagebench.measure.serve_bench) -----------

LATENCY_STATS = tuple(C(f"{m}_{stat}_ms", "float", f"{what}, {stat}, milliseconds")
                      for m, what in (("ttft", "time to first token (queueing included)"),
                                      ("tpot", "time per output token after the first"),
                                      ("itl", "gap between successive tokens"),
                                      ("e2el", "end-to-end latency"),
                                      ("queue", "arrival to first scheduled"))
                      for stat in ("mean", "p50", "p90", "p99"))
SERVING_CONFIG = (
    C("trace", "str", "trace name or file"), C("arrival", "str", "trace (scaled) or poisson"),
    C("request_rate", "float", "requests/s asked (inf: all at once)"),
    C("num_requests", "int", "requests replayed"), MODEL, BLOCK_SIZE,
    C("kv_cache_dtype", "str", "auto (the model's dtype) or fp8_e4m3"),
    C("prefix_caching", "bool", "prefix caching on"))
SERVE_BENCH = schema(
    "serve_bench", "one request rate x configuration served in wall-clock time: latency "
    "percentiles as vLLM's serving benchmark defines them, throughput, goodput at the SLOs",
    *SERVING_CONFIG,
    C("duration_s", "float", "first arrival to last finish, seconds"),
    C("request_throughput", "float", "finished requests/s"),
    C("output_throughput", "float", "output tokens/s"),
    C("goodput", "float", "requests/s meeting every SLO"),
    C("num_good_requests", "int", "requests meeting every SLO"),
    *LATENCY_STATS,
    *optional(C("slo_ttft_ms", "float", "TTFT SLO; empty: none"),
              C("slo_tpot_ms", "float", "TPOT SLO; empty: none"),
              C("time_scale", "float", "trace times divided by this (trace arrivals)"),
              C("num_output_tokens", "int", "tokens generated"),
              C("num_blocks", "int", "KV pool, blocks"),
              C("kv_cache_memory_bytes", "int", "KV pool, bytes"),
              C("peak_blocks", "int", "most blocks in use at once"),
              C("mean_blocks", "float", "mean blocks in use over steps"),
              C("num_preemptions", "int", "sequences preempted"),
              C("prefix_cache_hit_rate", "float", "prompt tokens found cached"),
              C("num_steps", "int", "engine steps"), C("mode", "str", "how decode steps ran"),
              C("replicas", "int", "data-parallel engines sharing the stream, one GPU each "
                "(every N-th arrival); empty: 1"),
              C("max_model_len", "int", "requests clipped to this"),
              C("max_output_len", "int", "outputs cut to this"),
              C("max_num_seqs", "int", "engine's running-sequence cap"),
              C("max_num_batched_tokens", "int", "engine's token budget per step"),
              C("seed", "int", "sample and arrival seed"),
              C("endpoint", "str", "server URL; empty: in process"),
              C("peak_kv_cache_usage", "float", "endpoint: the server's peak KV-cache usage "
                "(its /metrics), 0..1"),
              C("slo_attainment", "float", "share of requests that must meet every SLO"),
              C("meets_slo", "bool", "num_good_requests >= slo_attainment x num_requests"),
              C("predicted", "bool", "the simulator's prediction, not a measurement"),
              C("repeat", "int", "which run of the same point (serve-bench --repeats); "
                "empty: 0")))
SERVE_STEPS = schema(
    "serve_steps", "one engine step of a serve-bench run: what it computed and how long it "
    "took (the step-cost model's training data)",
    C("num_prefill_tokens", "int", "prompt or recomputed positions"),
    C("num_decode_seqs", "int", "sequences decoding one token"),
    C("num_context_tokens", "int", "KV tokens the step's attention reads"),
    C("step_time_ms", "float", "wall time of the step"), BLOCK_SIZE,
    C("kv_cache_dtype", "str", "auto or fp8_e4m3"),
    *optional(MODEL, C("trace", "str", "trace"), C("request_rate", "float", "requests/s"),
              C("batch_size", "int", "sequences in the step"),
              C("prefix_caching", "bool", "prefix caching on"), C("mode", "str", "decode mode"),
              C("gc_ms", "float", "time the step spent in Python's garbage collector"),
              C("device_allocs", "int", "CUDA allocator: device allocations in the step"),
              C("alloc_retries", "int", "CUDA allocator: retries (cache freed) in the step"),
              C("repeat", "int", "which run of the same point (serve-bench --repeats)")))
STEP_COST = schema(
    "step_cost", "a step-cost model's coefficients fitted on serve_steps (measure.step_cost): "
    "step_ms = base + per prefill token + per decode sequence + per 1k context tokens "
    "(+ per step with prompt tokens + per prefilling sequence)",
    MODEL, BLOCK_SIZE, C("kv_cache_dtype", "str", "auto or fp8_e4m3"),
    C("base_ms", "float", "fixed cost of a step"),
    C("prefill_token_ms", "float", "per prefill token"),
    C("decode_seq_ms", "float", "per decoding sequence"),
    C("context_ktoken_ms", "float", "per 1,000 context tokens read"),
    *optional(C("prefill_step_ms", "float", "fixed cost of a step with prompt tokens (eager)"),
              C("prefill_seq_ms", "float", "per sequence with prompt tokens in the step"),
              C("num_steps", "int", "steps fitted"),
              C("rel_err_median", "float", "median |predicted - measured| / measured"),
              C("rel_err_median_decode", "float", "the same over decode-only steps"),
              C("rel_err_median_prefill", "float", "the same over prefill-only steps"),
              C("rel_err_median_mixed", "float", "the same over steps of both"),
              C("mode", "str", "decode mode")))

# ---- benchmark histories (pagebench.results.history) -------------------------------------

HISTORY = (C("machine", "str", "device label"), C("commit", "str", "commit measured"),
           C("benchmark", "str", "benchmark name"),
           nullable(C("params", "str", "parameters; empty: none")),
           *optional(C("date", "str", "when")))
ASV = schema("asv", "one asv benchmark value at one commit", *HISTORY,
             C("value", "float", "result"), C("unit", "str", "its unit"), environment=False)
PYTEST_BENCHMARK = schema(
    "pytest_benchmark", "one pytest-benchmark result", *HISTORY,
    C("median_us", "float", "median"), C("iqr_us", "float", "interquartile range"),
    C("rounds", "int", "rounds"), environment=False)

DATASETS: dict[str, Schema] = {s.name: s for s in (
    KERNELS, KERNELS_EQUIVALENCE, KERNELS_PREFILL, KERNELS_PREFILL_EQUIVALENCE, KERNELS_FP8,
    KERNELS_LAYOUT, KERNELS_PLAN, ENGINE_BATCH, ENGINE_COW, ENGINE_PREFIX, ENGINE_POOL,
    ENGINE_EQUAL_MEMORY, ENGINE_COMPARE, ENGINE, MEMORY_STATIC, WORKLOAD_STATIC, MEMORY_MAX_LEN,
    MEMORY_DYNAMIC_SUMMARY,
    MEMORY_DYNAMIC_TIMELINE, BLOCK_WASTE, KV_GEOMETRY, CAPACITY, CAPACITY_ARTICLE,
    CAPACITY_FP8, CAPACITY_TP, REAL_TRACES_STATIC, REAL_TRACES_DYNAMIC, REAL_TRACES_TIMELINE,
    REAL_TRACES_PREFIX, REAL_TRACES_ENGINE, REAL_TRACES_GOODPUT, FP8_ENGINE, KV_ACCURACY,
    TP_EQUALITY, TP_CAPACITY, TP_THROUGHPUT, TP_ALLREDUCE, TP_ALLREDUCE_BW, TP_ATTENTION,
    SWEEP_WALL, SERVE_BENCH, SERVE_STEPS, STEP_COST,
    ASV, PYTEST_BENCHMARK)}

# ---- derived by pagebench.analysis from the datasets above (never read from files) --------

DEVICE_LABEL = C("device_label", "str", "device label (pagebench.results.devices)")
SHAPE = C("shape", "str", "preset whose attention shape was used")
BATCH, CONTEXT = C("batch", "int", "sequences"), C("context", "int", "cached tokens")
POINT = (BATCH, CONTEXT, BLOCK_SIZE)
TIMED_COLUMNS = (C("paged", "bool", "a paged layout"), DEVICE_LABEL,
                 C("gpu", "bool", "measured on a GPU"), SHAPE,
                 C("timed_as", "str", "empty: a timing; else what the row is instead (Triton "
                   "interpreted on a CPU, or a CPU row marked as graph replay)"))
VERDICT = schema(
    "claims", "one claim's verdict (pagebench.analysis.claims.judge)",
    C("key", "str", "the claim's id"),
    C("kind", "str", "arithmetic (a formula or the article's own script), measured (a timing "
      "or a run) or citation (a paper's number against a measurement of the same thing)"),
    C("claim", "str", "the claim in the article's words"),
    C("headline", "str", "the measured number(s) at a glance; else all of measured"),
    C("measured", "str", "every detail measured"),
    C("device", "str", "the devices (or 'any machine (...)') the verdict was judged on"),
    C("verdict", "str", "holds, does not hold, within noise (the criterion falls inside the "
      "repeats' spread), or not measured here"),
    C("criterion", "str", "what was checked"),
    C("data", "str", "the datasets measured, space-separated"),
    C("section", "str", "the report section whose verdict table shows it: claims (the "
      "article's), fp8, parallel"), environment=False)
KERNELS_TIMED = schema("kernels_timed", "a timed kernel row of dataset kernels, labelled",
                       *KERNELS.columns, *TIMED_COLUMNS, environment=False)
KERNELS_BATCH1_RATIO = schema(
    "kernels_batch1_ratio", "batch 1: fastest paged / fastest contiguous time at one point",
    DEVICE_LABEL, SHAPE, CONTEXT, BLOCK_SIZE,
    C("paged_backend", "str", "fastest paged variant"),
    C("time_us_paged", "float", "its time"), C("contiguous_backend", "str", "fastest contiguous"),
    C("time_us_contiguous", "float", "its time"), C("ratio", "float", "paged / contiguous"),
    environment=False)
KERNELS_THROUGHPUT = schema(
    "kernels_throughput", "the fastest row of one series (backend, block) at one batch size, "
    "of one commit per device and shape (the newest with a batch sweep)",
    *KERNELS.columns, *TIMED_COLUMNS,
    C("series", "str", "backend and block size (and dtype where the commit swept several)"),
    C("tokens_per_s", "float", "batch / step time"),
    C("primary", "bool", "contiguous, or the primary paged backend"), environment=False)
KERNELS_BANDWIDTH = schema(
    "kernels_bandwidth", "achieved GB/s of the fastest row per backend and batch, of one "
    "commit per device and shape (the newest with a batch sweep)",
    *KERNELS.columns, *TIMED_COLUMNS,
    C("series", "str", "backend (and dtype where the commit swept several)"), environment=False)
KERNELS_BLOCK_COST = schema(
    "kernels_block_cost", "one block size's median paged time relative to the best block, "
    "of one commit per device (the newest that timed more than one block size)",
    DEVICE_LABEL, C("commit", "str", "the commit measured"), BLOCK_SIZE,
    C("relative_time", "float", "median of time / best block's time"),
    C("gpu", "bool", "measured on a GPU"), environment=False)
KERNELS_PREFILL_SUMMARY = schema(
    "kernels_prefill_summary", "one prefill point: each variant's time and their ratios, of "
    "one commit per device and shape (the newest)",
    DEVICE_LABEL, SHAPE, C("commit", "str", "the commit measured"), BATCH,
    C("query_len", "int", "new tokens"),
    C("cached", "int", "cached tokens"), environment=False)
KERNELS_VS_FASTEST = schema(
    "kernels_vs_fastest", "one backend (and block size) at one decode point beside the "
    "fastest backend there, of one commit per device and shape (the newest)",
    DEVICE_LABEL, SHAPE, C("kv_dtype", "str", "K/V cache element type"), LENGTHS, BATCH,
    CONTEXT, BLOCK_SIZE, C("backend", "str", "timed variant"), TIME_US,
    C("relative_time", "float", "time / the fastest backend's at the point"),
    C("fastest", "str", "the fastest backend at the point"),
    *optional(C("gbps", "float", "K/V GB/s"),
              C("read_fraction", "float", "gbps / the device's read-only GB/s")),
    environment=False)
KERNELS_PREFILL_VS_FASTEST = schema(
    "kernels_prefill_vs_fastest", "one prefill backend at one point (whole prompts, chunks, "
    "mixed steps) beside the fastest there, of one commit per device and shape (the newest)",
    DEVICE_LABEL, SHAPE, LENGTHS, BATCH, C("query_len", "int", "new tokens per sequence"),
    C("cached", "int", "cached tokens per sequence"), C("backend", "str", "timed variant"),
    TIME_US, C("relative_time", "float", "time / the fastest backend's at the point"),
    C("fastest", "str", "the fastest backend at the point"), environment=False)
KERNELS_BLOCK_COST_KERNEL = schema(
    "kernels_block_cost_kernel", "one paged kernel's time at one block size over its best "
    "block's, over the cases of one commit per device (the newest with several block sizes)",
    DEVICE_LABEL, C("commit", "str", "the commit measured"), C("kernel", "str", "registry backend"),
    BLOCK_SIZE, C("relative_time", "float", "median over cases of time / best block's time"),
    C("relative_low", "float", "the smallest over the cases"),
    C("relative_high", "float", "the largest over the cases"),
    C("cases", "int", "(shape, batch, context) cases"), environment=False)
KERNELS_BATCH1_FAMILY = schema(
    "kernels_batch1_family", "batch 1, one paged-kernel family at one context and block size: "
    "its fastest paged time over its contiguous baseline, with the repeats' spread",
    DEVICE_LABEL, SHAPE, CONTEXT, BLOCK_SIZE, C("family", "str", "triton or flashinfer"),
    C("paged_backend", "str", "the family's fastest paged variant"),
    C("contiguous_backend", "str", "its baseline (Triton: its own; FlashInfer: the fastest)"),
    C("ratio", "float", "paged / contiguous median time"),
    C("ratio_low", "float", "paged q20 / contiguous q80"),
    C("ratio_high", "float", "paged q80 / contiguous q20"),
    C("paging", "str", "slower, faster, or within noise (the spread straddles 1)"),
    environment=False)
RECOMMENDATION = schema(
    "recommendation", "one block size's score: utilisation x relative decode speed "
    "(pagebench.analysis.advice)", BLOCK_SIZE, UTILISATION,
    nullable(C("speed", "float", "decode speed / best block size's (engine tokens/s on a GPU, "
               "else 1 / relative kernel time); empty: unmeasured")),
    nullable(C("speed_low", "float", "its low end (repeats' min)")),
    nullable(C("speed_high", "float", "its high end (repeats' max)")),
    C("score", "float", "utilisation x speed"), C("score_low", "float", "its low end"),
    C("score_high", "float", "its high end"),
    C("allowed", "bool", "a block size the backend constraint admits"), environment=False)
RECOMMENDATION_TRACES = schema(
    "recommendation_traces", "the block size recommended on one real trace's KV utilisation "
    "(pagebench.analysis.advice, the same speed data as the recommendation)",
    C("trace", "str", "trace name"), C("block_size", "int", "the best median score"),
    C("tied", "str", "block sizes within noise of it, comma-separated"),
    C("recommendation", "str", "in words"), environment=False)
FP8_DECODE = schema("fp8_decode", "one decode point, bf16 against e4m3 cache", *POINT,
                    C("bf16_us", "float", "bf16 time"), C("fp8_us", "float", "e4m3 time"),
                    C("fp8_over_bf16", "float", "their ratio"), environment=False)
LAYOUT_SPREAD = schema("layout_spread", "one decode point, each table layout's time", *POINT,
                       C("slowest_over_fastest", "float", "slowest / fastest layout"),
                       environment=False)
TP_ALLREDUCE_STEP = schema("tp_allreduce_step", "tp_allreduce beside the CUDA-graph step",
                           *TP_ALLREDUCE.columns, environment=False)
TP_CASE = (C("machine", "str", "device label"), MODEL, C("batch", "int", "sequences"))
TP_CHOICE = schema(
    "tp_choice", "per model and batch: one GPU, tp=2 and two replicas (CUDA graphs), the "
    "better use of a second GPU", *TP_CASE,
    C("one_gpu_tokens_per_s", "float", "one GPU, CUDA graphs"),
    C("tp2_tokens_per_s", "float", "tp=2, CUDA graphs; empty: not measured"),
    C("replicas2_tokens_per_s", "float", "two replicas, CUDA graphs; empty: not measured"),
    C("tp2_speedup", "float", "tp=2 / one GPU"),
    C("replicas2_speedup", "float", "two replicas / one GPU"),
    C("choice", "str", "tp=2, 2 replicas or one GPU"),
    C("baseline_alone", "bool", "the one-GPU run had the host to itself"), environment=False)
TP_STEP_MODEL = schema(
    "tp_step_model", "tp=2 decode step predicted: one GPU's graph step / 2 + the all-reduces",
    *TP_CASE,
    C("one_gpu_step_ms", "float", "one GPU's CUDA-graph decode step"),
    C("compute_per_rank_ms", "float", "half of it"),
    C("allreduce_bytes", "int", "one all-reduce: batch × hidden × dtype"),
    C("allreduce_ms_per_step", "float", "2 × layers all-reduces timed alone"),
    C("predicted_tp2_step_ms", "float", "compute per rank + all-reduces"),
    C("measured_tp2_step_ms", "float", "tp=2 CUDA-graph step; empty: not measured"),
    C("measured_over_predicted", "float", "measured / predicted"), environment=False)
SWEEP_WALL_SPEEDUP = schema("sweep_wall_speedup", "sweep_wall with the speedup over one GPU",
                            *SWEEP_WALL.columns, C("speedup", "float", "one GPU's wall / this"),
                            environment=False)

SERVING_KEY = (C("machine", "str", "device label"), MODEL, C("trace", "str", "trace"), BLOCK_SIZE,
               C("kv_cache_dtype", "str", "auto or fp8_e4m3"),
               C("prefix_caching", "bool", "prefix caching on"))
SERVING_MAX_RATE = schema(
    "serving_max_rate", "per configuration, the largest measured request rate meeting the SLO",
    *SERVING_KEY, C("max_rate_at_slo", "float", "requests/s; empty: no rate met it"),
    C("rates_measured", "int", "finite rates measured"),
    C("rates_missed_below", "int", "lower rates that missed the SLO"), environment=False)
SERVING_PREDICTION = schema(
    "serving_prediction", "a measured serve_bench point beside the simulator's prediction",
    *SERVING_KEY, C("request_rate", "float", "requests/s"),
    C("metric", "str", "ttft_p50_ms, ttft_p99_ms, tpot_p50_ms or tpot_p99_ms"),
    C("measured_ms", "float", "measured"), C("predicted_ms", "float", "predicted"),
    C("rel_err", "float", "(predicted - measured) / measured"), environment=False)
SERVING_PREDICTION_ERROR = schema(
    "serving_prediction_error", "per trace and metric, the simulator's |relative error| over "
    "the measured points", C("machine", "str", "device label"), MODEL, C("trace", "str", "trace"),
    C("metric", "str", "ttft_p50_ms, ttft_p99_ms, tpot_p50_ms or tpot_p99_ms"),
    C("median_abs_err", "float", "median |predicted - measured| / measured"),
    C("max_abs_err", "float", "largest |predicted - measured| / measured"),
    C("points", "int", "measured points with a prediction"), environment=False)

DERIVED: dict[str, Schema] = {s.name: s for s in (
    SERVING_MAX_RATE, SERVING_PREDICTION, SERVING_PREDICTION_ERROR,
    VERDICT, KERNELS_TIMED, KERNELS_BATCH1_RATIO, KERNELS_THROUGHPUT, KERNELS_BANDWIDTH,
    KERNELS_BLOCK_COST, KERNELS_PREFILL_SUMMARY, KERNELS_VS_FASTEST, KERNELS_BATCH1_FAMILY,
    KERNELS_PREFILL_VS_FASTEST, KERNELS_BLOCK_COST_KERNEL, RECOMMENDATION, RECOMMENDATION_TRACES,
    FP8_DECODE, LAYOUT_SPREAD, TP_ALLREDUCE_STEP, TP_CHOICE, TP_STEP_MODEL, SWEEP_WALL_SPEEDUP)}

# file-name prefix under reports/data/<machine>/ -> dataset; first match wins; None: a file the
# report does not read
FILE_KINDS = (
    ("kernels_prefill_equivalence", "kernels_prefill_equivalence"),
    ("kernels_prefill_tuning", None), ("kernels_prefill", "kernels_prefill"),
    ("kernels_equivalence", "kernels_equivalence"), ("kernels_tuning", None),
    ("kernels_fp8", "kernels_fp8"), ("kernels_layout", "kernels_layout"),
    ("kernels_plan", "kernels_plan"),
    ("fp8_engine", "fp8_engine"), ("kv_accuracy", "kv_accuracy"), ("kernels", "kernels"),
    ("engine_cow", "engine_cow"), ("engine_prefix", "engine_prefix"),
    ("engine_pool", "engine_pool"), ("engine_batch", "engine_batch"),
    ("engine_throughput", "engine_batch"), ("engine_equal_memory", "engine_equal_memory"),
    ("engine_vs_transformers", "engine_compare"), ("engine", "engine"),
    ("capacity", "capacity"), ("dynamic", "memory_dynamic_summary"),
    ("tp_equality", "tp_equality"), ("tp_capacity", "tp_capacity"),
    ("tp_throughput", "tp_throughput"), ("tp_allreduce_bw", "tp_allreduce_bw"),
    ("tp_allreduce", "tp_allreduce"),
    ("tp_attention", "tp_attention"), ("sweep_wall", "sweep_wall"),
    ("serve_bench", "serve_bench"), ("serve_steps", "serve_steps"),
    ("step_cost", "step_cost"),
    ("sweep_rows", None),  # the split sweep's own rows: not a decode-kernel dataset here
)


def classify(path) -> str | None:
    """The dataset a results file holds, by its name (None: not report data)."""
    stem = Path(path).stem.lower()
    if "smoke" in stem:  # a quick check run beside the full one
        return None
    return next((name for prefix, name in FILE_KINDS if stem.startswith(prefix)), None)


# A report page <stem>.html writes its tables as CSV to <stem>_data/ beside it
# (report.build.write_report), built as .<stem>_data.*.new and swapped in: report output, never
# results to read back in.
REPORT_DATA_SUFFIX = "_data"


def report_data_dir(page) -> Path:
    """The directory the report page ``page`` writes its CSVs to: ``<stem>_data`` beside it."""
    page = Path(page)
    return page.parent / (page.stem + REPORT_DATA_SUFFIX)


def is_report_output(directory) -> bool:
    """``directory`` is a report's own data: ``<stem>_data`` beside a ``<stem>.html`` page, or
    such a directory being built or replaced (``.<stem>_data.*.new`` / ``.old``)."""
    directory = Path(directory)
    name = directory.name
    if name.startswith(".") and name.endswith((".new", ".old")):
        name = name[1:].split(".", 1)[0]
    if not name.endswith(REPORT_DATA_SUFFIX) or name == REPORT_DATA_SUFFIX:
        return False
    return (directory.parent / (name[:-len(REPORT_DATA_SUFFIX)] + ".html")).is_file()
