"""The measurements the report runs on the machine at hand, each adding tidy frames to Results.

Simulators run in seconds; the CPU kernel and engine sweeps take a minute or two and are skipped
by ``pagebench report --quick``. Each function is called through ``collect.guarded``: an error
becomes a warning naming the sweep.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagebench import defaults
from pagebench.config import ceil_div
from pagebench.report.collect import Results, as_frame, call_with_supported
from pagebench.report.devices import device_label

WORKLOAD = defaults.REFERENCE_LENGTHS  # the article's length distribution
NUM_SEQS, SEED, MAX_LEN = (defaults.REFERENCE_NUM_SEQS, defaults.REFERENCE_SEED,
                           defaults.REFERENCE_MAX_LEN)
BLOCK_SIZES = defaults.CURVE_BLOCK_SIZES
MAX_LENS = (1024, 2048, 4096, 8192, 16384, 32768)


def here(device: str) -> str:
    """The device label of rows this report run measures (see :mod:`pagebench.report.devices`)."""
    import os

    from pagebench.timing import environment

    return device_label(device, environment(device)["device_name"], os.cpu_count(),
                        this_run=True)


def _label(allocator, block_size) -> str:
    return allocator if block_size is None or pd.isna(block_size) else f"paged {int(block_size)}"


def static_memory(results: Results, device: str = "cpu", quick: bool = False) -> None:
    """Utilisation per allocator and block size; utilisation versus max_model_len."""
    from pagebench.sim.static import static_fragmentation
    from pagebench.sim.workloads import sample_lengths

    lengths = sample_lengths(WORKLOAD, NUM_SEQS, SEED, MAX_LEN)
    res = static_fragmentation(lengths, MAX_LEN, BLOCK_SIZES)
    static = pd.DataFrame(res["results"]).assign(
        workload=WORKLOAD, num_seqs=res["num_seqs"], max_len=res["max_len"],
        tokens_stored=res["tokens_stored"], seed=SEED)
    static["block_size"] = static["block_size"].astype("Int64")
    results.add("memory_static", static, "pagebench.sim.static")

    rows = []
    for max_len in MAX_LENS:
        lengths = sample_lengths(WORKLOAD, NUM_SEQS, SEED, max_len)
        res = static_fragmentation(lengths, max_len, (16, 128))
        for r in res["results"]:
            rows.append({"max_len": max_len, "label": _label(r["allocator"], r["block_size"]),
                         "allocator": r["allocator"], "block_size": r["block_size"],
                         "utilisation": r["utilisation"],
                         "wasted_slots_per_seq": r["wasted_slots_per_seq"],
                         "workload": WORKLOAD, "num_seqs": NUM_SEQS, "seed": SEED})
    sweep = pd.DataFrame(rows)
    sweep["block_size"] = sweep["block_size"].astype("Int64")
    results.add("memory_max_len", sweep, "pagebench.sim.static")


def block_waste(results: Results, device: str = "cpu", quick: bool = False) -> None:
    """Tail waste per sequence as the real BlockManager allocates it: prompt, then token by token.

    Each sequence's first half is allocated as a prompt and the rest appended one token at a
    time; waste = slots in its blocks − tokens stored.
    """
    from pagebench.engine.block_manager import BlockManager
    from pagebench.sim.workloads import sample_lengths

    lengths = sample_lengths(WORKLOAD, 200 if quick else 600, SEED, MAX_LEN)
    rows = []
    for bs in defaults.BLOCK_SIZES:
        # a pool as large as the longest sequence; each sequence is freed once measured
        manager = BlockManager(ceil_div(MAX_LEN, bs), bs)
        waste = []
        for i, n in enumerate(lengths):
            n = int(n)
            prompt = max(1, n // 2)
            manager.allocate(i, list(range(prompt)))
            for t in range(prompt, n):
                manager.append_token(i, t)
            waste.append(len(manager.block_table(i)) * bs - manager.num_tokens(i))
            manager.free(i)
        waste = np.asarray(waste)
        rows.append({"block_size": bs, "num_seqs": len(lengths), "max_waste_slots": int(waste.max()),
                     "mean_waste_slots": float(waste.mean()), "bound_slots": bs - 1,
                     "workload": WORKLOAD})
    results.add("block_waste", pd.DataFrame(rows), "pagebench.engine.BlockManager")


def kv_geometry_rows() -> pd.DataFrame:
    from pagebench.config import PRESETS, KVGeometry

    rows = []
    for name in PRESETS:
        g = KVGeometry.from_name(name, dtype="bfloat16")
        rows.append({"model": name, "dtype": "bfloat16", "num_layers": g.num_layers,
                     "num_kv_heads": g.num_kv_heads, "head_dim": g.head_dim,
                     "bytes_per_token": g.bytes_per_token,
                     "bytes_per_block_16": g.bytes_per_block(16)})
    return pd.DataFrame(rows)


CAPACITY_CASES = (
    dict(model="qwen2.5-0.5b", gpu_memory="16GiB", max_model_len=4096),
    dict(model="qwen2.5-0.5b", gpu_memory="16GiB", max_model_len=32768),
    dict(model="qwen2.5-7b", gpu_memory="80GiB", max_model_len=4096),
    dict(model="llama-3-8b", gpu_memory="80GiB", max_model_len=8192),
    dict(model="llama-3-8b", gpu_memory="141GiB", max_model_len=8192),
    dict(model="mistral-7b", gpu_memory="141GiB", max_model_len=32768),
)
PLAN_COLUMNS = ("model", "gpu_memory_bytes", "max_model_len", "block_size", "bytes_per_token",
                "bytes_per_block", "weights_bytes", "kv_cache_bytes", "num_blocks",
                "cacheable_tokens", "max_concurrency_naive", "max_concurrency_pow2",
                "max_concurrency_oracle", "max_concurrency_paged", "paged_vs_naive")


def capacity(results: Results, device: str = "cpu", quick: bool = False) -> None:
    """KV geometry of the presets, the article's 250-request arithmetic, planner cases."""
    from pagebench.sim.capacity import article_capacity, capacity_plan

    results.add("kv_geometry", kv_geometry_rows(), "pagebench.config.KVGeometry")
    article = article_capacity()
    article["notes"] = "; ".join(article.get("notes") or [])
    results.add("capacity_article", pd.DataFrame([article]),
                "pagebench.sim.capacity.article_capacity")
    rows = []
    for case in CAPACITY_CASES:
        try:
            plan = capacity_plan(**case, gpu_memory_utilization=0.9, block_size=16,
                                 lengths=WORKLOAD, seed=SEED)
        except Exception as e:  # noqa: BLE001 -- one impossible case keeps the others
            results.warn(f"capacity: {case}: {e}")
            continue
        rows.append({"gpu_memory": case["gpu_memory"]} | {k: plan.get(k) for k in PLAN_COLUMNS})
    results.add("capacity", pd.DataFrame(rows), "pagebench.sim.capacity.capacity_plan")


