"""What ``pagebench report`` measures on the machine at hand, and the run that measures it and
writes the report (:func:`build_report`).

Each step calls the subsystem that measures (sim, engine, kernels) and adds its rows to
:class:`~pagebench.results.Results` under a dataset name. Simulators run in seconds; the CPU
kernel and engine sweeps take a minute or two and are skipped by ``pagebench report --quick``.
:func:`plan` lists the steps; :func:`pagebench.results.collect.collect` runs each through
``guarded``, so an error becomes a warning naming the step; :func:`pagebench.analysis.analyse`
derives the tables and verdicts, and :func:`pagebench.report.write_report` renders them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from pagebench import defaults
from pagebench.analysis import analyse
from pagebench.errors import ConfigError
from pagebench.measure.tail_waste import tail_waste_rows
from pagebench.report import write_report
from pagebench.report.build import page_path
from pagebench.results import Results, report_data_dir
from pagebench.results.datasets import WORKLOAD_STATIC
from pagebench.results.collect import collect
from pagebench.results.devices import device_label
from pagebench.measure.memory import (article_capacity, geometry_rows, max_len_rows,
                                     planner_case_rows, reference_run, utilisation_rows)
from pagebench.measure.real_traces import study_traces
from pagebench.sim.capacity import fp8_rows, tensor_parallel_rows
from pagebench.sim.step_cost import (H200_ENGINE_STEP_COST, H200_ENGINE_STEP_COST_SOURCE,
                                     StepCostModel, read_step_cost)
from pagebench.sim.static import static_fragmentation
from pagebench.sim.workloads import sample_lengths

WORKLOAD, SEED = defaults.REFERENCE_LENGTHS, defaults.REFERENCE_SEED  # the article's lengths
MAX_LENS = (1024, 2048, 4096, 8192, 16384, 32768)
QUICK_REQUESTS = 2000  # requests of each real trace replayed with --quick


def here(device: str) -> str:
    """The device label of rows this report run measures (see :mod:`pagebench.results.devices`)."""
    from pagebench.measure.timing import environment  # imports torch: only when a sweep runs

    return device_label(device, environment(device)["device_name"], os.cpu_count(),
                        this_run=True)


def static_memory(results: Results, device: str = "cpu", quick: bool = False) -> None:
    """Utilisation per allocator and block size; utilisation versus max_model_len."""
    num_seqs = defaults.REFERENCE_NUM_SEQS
    results.add("memory_static", pd.DataFrame(utilisation_rows(
        WORKLOAD, num_seqs, SEED, defaults.REFERENCE_MAX_LEN, defaults.CURVE_BLOCK_SIZES)),
        "pagebench.sim.static")
    results.add("memory_max_len", pd.DataFrame(max_len_rows(WORKLOAD, num_seqs, SEED, MAX_LENS)),
                "pagebench.sim.static")


def workload_memory(workload) -> callable:
    """The step that adds dataset ``workload_static``: utilisation per allocator and block size
    on ``workload`` (a :class:`~pagebench.sim.user_workload.UserWorkload`), which the
    recommendation then uses in place of the article's lengths."""
    def step(results: Results, device: str = "cpu", quick: bool = False) -> None:
        max_len = workload.max_model_len()
        res = static_fragmentation(workload.lengths, max_len, defaults.CURVE_BLOCK_SIZES)
        results.add("workload_static", pd.DataFrame([WORKLOAD_STATIC.row(
            **r, workload=workload.name, num_seqs=res["num_seqs"], max_len=max_len,
            tokens_stored=res["tokens_stored"], seed=None) for r in res["results"]]),
            "pagebench.sim.static (the workload of --lengths/--trace)")
    return step


def block_waste(results: Results, device: str = "cpu", quick: bool = False) -> None:
    lengths = sample_lengths(WORKLOAD, 200 if quick else 600, SEED, defaults.REFERENCE_MAX_LEN)
    results.add("block_waste", pd.DataFrame(tail_waste_rows(lengths)).assign(workload=WORKLOAD),
                "pagebench.engine.BlockManager")


