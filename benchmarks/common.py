"""Shared helpers for the asv suites: device, optional modules, sizes, GPU timing.

Every suite imports pagebench modules through ``optional`` so that a history run over a commit
that predates a subsystem skips that suite's cases (``NotImplementedError`` in ``setup``) instead
of failing to import. GPU cases are ``track_*`` benchmarks that return the median of CUDA-event
timings from ``pagebench.timing.measure``: asv's own ``time_*`` is host wall clock and does not
synchronise the GPU.
"""

from __future__ import annotations

import importlib
import os

# Ask NVML, not the CUDA runtime, whether a GPU exists: importing this module must not
# initialise CUDA (asv may fork after importing it).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"

# Attention shapes (num_q_heads, num_kv_heads, head_dim): Llama-3-8B and Qwen2.5-0.5B.
SHAPES = {"llama-3-8b": (32, 8, 128), "qwen2.5-0.5b": (14, 2, 64)}

# The article's reference workload: lognormal(5.5, 0.9) lengths, 2,000 sequences, seed 0.
REFERENCE_LENGTHS = "lognormal:5.5,0.9"
REFERENCE_NUM_SEQS = 2000
REFERENCE_MAX_LEN = 4096


def optional(module: str):
    """The module, or None when this commit does not have it (or it fails to import)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def require(module: str, *attrs: str):
    """The module for a benchmark's ``setup``; skips the case when it or an attribute is missing."""
    mod = optional(module)
    if mod is None:
        raise NotImplementedError(f"{module} is not in this commit")
    for attr in attrs:
        if not hasattr(mod, attr):
            raise NotImplementedError(f"{module}.{attr} is not in this commit")
    return mod


def require_gpu() -> None:
    if not ON_GPU:
        raise NotImplementedError("needs a CUDA device")


def require_cpu() -> None:
    """CPU-sized cases (``time_*``) are skipped on a GPU machine, whose cases are ``track_*``."""
    if ON_GPU:
        raise NotImplementedError("CPU-sized case; the GPU machine runs the track_* cases")


def gpu_median_us(fn, *, cuda_graph: bool = False, repeat: int = 30) -> float:
    """Median of CUDA-event timings (L2 flushed before each call) of ``fn``, in microseconds."""
    from pagebench.timing import measure

    try:
        timing = measure(fn, device="cuda", warmup=5, repeat=repeat, cuda_graph=cuda_graph)
    except TypeError:  # an older timing primitive without a keyword: time without it
        timing = measure(fn, device="cuda", warmup=5, repeat=repeat)
    return timing.median_us


def cpu_median_us(fn, repeat: int = 15) -> float:
    from pagebench.timing import measure

    return measure(fn, device="cpu", warmup=2, repeat=repeat).median_us


def reference_lengths(num_seqs: int = REFERENCE_NUM_SEQS, seed: int = 0,
                      max_len: int = REFERENCE_MAX_LEN):
    from pagebench.sim.workloads import sample_lengths

    return sample_lengths(REFERENCE_LENGTHS, num_seqs, seed=seed, max_len=max_len)


# ---- subsystems still landing: adapters that return None when this commit lacks them --------
def capacity_plans(block_sizes):
    """block size -> the capacity planner's result for the reference deployment, or None."""
    capacity = optional("pagebench.sim.capacity")
    plan = getattr(capacity, "plan_capacity", None) if capacity else None
    if plan is None:
        return None
    return {bs: dict(plan(model="qwen2.5-0.5b", gpu_memory="16GiB",
                          gpu_memory_utilization=0.9, max_model_len=4096, block_size=bs,
                          lengths=REFERENCE_LENGTHS))
            for bs in block_sizes}


def dynamic_results():
    """allocator label -> the time-stepped simulation's summary on the reference workload."""
    dynamic = optional("pagebench.sim.dynamic")
    simulate = getattr(dynamic, "simulate_dynamic", None) if dynamic else None
    if simulate is None:
        return None
    return None


def dynamic_runner(num_requests: int):
    """A no-argument call that runs the time-stepped simulation on ``num_requests`` requests."""
    require("pagebench.sim.dynamic")
    raise NotImplementedError("pagebench.sim.dynamic API not wired yet")
