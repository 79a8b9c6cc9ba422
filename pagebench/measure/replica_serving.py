"""The serving benchmark over data-parallel replicas: each replica (one process and GPU,
``pagebench.engine.replicas``) serves every N-th arrival of the same request stream in
wall-clock time, and the requests' timings are merged into one run's latency percentiles,
throughput and goodput, as ``serve-bench`` scores one engine (``serving_metrics``).

The replicas start each run together at a barrier, and a request keeps its arrival time:
replica ``i`` of ``N`` sees requests ``i, i + N, ...`` at the times they arrive at the whole
system, so its rate is the run's rate / N. The run's duration is the last finish over all
replicas.
"""

from __future__ import annotations

from functools import partial

from pagebench.engine import replicas as dp
from pagebench.errors import ConfigError
from pagebench.measure.serve_bench import (
    ServeConfig, TraceRequests, engine_config, metrics_at_slo, warm_up)
from pagebench.measure.serving import run_serving
from pagebench.results.datasets import SERVE_BENCH


def serve_share(engine, jobs, sync) -> list[dict]:
    """Replica work: per job ``(request indices, ServingRequests)``, the requests served in
    wall-clock time after a barrier; their indices, timings, the run's duration and steps."""
    out = []
    for indices, requests in jobs:
        engine.reset_prefix_cache()
        sync()
        run = run_serving(engine, requests) if requests else None
        out.append(dict(indices=list(indices), timings=run.requests if run else [],
                        duration_s=run.duration_s if run else 0.0,
                        num_steps=len(run.stats.steps) if run else 0))
    return out


def merge_runs(per_replica: list[list[dict]], job: int, count: int) -> tuple[list, float, int]:
    """(every request's timing in request order, the longest replica duration, steps over all
    replicas) of job ``job``; PagebenchError unless each request ran exactly once."""
    timings = dp.in_request_order(per_replica, job, "timings", count)
    return (timings, max(r[job]["duration_s"] for r in per_replica),
            sum(r[job]["num_steps"] for r in per_replica))


def serve_bench_replicas(build_model, replicas: int, device: str, traces: list[TraceRequests],
                         config: ServeConfig, rates, *, poisson: bool = False,
                         time_scale: float = 1.0, slo_ttft_ms=None, slo_tpot_ms=None,
                         attainment: float | None = None, engine_options: dict | None = None,
                         base: dict | None = None, threads: int | None = None) -> list[dict]:
    """serve_bench rows (one per trace x rate) of ``replicas`` engines of ``config``, each
    built from ``build_model(device=...)`` (picklable) and warmed up as ``serve-bench``
    warms its engine; ``base``: columns every row carries (model, environment, ...)."""
    max_model_len = max(t.max_model_len for t in traces)
    setup = dp.ReplicaSetup(
        build_model, device, engine_config(config, max_model_len) | (engine_options or {}),
        warmup=warm_up, threads=threads)
    runs = [(trace, rate, trace.at_rate(rate, poisson=poisson, time_scale=time_scale))
            for trace in traces for rate in rates]
    shares = [dp.split_round_robin(len(requests), replicas) for _, _, requests in runs]
    jobs = [[(share[i], [requests[j] for j in share[i]])
             for (_, _, requests), share in zip(runs, shares)] for i in range(replicas)]
    per_replica = dp.run_replicas(setup, serve_share, jobs)
    rows = []
    for job, (trace, rate, requests) in enumerate(runs):
        timings, duration, steps = merge_runs(per_replica, job, len(requests))
        metrics = metrics_at_slo(timings, duration, slo_ttft_ms, slo_tpot_ms, attainment)
        asked = rate if rate is not None else trace.trace_rate * time_scale
        rows.append(SERVE_BENCH.row(**(base or {}) | dict(
            trace=trace.trace, arrival="poisson" if poisson else "trace", request_rate=asked,
            num_requests=len(requests), block_size=config.block_size,
            kv_cache_dtype=config.kv_cache_dtype, prefix_caching=config.prefix_caching,
            slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, time_scale=time_scale,
            max_model_len=trace.max_model_len, max_output_len=trace.max_output_len,
            seed=trace.seed, replicas=replicas, num_steps=steps) | metrics))
    return rows


def check_replica_run(replicas: int, configs: list, find_max_rate: bool) -> None:
    """ConfigError for what replicas do not run: several engine configurations, a max-rate
    search."""
    if replicas == 1:
        return
    if len(configs) != 1:
        raise ConfigError(f"replicas: serve one configuration (block size, KV dtype, prefix "
                          f"caching) at a time, not {len(configs)}")
    if find_max_rate:
        raise ConfigError("replicas: the max-rate search runs on one engine; give --rates")


def model_builder(load, name: str, dtype_name: str | None):
    """A picklable ``build_model(device=...)`` from ``load(name, device, dtype_name)`` returning
    (model, label)."""
    return partial(_first, load, name, dtype_name)


def _first(load, name, dtype_name, device):
    return load(name, str(device), dtype_name)[0]