def capacity(results: Results, device: str = "cpu", quick: bool = False) -> None:
    """KV geometry of the presets, the article's 250-request arithmetic, planner cases, and the
    planner's bf16 vs fp8 and tensor-parallel tables."""
    results.add("kv_geometry", pd.DataFrame(geometry_rows()), "pagebench.config.KVGeometry")
    article = article_capacity()
    article["notes"] = "; ".join(article.get("notes") or [])
    results.add("capacity_article", pd.DataFrame([article]),
                "pagebench.sim.capacity.article_capacity")
    rows, errors = planner_case_rows(WORKLOAD, SEED)
    for error in errors:
        results.warn(f"capacity: {error}")
    results.add("capacity", pd.DataFrame(rows), "pagebench.sim.capacity.capacity_plan")
    results.add("capacity_fp8", pd.DataFrame(fp8_rows()), "pagebench.sim.capacity.fp8_rows")
    results.add("capacity_tp", pd.DataFrame(tensor_parallel_rows()),
                "pagebench.sim.capacity.tensor_parallel_rows")


def dynamic_memory(results: Results, device: str = "cpu", quick: bool = False) -> None:
    """Time-stepped simulation (:func:`pagebench.sim.dynamic.reference_run`: the article's
    lengths arriving faster than they finish, in its 12.4 GB budget). 20,000 requests take ~2 s
    and are needed: with far fewer, paged allocation never runs out of memory."""
    res = reference_run(block_sizes=defaults.ENGINE_BLOCK_SIZES, max_timeline_rows=400)
    results.add("memory_dynamic_summary", res.summary_frame().assign(
        workload=res.workload.get("source", WORKLOAD), article_reference=True),
        "pagebench.sim.dynamic.reference_run")
    timeline = res.timeline_frame()
    timeline = timeline[(timeline["allocator"] != "paged") | (timeline["block_size"] == 16)]
    results.add("memory_dynamic_timeline", timeline, "pagebench.sim.dynamic.reference_run")


def committed_step_cost(data_dir=None) -> tuple[StepCostModel, str]:
    """The step-cost model the real-trace study serves with: block 16, cache dtype auto, from
    the committed data's ``<machine>/step_cost*.csv`` (fitted on a GPU by ``step-cost-fit``):
    the first file's model of the budget's own model
    (:data:`~pagebench.sim.real_load.REAL_BUDGET_CASE`, Llama-3-8B) if any file has one, else
    the first file's only block-16 model, else the default derived from the H200 engine batch
    sweep (:data:`~pagebench.sim.step_cost.H200_ENGINE_STEP_COST`). Every run mode (report,
    ``report --quick``, ``claims --simulate``) asks this, so all serve with the same costs."""
    from pagebench.results.collect import default_data_dir
    from pagebench.sim.real_load import REAL_BUDGET_CASE

    root = Path(data_dir) if data_dir is not None else default_data_dir()
    paths = sorted(root.glob("*/step_cost*.csv"))
    for model in (REAL_BUDGET_CASE["model"], None):
        for path in paths:
            try:
                cost = read_step_cost(path, block_size=16, model=model)
            except ConfigError:
                continue
            return cost, (f"fitted on serving steps ({path.parent.name}/{path.name}, "
                          f"{model + ', ' if model else ''}block 16)")
    return H200_ENGINE_STEP_COST, H200_ENGINE_STEP_COST_SOURCE


def real_traces(results: Results, device: str = "cpu", quick: bool = False) -> None:
    """Azure and Mooncake traces replayed in the simulators, and in the engine unless quick."""
    source = "pagebench.sim (real traces, " + ("quick: first requests" if quick else
                                                "whole traces") + ")"
    cost, cost_source = committed_step_cost()
    for kind, frame in study_traces(QUICK_REQUESTS if quick else None, step_cost=cost,
                                    step_cost_source=cost_source).items():
        results.add(f"real_traces_{kind}", frame, source)
    if not quick:  # the engine, the kernels and timing import torch: only when they run
        from pagebench.measure.engine_bench import tiny_model
        from pagebench.measure.trace_replay import replay_trace

        model = tiny_model(device=device)
        rows = [replay_trace(model, name, 24, max_model_len=1024, max_output_len=16)
                for name in ("mooncake-conv", "azure-conv")]
        results.add("real_traces_engine", pd.DataFrame(rows),
                    "pagebench.measure.trace_replay (tiny random model)")


