"""Real traces at a real KV budget: the article's reservation and throughput claims judged where
memory, not an arranged budget, is what runs out.

The budget is the KV memory a real GPU leaves for a real model (:data:`REAL_BUDGET_CASE`, the
capacity planner's Llama-3-8B on one H100 80 GiB). The trace is served by
:func:`pagebench.sim.serving.simulate_serving` (prefill and decode costing what a
:class:`~pagebench.sim.step_cost.StepCostModel` says, vLLM V1's scheduler limits) with its
arrivals compressed by a time scale (scale 8: eight times the trace's request rate). The scale
is the smallest power of two in :data:`TIME_SCALES` at which paged block 16 is memory-bound
(a waiting request refused for want of blocks, or a preemption) for at least
:data:`MEMORY_BOUND_SHARE` of the run's time; where no scale gets there, the largest one, and
the runs that never ran short of memory say so. At that rate every allocator serves the same
requests in the same memory:

- ``paged`` at a block size: blocks as tokens need them;
- ``naive`` (reserve-max), ``pow2``, ``oracle``: a contiguous reservation per request of
  ``max_model_len`` slots, the power of two holding its length, or its exact length (Orca's
  three baselines), held from admission to finish.

Memory rows: the time-weighted share of the budget holding token state (KV entries written),
over the whole run and over its memory-bound steps. Goodput rows: paged block 16 against
reserve-max at :data:`GOODPUT_SCALE_FACTORS` times that scale, requests/s meeting
:data:`SLO_TTFT_S` and :data:`SLO_TPOT_S` (the article's throughput claim as throughput at
equal memory under a latency bound).
"""

from __future__ import annotations

import math

import numpy as np

from pagebench.sim.capacity import capacity_plan
from pagebench.sim.dynamic import label
from pagebench.defaults import SLO_ATTAINMENT
from pagebench.errors import ConfigError
from pagebench.sim.latency import is_good, serving_metrics
from pagebench.sim.serving import SimulatedRun, simulate_serving
from pagebench.sim.step_cost import StepCostModel

# one H100 80 GiB serving Llama-3-8B in bf16 at gpu_memory_utilization 0.9 (a PLANNER_CASES row)
REAL_BUDGET_CASE = dict(model="llama-3-8b", gpu_memory="80GiB")
REAL_BUDGET_TEXT = "Llama-3-8B (bf16, 128 KiB per token) on one H100 80 GiB"
# vLLM V1's scheduler defaults for an API server on a GPU with >= 70 GiB
MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS = 1024, 8192
TIME_SCALES = tuple(2 ** k for k in range(11))  # 1 .. 1024 times the trace's request rate
MEMORY_BOUND_SHARE = 0.25
SLO_TTFT_S, SLO_TPOT_S = 1.0, 0.05
# the search for the largest rate meeting the SLOs: powers of two from 1/16 of the trace's rate
GOODPUT_SCALES = tuple(2.0 ** k for k in range(-4, 11))
GOODPUT_REFINE_STEPS = 3  # then bisections between the last power met and the next: ~9% steps
GOODPUT_METRICS = ("goodput", "request_throughput", "output_throughput", "ttft_p50_ms",
                   "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")
RESERVATIONS = ("naive", "pow2", "oracle")
MEMORY_RUNS = (("paged", 16), ("paged", 128), ("naive", None), ("pow2", None),
               ("oracle", None))
GOODPUT_RUNS = (("paged", 16), ("naive", None))
TIMELINE_ROWS = 300


def real_budget_tokens(case: dict | None = None) -> int:
    """KV tokens of :data:`REAL_BUDGET_CASE` (or ``case``: capacity_plan keywords)."""
    return int(capacity_plan(**(REAL_BUDGET_CASE if case is None else case))["cacheable_tokens"])


def reserve_lengths(allocator: str, prompt_len, output_len, max_model_len: int):
    """Slots each request reserves at admission under ``allocator`` (None: paged)."""
    need = np.asarray(prompt_len, dtype=np.int64) + np.asarray(output_len, dtype=np.int64) - 1
    if allocator == "paged":
        return None
    if allocator == "naive":
        return np.full_like(need, max_model_len)
    if allocator == "pow2":
        pow2 = np.left_shift(1, np.ceil(np.log2(np.maximum(need, 1))).astype(np.int64))
        return np.maximum(np.minimum(pow2, max_model_len), need)
    if allocator == "oracle":
        return need
    raise ConfigError(f"allocator: expected paged or one of {', '.join(RESERVATIONS)}, "
                      f"got {allocator!r}")


