"""The decisions a user comes for, from the data that decides them: the block size (KV
utilisation on the workload times the engine's decode speed on a GPU, with the repeats'
spread), the fp8 KV cache (capacity, decode and prefill speed, measured accuracy) and the
request rate a latency target allows (serving data, where there is any).

Each answer is a record that names the data behind it (device, commit, workload); a missing
piece is named as missing, never filled in. ``pagebench recommend`` and the report's
Recommendation section both read these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from pagebench.analysis.derive import kernel_cost_per_block
from pagebench.analysis.fp8 import FP8, decode_ratios
from pagebench.results.derived import Recommendation

# without a spread (kernel medians only), scores this close to the best count as a tie
UNSPREAD_TIE = 0.02
# fp8 accuracy the verdict accepts: perplexity at most 1% above the reference's, and the
# reference's greedy (top-1) token chosen at least 98% of the time
PERPLEXITY_TOLERANCE = 0.01
TOP1_FLOOR = 0.98
KV_ACCURACY_COLUMNS = ("model", "kv_dtype", "reference_dtype", "block_size", "perplexity",
                       "perplexity_reference", "top1_agreement", "tokens")
FP8_NAMES = ("fp8_e4m3", "float8_e4m3fn", "fp8")  # how a dataset may spell the e4m3 cache


def run_words(frame: pd.DataFrame) -> str:
    """``NVIDIA H200, commit c46d36d`` of the rows of ``frame`` (their devices and commits)."""
    names = (frame["device_name"] if "device_name" in frame else frame.get("device"))
    devices = sorted(set(names.dropna().astype(str))) if names is not None else []
    commits = sorted(set(frame["commit"].dropna().astype(str))) if "commit" in frame else []
    return (", ".join(devices) or "unknown device") + (
        f", commit {', '.join(commits)}" if commits else ", commit not recorded")


def on_gpu(frame: pd.DataFrame) -> pd.Series:
    return frame["device"].astype(str).str.startswith("cuda") if "device" in frame else \
        pd.Series(False, index=frame.index)


# ---- block size --------------------------------------------------------------------------

def engine_speed(engine: pd.DataFrame | None,
                 batch: int | None = None) -> tuple[pd.DataFrame, str] | None:
    """Relative decode speed per block size from the engine's GPU rows (dataset
    ``engine_batch``): the commit with most rows, CUDA-graph mode where recorded, at the largest
    batch measured at two or more block sizes (where a block size's kernel cost shows most), or
    with ``batch`` (the sequences a workload keeps running at once) the largest such batch not
    above it (else the smallest).
    Columns ``block_size``, ``speed`` (median / best median), ``speed_low``, ``speed_high``
    (the repeats' min and max over the best median); with the words naming the data."""
    if engine is None or engine.empty or "decode_tokens_per_s" not in engine:
        return None
    df = engine[on_gpu(engine)].dropna(subset=["block_size", "decode_tokens_per_s"])
    if "mode" in df:
        df = df[df["mode"].fillna("graphs") == "graphs"]
    if df.empty:
        return None
    if "commit" in df:
        df = df[df["commit"] == df["commit"].value_counts().idxmax()]
    sizes = df.groupby("batch")["block_size"].nunique()
    swept = sorted(int(b) for b in sizes[sizes >= 2].index)
    if not swept:
        return None
    wanted = batch
    batch = swept[-1] if wanted is None else max([b for b in swept if b <= wanted] or swept[:1])
    at = df[df["batch"] == batch].groupby("block_size", as_index=False).agg(
        tps=("decode_tokens_per_s", "median"),
        low=("decode_tokens_per_s_min" if "decode_tokens_per_s_min" in df
             else "decode_tokens_per_s", "min"),
        high=("decode_tokens_per_s_max" if "decode_tokens_per_s_max" in df
              else "decode_tokens_per_s", "max"))
    top = at["tps"].max()
    out = pd.DataFrame({"block_size": at["block_size"].astype(int), "speed": at["tps"] / top,
                        "speed_low": at["low"] / top, "speed_high": at["high"] / top})
    repeats = int(df["repeats"].max()) if "repeats" in df else 1
    why = "" if wanted is None else f", the measured batch nearest the {wanted:,} sequences " \
        "that fit"
    words = (f"engine decode tokens/s at batch {batch}{why} ({run_words(df)}; "
             f"{repeats} repeats, min–max)")
    return out, words


def kernel_speed(kernels: pd.DataFrame | None) -> tuple[pd.DataFrame, str] | None:
    """Relative speed per block size from the paged kernel's median time (1 / relative time,
    :func:`~pagebench.analysis.derive.kernel_cost_per_block`), a GPU's where one measured it;
    no spread is recorded, so the band is :data:`UNSPREAD_TIE` wide."""
    cost = kernel_cost_per_block(kernels)
    if cost.empty:
        return None
    chosen = cost[cost["gpu"]] if cost["gpu"].any() else cost
    device = str(chosen.groupby("device_label")["block_size"].nunique().idxmax())
    chosen = chosen[chosen["device_label"] == device]
    speed = 1.0 / chosen["relative_time"].to_numpy()
    out = pd.DataFrame({"block_size": chosen["block_size"].astype(int).to_numpy(),
                        "speed": speed, "speed_low": speed * (1 - UNSPREAD_TIE),
                        "speed_high": speed})
    words = (f"paged kernel median time per block size on {device}, commit "
             f"{', '.join(sorted(set(chosen['commit'])))} (no spread recorded: a "
             f"{UNSPREAD_TIE:.0%} band)")
    return out, words


def choose_block_size(utilisation: dict[int, float], workload: str,
                      engine: pd.DataFrame | None = None, kernels: pd.DataFrame | None = None,
                      allowed=None, constraint: str | None = None, batch: int | None = None,
                      ) -> tuple[Recommendation, pd.DataFrame] | None:
    """The block size with the best (KV utilisation on ``workload``) x (relative decode speed):
    capacity grows with the first, tokens/s with the second. Speed comes from the engine on a
    GPU (:func:`engine_speed`), else the kernel sweep (:func:`kernel_speed`), else is unknown
    (memory alone decides, and says so). Block sizes whose score interval (utilisation x the
    speed's low..high) reaches the best's low end tie with it: then no block size wins outside
    the noise and the record names the range. ``allowed`` (block size -> bool; a backend's
    constraint, e.g. multiples of 16, worded by ``constraint``) rules the others out. None
    without any utilisation, or when the constraint admits no block size. ``batch``: the
    sequences the workload keeps running at once, which picks the engine's batch
    (:func:`engine_speed`)."""
    if not utilisation:
        return None
    speed = engine_speed(engine, batch) or kernel_speed(kernels)
    if speed is None:
        table = pd.DataFrame({"block_size": sorted(utilisation)})
        table["speed"] = table["speed_low"] = table["speed_high"] = math.nan
        basis = "no speed data: memory alone decides (small blocks may be slow; unmeasured)"
    else:
        table, basis = speed
        table = table[table["block_size"].isin(utilisation)].sort_values("block_size")
        if table.empty:
            return None
    table = table.reset_index(drop=True)
    table.insert(1, "utilisation", [utilisation[int(b)] for b in table["block_size"]])
    fill = table["speed"].isna()
    for col, src in (("score", "speed"), ("score_low", "speed_low"), ("score_high", "speed_high")):
        table[col] = table["utilisation"] * table[src].where(~fill, 1.0)
    table["allowed"] = [bool(allowed(int(b))) if allowed else True for b in table["block_size"]]
    allowed = table[table["allowed"]]
    if allowed.empty:
        return None
    best = allowed.loc[allowed["score"].idxmax()]
    tied = allowed[allowed["score_high"] >= best["score_low"]]["block_size"].tolist()
    excluded = tuple(int(b) for b in table.loc[~table["allowed"], "block_size"])
    rec = Recommendation(int(best["block_size"]), float(best["utilisation"]),
                         tuple(int(b) for b in sorted(tied)), basis, workload,
                         speed is not None, excluded, constraint)
    return rec, table


# ---- fp8 KV cache ------------------------------------------------------------------------

@dataclass(frozen=True)
class Fp8Verdict:
    """One verdict on the fp8 (e4m3) KV cache and the evidence behind it, line by line."""

    verdict: str
    evidence: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)


def is_fp8(values: pd.Series) -> pd.Series:
    return values.astype(str).str.lower().isin(FP8_NAMES)


def decode_summary(kernels_fp8: pd.DataFrame | None) -> tuple[float, float, str] | None:
    """(median, max) of the fastest fp8 kernel's time / bf16's per decode point of the newest
    run, and the words naming it."""
    ratios = decode_ratios(kernels_fp8)
    if ratios is None or ratios.empty:
        return None
    best = ratios.loc[ratios.groupby(["machine", "commit", "batch", "context", "block_size"])
                      ["fp8_over_bf16"].idxmin()]
    run = best[best["commit"] == best["commit"].value_counts().idxmax()]
    points = kernels_fp8[kernels_fp8["commit"].astype(str) == run["commit"].iloc[0]]
    return (float(run["fp8_over_bf16"].median()), float(run["fp8_over_bf16"].max()),
            f"kernels_fp8 decode, {len(run)} points ({run_words(points)}), fastest fp8 "
            "kernel / Triton bf16")


def prefill_summary(kernels_fp8: pd.DataFrame | None) -> tuple[float, float, str] | None:
    """(median, max) of the same prefill kernel's fp8 time / its bf16 time per point."""
    if kernels_fp8 is None or "op" not in kernels_fp8:
        return None
    pre = kernels_fp8[kernels_fp8["op"] == "prefill"]
    keys = [c for c in ("commit", "batch", "context", "query_len", "block_size", "backend")
            if c in pre]
    bf16 = pre[pre["cache_dtype"] == "bfloat16"]
    fp8 = pre[pre["cache_dtype"] == FP8]
    both = fp8.merge(bf16[keys + ["time_us"]], on=keys, suffixes=("", "_bf16"))
    if both.empty:
        return None
    ratio = both["time_us"] / both["time_us_bf16"]
    return (float(ratio.median()), float(ratio.max()),
            f"kernels_fp8 prefill, {len(both)} points ({run_words(both)}), the same kernel "
            "fp8 / bf16")


def accuracy_summary(accuracy: pd.DataFrame | None) -> tuple[dict, str] | None:
    """The worst e4m3 row of dataset ``kv_accuracy`` (perplexity ratio to the reference's,
    top-1 agreement) over block sizes and models, and the words naming it."""
    if accuracy is None or accuracy.empty:
        return None
    missing = [c for c in KV_ACCURACY_COLUMNS if c not in accuracy]
    if missing:
        raise ValueError(f"kv_accuracy: missing column(s) {', '.join(missing)}")
    rows = accuracy[is_fp8(accuracy["kv_dtype"])]
    if rows.empty:
        return None
    ppl = rows["perplexity"] / rows["perplexity_reference"]
    worst = {"perplexity_ratio": float(ppl.max()),
             "top1_agreement": float(rows["top1_agreement"].min()),
             "tokens": int(rows["tokens"].min()),
             "models": ", ".join(sorted(set(rows["model"].astype(str)))),
             "reference": ", ".join(sorted(set(rows["reference_dtype"].astype(str))))}
    return worst, (f"kv_accuracy, {len(rows)} row(s): {worst['models']} vs "
                   f"{worst['reference']} ({run_words(rows)})")


def fp8_verdict(sequences: dict[str, int], capacity_words: str, kernels_fp8=None,
                accuracy=None, prompt_share: float | None = None) -> Fp8Verdict:
    """One verdict on the fp8 KV cache for a workload: ``sequences`` that fit per cache dtype
    (``{"auto": n, "fp8_e4m3": m}``, from the capacity planner, named by ``capacity_words``),
    decode and prefill speed (dataset ``kernels_fp8``), measured accuracy (``kv_accuracy``),
    and the workload's share of prompt tokens (None: lengths only). Accuracy decides first
    (a cache that changes the answers is not worth any speed); then memory (twice the
    sequences) and speed weighed by the workload's tokens."""
    ev, missing, nums = [], [], {}
    bf16, fp8 = sequences.get("auto"), sequences.get("fp8_e4m3")
    if bf16 and fp8:
        nums["capacity_ratio"] = fp8 / bf16
        ev.append(f"capacity: {fp8:,} sequences fit with fp8 vs {bf16:,} ({fp8 / bf16:.2f}×) "
                  f"[{capacity_words}]")
    dec, pre = decode_summary(kernels_fp8), prefill_summary(kernels_fp8)
    for op, summary in (("decode", dec), ("prefill", pre)):
        if summary is None:
            missing.append(f"{op} speed (kernels_fp8 {op} rows)")
            continue
        nums[f"{op}_ratio"], nums[f"{op}_ratio_max"] = summary[0], summary[1]
        ev.append(f"{op}: fp8 takes {summary[0]:.2f}× bf16's time (median; worst "
                  f"{summary[1]:.2f}×) [{summary[2]}]")
    acc = accuracy_summary(accuracy)
    if acc:
        a, words = acc
        nums |= {"perplexity_ratio": a["perplexity_ratio"], "top1_agreement": a["top1_agreement"]}
        ev.append(f"accuracy: perplexity {a['perplexity_ratio'] - 1:+.2%} vs the reference, "
                  f"top-1 agreement {a['top1_agreement']:.3f} over ≥ {a['tokens']:,} tokens "
                  f"[{words}]")
    else:
        missing.append("accuracy (dataset kv_accuracy: reports/data/<machine>/kv_accuracy*.csv "
                       f"with columns {', '.join(KV_ACCURACY_COLUMNS)})")
    if dec and pre and prompt_share is not None:
        weighted = prompt_share * pre[0] + (1 - prompt_share) * dec[0]
        nums["attention_time_ratio"] = weighted
        ev.append(f"this workload: {prompt_share:.0%} of its tokens are prompt; weighing each "
                  "prompt token at the prefill ratio and each output token at the decode ratio "
                  f"gives {weighted:.2f}× bf16's attention time (a bound that overstates "
                  "prefill: a prompt token's attention costs less than an output token's)")
    return Fp8Verdict(_fp8_words(nums, acc is not None, prompt_share), ev, missing, nums)


def _fp8_words(nums: dict, measured: bool, prompt_share: float | None) -> str:
    capacity = nums.get("capacity_ratio")
    if not measured:
        return ("not decided: accuracy is not measured, and capacity "
                + (f"({capacity:.2f}×) " if capacity else "")
                + "and speed cannot outweigh a cost to the answers that nobody measured")
    if (nums["perplexity_ratio"] > 1 + PERPLEXITY_TOLERANCE
            or nums["top1_agreement"] < TOP1_FLOOR):
        return (f"not worth it: accuracy falls outside the tolerance (perplexity ≤ "
                f"+{PERPLEXITY_TOLERANCE:.0%}, top-1 agreement ≥ {TOP1_FLOOR})")
    weighted = nums.get("attention_time_ratio")
    more = f"{capacity:.2f}× the sequences" if capacity else "more sequences"
    if weighted is None:
        return (f"worth it where memory binds ({more}) and decode dominates; speed on this "
                "workload unknown (its prompt/output split or the kernel data is missing)")
    if weighted <= 1:
        return (f"worth it for this workload: {more} and attention at {weighted:.2f}× bf16's "
                "time; long-context, decode-heavy traffic gains most")
    return (f"worth it where memory binds ({more}); for speed alone, not shown on this "
            f"prompt-heavy workload ({prompt_share:.0%} prompt tokens: fp8 prefill is slower, "
            f"token-weighted bound {weighted:.2f}× bf16's attention time)")


# ---- serving -----------------------------------------------------------------------------

LATENCY_ORDER = ("tpot", "itl", "ttft", "e2el", "latency")  # per-token latency first
QUANTILE_ORDER = ("p99", "p90", "p50", "mean")


def latency_bound_rate(serving: pd.DataFrame | None, slo_ms: float,
                       block_size: int | None = None) -> tuple[float | None, str]:
    """The highest finite request rate whose latency stays within ``slo_ms``, from a serving
    dataset (``serve_bench``: ``request_rate`` and latency columns such as ``tpot_p99_ms``,
    per-token latency and the highest percentile first); rows at ``block_size`` with the
    model's own KV dtype where the data has them. (None, why) where it cannot say."""
    if serving is None or serving.empty:
        return None, "no serving data"
    rates = [c for c in serving if "rate" in c.lower() and pd.api.types.is_numeric_dtype(
        serving[c])]
    lat = [c for c in serving if c.lower().endswith("_ms") and "slo" not in c.lower()
           and pd.api.types.is_numeric_dtype(serving[c])
           and any(k in c.lower() for k in LATENCY_ORDER)]
    lat.sort(key=lambda c: (next(i for i, k in enumerate(LATENCY_ORDER) if k in c.lower()),
                            next((i for i, q in enumerate(QUANTILE_ORDER) if q in c.lower()), 9)))
    if not rates or not lat:
        return None, (f"serving data without a rate and a latency (ms) column (columns: "
                      f"{', '.join(map(str, serving.columns))})")
    rows = serving[serving[rates[0]].map(lambda r: r == r and math.isfinite(r))]
    where = []
    if block_size is not None and "block_size" in rows and (rows["block_size"] == block_size).any():
        rows = rows[rows["block_size"] == block_size]
        where.append(f"block {block_size}")
    if "kv_cache_dtype" in rows and (rows["kv_cache_dtype"].astype(str) == "auto").any():
        rows = rows[rows["kv_cache_dtype"].astype(str) == "auto"]
        where.append("KV cache auto")
    ok = rows[rows[lat[0]] <= slo_ms]
    words = (f"{lat[0]} ≤ {slo_ms:g} ms over {len(rows)} serving rows"
             + (f" at {', '.join(where)}" if where else "") + f" ({run_words(rows)})")
    if ok.empty:
        return None, "no measured rate meets " + words
    return float(ok[rates[0]].max()), words