def kernel_sweep(results: Results, device: str = "cpu", quick: bool = False) -> None:
    from pagebench.measure.kernel_sweep import run_sweep

    frame = pd.DataFrame(run_sweep(device=device, quick=True)).assign(machine=here(device))
    results.add("kernels", frame, "pagebench.measure.kernel_sweep.run_sweep (this run)")


# (function in pagebench.measure.engine_bench, keyword arguments) sized for ~1 minute on 2 CPU cores with
# the bench's tiny random-weight model; each returns rows of one dataset (their ``experiment``).
ENGINE_SWEEPS = (
    ("cow_comparison", dict(prompt_len=256, max_tokens=16)),
    ("prefix_cache_comparison", dict(num_requests=8, max_tokens=8)),
    ("pool_size_sweep", dict(pool_fractions=(0.3, 0.6, 1.0), num_requests=16, max_tokens=32)),
    ("throughput_vs_batch", dict(batch_sizes=(1, 4, 16), block_sizes=(16, 128), max_tokens=16)),
)


def engine_sweeps(results: Results, device: str = "cpu", quick: bool = False) -> None:
    from pagebench.measure import engine_bench

    # on CPU each comparison builds its own tiny model; elsewhere one, on that device
    model = {} if device == "cpu" else {"model": engine_bench.tiny_model(device=device)}
    label = here(device)
    for fn_name, kwargs in ENGINE_SWEEPS:
        try:
            frame = pd.DataFrame(getattr(engine_bench, fn_name)(**kwargs, **model))
        except Exception as e:  # noqa: BLE001 -- one failed comparison keeps the others
            results.warn(f"engine: {fn_name} failed ({type(e).__name__}: {e})")
            continue
        results.add(frame["experiment"].iloc[0], frame.assign(machine=label),
                    f"pagebench.measure.engine_bench.{fn_name} (this run)")


def plan(run_sweeps: bool, workload=None) -> list[tuple[str, object]]:
    """(label, step) in the order they run; the kernel and engine sweeps only if asked; the
    utilisation of ``workload`` (a user's, for the recommendation) if given."""
    steps = [("memory: static fragmentation", static_memory),
             ("memory: block manager tail waste", block_waste),
             ("capacity planner", capacity),
             ("memory: time-stepped simulation", dynamic_memory),
             ("memory: real traces", real_traces)]
    if workload is not None:
        steps.append((f"memory: {workload.name}", workload_memory(workload)))
    if run_sweeps:
        steps += [("kernels: quick sweep", kernel_sweep),
                  ("engine: quick comparisons", engine_sweeps)]
    return steps


def default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001 (a broken torch install: the report still builds, on cpu)
        return "cpu"


def build_report(out="reports/index.html", *, device: str | None = None, quick: bool = False,
                 results_dirs=(), data_dir=None, progress: bool = True,
                 workload=None) -> tuple[Path, Results]:
    """Run the steps of :func:`plan` (all but the simulators skipped with ``quick``), read
    committed data and benchmark results, and write the report, its recommendation made for
    ``workload`` if given (a :class:`~pagebench.sim.user_workload.UserWorkload`). Returns the
    page's path and the data."""
    from pagebench.measure.timing import environment

    device = device or default_device()
    if device not in ("cpu", "cuda") and not str(device).startswith("cuda:"):
        raise ValueError(f"device: expected cpu or cuda, got {device!r}")
    if str(device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device: cuda requested but torch sees no CUDA device")
    page = page_path(out)
    # the page's own CSVs (from an earlier run) are output, never read back as results
    results = collect(device=device, quick=quick, steps=plan(not quick, workload),
                      data_dir=data_dir, results_dirs=results_dirs, progress=progress,
                      exclude=[report_data_dir(page)])
    options = {"quick": quick, "sweeps run here": "simulators only" if quick else
               "simulators, CPU kernel sweep, engine comparisons",
               "results dirs": ", ".join(map(str, results_dirs)) or "(none)",
               "workload of the recommendation": "the article's lengths" if workload is None
               else workload.name}
    options |= {f"time: {k}": f"{v:.1f} s" for k, v in results.timings_s.items()}
    analyse(results)
    path = write_report(results, page, env=environment(device), options=options)
    return path, results
