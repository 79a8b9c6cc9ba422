"""The fp8 KV cache and block-table layout, judged: fp8 / bf16 decode ratios, the layouts'
spread, and the claims the report's "fp8 KV cache and block-table layout" section shows.

Datasets (``scripts/h200_fp8.sh``, committed under ``reports/data/h200/``): ``kernels_fp8``,
``kernels_layout`` and ``fp8_engine``, beside the capacity planner's bf16 vs fp8 arithmetic
(``capacity_fp8``: :func:`pagebench.sim.capacity.fp8_rows`, any machine).
"""

from __future__ import annotations

import pandas as pd

from pagebench.analysis.claims import ARITHMETIC, Claim, Measured, Part, per_machine
from pagebench.analysis.derive import row_labels, table
from pagebench.analysis.noise import NO_SPREAD, Band, against, combine
from pagebench.results import Results
from pagebench.results.derived import ARITHMETIC_KIND, MEASURED_KIND
from pagebench.results.devices import frame_devices

SECTION = "fp8"
FP8 = "float8_e4m3fn"
# the long-context points: batch >= 32 x 4,096 tokens, or a sequence of >= 65,536
LONG_BATCH, LONG_BATCH_CONTEXT, LONG_CONTEXT = 32, 4096, 65536
HALF_TIME_BOUND = 0.6  # fp8 / bf16 time: half the bytes, with some slack for fixed costs
LAYOUT_SPREAD_BOUND = 1.10  # slowest / fastest layout at one point
LAYOUTS = ("contiguous", "shuffled", "aged")  # the block-table layouts a point compares


# the columns beside ``machine`` that say which run a row belongs to, where recorded
RUN = ("model_shape", "commit")


def run_keys(frame: pd.DataFrame) -> list[str]:
    """The columns that say which run a row belongs to: its machine (always), and its model
    shape and commit where recorded; rows are compared only within one run."""
    return ["machine"] + [c for c in RUN if c in frame]


