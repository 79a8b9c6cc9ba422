"""Wall-clock serving: requests arrive at their times, the engine admits them as they come.

``run_serving`` drives an engine's ``add_request`` / ``step()`` loop against a real clock:
before each step it adds every request whose arrival time has passed; with nothing to run it
sleeps until the next arrival (no idle step is skipped: time passes as it would for a server).
Each request's arrival, first scheduled step, every token and finish are recorded, as is each
step's start, duration, batch and KV blocks in use.

``serving_metrics`` computes the latency figures as vLLM's serving benchmark
(``vllm bench serve``, ``benchmarks/benchmark_serving.py``) defines them:

- TTFT: first token time - arrival time (queueing included);
- TPOT: (end-to-end latency - TTFT) / (output tokens - 1), over requests with more than one
  output token (a one-token request counts as TPOT 0 for goodput, as vLLM does);
- ITL: every gap between successive tokens of a request, pooled over requests;
- end-to-end latency (E2EL): finish - arrival;
- goodput: requests meeting every given SLO (TTFT <= ``slo_ttft_s``, TPOT <= ``slo_tpot_s``)
  per second of the run; throughput: requests, and output tokens, per second of the run; the
  run lasts from time 0 (the first arrival) to the last finish;
- queueing time (vLLM's ``vllm:request_queue_time_seconds``): first scheduled - arrival.

Percentiles are numpy's (linear interpolation, as vLLM), in milliseconds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from pagebench.errors import ConfigError

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el", "queue")


@dataclass(slots=True)
class ServingRequest:
    """One request to replay: its arrival (seconds from the start), prompt and parameters."""

    arrival_s: float
    prompt: list[int]
    params: object  # SamplingParams


@dataclass(slots=True)
class RequestTiming:
    """What happened to one request, in seconds from the start of the run."""

    arrival_s: float
    prompt_len: int
    first_scheduled_s: float | None = None
    token_s: list[float] = field(default_factory=list)
    finish_s: float | None = None

    @property
    def num_output(self) -> int:
        return len(self.token_s)

    @property
    def ttft_s(self) -> float:
        return self.token_s[0] - self.arrival_s

    @property
    def e2el_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """0 for a single-token request (as vLLM's goodput counts it)."""
        n = self.num_output
        return (self.e2el_s - self.ttft_s) / (n - 1) if n > 1 else 0.0

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_s, self.token_s[1:])]

    @property
    def queue_s(self) -> float:
        return self.first_scheduled_s - self.arrival_s


@dataclass(slots=True)
class StepTiming:
    """One engine step on the run's clock, with the engine's record of it."""

    start_s: float
    end_s: float
    record: object  # pagebench.engine.stats.StepRecord


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


def run_serving(engine, requests: list[ServingRequest], *, clock=time.perf_counter,
                sleep=time.sleep, progress=None) -> ServingRun:
    """Serve ``requests`` (any order) on ``engine`` in wall-clock time; see the module doc.
    ``progress``: an object with ``update(n)`` (a tqdm bar), advanced per finished request."""
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i),
                   reverse=True)
    for i in order:  # every request checked before any is queued: a bad one queues nothing
        engine.check_requests([requests[i].prompt], requests[i].params)
    timings = [RequestTiming(r.arrival_s, len(r.prompt)) for r in requests]
    by_id, steps = {}, []
    engine.begin_stats()
    t0 = clock()
    try:
        while order or engine.has_unfinished_requests:
            now = clock() - t0
            while order and requests[order[-1]].arrival_s <= now:
                i = order.pop()
                by_id[engine.add_request(requests[i].prompt, requests[i].params)] = i
            if not engine.has_unfinished_requests:
                sleep(max(0.0, requests[order[-1]].arrival_s - now))
                continue
            out = engine.step()
            end = clock() - t0
            steps.append(StepTiming(now, end, engine.step_records[-1]))
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


def _summary(values_s, prefix: str) -> dict:
    ms = np.asarray(values_s, dtype=np.float64) * 1e3
    if ms.size == 0:
        return {f"{prefix}_mean_ms": math.nan} | {f"{prefix}_p{p}_ms": math.nan
                                                   for p in PERCENTILES}
    return {f"{prefix}_mean_ms": float(ms.mean())} | {
        f"{prefix}_p{p}_ms": float(np.percentile(ms, p)) for p in PERCENTILES}


def is_good(timing: RequestTiming, slo_ttft_s: float | None, slo_tpot_s: float | None) -> bool:
    """Meets every SLO given (None: that SLO is not set)."""
    return (slo_ttft_s is None or timing.ttft_s <= slo_ttft_s) and \
        (slo_tpot_s is None or timing.tpot_s <= slo_tpot_s)


def serving_metrics(timings: list[RequestTiming], duration_s: float, *,
                    slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> dict:
    """The run's latency percentiles, throughput and goodput (definitions in the module doc).
    Every request must have finished."""
    if any(t.finish_s is None or not t.token_s for t in timings):
        raise ConfigError("timings: every request must have finished with a token")
    good = sum(is_good(t, slo_ttft_s, slo_tpot_s) for t in timings)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: math.nan)
    out = dict(num_requests=len(timings), duration_s=duration_s,
               num_output_tokens=sum(t.num_output for t in timings),
               num_good_requests=good)
    out |= dict(request_throughput=per_s(len(timings)),
                output_throughput=per_s(out["num_output_tokens"]),
                goodput=per_s(good))
    out |= _summary([t.ttft_s for t in timings], "ttft")
    out |= _summary([t.tpot_s for t in timings if t.num_output > 1], "tpot")
    out |= _summary([g for t in timings for g in t.itl_s], "itl")
    out |= _summary([t.e2el_s for t in timings], "e2el")
    out |= _summary([t.queue_s for t in timings if t.first_scheduled_s is not None], "queue")
    return out
