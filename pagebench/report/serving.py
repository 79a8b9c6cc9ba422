"""The report's "Serving" section: latency against request rate per configuration, the largest
rate meeting the SLO, and the simulator's prediction beside each measured point (the tables of
:mod:`pagebench.analysis.serving`).

Datasets ``real_traces_goodput`` (simulated by :mod:`pagebench.sim.real_load`, every run) and
``serve_bench`` (``pagebench serve-bench``; ``scripts/gpu_serving.sh`` commits it under
``reports/data/<machine>/``, with the simulator's predictions of the same points from
``pagebench step-cost-fit --validate``).
"""

from __future__ import annotations

import math

import pandas as pd

from pagebench.report import plots
from pagebench.report.sections import Section, View, derived
from pagebench.results import Results

SOURCE = "serve_bench rows (pagebench serve-bench; scripts/gpu_serving.sh)"
TEXT = ("Requests of a real trace arrive in wall-clock time at each rate (the trace's times "
        "stretched to it; inf: all at once) and the engine admits them as they come. TTFT = "
        "first token - arrival (queueing included); TPOT = (end-to-end - TTFT) / (output tokens "
        "- 1); goodput = requests/s meeting every SLO; as vLLM's serving benchmark defines them "
        "(docs/serving.md). Predicted points come from the simulator driven by the step-cost "
        "model fitted on the same engine's steps.")


GOODPUT_TEXT = (
    "The article's throughput claim as throughput at equal memory under a latency bound: the "
    "real-trace samples and KV budget of the Real traces part, paged block 16 and reserve-max "
    "each at rates searched (doubling or halving from the memory-bound rate, then three "
    "bisections) for the largest at which 90% of requests meet TTFT <= 1 s and TPOT <= 50 ms. "
    "Simulated, not measured: the step costs are the step_cost column's model (by default the "
    "Qwen2.5-0.5B engine on an H200), not an 8B model's, so the rates are those at which that "
    "cost model fills that memory.")


def is_predicted(frame: pd.DataFrame) -> pd.Series:
    if "predicted" not in frame:
        return pd.Series(False, frame.index)
    return frame["predicted"].fillna(False).astype(bool)


def config_label(frame: pd.DataFrame) -> pd.Series:
    prefix = frame["prefix_caching"].map(lambda on: "prefix on" if on else "prefix off")
    kind = frame["predicted"].map(lambda p: " (predicted)" if p else "")
    return ("block " + frame["block_size"].astype("Int64").astype(str) + ", "
            + frame["kv_cache_dtype"].astype(str) + ", " + prefix + kind)


def latency_plot(metric: str, title: str):
    def plot(frame: pd.DataFrame) -> plots.Plot | None:
        rows = frame.assign(predicted=is_predicted(frame), model=frame["model"].astype(str),
                            machine=frame["machine"].fillna("unknown device").astype(str))
        rows = rows[rows["request_rate"].map(math.isfinite) & rows[metric].notna()]
        if rows.empty:
            return None
        rows = rows.assign(series=config_label(rows),
                           panel=rows["machine"] + ", " + rows["model"] + ", " + rows["trace"])
        return plots.lines(rows, "request_rate", metric, "series", title,
                           "request rate (requests/s)", metric.replace("_ms", " (ms)"),
                           f"{title} against request rate, one line per configuration",
                           legend_title="configuration", logx=True, logy=True, panel="panel")
    return plot


VIEWS = (
    View("serve_bench", "Largest measured request rate meeting the SLO (slo_attainment of the "
         "requests within every SLO), per configuration; rates_missed_below: lower rates that "
         "missed it", frame=derived("serving_max_rate")),
    View("serve_bench", "Measured serving points", (
        "machine", "model", "trace", "block_size", "kv_cache_dtype", "prefix_caching",
        "request_rate", "request_throughput", "goodput", "ttft_p50_ms", "ttft_p99_ms",
        "tpot_p50_ms", "tpot_p99_ms", "itl_p99_ms", "num_preemptions", "peak_blocks",
        "slo_ttft_ms", "slo_tpot_ms"),
         plot=lambda f: [latency_plot("ttft_p99_ms", "TTFT p99")(f),
                         latency_plot("tpot_p99_ms", "TPOT p99")(f)],
         table=lambda f: f[~is_predicted(f)]),
    View("serve_bench", "Simulator against engine, per trace: median and largest |error| of "
         "p50 and p99 TTFT and TPOT over the trace's measured points (every configuration and "
         "rate; same requests and rates; the aim is <= 10%, as Vidur reports)",
         frame=derived("serving_prediction_error"),
         missing="simulator predictions (pagebench step-cost-fit --validate "
         "--predictions-out)"),
    View("serve_bench", "Simulator against engine: p50 and p99 TTFT and TPOT at each measured "
         "point; rel_err = (predicted - measured) / measured",
         frame=derived("serving_prediction"),
         missing="simulator predictions (pagebench step-cost-fit --validate "
         "--predictions-out)"),
    View("real_traces_goodput", "Goodput at equal KV memory on the real traces: paged block 16 "
         "against reserve-max", ("trace", "label", "request_rate", "time_scale", "meets_slo",
                                 "goodput", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
                                 "tpot_p99_ms", "num_preemptions", "step_cost"),
         text=GOODPUT_TEXT, missing="real-trace goodput search (pagebench.sim.real_load)"),
)


def section(results: Results) -> Section:
    s = Section("serving", "Serving")
    s.text(TEXT)
    return s.show(results, VIEWS, empty=SOURCE)
