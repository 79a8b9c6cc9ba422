"""Fit the step-cost model on measured engine steps, and score the simulator it drives against
measured serving runs.

``fit_step_cost``: per (model, block size, cache dtype, mode), a non-negative least-squares fit
of ``step_time_ms`` on ``[1, prefill tokens, decode sequences, context tokens / 1000]`` over
``serve_steps`` rows, refitted once without the steps whose residual exceeds
``OUTLIER_MADS`` median absolute deviations (a one-off Triton compile or allocator stall is
not a step's cost). ``predict_serve_bench``: a measured ``serve_bench`` row's requests (the
same seeded sample, rate and engine limits) run through :func:`pagebench.sim.serving.
simulate_serving`, giving the same row with ``predicted`` set.
"""

from __future__ import annotations

import math

import numpy as np

from pagebench.errors import ConfigError
from pagebench.measure.serve_bench import metrics_at_slo, trace_sample
from pagebench.measure.serving import arrival_times
from pagebench.results.datasets import SERVE_BENCH, STEP_COST
from pagebench.sim.serving import simulate_serving
from pagebench.sim.step_cost import COEFFICIENTS, StepCostModel

GROUP = ("model", "block_size", "kv_cache_dtype", "mode")
OUTLIER_MADS = 8.0


def _features(frame) -> np.ndarray:
    return np.column_stack([np.ones(len(frame)), frame["num_prefill_tokens"],
                            frame["num_decode_seqs"], frame["num_context_tokens"] / 1000.0])


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: drop the most negative and refit until none
    is (an active set small enough to need nothing more)."""
    active = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        coef[active] = np.linalg.lstsq(x[:, active], y, rcond=None)[0]
        if coef.min() >= 0:
            return coef
        active.remove(int(np.argmin(coef)))


def fit_one(frame) -> tuple[np.ndarray, float, int]:
    """(coefficients, median relative error, steps kept) for one group's steps."""
    x, y = _features(frame), frame["step_time_ms"].to_numpy(dtype=np.float64)
    coef = nonnegative_lstsq(x, y)
    resid = y - x @ coef
    mad = np.median(np.abs(resid - np.median(resid))) or 1e-9
    keep = np.abs(resid) <= OUTLIER_MADS * mad
    coef = nonnegative_lstsq(x[keep], y[keep])
    rel = np.abs(x[keep] @ coef - y[keep]) / np.maximum(y[keep], 1e-9)
    return coef, float(np.median(rel)), int(keep.sum())


def fit_step_cost(steps, environment: dict | None = None) -> list[dict]:
    """``step_cost`` rows, one per group of ``steps`` (a DataFrame of serve_steps rows)."""
    if len(steps) == 0:
        raise ConfigError("steps: no engine steps to fit")
    frame = steps.copy()
    for name in GROUP:
        if name not in frame:
            frame[name] = None
    frame[list(GROUP)] = frame[list(GROUP)].astype(object).where(frame[list(GROUP)].notna(), "")
    rows = []
    for key, group in frame.groupby(list(GROUP), sort=True):
        if len(group) < len(COEFFICIENTS):
            continue
        coef, err, kept = fit_one(group)
        labels = dict(zip(GROUP, key))
        rows.append(STEP_COST.row(**(environment or {}) | labels | dict(
            zip(COEFFICIENTS, coef.tolist())) | dict(num_steps=kept, rel_err_median=err,
                                                      mode=labels["mode"] or None)))
    return rows


def cost_model(row: dict) -> StepCostModel:
    return StepCostModel(*(float(row[name]) for name in COEFFICIENTS))


def _optional(value, default=None):
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return default
    return value


def predict_serve_bench(row: dict, cost: StepCostModel) -> dict:
    """The simulator's prediction of a measured serve_bench ``row``."""
    max_output = _optional(row.get("max_output_len"))
    arrival, workload = trace_sample(row["trace"], int(row["num_requests"]),
                                     max_model_len=int(row["max_model_len"]),
                                     max_output_len=None if max_output is None
                                     else int(max_output), seed=int(row["seed"]))
    rate = float(row["request_rate"])
    times = arrival_times(arrival, rate=rate, poisson=row["arrival"] == "poisson",
                          seed=int(row["seed"]))
    run = simulate_serving(times, workload.prompt_len, workload.output_len, cost,
                           block_size=int(row["block_size"]), num_blocks=int(row["num_blocks"]),
                           max_num_seqs=int(_optional(row.get("max_num_seqs"), 256)),
                           max_num_batched_tokens=int(_optional(
                               row.get("max_num_batched_tokens"), 2048)),
                           prefix_caching=bool(row["prefix_caching"]),
                           hash_ids=workload.hash_ids)
    attainment = _optional(row.get("slo_attainment"))
    metrics = metrics_at_slo(run.requests, run.duration_s, _optional(row.get("slo_ttft_ms")),
                             _optional(row.get("slo_tpot_ms")),
                             None if attainment is None else float(attainment))
    prompt = int(workload.prompt_len.sum())
    blocks = [s.blocks_used for s in run.steps] or [0]
    return SERVE_BENCH.row(**dict(row) | metrics | dict(
        predicted=True, num_preemptions=run.num_preemptions, num_steps=len(run.steps),
        peak_blocks=max(blocks), mean_blocks=sum(blocks) / len(blocks),
        prefix_cache_hit_rate=run.num_cached_prompt_tokens / prompt if prompt else 0.0))
