"""``pagebench serve-bench``: serve a real trace's requests at request rates, per engine
configuration (block size x KV cache dtype x prefix caching), and tabulate the latency.

Requests are a seeded sample of the trace, clipped to ``max_model_len`` and their outputs to
``max_output_len``, with token ids synthesised as the trace replay does
(:func:`pagebench.measure.trace_replay.synthesise_prompts`: equal ``hash_ids``, equal token
blocks), each generating exactly its output length. One engine per configuration, warmed up
once on a few prompts and then by ``warmup_passes`` untimed runs of every trace's requests all
at once (the batch shapes, chunked prefills and decode batch sizes the timed runs will meet,
so that the first timed rate pays no compile or first-use cost), its heap frozen while the
timed runs last (:func:`~pagebench.measure.serving.frozen_heap`); before each rate its prefix
cache is emptied, so no run finds what another left.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from pagebench.defaults import WARMUP_PASSES
from pagebench.measure.engine_bench import release_memory
from pagebench.engine.engine import LLMEngine
from pagebench.engine.sampling import SamplingParams
from pagebench.measure.trace_replay import synthesise_prompts
from pagebench.errors import ConfigError
from pagebench.measure.serving import (ServingRequest, arrival_times, device_counters,
                                       frozen_heap, run_serving, serving_metrics)
from pagebench.results.datasets import SERVE_BENCH, SERVE_STEPS
from pagebench.sim.real_traces import read_timed_trace

# warm-up prompt lengths (clipped to the engine's limit): short and long prefills, a chunked one
WARMUP_PROMPT_LENS = (16, 100, 700, 3000)
DEFAULT_SLO_ATTAINMENT = 0.9  # a rate "meets the SLO" when this share of requests does
STEP_LABELS = ("model", "trace", "request_rate", "block_size", "kv_cache_dtype",
               "prefix_caching", "mode", "repeat")
SEARCH_STEPS = 4  # bisections between the last rate that met the SLO and the first that missed


@dataclass(frozen=True)
class ServeConfig:
    block_size: int
    kv_cache_dtype: str = "auto"
    prefix_caching: bool = True

    def describe(self) -> str:
        return (f"block {self.block_size}, {self.kv_cache_dtype}, prefix caching "
                f"{'on' if self.prefix_caching else 'off'}")


@dataclass(frozen=True)
class TraceRequests:
    """A trace sample ready to serve: trace-time arrivals (seconds), prompts, output lengths
    (and the trace's ``hash_ids``, for the simulator's prefix cache)."""

    trace: str
    arrival_s: list[float]
    prompts: list[list[int]]
    output_len: list[int]
    max_model_len: int
    max_output_len: int | None
    seed: int
    hash_ids: tuple | None = None

    @property
    def trace_rate(self) -> float:
        """The sample's own mean rate, requests/s (inf: all at one instant)."""
        span = max(self.arrival_s) - min(self.arrival_s)
        return (len(self.arrival_s) - 1) / span if span > 0 else math.inf

    def at_rate(self, rate: float | None, *, poisson: bool = False, time_scale: float = 1.0,
                ) -> list[ServingRequest]:
        times = arrival_times(self.arrival_s, rate=rate, time_scale=time_scale,
                              poisson=poisson, seed=self.seed)
        return [ServingRequest(float(t), p, SamplingParams(max_tokens=n, ignore_eos=True))
                for t, p, n in zip(times.tolist(), self.prompts, self.output_len)]


def trace_sample(trace: str, num_requests: int, *, max_model_len: int,
                 max_output_len: int | None, seed: int = 0):
    """(trace-time arrivals in seconds, the clipped Workload) of a seeded sample."""
    sample = read_timed_trace(trace).sample(num_requests, seed)
    return sample.arrival_s, sample.to_workload(max_model_len=max_model_len,
                                                max_output_len=max_output_len)


def trace_requests(trace: str, num_requests: int, vocab_size: int, *, max_model_len: int,
                   max_output_len: int | None, seed: int = 0) -> TraceRequests:
    arrival, workload = trace_sample(trace, num_requests, max_model_len=max_model_len,
                                     max_output_len=max_output_len, seed=seed)
    return TraceRequests(trace, arrival.tolist(), synthesise_prompts(workload, vocab_size, seed),
                         workload.output_len.tolist(), max_model_len, max_output_len, seed,
                         workload.hash_ids)


def model_label(model) -> str:
    cfg = model.config
    return f"{cfg.model_type}-L{cfg.num_hidden_layers}-H{cfg.hidden_size}"


