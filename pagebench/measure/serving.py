"""Wall-clock serving: requests arrive at their times, the engine admits them as they come.

``run_serving`` drives an engine's ``add_request`` / ``step()`` loop against a real clock:
before each step it adds every request whose arrival time has passed; with nothing to run it
sleeps until the next arrival (no idle step is skipped: time passes as it would for a server).
Each request's arrival, first scheduled step, every token and finish are recorded, as is each
step's start, duration, batch, KV blocks in use and the time Python's garbage collector took
inside it (a collection of a process holding a model's many objects can take tens of
milliseconds, which no step-cost model sees coming; :func:`frozen_heap` keeps it short).

The metrics (:func:`pagebench.sim.latency.serving_metrics`) are vLLM's serving benchmark's;
the simulator's predictions are scored the same way.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pagebench.errors import ConfigError
from pagebench.sim.latency import RequestTiming, serving_metrics

__all__ = ["ServingRequest", "RequestTiming", "StepTiming", "ServingRun", "GCTimer",
           "arrival_times", "device_counters", "frozen_heap", "run_serving", "serving_metrics"]


@dataclass(slots=True)
class ServingRequest:
    """One request to replay: its arrival (seconds from the start), prompt and parameters."""

    arrival_s: float
    prompt: list[int]
    params: object  # SamplingParams


@dataclass(slots=True)
class StepTiming:
    """One engine step on the run's clock, with the engine's record of it."""

    start_s: float
    end_s: float
    record: object  # pagebench.engine.stats.StepRecord
    gc_s: float = 0.0  # time in the garbage collector during the step
    counters: dict | None = None  # run_serving(counters=...)'s increase over the step


@dataclass(slots=True)
class ServingRun:
    requests: list[RequestTiming]
    steps: list[StepTiming]
    duration_s: float
    stats: object  # the engine's EngineStats over the run


def arrival_times(trace_arrival_s, *, rate: float | None = None, time_scale: float = 1.0,
                  poisson: bool = False, seed: int = 0) -> np.ndarray:
    """Arrival times (seconds, first at 0) for ``len(trace_arrival_s)`` requests.

    ``poisson``: exponential gaps at ``rate`` requests/s (the trace's times unused), as
    ``vllm bench serve --request-rate``. Otherwise the trace's own times, divided by
    ``time_scale``, or stretched so that their mean rate is ``rate`` when given.
    ``rate=inf``: every request at 0."""
    arrival = np.asarray(trace_arrival_s, dtype=np.float64)
    arrival = arrival - (arrival.min() if arrival.size else 0.0)
    count = arrival.size
    if rate is not None and not (isinstance(rate, (int, float)) and rate > 0):
        raise ConfigError(f"request_rate: must be a positive number of requests/s, got {rate!r}")
    if not (isinstance(time_scale, (int, float)) and math.isfinite(time_scale)
            and time_scale > 0):
        raise ConfigError(f"time_scale: must be a positive number, got {time_scale!r}")
    if rate is not None and math.isinf(rate):
        return np.zeros(count)
    if poisson:
        if rate is None:
            raise ConfigError("request_rate: Poisson arrivals need a rate")
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, max(count - 1, 0))
        return np.concatenate([[0.0], np.cumsum(gaps)])[:count]
    if rate is None:
        return arrival / time_scale
    span = arrival.max(initial=0.0)
    if count < 2 or span == 0:
        return np.zeros(count)
    return arrival * ((count - 1) / span) / rate


class GCTimer:
    """Total time spent in Python's garbage collector while installed (``gc.callbacks``)."""

    def __init__(self, clock=time.perf_counter):
        self.clock, self.total_s, self.collections, self._start = clock, 0.0, 0, None

    def __call__(self, phase, info):
        if phase == "start":
            self._start = self.clock()
        elif self._start is not None:
            self.total_s += self.clock() - self._start
            self.collections += 1
            self._start = None

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


@contextlib.contextmanager
def frozen_heap():
    """Collect, then move every object alive (the model, the engine, the imported modules) out
    of the collector's reach while the block runs, as vLLM does after start-up: a collection
    then scans only what serving allocates. Unfrozen after, so that a long-lived process (a
    test session, a notebook) can still collect what the block's engine leaves in cycles."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def device_counters(device) -> Callable[[], dict] | None:
    """For a CUDA ``device``: the caching allocator's cumulative count of device allocations
    (``cudaMalloc``) and of retries after a failed one (which free the cache and synchronise),
    each a stall a step-cost model does not see; None elsewhere."""
    import torch

    if torch.device(device).type != "cuda":
        return None

    def read() -> dict:
        stats = torch.cuda.memory_stats(device)
        return {"device_allocs": stats.get("num_device_alloc", 0),
                "alloc_retries": stats.get("num_alloc_retries", 0)}
    return read


def run_serving(engine, requests: list[ServingRequest], *, clock=time.perf_counter,
                sleep=time.sleep, progress=None, counters=None) -> ServingRun:
    """Serve ``requests`` (any order) on ``engine`` in wall-clock time; see the module doc.
    ``progress``: an object with ``update(n)`` (a tqdm bar), advanced per finished request;
    ``counters``: a callable returning cumulative counts (:func:`device_counters`), whose
    increase over each step is kept in its :class:`StepTiming`."""
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i),
                   reverse=True)
    for i in order:  # every request checked before any is queued: a bad one queues nothing
        engine.check_requests([requests[i].prompt], requests[i].params)
    timings = [RequestTiming(r.arrival_s, len(r.prompt)) for r in requests]
    by_id, steps = {}, []
    engine.begin_stats()
    t0 = clock()
    try:
        with GCTimer() as collector:
            while order or engine.has_unfinished_requests:
                now = clock() - t0
                while order and requests[order[-1]].arrival_s <= now:
                    i = order.pop()
                    by_id[engine.add_request(requests[i].prompt, requests[i].params)] = i
                if not engine.has_unfinished_requests:
                    sleep(max(0.0, requests[order[-1]].arrival_s - now))
                    continue
                collected = collector.total_s
                before = counters() if counters is not None else None
                out = engine.step()
                end = clock() - t0
                grown = None if before is None else {
                    k: v - before[k] for k, v in counters().items()}
                steps.append(StepTiming(now, end, engine.step_records[-1],
                                        collector.total_s - collected, grown))
                for rid in out.scheduled:
                    t = timings[by_id[rid]]
                    if t.first_scheduled_s is None:
                        t.first_scheduled_s = now
                for rid, tokens in out.new_tokens.items():
                    timings[by_id[rid]].token_s.extend([end] * len(tokens))
                for request in out.finished:
                    timings[by_id[request.request_id]].finish_s = end
                    if progress is not None:
                        progress.update(1)
    except BaseException:
        engine.abort_all()
        raise
    stats = engine.end_stats()
    return ServingRun(timings, steps, max((t.finish_s for t in timings), default=0.0), stats)
