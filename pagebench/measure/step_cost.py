"""Fit the step-cost model on measured engine steps, and score the simulator it drives against
measured serving runs.

``fit_step_cost``: per (model, block size, cache dtype, mode), a non-negative least-squares fit
of ``step_time_ms`` on ``[1, prefill tokens, decode sequences, context tokens / 1000, any
prefill, prefilling sequences]`` over ``serve_steps`` rows, refitted once without the steps
that took more than ``OUTLIER_RATIO`` times the first fit's prediction (a one-off Triton
compile or allocator stall is not a step's cost; a rule in absolute terms would drop every
prefill step, which the many decode steps out-number). The median error is reported per step
kind (decode-only, prefill-only, mixed), since decode steps out-number the others and would
hide them in one median. ``predict_serve_bench``: a measured ``serve_bench`` row's requests
(the same seeded sample, rate and engine limits) run through :func:`pagebench.sim.serving.
simulate_serving`, giving the same row with ``predicted`` set. ``MeasuredSteps``: a "cost
model" that replays a run's measured step times in order, so that the simulator's error with
it is the scheduler's and queueing model's alone (the fitted model's error is the rest).
``step_time_ms`` leaves out the engine's host time between steps (``inter_step_gap_ms``): a
replay without it runs a clock that falls behind the engine's, admits an arrival a step later
than the engine did and from there no longer schedules as it did, so the replay adds it.
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
RUN = ("trace", "request_rate", "block_size", "kv_cache_dtype", "prefix_caching")
OUTLIER_RATIO = 4.0
STEP_KINDS = ("decode", "prefill", "mixed")


def prefill_seqs(frame) -> np.ndarray:
    """Sequences with prompt tokens per step: the batch less its decoding sequences (without
    ``batch_size``, one where a step has prompt tokens)."""
    prefill = frame["num_prefill_tokens"].to_numpy(dtype=np.float64)
    if "batch_size" not in frame or frame["batch_size"].isna().any():
        return (prefill > 0).astype(np.float64)
    return (frame["batch_size"] - frame["num_decode_seqs"]).to_numpy(dtype=np.float64)


def step_kinds(frame) -> np.ndarray:
    """"decode" (no prompt tokens), "prefill" (no decoding sequence) or "mixed" per step."""
    return np.where(frame["num_prefill_tokens"] == 0, "decode",
                    np.where(frame["num_decode_seqs"] == 0, "prefill", "mixed"))


def _features(frame) -> np.ndarray:
    seqs = prefill_seqs(frame)
    return np.column_stack([np.ones(len(frame)), frame["num_prefill_tokens"],
                            frame["num_decode_seqs"], frame["num_context_tokens"] / 1000.0,
                            (seqs > 0).astype(np.float64), seqs])


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


def fit_one(frame) -> tuple[np.ndarray, dict, int]:
    """(coefficients, median relative error overall and per step kind, steps kept) for one
    group's steps."""
    x, y = _features(frame), frame["step_time_ms"].to_numpy(dtype=np.float64)
    coef = nonnegative_lstsq(x, y)
    keep = y <= OUTLIER_RATIO * np.maximum(x @ coef, 1e-9)
    coef = nonnegative_lstsq(x[keep], y[keep])
    rel = np.abs(x[keep] @ coef - y[keep]) / np.maximum(y[keep], 1e-9)
    kinds = step_kinds(frame)[keep]
    errors = {"rel_err_median": float(np.median(rel))} | {
        f"rel_err_median_{kind}": float(np.median(rel[kinds == kind])) if (kinds == kind).any()
        else None for kind in STEP_KINDS}
    return coef, errors, int(keep.sum())


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
        coef, errors, kept = fit_one(group)
        labels = dict(zip(GROUP, key))
        rows.append(STEP_COST.row(**(environment or {}) | labels | dict(
            zip(COEFFICIENTS, coef.tolist())) | errors | dict(num_steps=kept,
                                                               mode=labels["mode"] or None)))
    return rows


def cost_model(row: dict) -> StepCostModel:
    return StepCostModel(*(float(_optional(row.get(name), 0.0)) for name in COEFFICIENTS))


class MeasuredSteps:
    """The measured step times of one run, in order, as a cost model: the simulator's step
    ``k`` lasts what the engine's step ``k`` took, plus ``gap_ms`` (the host time between
    steps, :func:`inter_step_gap_ms`). ``matched`` counts the steps whose work (prefill tokens,
    decoding sequences, context) equals the measured step's: all of them when the simulator
    schedules as the engine did. Past the measured steps, or where a step's work differs, it
    falls back to ``fallback`` (plus ``gap_ms``)."""

    def __init__(self, steps, fallback: StepCostModel, gap_ms: float = 0.0):
        self.steps = steps[["num_prefill_tokens", "num_decode_seqs", "num_context_tokens",
                            "step_time_ms"]].to_numpy().tolist()
        self.fallback, self.gap_ms, self.index, self.matched = fallback, gap_ms, 0, 0

    def step_ms(self, prefill_tokens, decode_seqs, context_tokens, prefill_seqs=None) -> float:
        k, self.index = self.index, self.index + 1
        if k < len(self.steps) and self.steps[k][:3] == [prefill_tokens, decode_seqs,
                                                         context_tokens]:
            self.matched += 1
            return float(self.steps[k][3]) + self.gap_ms
        return self.gap_ms + self.fallback.step_ms(prefill_tokens, decode_seqs, context_tokens,
                                                   prefill_seqs)


def inter_step_gap_ms(steps, measured_rows) -> float:
    """The engine's host time between steps, which ``step_time_ms`` leaves out: over the
    measured serve_bench rows whose requests all arrive at once (no idle time in the run),
    the median of (duration - the run's step times) / its steps; 0 where there is none."""
    gaps = []
    for row in measured_rows:
        if math.isinf(float(row["request_rate"])):
            run = run_steps(steps, row)
            if len(run):
                gaps.append((float(row["duration_s"]) * 1e3 - float(run["step_time_ms"].sum()))
                            / len(run))
    return max(float(np.median(gaps)), 0.0) if gaps else 0.0


def run_steps(steps, row: dict):
    """The rows of ``steps`` (serve_steps) measured in the run of serve_bench ``row``."""
    mask = np.ones(len(steps), dtype=bool)
    for name in RUN + ("model", "mode", "repeat"):
        if name in steps and name in row and _optional(row[name]) is not None:
            mask &= (steps[name] == row[name]).to_numpy()
    return steps[mask]


def _optional(value, default=None):
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return default
    return value


def predict_serve_bench(row: dict, cost) -> dict:
    """The simulator's prediction of a measured serve_bench ``row`` (``cost``: a
    :class:`StepCostModel` or :class:`MeasuredSteps`)."""
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
