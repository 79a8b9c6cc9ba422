"""Serving under load, derived from ``serve_bench`` rows: the largest measured rate meeting the
SLO per configuration, and each measured point beside the simulator's prediction of it.

Measured and predicted rows are told apart by ``predicted``; a prediction is paired with the
measured row of the same machine, model, trace, configuration, rate, sample size and seed.
"""

from __future__ import annotations

import math

import pandas as pd

from pagebench.analysis.derive import row_labels

CONFIG = ["machine", "model", "trace", "block_size", "kv_cache_dtype", "prefix_caching"]
PAIRED = CONFIG + ["request_rate", "num_requests", "seed", "repeat"]
COMPARED = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")


def labelled(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its machine labels and a boolean ``predicted`` (empty: measured)."""
    predicted = frame["predicted"] if "predicted" in frame else pd.Series(False, frame.index)
    return frame.assign(machine=row_labels(frame),
                        predicted=predicted.fillna(False).astype(bool),
                        model=frame["model"].fillna("").astype(str))


def measured_rows(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    if frame is None or len(frame) == 0:
        return None
    frame = labelled(frame)
    return frame[~frame["predicted"]]


def max_rate_at_slo(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per configuration: the largest finite measured rate whose rows (every repeat)
    ``meets_slo``, and how many lower rates missed it (latency need not grow with the rate:
    a stall or a slow step in a short run can miss at a light rate)."""
    rows = measured_rows(frame)
    if rows is None or "meets_slo" not in rows or rows["meets_slo"].isna().all():
        return None
    rows = rows[rows["request_rate"].map(math.isfinite) & rows["meets_slo"].notna()]
    out = []
    for key, g in rows.groupby(CONFIG, sort=True, dropna=False):
        met = g["meets_slo"].astype(bool).groupby(g["request_rate"]).all()  # every repeat
        good = met.index[met.to_numpy()]
        best = float(good.max()) if len(good) else math.nan
        out.append(dict(zip(CONFIG, key)) | dict(
            max_rate_at_slo=best, rates_measured=int(g["request_rate"].nunique()),
            rates_missed_below=int((~met[met.index < best]).sum()) if len(good) else 0))
    return pd.DataFrame(out)


def prediction_table(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """One row per measured point with a prediction and per metric of :data:`COMPARED`:
    measured, predicted, and (predicted - measured) / measured."""
    if frame is None or len(frame) == 0:
        return None
    frame = labelled(frame)
    keys = [k for k in PAIRED if k in frame]
    both = frame[~frame["predicted"]].merge(frame[frame["predicted"]][keys + list(COMPARED)],
                                            on=keys, suffixes=("", "_predicted"))
    if both.empty:
        return None
    out = []
    for name in COMPARED:
        part = both[CONFIG + ["request_rate"]].copy()
        part["metric"] = name
        part["measured_ms"] = both[name].astype(float)
        part["predicted_ms"] = both[f"{name}_predicted"].astype(float)
        part["rel_err"] = (part["predicted_ms"] - part["measured_ms"]) / part["measured_ms"]
        out.append(part)
    return pd.concat(out, ignore_index=True)


def error_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per machine, model, trace and metric: the median and largest |relative error| over the
    trace's points (every configuration and rate)."""
    err = table.assign(abs_err=table["rel_err"].abs())
    return (err.groupby(["machine", "model", "trace", "metric"], sort=True)["abs_err"]
            .agg(median_abs_err="median", max_abs_err="max", points="count").reset_index())


def prediction_error(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """:func:`error_summary` of the measured points with a prediction (the validation)."""
    table = prediction_table(frame)
    return None if table is None else error_summary(table)


TABLES = {"serving_max_rate": lambda r: max_rate_at_slo(r.get("serve_bench")),
          "serving_prediction": lambda r: prediction_table(r.get("serve_bench")),
          "serving_prediction_error": lambda r: prediction_error(r.get("serve_bench"))}