def build_engine(model, config: ServeConfig, *, max_model_len: int, engine_options: dict,
                 ) -> LLMEngine:
    """An engine for ``config``, warmed up (kernels compiled for short, long and chunked
    prefills and for decode batches, an fp8 cache calibrated) on a few requests, its prefix
    cache emptied after."""
    engine = LLMEngine(model, **engine_config(config, max_model_len) | engine_options)
    warm_up(engine)
    return engine


def engine_config(config: ServeConfig, max_model_len: int) -> dict:
    """The ``LLMEngine`` options ``config`` sets."""
    return dict(block_size=config.block_size, kv_cache_dtype=config.kv_cache_dtype,
                enable_prefix_caching=config.prefix_caching, max_model_len=max_model_len)


def warm_up(engine: LLMEngine) -> None:
    """A few requests of short to long prompts (see :func:`build_engine`), then the prefix
    cache emptied."""
    vocab = engine.vocab_size
    lens = sorted({max(1, min(n, engine.max_model_len - 8)) for n in WARMUP_PROMPT_LENS})
    warm = [[(7 * i + 13 * j) % vocab for j in range(n)] for i, n in enumerate(lens)]
    engine.generate(warm, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    engine.reset_prefix_cache()


def warm_up_on_traces(engine: LLMEngine, traces: list[TraceRequests], passes: int) -> None:
    """``passes`` untimed runs of every trace's requests all at once (see the module doc)."""
    for _ in range(passes):
        for requests in traces:
            engine.reset_prefix_cache()
            engine.generate([list(p) for p in requests.prompts],
                            [SamplingParams(max_tokens=n, ignore_eos=True)
                             for n in requests.output_len], use_tqdm=False)


def serve_once(engine: LLMEngine, requests: TraceRequests, rate: float | None, *,
               poisson: bool, time_scale: float, slo_ttft_ms: float | None,
               slo_tpot_ms: float | None, attainment: float = DEFAULT_SLO_ATTAINMENT,
               progress=None) -> tuple[dict, list[dict]]:
    """One run: its serve_bench metrics (no configuration columns) and its steps' rows."""
    engine.reset_prefix_cache()
    run = run_serving(engine, requests.at_rate(rate, poisson=poisson, time_scale=time_scale),
                      progress=progress, counters=device_counters(engine.runner.device))
    metrics = metrics_at_slo(run.requests, run.duration_s, slo_ttft_ms, slo_tpot_ms, attainment)
    stats = run.stats
    metrics |= dict(num_blocks=engine.num_blocks,
                    kv_cache_memory_bytes=engine.runner.kv_cache_bytes,
                    peak_blocks=stats.peak_blocks, mean_blocks=stats.mean_blocks,
                    num_preemptions=stats.num_preemptions,
                    prefix_cache_hit_rate=stats.prefix_cache_hit_rate,
                    num_steps=len(stats.steps))
    steps = [dict(num_prefill_tokens=s.record.num_prefill_tokens,
                  num_decode_seqs=s.record.num_decode_seqs,
                  num_context_tokens=s.record.num_context_tokens,
                  batch_size=s.record.batch_size,
                  step_time_ms=(s.end_s - s.start_s) * 1e3, gc_ms=s.gc_s * 1e3)
             | (s.counters or {}) for s in run.steps]
    return metrics, steps


def metrics_at_slo(timings, duration_s: float, slo_ttft_ms, slo_tpot_ms,
                   attainment: float | None) -> dict:
    """:func:`serving_metrics` at SLOs given in milliseconds, with their verdict (none without
    an ``attainment``)."""
    metrics = serving_metrics(timings, duration_s,
                              slo_ttft_s=None if slo_ttft_ms is None else slo_ttft_ms / 1e3,
                              slo_tpot_s=None if slo_tpot_ms is None else slo_tpot_ms / 1e3)
    if attainment is None:
        return metrics
    return metrics | slo_verdict(metrics, slo_ttft_ms, slo_tpot_ms, attainment)


def slo_verdict(metrics: dict, slo_ttft_ms, slo_tpot_ms, attainment: float) -> dict:
    """``meets_slo`` (None without an SLO) and the ``slo_attainment`` it was judged at."""
    if slo_ttft_ms is None and slo_tpot_ms is None:
        return dict(meets_slo=None, slo_attainment=None)
    return dict(meets_slo=metrics["num_good_requests"] >= attainment * metrics["num_requests"],
                slo_attainment=attainment)


def meets_slo(row: dict, attainment: float) -> bool:
    return row["num_good_requests"] >= attainment * row["num_requests"]


def rates_to_search(first: float) -> itertools.count:
    """Doubling from ``first``: the search's upward probes."""
    return (first * 2 ** k for k in itertools.count())


def serve_bench(model, traces: list[TraceRequests], configs: list[ServeConfig], rates, *,
                poisson: bool = False, time_scale: float = 1.0, slo_ttft_ms=None,
                slo_tpot_ms=None, find_max_rate: bool = False,
                attainment: float = DEFAULT_SLO_ATTAINMENT, engine_options: dict | None = None,
                mode: str | None = None, model_name: str | None = None, environment=None,
                progress=None, max_search_runs: int = 12, warmup_passes: int = WARMUP_PASSES,
                repeats: int = 1, on_config=None) -> tuple[list[dict], list[dict]]:
    """serve_bench rows (one per configuration x trace x rate) and serve_steps rows.

    One engine per configuration serves every trace. ``rates``: requests/s (``math.inf``: all
    at once; None: the trace's own times divided by ``time_scale``). ``find_max_rate``: from
    ``rates[0]``, double until the SLO is missed (fewer than ``attainment`` of the requests
    meet every SLO), then bisect ``SEARCH_STEPS`` times; every probe is a row, the largest
    rate meeting it marked ``max_rate_at_slo`` in ``note``. ``on_config(rows, steps)`` is
    called with everything so far after each configuration (to save partial results)."""
    if find_max_rate and slo_ttft_ms is None and slo_tpot_ms is None:
        raise ConfigError("find_max_rate: give an SLO (slo_ttft_ms or slo_tpot_ms) to search for")
    if find_max_rate and (not rates or rates[0] is None or math.isinf(rates[0])):
        raise ConfigError("find_max_rate: start from a finite request rate")
    if find_max_rate and repeats != 1:
        raise ConfigError("repeats: the max-rate search runs each rate once")
    engine_options = engine_options or {}
    rows, step_rows = [], []
    base = (environment or {}) | dict(
        arrival="poisson" if poisson else "trace", model=model_name or model_label(model),
        slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, time_scale=time_scale, mode=mode,
        max_num_seqs=engine_options.get("max_num_seqs"),
        max_num_batched_tokens=engine_options.get("max_num_batched_tokens"))
    device = next(model.parameters()).device
    max_model_len = max(t.max_model_len for t in traces)
    for config in configs:
        engine = build_engine(model, config, max_model_len=max_model_len,
                              engine_options=engine_options)
        warm_up_on_traces(engine, traces, warmup_passes)
        labels = base | dict(block_size=config.block_size,
                             kv_cache_dtype=config.kv_cache_dtype,
                             prefix_caching=config.prefix_caching)
        with frozen_heap():
            for requests in traces:
                def measure(rate, requests=requests, repeat=0):
                    metrics, steps = serve_once(engine, requests, rate, poisson=poisson,
                                                time_scale=time_scale, slo_ttft_ms=slo_ttft_ms,
                                                slo_tpot_ms=slo_tpot_ms, attainment=attainment,
                                                progress=progress)
                    asked = rate if rate is not None else requests.trace_rate * time_scale
                    run = labels | dict(trace=requests.trace, num_requests=len(requests.prompts),
                                        max_model_len=requests.max_model_len,
                                        max_output_len=requests.max_output_len,
                                        seed=requests.seed, request_rate=asked, repeat=repeat)
                    rows.append(SERVE_BENCH.row(**run | metrics))
                    step_rows.extend(SERVE_STEPS.row(**{k: run[k] for k in STEP_LABELS} | s)
                                     for s in steps)
                    return rows[-1]

                if find_max_rate:
                    search_max_rate(measure, rates[0], attainment, max_search_runs)
                else:
                    for rate in rates:
                        for repeat in range(repeats):
                            measure(rate, repeat=repeat)
        engine = None  # the closures above hold the cell, not the engine
        release_memory(device)
        if on_config is not None:
            on_config(rows, step_rows)
    return rows, step_rows


def search_max_rate(measure, first: float, attainment: float, max_runs: int) -> float | None:
    """The largest rate found meeting the SLO (``measure(rate)`` returns a serve_bench row,
    whose ``note`` it marks); None if even ``first`` misses it."""
    good, bad, runs = None, None, 0
    for rate in rates_to_search(first):
        row, runs = measure(rate), runs + 1
        if not meets_slo(row, attainment):
            bad = rate
            break
        good, good_row = rate, row
        if runs >= max_runs:
            break
    for _ in range(SEARCH_STEPS if bad is not None and good is not None else 0):
        if runs >= max_runs:
            break
        mid = (good + bad) / 2
        row, runs = measure(mid), runs + 1
        if meets_slo(row, attainment):
            good, good_row = mid, row
        else:
            bad = mid
    if good is not None:
        good_row["note"] = "max_rate_at_slo"
    return good


def serve_bench_endpoint(url: str, traces: list[TraceRequests], rates, *, model_name: str,
                         poisson: bool = False, time_scale: float = 1.0, slo_ttft_ms=None,
                         slo_tpot_ms=None, attainment: float = DEFAULT_SLO_ATTAINMENT,
                         environment: dict | None = None) -> list[dict]:
    """serve_bench rows of a running server at ``url`` (see
    :mod:`pagebench.measure.endpoint`): the configuration is the server's, so block size,
    cache dtype and prefix caching are not known here (``kv_cache_dtype`` "server")."""
    from pagebench.measure.endpoint import serve_endpoint

    rows = []
    for requests in traces:
        for rate in rates:
            run = serve_endpoint(url, requests.at_rate(rate, poisson=poisson,
                                                       time_scale=time_scale), model_name)
            server = run.server
            metrics = metrics_at_slo(run.requests, run.duration_s, slo_ttft_ms, slo_tpot_ms,
                                     attainment)
            if server:
                metrics |= dict(num_preemptions=server.get("num_preemptions_total"),
                                prefix_cache_hit_rate=server.get("prefix_cache_hits_total", 0)
                                / server["prefix_cache_queries_total"]
                                if server.get("prefix_cache_queries_total") else None,
                                peak_kv_cache_usage=server.get("peak_kv_cache_usage_perc",
                                                               server.get(
                                                                   "peak_gpu_cache_usage_perc")))
            asked = rate if rate is not None else requests.trace_rate * time_scale
            rows.append(SERVE_BENCH.row(**(environment or {}) | dict(
                trace=requests.trace, arrival="poisson" if poisson else "trace",
                request_rate=asked, num_requests=len(requests.prompts), model=model_name,
                block_size=None, kv_cache_dtype="server", prefix_caching=None, endpoint=url,
                max_model_len=requests.max_model_len, max_output_len=requests.max_output_len,
                seed=requests.seed, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
                time_scale=time_scale) | metrics))
    return rows


def predict_bench(traces: list[TraceRequests], configs: list[ServeConfig], rates, *,
                  costs: dict, num_blocks: dict, model_name: str, poisson: bool = False,
                  time_scale: float = 1.0, slo_ttft_ms=None, slo_tpot_ms=None,
                  attainment: float = DEFAULT_SLO_ATTAINMENT, max_num_seqs: int = 256,
                  max_num_batched_tokens: int = 2048) -> list[dict]:
    """serve_bench rows predicted by the simulator (``predicted`` set) instead of measured:
    ``costs`` and ``num_blocks`` map each configuration to its step-cost model and pool."""
    from pagebench.sim.serving import simulate_serving

    rows = []
    for config in configs:
        for requests in traces:
            for rate in rates:
                timed = requests.at_rate(rate, poisson=poisson, time_scale=time_scale)
                run = simulate_serving(
                    [r.arrival_s for r in timed], [len(p) for p in requests.prompts],
                    requests.output_len, costs[config], block_size=config.block_size,
                    num_blocks=num_blocks[config], max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_batched_tokens,
                    prefix_caching=config.prefix_caching, hash_ids=requests.hash_ids)
                metrics = metrics_at_slo(run.requests, run.duration_s, slo_ttft_ms,
                                         slo_tpot_ms, attainment)
                prompt = sum(len(p) for p in requests.prompts)
                asked = rate if rate is not None else requests.trace_rate * time_scale
                rows.append(SERVE_BENCH.row(**metrics | dict(
                    trace=requests.trace, arrival="poisson" if poisson else "trace",
                    request_rate=asked, num_requests=len(requests.prompts), model=model_name,
                    block_size=config.block_size, kv_cache_dtype=config.kv_cache_dtype,
                    prefix_caching=config.prefix_caching, predicted=True,
                    num_blocks=num_blocks[config], num_preemptions=run.num_preemptions,
                    num_steps=len(run.steps), max_model_len=requests.max_model_len,
                    max_output_len=requests.max_output_len, seed=requests.seed,
                    slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, time_scale=time_scale,
                    max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                    prefix_cache_hit_rate=run.num_cached_prompt_tokens / prompt,
                    peak_blocks=max((st.blocks_used for st in run.steps), default=0))))
    return rows