# Time-stepped simulation: pagebench.sim.dynamic.reference_run (the article's lengths arriving
# faster than they finish, in the article's 12.4 GB budget). 20,000 requests take ~2 s and are
# needed: with far fewer, paged allocation never runs out of memory and never saturates.
DYNAMIC = dict(num_requests=20_000, block_sizes=defaults.ENGINE_BLOCK_SIZES)


def dynamic_memory(results: Results, device: str = "cpu", quick: bool = False) -> None:
    """Time-stepped simulation: a summary per allocator and the breakdown over time."""
    from pagebench.sim.dynamic import reference_run

    res = reference_run(DYNAMIC["num_requests"], block_sizes=DYNAMIC["block_sizes"], max_timeline_rows=400)
    summary = res.summary_frame()
    summary["block_size"] = summary["block_size"].astype("Int64")
    summary["workload"] = res.workload.get("source", WORKLOAD)
    results.add("memory_dynamic_summary", summary, "pagebench.sim.dynamic.reference_run")
    timeline = res.timeline_frame()
    timeline = timeline[(timeline["allocator"] != "paged") | (timeline["block_size"] == 16)]
    results.add("memory_dynamic_timeline", timeline, "pagebench.sim.dynamic.reference_run")


def kernel_sweep(results: Results, device: str = "cpu", quick: bool = False) -> None:
    from pagebench.kernels.sweep import run_sweep

    frame = as_frame(call_with_supported(run_sweep, device=device, quick=True))
    frame["machine"] = here(device)
    results.add("kernels", frame, "pagebench.kernels.sweep.run_sweep (this run)")


# (function in pagebench.engine.bench, keyword arguments) sized for ~1 minute on 2 CPU cores with
# the bench's tiny random-weight model; each returns tidy rows with an ``experiment`` column.
ENGINE_SWEEPS = (
    ("cow_comparison", dict(prompt_len=256, max_tokens=16)),
    ("prefix_cache_comparison", dict(num_requests=8, max_tokens=8)),
    ("pool_size_sweep", dict(pool_fractions=(0.3, 0.6, 1.0), num_requests=16, max_tokens=32)),
    ("throughput_vs_batch", dict(batch_sizes=(1, 4, 16), block_sizes=(16, 128), max_tokens=16)),
)


def engine_sweeps(results: Results, device: str = "cpu", quick: bool = False) -> None:
    from pagebench.engine import bench
    from pagebench.report.collect import add_engine_rows

    # on CPU each comparison builds its own tiny model; elsewhere one, on that device
    model = {} if device == "cpu" else {"model": bench.tiny_model(device=device)}
    label = here(device)
    for fn_name, kwargs in ENGINE_SWEEPS:
        fn = getattr(bench, fn_name, None)
        if fn is None:
            results.warn(f"engine: pagebench.engine.bench has no {fn_name}()")
            continue
        try:
            frame = as_frame(call_with_supported(fn, **kwargs, **model))
        except Exception as e:  # noqa: BLE001 -- one failed comparison keeps the others
            results.warn(f"engine: {fn_name} failed ({type(e).__name__}: {e})")
            continue
        frame["machine"] = label
        add_engine_rows(results, frame, f"pagebench.engine.bench.{fn_name} (this run)",
                        default=fn_name)


def real_traces(results: Results, device: str = "cpu", quick: bool = False) -> None:
    """Azure and Mooncake traces replayed in the simulators (and the engine unless quick)."""
    from pagebench.report.real_traces import trace_sweeps

    trace_sweeps(results, device=device, quick=quick)
