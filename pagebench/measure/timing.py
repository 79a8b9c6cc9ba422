"""The one timing primitive, for CPU and CUDA, and the environment stamped on every result.

CPU: ``time.perf_counter`` around each call, after warm-up; the median is reported.
CUDA: CUDA events around each call after warm-up (``warmup`` calls, then ``CUDA_WARMUP_S`` of
untimed repeats), L2 flushed before every repeat (so each call reads its K/V from HBM, as in a
real decode step), optionally replayed from a CUDA graph (batch-1 cases are launch-bound; a
graph removes the Python launch gaps that a server would not have).
The flush *reads* a buffer larger than L2: a flush that writes one (zeroing it) leaves L2 full of
dirty lines, and the timed call then pays for writing them back (about 8 us on the H200 for any
call that reads more than L2 holds; docs/kernels.md, "Timing on the GPU").
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from collections.abc import Callable

# Version of the CUDA timing below, stamped on every row (``timing_harness``): 1 (rows without
# the column, before 79a173a) zeroed a new flush buffer per call and warmed up for 3 calls;
# 2 reads one buffer and warms up for CUDA_WARMUP_S (docs/kernels.md, "Timing on the GPU").
HARNESS = 2
L2_FLUSH_BYTES = 256 * 2**20  # well above any current GPU's L2 (H200: 60 MB)
CUDA_WARMUP_S = 0.05  # replays before the timed ones (after ``warmup`` calls), in seconds
_flush_buffers: dict = {}  # device index -> the process's flush buffer


@dataclass(frozen=True, slots=True)
class Timing:
    median_us: float
    q20_us: float
    q80_us: float
    min_us: float
    repeats: int
    method: str

    def to_dict(self) -> dict:
        return asdict(self)


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Run with ``n`` intra-op threads (None: unchanged). On a small shared CPU one thread is
    far steadier: OpenMP workers spin-waiting on a busy core can slow a step tenfold."""
    import torch

    saved = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def summarise(samples_us: list[float], method: str) -> Timing:
    """Samples in microseconds (any order) as a ``Timing``: median, 20th/80th percentiles, min."""
    samples = sorted(samples_us)
    n = len(samples)

    def q(p):
        return samples[min(n - 1, max(0, round(p * (n - 1))))]

    return Timing(statistics.median(samples), q(0.2), q(0.8), samples[0], n, method)


def measure(fn: Callable[[], object], *, device="cpu", warmup: int = 3, repeat: int = 20,
            min_time_s: float = 0.0, flush_l2: bool = True, cuda_graph: bool = False) -> Timing:
    """Time ``fn()`` (no arguments) and return the median and quantiles in microseconds.

    ``min_time_s`` keeps repeating (beyond ``repeat``) until that much time was measured.
    """
    if warmup < 0 or repeat < 1:
        raise ValueError(f"warmup/repeat: need warmup >= 0 and repeat >= 1, got {warmup}/{repeat}")
    if str(device).startswith("cuda"):
        return _measure_cuda(fn, warmup, repeat, min_time_s, flush_l2, cuda_graph)
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    total = 0.0
    while len(samples) < repeat or total < min_time_s:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        samples.append(dt * 1e6)
        total += dt
    return summarise(samples, "cpu perf_counter, median")


def _measure_cuda(fn, warmup, repeat, min_time_s, flush_l2, cuda_graph) -> Timing:
    import torch

    for _ in range(max(warmup, 1)):
        fn()
    torch.cuda.synchronize()
    call = capture_graph(fn).replay if cuda_graph else fn
    flush = l2_flush() if flush_l2 else None
    # Warm up for a while, not for a number of calls: on the H200 a new graph's first few
    # milliseconds of replays ran up to 14% slower when the process had just taken memory from
    # the driver (docs/kernels.md, "Timing on the GPU")
    warm_until = time.perf_counter() + CUDA_WARMUP_S
    while time.perf_counter() < warm_until:
        cuda_event_us(call, flush)
    samples: list[float] = []
    while len(samples) < repeat or sum(samples) < min_time_s * 1e6:
        samples.append(cuda_event_us(call, flush))
    method = "cuda events, median" + (", L2 flushed by a read" if flush_l2 else "") + (
        ", cuda graph" if cuda_graph else "")
    return summarise(samples, method)


def capture_graph(fn: Callable[[], object]):
    """``fn`` captured in a ``torch.cuda.CUDAGraph`` (after two calls on a side stream, as
    capture needs); ``fn``'s allocations live in the graph's private pool."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def cuda_event_us(call: Callable[[], object], flush: Callable[[], object] | None = None) -> float:
    """One ``call()`` between two CUDA events, after ``flush()`` (if given), in microseconds."""
    import torch

    if flush is not None:
        flush()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def l2_flush() -> Callable[[], object]:
    """A call that evicts the current CUDA device's L2 by reading (summing) a buffer of
    ``L2_FLUSH_BYTES``, one per device and process. Reading leaves only clean lines behind."""
    import torch

    index = torch.cuda.current_device()
    if index not in _flush_buffers:
        _flush_buffers[index] = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.int32,
                                            device=f"cuda:{index}")
    buf = _flush_buffers[index]
    return lambda: buf.sum(dtype=torch.int64)


@functools.cache
def git_commit() -> str:
    """The checkout's short HEAD, ``-dirty`` after it when tracked files differ from it (what
    was measured is not that commit); ``PAGEBENCH_COMMIT`` overrides it (a copy of the tree
    whose .git is stale or absent, such as a remote GPU machine's)."""
    if os.environ.get("PAGEBENCH_COMMIT"):
        return os.environ["PAGEBENCH_COMMIT"]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                              cwd=__file__.rsplit("/", 2)[0]).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = head and git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if changed else head or "unknown"


# the columns every result row carries (``environment``'s keys, in this order)
ENVIRONMENT_COLUMNS = ("device", "device_name", "torch_version", "triton_version",
                       "pagebench_version", "python_version", "commit", "timing_harness",
                       "timestamp")


def environment(device="cpu") -> dict:
    """Device, versions, commit, timing harness and the time (UTC, ISO 8601, to the second)
    of this call: the columns every result row carries (``ENVIRONMENT_COLUMNS``). A run calls
    it once as it starts, so its rows carry their run's start: what orders runs (and their
    commits) in :mod:`pagebench.results.commits`, without asking git."""
    import torch

    import pagebench

    env = {
        "device": str(device),
        "device_name": platform.processor() or platform.machine(),
        "torch_version": torch.__version__,
        "triton_version": None,
        "pagebench_version": pagebench.__version__,
        "python_version": platform.python_version(),
        "commit": git_commit(),
        "timing_harness": HARNESS,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        env["device_name"] = torch.cuda.get_device_name()
    try:
        import triton

        env["triton_version"] = triton.__version__
    except Exception:  # noqa: BLE001 -- triton missing or broken: record it as absent
        pass
    return env