def labelled_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its ``machine`` label, and "" for an empty :data:`RUN` value (rows of a
    file that recorded no commit are a run of their own, not dropped by a group-by)."""
    return frame.assign(machine=row_labels(frame),
                        **{c: frame[c].fillna("").astype(str) for c in RUN if c in frame})


def decode_ratios(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """One row per machine, decode point and fp8 kernel (``backend``: Triton's, the CUDA one):
    Triton's bf16 and the kernel's e4m3 times of the same run (:func:`run_keys`), their ratio,
    fp8's copy fraction and error against the bf16 cache."""
    if frame is None:
        return None
    dec = frame[frame["op"] == "decode"].copy()
    if "launch" in dec:  # other launch options are shown in the CSV, not compared here
        dec = dec[dec["launch"].fillna("default") == "default"]
    dec["backend"] = dec["backend"].fillna("triton") if "backend" in dec else "triton"
    dec = labelled_runs(dec)
    keys = run_keys(dec) + ["batch", "context", "block_size"]
    bf16 = dec[(dec["cache_dtype"] == "bfloat16") & (dec["backend"] == "triton")]
    fp8 = dec[dec["cache_dtype"] == FP8]
    out = fp8.merge(bf16[keys + ["time_us", *(["copy_fraction"] if "copy_fraction" in bf16
                                              else [])]],
                    on=keys, suffixes=("", "_bf16"))
    if out.empty:
        return None
    out = out.rename(columns={"time_us": "fp8_us", "time_us_bf16": "bf16_us",
                              "copy_fraction_bf16": "bf16_copy_fraction",
                              **{c: f"fp8_{c}" for c in ("copy_fraction", "err_vs_bf16_cache",
                                                         "err_vs_dequantised")}})
    out["fp8_over_bf16"] = out["fp8_us"] / out["bf16_us"]
    cols = keys + ["backend", "bf16_us", "fp8_us", "fp8_over_bf16"] + [
        c for c in ("bf16_copy_fraction", "fp8_copy_fraction", "fp8_err_vs_bf16_cache",
                    "fp8_err_vs_dequantised") if c in out]
    return out[cols].sort_values(["machine", "block_size", "context", "batch", "backend"]) \
        .reset_index(drop=True)


def capacity_parts(results: Results) -> Measured | None:
    """The planner's range, and every engine row; judged only beside the planner's rows (the
    criterion's first half)."""
    plan, engine = results.get("capacity_fp8"), results.get("fp8_engine")
    parts, sources = [], []
    if plan is not None:
        lo, hi = plan["blocks_ratio"].min(), plan["blocks_ratio"].max()
        parts.append(Part((lo, hi), f"planner {lo:.3f}–{hi:.3f}× ({', '.join(plan['model'])})"))
        sources.append(ARITHMETIC)
    for row in [] if engine is None else engine.to_dict("records"):
        memory = row.get("kv_cache_memory")
        within = "" if memory is None or pd.isna(memory) else f" in {memory}"
        ratio = float(row["blocks_ratio"])
        parts.append(Part(None if plan is None else (ratio,),
                          f"engine pool{within} {int(row['blocks_bf16']):,} → "
                          f"{int(row['blocks_fp8']):,} blocks ({ratio:.2f}×)"))
    if engine is not None:
        sources.append(f"engine: {frame_devices(engine)}")
    note = "" if plan is not None else " (not judged without the capacity planner's rows)"
    return Measured(parts, "; ".join(sources), note) if parts else None


def decode_time_part(machine: str, ratios: pd.DataFrame) -> Part | None:
    """One run's fastest fp8 decode at each long-context point against Triton's bf16; judged
    at block 16, the worst of those points (None: no block-16 point)."""
    best = ratios.loc[ratios.groupby(["batch", "context", "block_size"])["fp8_over_bf16"]
                      .idxmin()]
    judged = best[best["block_size"] == 16]
    if judged.empty:
        return None
    text = f"{machine}: " + ", ".join(
        f"{int(r.batch)}×{int(r.context)} b{int(r.block_size)}: {r.fp8_over_bf16:.2f}× "
        f"({r.backend})" for r in best.itertuples())
    # the rows carry medians alone: each time gets ±NO_SPREAD (Band.point)
    bands = [Band.point(r.fp8_us) / Band.point(r.bf16_us) for r in judged.itertuples()]
    return Part(bands, text + f" (no spread recorded: ±{100 * NO_SPREAD:.0f}% assumed on each "
                f"time)", name=machine)


def decode_time_parts(results: Results) -> Measured | None:
    """One part per machine and run (:data:`RUN`): an older commit's faster kernel never
    stands in for the newer one's at a point."""
    ratios = table(results, "fp8_decode", TABLES["fp8_decode"])
    if ratios.empty:
        return None
    long = ratios[((ratios["batch"] >= LONG_BATCH) & (ratios["context"] >= LONG_BATCH_CONTEXT))
                  | (ratios["context"] >= LONG_CONTEXT)]
    return per_machine(long, decode_time_part, RUN)


def layout_spread(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per machine, run (:func:`run_keys`) and point: each layout's time, slowest / fastest
    (empty unless all of :data:`LAYOUTS` were timed there), and whether the point fits in
    L2."""
    if frame is None:
        return None
    frame = labelled_runs(frame)
    keys = run_keys(frame) + ["batch", "context", "block_size"]
    wide = frame.pivot_table(index=keys, columns="table_layout", values="time_us",
                             aggfunc="median")
    times = wide.reindex(columns=list(LAYOUTS))
    wide.columns = [f"{c}_us" for c in wide.columns]
    complete = times.notna().all(axis=1)
    wide["slowest_over_fastest"] = (times.max(axis=1) / times.min(axis=1)).where(complete)
    if {"q20_us", "q80_us"} <= set(frame.columns):  # the ratio's band: q80 / q20 at its ends
        q20, q80 = (frame.pivot_table(index=keys, columns="table_layout", values=q,
                                      aggfunc="median").reindex(columns=list(LAYOUTS))
                    for q in ("q20_us", "q80_us"))
        slowest, fastest = times.idxmax(axis=1), times.idxmin(axis=1)
        wide["slowest_over_fastest_lo"] = (picked(q20, slowest) / picked(q80, fastest)) \
            .where(complete)
        wide["slowest_over_fastest_hi"] = (picked(q80, slowest) / picked(q20, fastest)) \
            .where(complete)
    if "fits_l2" in frame:
        wide["fits_l2"] = frame.groupby(keys)["fits_l2"].max()
    if "footprint_bytes" in frame:
        wide["footprint_mb"] = frame.groupby(keys)["footprint_bytes"].max() / 1e6
    return wide.reset_index()


def picked(values: pd.DataFrame, columns: pd.Series) -> pd.Series:
    """Each row's value in the column ``columns`` names for it (NaN where it names none)."""
    return pd.Series([values.at[i, c] if isinstance(c, str) else float("nan")
                      for i, c in columns.items()], index=values.index)


def layout_part(machine: str, spread: pd.DataFrame) -> Part | None:
    """One machine's worst spread over its points with every layout whose K/V does not fit in
    L2 (None: no such point)."""
    judged = spread.dropna(subset=["slowest_over_fastest"])
    partial = len(spread) - len(judged)
    if "fits_l2" in judged:
        judged = judged[~judged["fits_l2"].astype(bool)]
    if judged.empty:
        return None
    worst = judged.loc[judged["slowest_over_fastest"].idxmax()]
    bands = [Band.of(r["slowest_over_fastest"], r.get("slowest_over_fastest_lo"),
                     r.get("slowest_over_fastest_hi")) for _, r in judged.iterrows()]
    flagged = len(spread) - partial - len(judged)
    text = (f"{machine}: worst {worst['slowest_over_fastest']:.2f}× at {int(worst['batch'])}×"
            f"{int(worst['context'])} block {int(worst['block_size'])}; median "
            f"{judged['slowest_over_fastest'].median():.2f}× over {len(judged)} points"
            + (f" ({flagged} L2-resident points left out)" if flagged else "")
            + (f" ({partial} points without all three layouts left out)" if partial else "")
            + ("" if all(b.recorded for b in bands) else
               f" (no spread recorded: ±{100 * NO_SPREAD:.0f}% assumed)"))
    return Part(bands, text, name=machine)


def layout_parts(results: Results) -> Measured | None:
    """One part per machine and run (:data:`RUN`)."""
    spread = table(results, "layout_spread", TABLES["layout_spread"])
    return None if spread.empty else per_machine(spread, layout_part, RUN)


# an fp8 cache's cost on the trained model's held-out text, per block size: perplexity within
# 1% of the bf16 cache's and the same top-1 prediction at >= 98% of positions
PERPLEXITY_BOUND, AGREEMENT_BOUND = 1.01, 0.98


def accuracy_part(machine: str, rows: pd.DataFrame) -> Part | None:
    """One fp8 format of one run against its bf16 reference: judged at its worst block size."""
    rows = rows[rows["reference_dtype"] == "bfloat16"]
    if rows.empty:
        return None
    ratio = rows["perplexity"].astype(float) / rows["perplexity_reference"].astype(float)
    agree = rows["top1_agreement"].astype(float)
    kv = rows["kv_dtype"].iloc[0]
    text = (f"{machine} {kv}: perplexity {rows['perplexity'].astype(float).max():.3f} vs bf16 "
            f"{rows['perplexity_reference'].astype(float).max():.3f} (≤ {ratio.max():.4f}×), "
            f"top-1 agreement ≥ {agree.min():.4f} over block sizes "
            f"{', '.join(str(int(b)) for b in sorted(rows['block_size']))}; "
            f"{int(rows['tokens'].max()):,} held-out tokens")
    return Part((float(ratio.max()), float(agree.min())), text,
                f"{kv} perplexity ×{ratio.max():.3f}, top-1 {100 * agree.min():.1f}%", machine)


def accuracy_parts(results: Results) -> Measured | None:
    frame = results.get("kv_accuracy")
    if frame is None:
        return None
    frame = frame[frame["kv_dtype"].astype(str).str.startswith("fp8")]
    measured = per_machine(frame, accuracy_part, ("model", "kv_dtype", "commit"))
    bf16 = results.get("kv_accuracy")
    bf16 = bf16[bf16["kv_dtype"] == "bfloat16"]
    note = "" if bf16.empty else (
        f" (bf16 against fp32: top-1 agreement ≥ {bf16['top1_agreement'].min():.4f}, "
        f"perplexity {bf16['perplexity'].max():.3f} vs {bf16['perplexity_reference'].max():.3f})")
    return None if measured is None else Measured(measured.parts, measured.device, note)


CLAIMS = (
    Claim("fp8_capacity", "fp8 KV doubles capacity.", "KV blocks fp8 / bf16 within 1.95–2.05× "
          "in the capacity planner (bf16 weights, 0.9 of the GPU, 4 GiB overhead) and in the "
          "engine's pool at equal KV memory where measured", ("capacity_fp8", "fp8_engine"),
          capacity_parts,
          lambda ratios: all(1.95 <= r <= 2.05 for r in ratios), kind=ARITHMETIC_KIND),
    Claim("fp8_decode_time", "fp8 KV halves decode time at long context.",
          f"the fastest e4m3 decode kernel (Triton's or the CUDA one) / Triton bf16 time below "
          f"{HALF_TIME_BOUND}×, beyond each time's noise band, at every block-16 point of batch ≥ 32 × 4,096 and 1 × 65,536 "
          "(Llama-3-8B shape, CUDA graphs); blocks 1 and 128 shown, not judged",
          ("kernels_fp8",), decode_time_parts,
          lambda bands: combine(against(b, HALF_TIME_BOUND, above=False) for b in bands),
          mark_parts=True, kind=MEASURED_KIND),
    Claim("layout_cost", "Block-table layout does not matter to the kernel.",
          f"Triton bf16 decode, slowest / fastest of contiguous, shuffled and aged tables ≤ "
          f"{LAYOUT_SPREAD_BOUND}× at every point whose K/V does not fit in L2 (points that fit "
          "are flagged and left out), per machine; each ratio's band from the two layouts' "
          "q20–q80", ("kernels_layout",), layout_parts,
          lambda bands: combine(against(b, LAYOUT_SPREAD_BOUND, above=False) for b in bands),
          mark_parts=True, kind=MEASURED_KIND),
    Claim("fp8_accuracy", "An fp8 KV cache keeps the model's predictions.",
          f"the shipped trained model (pagebench.engine.trained_model) on held-out text, all "
          f"attention read from the paged cache: perplexity with an fp8 cache ≤ "
          f"{PERPLEXITY_BOUND}× the bf16 cache's and top-1 agreement with it ≥ "
          f"{AGREEMENT_BOUND:.0%}, at every block size (per fp8 format)", ("kv_accuracy",),
          accuracy_parts, lambda v: v[0] <= PERPLEXITY_BOUND and v[1] >= AGREEMENT_BOUND,
          mark_parts=True, kind=MEASURED_KIND),
)


# derived tables the section shows: name -> function of the results
TABLES = {"fp8_decode": lambda results: decode_ratios(results.get("kernels_fp8")),
          "layout_spread": lambda results: layout_spread(results.get("kernels_layout"))}
