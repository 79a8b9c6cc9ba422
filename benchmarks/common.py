"""Shared helpers for the asv suites: device, optional modules, sizes, GPU timing.

Every suite imports pagebench modules through ``optional`` so that a history run over a commit
that predates a subsystem skips that suite's cases (``NotImplementedError`` in ``setup``) instead
of failing to import. GPU cases are ``track_*`` benchmarks that return the median of CUDA-event
timings from ``pagebench.measure.timing.measure``: asv's own ``time_*`` is host wall clock and does not
synchronise the GPU.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import pathlib

# Ask NVML, not the CUDA runtime, whether a GPU exists: importing a suite must not initialise
# CUDA (asv may fork after importing it).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")


@functools.cache
def on_gpu() -> bool:
    """Whether CUDA is usable (imports torch on first use: suites without torch stay light)."""
    import torch

    return torch.cuda.is_available()



def checkout_defaults():
    """``pagebench/defaults.py`` of this checkout, loaded by its path: the suites' sizes are
    what the checkout defines, so a history run measures every commit at the same sizes
    whichever pagebench the commit installs (``pagebench.config`` comes from that commit)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "pagebench" / "defaults.py"
    spec = importlib.util.spec_from_file_location("pagebench_checkout_defaults", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


defaults = checkout_defaults()
SHAPES = defaults.SHAPES  # attention shapes (num_q_heads, num_kv_heads, head_dim)
# The article's reference workload
REFERENCE_LENGTHS = defaults.REFERENCE_LENGTHS
REFERENCE_NUM_SEQS = defaults.REFERENCE_NUM_SEQS
REFERENCE_MAX_LEN = defaults.REFERENCE_MAX_LEN


class SkipCase(NotImplementedError):
    """Raised in a benchmark's ``setup``: asv skips a case whose set-up raises
    NotImplementedError. It means this commit or machine lacks what the case measures (an old
    commit without the module, a CPU machine for a CUDA case), not that code is unfinished."""


# modules a later commit moved: the suites name today's place, and a history run over a commit
# from before the move finds the module where that commit kept it
FORMER_NAMES = {"pagebench.measure.kernel_cases": "pagebench.kernels.fixtures",
                "pagebench.measure.prefill_sweep": "pagebench.kernels.prefill_sweep",
                "pagebench.measure.timing": "pagebench.timing"}


def optional(module: str):
    """The module (at its former name in a commit from before it moved), or None when this
    commit does not have it (or it fails to import)."""
    for name in (module, FORMER_NAMES.get(module)):
        if name is None:
            continue
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def public(mod, name: str):
    """``mod.name``, or None when this commit lacks it. asv runs this suite against older
    commits, where some helpers still had a private spelling (``_name``); reading that spelling
    here, and only here, keeps their history comparable."""
    return getattr(mod, name, None) or getattr(mod, "_" + name, None)


def require(module: str, *attrs: str):
    """The module for a benchmark's ``setup``; skips the case when it or an attribute is missing."""
    mod = optional(module)
    if mod is None:
        raise SkipCase(f"{module} is not in this commit")
    for attr in attrs:
        if public(mod, attr) is None:
            raise SkipCase(f"{module}.{attr} is not in this commit")
    return mod


def require_gpu() -> None:
    if not on_gpu():
        raise SkipCase("needs a CUDA device")


def require_cpu() -> None:
    """CPU-sized cases (``time_*``) are skipped on a GPU machine, whose cases are ``track_*``.

    They run on ``PAGEBENCH_ASV_THREADS`` torch threads (default 1): on a shared machine a
    single thread gives times that a later run can be compared with."""
    if on_gpu():
        raise SkipCase("CPU-sized case; the GPU machine runs the track_* cases")
    import torch

    torch.set_num_threads(int(os.environ.get("PAGEBENCH_ASV_THREADS", "1")))


def gpu_median_us(fn, *, cuda_graph: bool = True, repeat: int = 30) -> float:
    """Median of CUDA-event timings (L2 flushed before each call) of ``fn``, in microseconds,
    replayed from a CUDA graph as a serving engine runs decode: without one, a Triton call's
    Python launch path (tens of us) hides the kernel (H200: 67 vs 11 us at 1 x 1024)."""
    measure = optional("pagebench.measure.timing").measure
    return measure(fn, device="cuda", warmup=5, repeat=repeat, cuda_graph=cuda_graph).median_us


def cpu_median_us(fn, repeat: int = 15, warmup: int = 2) -> float:
    measure = optional("pagebench.measure.timing").measure
    return measure(fn, device="cpu", warmup=warmup, repeat=repeat).median_us


def reference_lengths(num_seqs: int = REFERENCE_NUM_SEQS, seed: int = 0,
                      max_len: int = REFERENCE_MAX_LEN):
    from pagebench.sim.workloads import sample_lengths

    return sample_lengths(REFERENCE_LENGTHS, num_seqs, seed=seed, max_len=max_len)


# ---- simulators and planner: adapters that return None when this commit lacks them ---------
DYNAMIC_RATE = 20.0  # requests per step: `pagebench simulate --dynamic`'s default
DYNAMIC_BLOCK_SIZES = defaults.BLOCK_SIZES


def capacity_plans(block_sizes):
    """block size -> the capacity planner's plan for the article's case (Qwen2.5-0.5B, bf16,
    16 GB card at 0.9, 1 GB weights + 1 GB overhead, max model length 4,096), or None."""
    capacity = optional("pagebench.sim.capacity")
    plan = getattr(capacity, "article_capacity", None)
    if plan is None:
        return None
    return {bs: dict(plan(block_size=bs)) for bs in block_sizes}


def _dynamic_api():
    dynamic, trace = optional("pagebench.sim.dynamic"), optional("pagebench.sim.trace")
    capacity = optional("pagebench.sim.capacity")
    run = getattr(dynamic, "run_dynamic", None)
    workload = getattr(trace, "poisson_workload", None)
    budget = getattr(capacity, "article_budget_tokens", None)
    if run is None or workload is None or budget is None:
        return None
    return run, workload, budget


def dynamic_runner(num_requests: int, block_sizes=DYNAMIC_BLOCK_SIZES):
    """A no-argument call running the time-stepped simulation of every allocator on
    ``num_requests`` Poisson requests with the reference lengths and the article's budget."""
    api = _dynamic_api()
    if api is None:
        raise SkipCase("the time-stepped simulator is not in this commit")
    run, poisson_workload, article_budget_tokens = api
    workload = poisson_workload(num_requests, DYNAMIC_RATE, REFERENCE_LENGTHS, seed=0,
                                max_len=REFERENCE_MAX_LEN)
    budget = article_budget_tokens()
    return lambda: run(workload, budget, block_sizes=block_sizes, max_len=REFERENCE_MAX_LEN)


def dynamic_results(num_requests: int = REFERENCE_NUM_SEQS):
    """allocator label ("naive", "paged-16", ...) -> summary row of the time-stepped simulation
    on the reference workload, or None when this commit has no such simulator."""
    try:
        result = dynamic_runner(num_requests)()
    except NotImplementedError:
        return None
    return {r["label"]: r for r in result.summary}


# ---- real traces ---------------------------------------------------------------------------
REAL_TRACE = "mooncake-conv"  # the one real trace the suites track: it carries prefix sharing
REAL_TRACE_REQUESTS = 2000  # its first requests, in arrival order (a few seconds per run)


def real_trace_workload(name: str = REAL_TRACE, num_requests: int = REAL_TRACE_REQUESTS):
    """The first ``num_requests`` of a shipped trace as a simulator workload (20 ms per step,
    the trace's own max_model_len), or SkipCase when this commit ships no traces."""
    traces = optional("pagebench.sim.real_traces")
    read = getattr(traces, "read_timed_trace", None)
    if read is None:
        raise SkipCase("pagebench.sim.real_traces is not in this commit")
    return read(name).head(num_requests).to_workload()