def serve(arrival_s, prompt_len, output_len, allocator: str, block_size: int | None,
          budget_tokens: int, cost: StepCostModel, time_scale: float, max_model_len: int,
          **limits) -> SimulatedRun:
    """The requests served in ``budget_tokens`` of KV memory by ``allocator``, arrivals
    divided by ``time_scale``; ``limits``: max_num_seqs, max_num_batched_tokens."""
    if not (isinstance(time_scale, (int, float)) and math.isfinite(time_scale)
            and time_scale > 0):
        raise ConfigError(f"time_scale: must be a positive number, got {time_scale!r}")
    limits = dict(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS) \
        | limits
    reserve = reserve_lengths(allocator, prompt_len, output_len, max_model_len)
    size = block_size if reserve is None else 1
    return simulate_serving(np.asarray(arrival_s, dtype=np.float64) / time_scale, prompt_len,
                            output_len, cost, block_size=size,
                            num_blocks=budget_tokens // size, reserve_len=reserve, **limits)


def memory_summary(run: SimulatedRun, budget_tokens: int) -> dict:
    """Time-weighted shares of the budget over the run (see the module doc)."""
    dur = np.array([s.end_s - s.start_s for s in run.steps])
    held = np.array([s.tokens_held for s in run.steps], dtype=np.float64)
    bound = np.array([s.memory_bound for s in run.steps], dtype=bool)
    total, sat = float(dur.sum()), float(dur[bound].sum())

    def share(mask, t):
        return (float((held[mask] * dur[mask]).sum() / (t * budget_tokens))
                 if t > 0 else None)
    return dict(token_state_fraction=share(np.ones_like(bound), total),
                token_state_fraction_saturated=share(bound, sat),
                saturated_step_fraction=sat / total if total > 0 else 0.0,
                memory_bound_steps=int(bound.sum()), num_preemptions=run.num_preemptions,
                num_steps=len(run.steps), duration_s=run.duration_s)


def timeline(run: SimulatedRun, budget_tokens: int, block_size: int | None,
             rows: int = TIMELINE_ROWS) -> dict[str, list]:
    """At most ``rows`` evenly spaced steps: token state, the rest of the allocated slots
    (paged: internal fragmentation and blocks of prompts not yet prefilled; contiguous:
    reserved, not yet used) and free slots."""
    pick = np.unique(np.linspace(0, len(run.steps) - 1, min(rows, len(run.steps))).astype(int))
    size = block_size or 1
    used = [run.steps[i].blocks_used * size for i in pick]
    held = [run.steps[i].tokens_held for i in pick]
    rest = "internal_frag" if block_size else "reserved_unused"
    return {"step": pick.tolist(), "token_state": held,
            rest: [u - h for u, h in zip(used, held)],
            "free": [budget_tokens - u for u in used], "budget_tokens": [budget_tokens] * len(pick)}


def memory_bound_scale(arrival_s, prompt_len, output_len, budget_tokens: int,
                       cost: StepCostModel, max_model_len: int, scales=TIME_SCALES,
                       share: float = MEMORY_BOUND_SHARE) -> tuple[float, dict]:
    """The smallest of ``scales`` at which paged block 16 is memory-bound for ``share`` of the
    run's time (bisection: the share grows with the rate), else the largest; with the runs
    made, keyed by scale."""
    scales = sorted(scales)
    runs = {}

    def bound(k):
        s = scales[k]
        if s not in runs:
            runs[s] = serve(arrival_s, prompt_len, output_len, "paged", 16, budget_tokens,
                            cost, s, max_model_len)
        return memory_summary(runs[s], budget_tokens)["saturated_step_fraction"] >= share

    lo, hi = 0, len(scales) - 1
    if not bound(hi):
        return scales[hi], runs
    while lo < hi:
        mid = (lo + hi) // 2
        if bound(mid):
            hi = mid
        else:
            lo = mid + 1
    return scales[lo], runs


def meets_slo(run: SimulatedRun) -> bool:
    """At least :data:`SLO_ATTAINMENT` of the requests meet both SLOs."""
    good = sum(is_good(t, SLO_TTFT_S, SLO_TPOT_S) for t in run.requests)
    return good >= SLO_ATTAINMENT * len(run.requests)


def max_scale_at_slo(run_at, start: float, scales=GOODPUT_SCALES,
                     refine: int = GOODPUT_REFINE_STEPS) -> list:
    """``[(scale, run), ...]`` tried in the search for the largest scale whose run
    :func:`meets_slo`: from the power of two nearest ``start`` in ``scales``, up while runs
    meet the SLOs or down while they miss them (a run far below the knee is the slow one: it
    decodes few sequences per step), then ``refine`` bisections (on a log scale) between the
    last scale that met and the first that missed. ``run_at(scale)`` serves the requests."""
    scales = sorted(scales)
    k = int(np.argmin([abs(math.log(s / start)) for s in scales]))
    tried = [(scales[k], run_at(scales[k]))]
    up = meets_slo(tried[0][1])
    while 0 <= k + (1 if up else -1) < len(scales):
        k += 1 if up else -1
        tried.append((scales[k], run_at(scales[k])))
        if meets_slo(tried[-1][1]) != up:
            break
    met = [s for s, r in tried if meets_slo(r)]
    missed = [s for s, r in tried if not meets_slo(r)]
    if met and missed:
        lo, hi = max(met), min(missed)
        for _ in range(refine):
            mid = math.sqrt(lo * hi)
            r = run_at(mid)
            tried.append((mid, r))
            lo, hi = (mid, hi) if meets_slo(r) else (lo, mid)
    return sorted(tried, key=lambda t: t[0])


def study_trace(arrival_s, prompt_len, output_len, max_model_len: int, cost: StepCostModel,
                budget_tokens: int | None = None, scales=TIME_SCALES) -> dict:
    """Memory rows, timelines and goodput rows of one trace (see the module doc): a dict of
    ``time_scale``, ``memory`` (dicts), ``timeline`` (dicts of lists) and ``goodput`` (dicts)."""
    budget = real_budget_tokens() if budget_tokens is None else budget_tokens
    arrival = np.asarray(arrival_s, dtype=np.float64)
    duration = float(arrival.max() - arrival.min()) if arrival.size else 0.0
    def rate(s):
        return (len(arrival) * s / duration if duration > 0 else math.inf)
    scale, paged_runs = memory_bound_scale(arrival, prompt_len, output_len, budget, cost,
                                           max_model_len, scales)
    cache = {("paged", 16, s): run for s, run in paged_runs.items()}

    def run(allocator, block_size, s):
        key = (allocator, block_size, s)
        if key not in cache:
            cache[key] = serve(arrival, prompt_len, output_len, allocator, block_size, budget,
                               cost, s, max_model_len)
        return cache[key]

    common = dict(budget_tokens=budget, max_model_len=max_model_len, time_scale=scale,
                  request_rate=rate(scale))
    memory, timelines = [], []
    for allocator, block_size in MEMORY_RUNS:
        r = run(allocator, block_size, scale)
        memory.append(dict(allocator=allocator, block_size=block_size,
                           label=label(allocator, block_size)) | common
                      | memory_summary(r, budget))
        timelines.append(dict(allocator=allocator, block_size=block_size,
                              label=label(allocator, block_size))
                         | timeline(r, budget, block_size))
    goodput = []
    for allocator, block_size in GOODPUT_RUNS:
        for s, r in max_scale_at_slo(lambda s: run(allocator, block_size, s), scale):
            m = serving_metrics(r.requests, r.duration_s, slo_ttft_s=SLO_TTFT_S,
                                slo_tpot_s=SLO_TPOT_S)
            goodput.append(dict(allocator=allocator, block_size=block_size,
                                label=label(allocator, block_size), budget_tokens=budget,
                                max_model_len=max_model_len, time_scale=s,
                                request_rate=rate(s), slo_ttft_ms=SLO_TTFT_S * 1e3,
                                slo_tpot_ms=SLO_TPOT_S * 1e3, slo_attainment=SLO_ATTAINMENT,
                                meets_slo=meets_slo(r), num_preemptions=r.num_preemptions)
                           | {k: m[k] for k in GOODPUT_METRICS})
    return dict(time_scale=scale, memory=memory, timeline=timelines, goodput=goodput)
