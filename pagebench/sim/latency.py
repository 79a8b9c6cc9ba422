"""Serving latency as vLLM's serving benchmark (``vllm bench serve``,
``benchmarks/benchmark_serving.py``) defines it, for measured and simulated runs alike.

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
from dataclasses import dataclass, field

import numpy as np

from pagebench.errors import ConfigError

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el", "queue")


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
