"""The report's sections: each turns tidy frames into text, tables and plots, or says "no data".

Most of a section is a list of :class:`View`s, one per dataset it shows, drawn by
:meth:`Section.show`. A section never raises for missing data; it shows a "no data" note naming
what is missing. All strings here are plain text: the template escapes them.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pagebench.report import plots
from pagebench.results import Results
from pagebench.results import devices
from pagebench.results.derived import ARTICLE, FAILS, HOLDS, WITHIN_NOISE, tally


@dataclass(slots=True)
class Table:
    caption: str
    columns: list[str]
    rows: list[list[str]]
    data: str | None = None  # dataset name: the CSV beside the report
    classes: list[list[str]] | None = None  # per-cell CSS class (claims verdicts)
    details: list[list[str]] | None = None  # per-cell text shown one click away ("" for none)


@dataclass(slots=True)
class Item:
    kind: str  # "text" | "table" | "plot" | "nodata"
    text: str = ""
    table: Table | None = None
    plot: plots.Plot | None = None


@dataclass(frozen=True, slots=True)
class View:
    """One dataset as a section shows it: text, plots, then a table linked to its CSV; without
    data, a "No data: ``missing``" note (nothing when ``missing`` is empty).

    ``frame`` reads what is shown (default: the dataset, or the table
    :func:`pagebench.analysis.analyse` derived, named ``data``; the table is linked to the CSV
    of ``data``). ``text`` and ``plot`` may be
    functions of that frame; ``table`` gives what the table shows of it (default: all of it).
    Without data, a ``needed`` view ends the views after it: they are derived from it.
    """

    data: str
    caption: str = ""  # "": no table
    columns: Sequence[str] | None = None  # None: every column but the provenance
    text: str | Callable[[pd.DataFrame], str] = ""
    plot: Callable[[pd.DataFrame], plots.Plot | list[plots.Plot] | None] | None = None
    missing: str = ""
    frame: Callable[[Results], pd.DataFrame | None] | None = None
    table: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    needed: bool = False


def reshaped(name: str, fn: Callable) -> Callable[[Results], pd.DataFrame | None]:
    """A view's ``frame``: ``fn`` of the dataset ``name`` (None where there is none)."""
    return lambda results: fn(results.get(name))


def derived(name: str) -> Callable[[Results], pd.DataFrame | None]:
    """A view's ``frame``: the table :func:`pagebench.analysis.analyse` derived as ``name``."""
    return lambda results: results.get(name)


def view_frame(results: Results, view: View) -> pd.DataFrame | None:
    """What ``view`` shows of ``results``."""
    return view.frame(results) if view.frame else results.get(view.data)


def has_rows(frame: pd.DataFrame | None) -> bool:
    return frame is not None and len(frame) > 0


@dataclass(slots=True)
class Section:
    id: str
    title: str
    items: list[Item] = field(default_factory=list)

    def text(self, text: str) -> None:
        self.items.append(Item("text", text=text))

    def nodata(self, what: str) -> None:
        self.items.append(Item("nodata", text=f"No data: {what}"))

    def table(self, table: Table | None) -> None:
        if table is not None:
            self.items.append(Item("table", table=table))

    def plot(self, plot: plots.Plot | None) -> None:
        if plot is not None:
            self.items.append(Item("plot", plot=plot))

    def show(self, results: Results, views: Sequence[View], empty: str = "") -> Section:
        """Each view's text, plots and table in turn, or its "no data" note; with ``empty``,
        where no view has data, one "No data: ``empty``" note instead of theirs."""
        frames = [view_frame(results, v) for v in views] if empty else None
        if frames is not None and not any(has_rows(f) for f in frames):
            self.nodata(empty)
            return self
        for i, v in enumerate(views):
            frame = frames[i] if frames is not None else view_frame(results, v)
            if not has_rows(frame):
                if v.missing:
                    self.nodata(v.missing)
                if v.needed:
                    break
                continue
            if v.text:
                self.text(v.text if isinstance(v.text, str) else v.text(frame))
            drawn = v.plot(frame) if v.plot else None
            for plot in drawn if isinstance(drawn, list) else [drawn]:
                self.plot(plot)
            if v.caption:
                self.table(make_table(v.table(frame) if v.table else frame, v.caption,
                                      v.columns, v.data))
        return self

    @property
    def plots(self) -> list[plots.Plot]:
        return [i.plot for i in self.items if i.kind == "plot"]


# ---- formatting --------------------------------------------------------------------------

DEVICE_COLUMNS = ("machine", "device_label")  # hold labels of pagebench.results.devices
PERCENT_COLUMNS = ("utilisation", "fraction", "hit_rate", "usage")
# shown once per dataset in the environment section, not in every table (all kept in the CSVs)
PROVENANCE_COLUMNS = ("device", "device_name", "torch_version", "triton_version",
                      "pagebench_version", "python_version", "commit", "source", "experiment",
                      "timing_harness", "timestamp")


def fmt(value, column: str = "") -> str:
    """A cell as text: integers with thousands separators, fractions in a percent column as
    percentages, other numbers to three significant digits; a missing value empty. A numpy
    bool (a nullable boolean column's cell) is a number here: 0 or 1."""
    if value is None or value is pd.NA:
        return ""
    if isinstance(value, bool) or not isinstance(value, numbers.Number | np.bool_):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    x = float(value)
    if math.isnan(x):
        return ""
    if any(key in column for key in PERCENT_COLUMNS) and 0 <= x <= 1.0000001:
        return f"{100 * x:.1f}%"
    if x.is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def make_table(df: pd.DataFrame | None, caption: str, columns=None, data: str | None = None,
               max_rows: int = 300) -> Table | None:
    if df is None or len(df) == 0:
        return None
    if columns is None:  # where it came from first, then the data; provenance is elsewhere
        columns = ["machine"] * ("machine" in df.columns) + [
            c for c in df.columns if c not in PROVENANCE_COLUMNS and c != "machine"]
    cols = [c for c in columns if c in df.columns]
    shown = df[cols].head(max_rows)
    rows = [[fmt(v, c) for c, v in zip(cols, rec)] for rec in shown.itertuples(index=False)]
    if len(df) > max_rows:
        caption += f" (first {max_rows} of {len(df)} rows; all in the CSV)"
    # the device label column reads "device" (the CSV keeps its name)
    header = ["device" if c in DEVICE_COLUMNS else str(c) for c in cols]
    classes = [["device" if c in DEVICE_COLUMNS else "" for c in cols]] * len(rows)
    return Table(caption, header, rows, data, classes)


# ---- environment -------------------------------------------------------------------------

def environment(results: Results, env: dict, options: dict) -> Section:
    s = Section("environment", "Environment")
    s.text("Measured on this machine with the settings below; committed data (e.g. H200 runs) "
           "keeps the device and versions it was measured with. Every table, plot and claim "
           "names a device by its short label; the devices table below says what each is.")
    rows = [["device label", devices.run_label(env) + devices.THIS_RUN]]
    rows += [["torch device" if k == "device" else k, fmt(v)] for k, v in env.items()]
    rows += [[k, fmt(v)] for k, v in options.items()]
    s.table(Table("This run", ["field", "value"], rows))
    s.table(devices_table(results))
    srcs = [[name, str(len(frame)), devices.frame_devices(frame, default=""),
             ", ".join(gpu_harnesses(frame)),
             "; ".join(dict.fromkeys(results.sources.get(name, [])))]
            for name, frame in sorted(results.frames.items())]
    if srcs:
        s.table(Table("Data sources (every dataset is a CSV beside this page)",
                      ["dataset", "rows", "devices", "GPU timing harness", "from"], srcs))
    s.text("Timing: one primitive (pagebench.measure.timing.measure): CPU perf_counter after warm-up, "
           "median; CUDA events, median, batch-1 cases also replayed from a CUDA graph. GPU "
           "timing harness 2 (rows since 79a173a; pagebench.measure.timing.HARNESS): 50 ms of untimed "
           "replays first, L2 flushed between repeats by reading a 256 MB buffer. Harness 1: "
           "a buffer zeroed as the flush, whose write-backs the timed call paid (about 8 us on "
           "the H200 for a call reading past L2), and a 3-call warm-up, so a point could sit in "
           "a slow start up to 14% high (docs/kernels.md, \"Timing on the GPU\").")
    return s


def gpu_harnesses(frame: pd.DataFrame) -> list[str]:
    """The timing harnesses (``pagebench.measure.timing.measure``'s versions) of ``frame``'s timed rows
    measured on a CUDA device (a row without the column: harness 1), in order; none for a frame
    without such rows (or without ``time_us``: engine rows are timed end to end instead)."""
    if "device" not in frame.columns or "time_us" not in frame.columns:
        return []
    gpu = frame[frame["device"].astype(str).str.startswith("cuda")]
    if gpu.empty:
        return []
    column = (gpu["timing_harness"] if "timing_harness" in gpu.columns
              else pd.Series(pd.NA, index=gpu.index))
    return list(dict.fromkeys(str(int(v)) if pd.notna(v) else "1" for v in column))


DEVICE_FIELDS = {"device": "kind", "device_name": "name / architecture", "cpu_count": "CPUs",
                 "torch_version": "torch", "triton_version": "triton", "commit": "commit"}


def devices_table(results: Results) -> Table | None:
    """One row per device label: what the device is, the versions and commits its data was
    measured with, and the datasets that hold it."""
    info: dict[str, dict[str, dict]] = {}
    for name, frame in sorted(results.frames.items()):
        if "machine" not in frame.columns:
            continue
        for label, g in frame.groupby(frame["machine"].astype(str), sort=False):
            d = info.setdefault(label, {k: {} for k in (*DEVICE_FIELDS, "datasets")})
            d["datasets"][name] = None
            for col in DEVICE_FIELDS:
                if col in g.columns:
                    values = (fmt(v) for v in g[col].dropna().unique())
                    if col == "commit":  # asv keeps 10 hex digits, the rest 7
                        values = (v[:7] for v in values)
                    d[col].update(dict.fromkeys(values))
    if not info:
        return None
    rows = [[label] + [", ".join(v for v in d[col] if v) for col in d] for label, d in info.items()]
    return Table("Devices: the full description behind each label",
                 ["device", *DEVICE_FIELDS.values(), "datasets"], rows,
                 classes=[["device"] + [""] * 7] * len(rows))


# ---- memory and capacity -----------------------------------------------------------------

def static_text(static: pd.DataFrame) -> str:
    r = static.iloc[0]
    return (f"Workload {r['workload']}: {int(r['num_seqs']):,} sequences, seed {int(r['seed'])}, "
            f"max_model_len {int(r['max_len']):,}, {int(r['tokens_stored']):,} tokens stored. "
            "Naive reserves max_model_len per sequence, pow2 the next power of two, oracle "
            "exactly the final length (needs to know it in advance), paged ceil(len / block) "
            "blocks.")


def max_len_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """One row per max_model_len, a utilisation column per allocator."""
    wide = sweep.pivot_table(index="max_len", columns="label", values="utilisation",
                             sort=False).reset_index()
    wide.columns = [str(c) if c == "max_len" else f"{c} utilisation" for c in wide.columns]
    return wide


MEMORY = (
    View("memory_static", "Utilisation per allocator", ("allocator", "block_size",
         "allocated_slots", "utilisation", "wasted_slots_per_seq"), text=static_text,
         plot=plots.utilisation_bars, missing="static fragmentation simulation (see warnings)"),
    View("memory_max_len", "Utilisation versus max_model_len", text="Raising max_model_len: "
         "naive reservation's utilisation falls in proportion, paged does not move.",
         plot=plots.max_len_lines, missing="max_model_len sweep", table=max_len_table),
    View("block_waste", "Tail waste per sequence as the BlockManager allocates it (prompt then "
         "token by token)", ("block_size", "num_seqs", "max_waste_slots", "bound_slots",
                             "mean_waste_slots")),
    View("memory_dynamic_timeline", text="Time-stepped simulation: requests arrive, grow one "
         "token per step and finish in a fixed KV budget. Contiguous allocators place "
         "reservations first-fit, so holes (external fragmentation) appear; paged allocation "
         "preempts when the pool runs dry. Breakdown of the budget: token states, "
         "reserved-but-unused, internal and external fragmentation.",
         plot=plots.breakdown_areas, missing="time-stepped simulation (pagebench.sim.dynamic)"),
    View("memory_dynamic_summary", "Time-stepped summary per allocator (fractions are mean "
         "shares of the budget; 'saturated' = over steps where requests wait for memory)",
         ("label", "budget_tokens", "num_requests", "token_state_fraction_saturated",
          "reserved_unused_fraction_saturated", "internal_fragmentation_fraction_saturated",
          "external_fragmentation_fraction_saturated", "token_state_fraction",
          "mean_concurrency", "peak_concurrency", "tokens_per_step", "num_preemptions",
          "refused_with_enough_free", "stranded_free_fraction")),
)


CAPACITY = (
    View("kv_geometry", "KV geometry of the presets (bf16)"),
    View("capacity_article", "The article's arithmetic: Qwen2.5-0.5B, 16 GB card, 12.4 GB of "
         "cache, 4,096-token sequences", ("model", "kv_cache_bytes", "bytes_per_token",
         "bytes_per_block", "num_blocks", "cacheable_tokens", "max_model_len",
         "max_concurrency_naive", "max_concurrency_paged", "paged_vs_naive")),
    View("capacity", "Capacity planner cases (gpu_memory_utilization 0.9, block 16, lengths "
         "lognormal(5.5, 0.9))", ("model", "gpu_memory", "max_model_len", "kv_cache_bytes",
         "num_blocks", "cacheable_tokens", "max_concurrency_naive", "max_concurrency_pow2",
         "max_concurrency_paged", "paged_vs_naive"), plot=lambda cap: plots.bars(
             cap.assign(case=cap["model"].astype(str) + "\n" + cap["gpu_memory"].astype(str)
                        + ", " + cap["max_model_len"].astype(str)), "case",
             {"max_concurrency_naive": "naive reservation",
              "max_concurrency_paged": "paged (block 16)"},
             "Concurrent sequences: naive reservation versus paging",
             "model, GPU memory, max_model_len", "bar chart of naive versus paged concurrency",
             ylabel="concurrent sequences"),
         missing="capacity planner (pagebench.sim.capacity)"),
)


def shown(sid: str, title: str, views: Sequence[View]) -> Callable[[Results], Section]:
    """A section made of ``views`` alone."""
    return lambda results: Section(sid, title).show(results, views)


memory = shown("memory", "Memory: how much reserved KV memory holds tokens", MEMORY)
capacity = shown("capacity", "Capacity: blocks, cacheable tokens, concurrency", CAPACITY)


# ---- kernels -----------------------------------------------------------------------------

def passed(eq: pd.DataFrame) -> pd.Series:
    """Each equivalence case: within tolerance (a missing flag counts as not)."""
    return eq["ok"].fillna(False).astype(bool)


def equivalence_table(eq: pd.DataFrame) -> pd.DataFrame:
    keys = [k for k in ("machine", "backend", "dtype") if k in eq.columns]
    return eq.assign(passed=passed(eq)).groupby(keys, as_index=False).agg(
        cases=("passed", "size"), passed=("passed", "sum"),
        **({"max_rel_err": ("rel_err", "max")} if "rel_err" in eq.columns else {}))


def devices_text(raw: pd.DataFrame) -> str:
    labels = raw.groupby("device_label").size()
    fresh = any(devices.THIS_RUN in str(d) for d in labels.index)
    return ("Devices in this data: " + "; ".join(f"{d} ({n} rows)" for d, n in labels.items())
            + (" (\"this run\": measured by the run that built this page; the others are "
               "committed data)" if fresh else "") + ". Each device is described under "
            "Environment. CPU timings show the harness works; GPU behaviour needs GPU data.")


def throughput_plot(tput: pd.DataFrame) -> plots.Plot:
    primary = tput[tput["primary"]]
    return plots.lines(primary.assign(panel=primary["device_label"] + " · " + primary["shape"]
                                      + " · context " + primary["context"].astype(int)
                                      .map("{:,}".format)),
                       "batch", "tokens_per_s", "series", "Decode throughput versus batch size",
                       "batch size (sequences)", "decode tokens/s (attention only)",
                       "line chart of throughput versus batch",
                       legend_title="backend (bs: block size)", logx=True, logy=True,
                       panel="panel")


def bandwidth_plots(bw: pd.DataFrame) -> list[plots.Plot | None]:
    """One plot per device, with its measured copy bandwidth as the ceiling."""
    out = []
    for label, g in bw.groupby("device_label"):
        ceiling = g.get("copy_gbps", pd.Series(dtype=float)).dropna()  # optional column
        hl = {f"copy ceiling {ceiling.median():,.0f} GB/s": float(ceiling.median())} \
            if len(ceiling) else None
        out.append(plots.lines(g.assign(panel=g["shape"]), "batch", "gbps", "series",
                               f"Achieved GB/s versus the copy ceiling: {label}",
                               "batch size (sequences)", "K/V bytes read / time (GB/s)",
                               "line chart of achieved bandwidth", legend_title="backend",
                               logx=True, hlines=hl, panel="panel"))
    return out


PREFILL = (  # paged prefill (whole prompts, chunks after a cached prefix) against causal SDPA
    View("kernels_prefill_equivalence", text=lambda eq: "Paged prefill against the float64 "
         f"reference: {int(passed(eq).sum())} of {len(eq)} cases within tolerance."),
    View("kernels_prefill_summary", "Paged prefill versus causal SDPA on a contiguous cache",
         text="Prefill: batch sequences, each a chunk of query_len new tokens after cached ones "
         "(0: a whole prompt), causal; one commit per device and shape, the newest. Times in "
         "us; \"graph\" columns are replayed from a CUDA graph (kernel time without the "
         "host's launch work). sdpa-contiguous is causal "
         "SDPA on a contiguous cache (FlashAttention where the GPU has it): the bar a paged "
         "prefill kernel is measured against; torch-paged gathers each sequence first.",
         missing="prefill timings (pagebench bench --prefill --out ..., or commit "
         "reports/data/<gpu>/kernels_prefill.csv)"),
    View("kernels_prefill_vs_fastest", "Every prefill backend against the fastest at each point",
         text="Prefill and mixed steps (lengths mixed:KxQ+Mx1@C: K chunks of Q tokens and M "
         "decodes at C tokens in one call), each backend relative to the fastest at the point. "
         "sdpa-contiguous passes no explicit mask (is_causal, or a bottom-right causal bias "
         "after a cached prefix), so SDPA's fused kernels stay eligible; "
         "sdpa-masked-contiguous is the boolean mask the earlier baseline used."),
    View("kernels_plan", "FlashInfer plan cost (host time)", ("model_shape", "backend", "batch",
         "context", "lengths", "block_size", "plan_us", "replan_us"),
         text="Host microseconds FlashInfer's plan takes at a decode point: a new wrapper's "
         "first plan, its buffers made (plan_us), and the table converted to "
         "indptr/indices/last_page_len and planned again on the same wrapper (replan_us): "
         "what a serving engine pays every step before the kernel runs; not included in the "
         "kernel times."),
)
KERNELS = (
    View("kernels_equivalence", "Paged kernels versus the float64 reference",
         text=lambda eq: "Equivalence against a float64 contiguous reference: "
         f"{int(passed(eq).sum())} of {len(eq)} cases within tolerance.",
         table=equivalence_table),
    View("kernels", text=devices_text, missing="kernel sweep (run without --quick on this "
         "machine, or commit reports/data/<gpu>/kernels.csv)",
         frame=derived("kernels_timed"), needed=True),
    View("kernels_batch1_ratio", "Batch-1 paged/contiguous ratio", text="Batch 1: fastest "
         "paged backend / fastest contiguous backend, per block size and context. Above 1 "
         "means paging costs time.", plot=lambda ratio: plots.lines(
             ratio.assign(panel=ratio["device_label"] + " · " + ratio["shape"]), "block_size",
             "ratio", "context", "Batch-1 paged / contiguous time versus block size",
             "block size (tokens)", "paged / contiguous time (×)",
             "line chart of batch-1 time ratio", legend_title="context (tokens)", logx=True,
             hlines={"contiguous": 1.0}, panel="panel"),
         missing="batch-1 paged versus contiguous pairs"),
    View("kernels_batch1_family", "Batch 1 per kernel family, with the repeats' spread",
         ("device_label", "shape", "family", "context", "block_size", "paged_backend",
          "contiguous_backend", "ratio", "ratio_low", "ratio_high", "paging"),
         text="Batch 1, per paged-kernel family: Triton paged against Triton on a contiguous "
         "cache (paging's own cost), FlashInfer paged against the fastest contiguous kernel "
         "timed (what a deployment pays). ratio_low/ratio_high divide the 20th and 80th "
         "percentiles of the repeats crosswise; paging is \"slower\" or \"faster\" only "
         "where that whole band lies on one side of 1."),
    View("kernels_vs_fastest", "Every decode backend against the fastest at each point",
         ("device_label", "shape", "kv_dtype", "lengths", "batch", "context", "backend",
          "block_size", "time_us", "relative_time", "fastest", "read_fraction"),
         text=lambda df: "Each backend's time (fastest block-table variant, CUDA graph or "
         "not) relative to the fastest backend at the same point (1.00 = it is the fastest), on "
         "the same tensors in one process; lengths: uniform batches, or ragged ones rescaled to "
         "mean context. read_fraction: K/V bytes per second over the device's read-only "
         "bandwidth (a reduction that only reads), the ceiling of a decode step. "
         + triton_behind_text(df)),
    View("kernels_throughput", "Throughput versus batch", ("device_label", "shape", "context",
         "series", "batch", "time_us", "q20_us", "q80_us", "tokens_per_s", "timed_as"),
         text="Attention-kernel throughput versus "
         "batch size (tokens/s = batch / step time) for each block size of the fastest paged "
         "backend and the contiguous baselines, at the context where batch was swept (every "
         "backend in the CSV), from one commit per device and shape: the newest that swept "
         "batch (the CSV's commit column). Attention alone reads each sequence's own K/V, so it scales with "
         "batch only while launch-bound; the engine section shows whole-model throughput. "
         "q20/q80: the 20th and 80th percentiles of the repeats (CPU timings swing between "
         "runs: read a CPU block-size difference only where these do not overlap); timed_as "
         "names rows that are no kernel timing (Triton interpreted on a CPU).",
         plot=throughput_plot, missing="throughput versus batch size"),
    View("kernels_bandwidth", "Achieved bandwidth (block 16 paged and contiguous)",
         ("device_label", "shape", "backend", "block_size", "batch", "context", "time_us",
          "q20_us", "q80_us", "gbps", "copy_gbps", "timed_as"), plot=bandwidth_plots,
         missing="achieved bandwidth (needs gbps and copy_gbps columns)"),
    View("kernels_block_cost_kernel", "Kernel cost per block size, per kernel",
         ("device_label", "kernel", "block_size", "relative_time", "relative_low",
          "relative_high", "cases"),
         text="Each paged kernel's time at a block size over its own best block size at the "
         "same case (median, and range over the cases): does FlashInfer's block 1 cost what "
         "Triton's does?"),
    View("kernels_block_cost", "Kernel cost per block size", plot=lambda cost: plots.lines(
             cost, "block_size", "relative_time", "device_label",
             "Paged kernel time per block size (1.0 = best block size; median over cases of "
             "the newest commit)", "block size (tokens)", "kernel time / best block's (×)",
             "line chart of kernel cost per block size", legend_title="device", logx=True)),
    *PREFILL,
)


kernels = shown("kernels", "Kernels: what paging costs per step, and what batching buys", KERNELS)


# ---- engine ------------------------------------------------------------------------------

def cases(frame: pd.DataFrame, keys: list[str], values, how: str = "mean", sort: bool = False,
          words=lambda key, v: str(v)) -> pd.DataFrame:
    """``values`` aggregated per ``keys`` (device first), each row named in ``case``: one line
    per key, the device's label first (the bar labels of a grouped bar chart)."""
    g = frame.groupby(keys, as_index=False, sort=sort, dropna=False)[values].agg(how)
    return g.assign(case=["\n".join(words(k, v) for k, v in zip(keys, row))
                          for row in g[keys].itertuples(index=False)])


def prefix_plot(pre: pd.DataFrame) -> plots.Plot | None:
    panels = {"num_computed_prompt_tokens": "prompt tokens computed (tokens)",
              "peak_blocks": "peak KV blocks (blocks)"}
    on = pre["enable_prefix_caching"].fillna(False).astype(bool)
    g = cases(pre.assign(caching=on.map({True: "on", False: "off"})), ["machine", "caching"],
              list(panels), sort=True,
              words=lambda k, v: f"caching {v}" if k == "caching" else str(v))
    return plots.bars(g, "case", panels, "Prefix caching on versus off",
                      "device and prefix caching", "bar charts of prefix caching effect")


def batch_series(batch: pd.DataFrame | None) -> pd.DataFrame | None:
    """Engine rows with the ``series`` each is drawn in: its block size, and on a GPU its mode
    where that is not the default (CUDA graphs)."""
    if batch is None:
        return None
    series = batch["block_size"].astype(str)
    if "mode" in batch.columns:
        mode = batch["mode"].fillna("").astype(str)
        series = series.where(mode.isin(["", "graphs"]), series + " " + mode)
    return batch.assign(series=series)


def batch_plots(batch: pd.DataFrame) -> list[plots.Plot | None]:
    """Tokens/s versus batch, end to end and in decode steps: a line per series, a panel per
    device, error bars from min to max over repeats."""
    out = []
    for y, title in (("tokens_per_s", "Engine throughput versus batch size (end to end)"),
                     ("decode_tokens_per_s", "Engine decode throughput versus batch size")):
        if y in batch.columns and batch[y].notna().any():
            out.append(plots.lines(batch[batch[y].notna()], "batch", y, "series", title,
                                   "batch size (sequences)", "generated tokens/s",
                                   f"line chart of {title.lower()}",
                                   legend_title="block size (tokens)", logx=True, logy=True,
                                   panel="machine", spread=(f"{y}_min", f"{y}_max")))
    return out


def compare_plot(cmp_: pd.DataFrame) -> plots.Plot | None:
    rows = cmp_[cmp_["tokens_per_s"].notna()]
    g = cases(rows, ["machine", "method", "batch"], "tokens_per_s", "median",
              words=lambda k, v: f"{v:g} requests" if k == "batch" else str(v))
    return plots.bars(g, "case", {"tokens_per_s": "tokens/s"},
                      "Engine versus transformers: tokens/s",
                      "device, generation method and requests",
                      "bar chart of engine versus transformers throughput",
                      ylabel="generated tokens/s", logy=True, hue="method")


ENGINE = (
    View("engine_cow", "Copy-on-write comparison", text="Copy-on-write: one prompt, n = 1 "
         "versus n = 4 completions. The prompt's blocks are shared; only divergent tokens take "
         "new blocks.", plot=lambda cow: plots.bars(
             cases(cow, ["machine", "variant"], ["peak_blocks"]), "case",
             {"peak_blocks": "peak blocks"}, "KV blocks: n = 1 versus n = 4", "device and request",
             "bar chart of blocks for n=1 and n=4", ylabel="peak KV blocks"),
         missing="copy-on-write comparison (pagebench.measure.engine_bench.cow_comparison)"),
    View("engine_prefix", "Prefix caching comparison", text="Prefix caching: requests sharing "
         "a system prompt, caching on versus off.", plot=prefix_plot,
         missing="prefix caching comparison (pagebench.measure.engine_bench.prefix_cache_comparison)"),
    View("engine_pool", "Pool size sweep", text="Pool size sweep: as the pool shrinks, "
         "preemptions start and throughput falls — the capacity cliff.", plot=lambda pool:
         plots.twin_lines(pool, "num_blocks", "tokens_per_s", "num_preemptions",
                          "Throughput and preemptions versus pool size", "pool size (KV blocks)",
                          "line chart of the capacity cliff",
                          left_label="generated tokens/s (solid)",
                          right_label="preemptions (dashed)", hue="machine"),
         missing="pool size sweep (pagebench.measure.engine_bench.pool_size_sweep)"),
    View("engine_batch", "Engine throughput versus batch", text="Error bars: min and max over "
         "repeats, where the data has them. On a GPU the engine replays decode steps from CUDA "
         "graphs of compiled layers; 'eager' rows run every step from Python.",
         plot=batch_plots, frame=reshaped("engine_batch", batch_series),
         missing="engine throughput versus batch (pagebench.measure.engine_bench.throughput_vs_batch)"),
    View("engine_compare", "Engine versus transformers", text="The engine against "
         "transformers' own generation on the same model and requests: continuous batching "
         "with its paged cache (generate_batch) and generate on the whole left-padded batch "
         "(contiguous cache).", plot=compare_plot),
    View("engine_equal_memory", "Equal-memory comparison", text="Equal KV memory: the paged "
         "engine against transformers' padded generate, which reserves prompt + max_tokens "
         "slots per sequence.", plot=lambda eq: plots.bars(
             cases(eq, ["machine", "method"], "tokens_per_s", "max", sort=True), "case",
             {"tokens_per_s": "tokens/s"}, "Same KV memory: tokens/s",
             "device and generation method", "bar chart of throughput at equal memory",
             ylabel="generated tokens/s")),
)


def engine(results: Results) -> Section:
    s = Section("engine", "Engine: sharing, prefix caching, and the capacity cliff")
    s.show(results, ENGINE)
    other = results.get("engine")
    for exp, part in [] if other is None else other.groupby(other["experiment"].astype(str),
                                                             sort=False):
        s.table(make_table(part, f"Engine results: {exp}", data="engine"))
    if all(results.get(v.data) is None for v in ENGINE) and other is None:
        s.text("No engine data: run `pagebench report` without --quick, or commit "
               "reports/data/<machine>/engine_*.csv.")
    return s


# ---- benchmark histories and the recommendation ------------------------------------------

def triton_behind_text(df: pd.DataFrame) -> str:
    """Where pagebench's Triton paged decode is not the fastest at batch 8 or more, per device,
    shape and lengths, in words: the report says plainly where it is slower."""
    keys = ["device_label", "shape", "lengths"]
    triton = df[(df["backend"] == "triton-paged") & (df["batch"] >= 8)]
    behind = triton[triton["relative_time"] > 1.0]
    if behind.empty:
        return "At batch 8 and more, pagebench's Triton paged decode is the fastest at every point."
    points = triton.groupby(keys).size()
    parts = [f"{dev} {shape}, {lengths}: up to {g['relative_time'].max():.2f}× the fastest "
             f"({len(g)} of {points[(dev, shape, lengths)]} points)"
             for (dev, shape, lengths), g in behind.groupby(keys)]
    return ("Where pagebench's Triton paged decode is slower than another backend at batch 8 and "
            "more: " + "; ".join(parts) + ". On ragged batches the kernel of older commits "
            "split every sequence as the longest (load imbalance, not paging); since the ragged "
            "split-KV each sequence splits by its own length, and what is left is the ragged "
            "grid's per-program split choice and merge launch (the commit column says which; "
            "docs/kernels.md, \"Ragged batches\").")


def asv_text(asv: pd.DataFrame) -> str:
    return (f"asv: {asv['commit'].nunique()} commit(s) on {asv['machine'].nunique()} device(s). "
            "One plot per benchmark: its value at each commit measured, one panel per device, "
            "one line per parameter set; the latest values are in the table below and every "
            "commit in the CSV.")


BENCHMARKS = (
    View("asv", "asv, latest per benchmark", ("machine", "commit", "benchmark", "params",
         "value", "unit"), text=asv_text,
         plot=lambda asv: [plots.history(g, str(bench), f"line chart of {bench} over commits")
                           for bench, g in asv.groupby("benchmark", sort=True)],
         missing="asv results (run `asv run`; results are read from asv's results_dir)",
         table=lambda asv: asv.sort_values("date").groupby(["machine", "benchmark", "params"],
                                                           as_index=False).last()),
    View("pytest_benchmark", "pytest-benchmark", ("machine", "commit", "benchmark", "params",
         "median_us", "iqr_us", "rounds"), missing="pytest-benchmark JSON (run `make bench`)"),
)


benchmarks = shown("benchmarks", "Benchmark histories (asv, pytest-benchmark)", BENCHMARKS)


def recommendation(results: Results) -> Section:
    """The recommended block size (:func:`pagebench.analysis.advice.choose_block_size`) on the
    workload it names, with the data behind it and its uncertainty."""
    s = Section("recommendation", "Recommendation")
    rec, table = results.recommendation, results.get("recommendation")
    if rec is None:
        s.nodata("needs a KV utilisation curve (and engine or kernel data for the speed side)")
        return s
    s.text(f"Workload: {rec.workload} (pass `pagebench report --lengths FILE` or `--trace "
           "NAME|FILE` to recommend for your own; `pagebench recommend` answers in seconds).")
    if rec.speed_measured:
        s.text(f"{rec.words()[0].upper()}{rec.words()[1:]}. It holds {rec.utilisation:.1%} of "
               "KV slots as tokens on this workload; the score is utilisation × decode speed "
               f"relative to the fastest block size, the speed from {rec.basis}. A block size "
               "ties with the best when its score's high end reaches the best's low end"
               + (": no block size wins outside the noise." if rec.no_winner else "."))
    else:
        s.text(f"Memory alone favours block size {rec.block_size} ({rec.utilisation:.1%}): "
               f"{rec.basis}. Treat this as incomplete.")
    if rec.excluded:
        s.text(f"Ruled out ({rec.constraint}): block sizes "
               + ", ".join(map(str, rec.excluded)) + ".")
    s.plot(plots.block_size_scores(table))
    s.table(make_table(table, "Score = utilisation × speed (low..high: the repeats' spread)",
                       data="recommendation"))
    traces = results.get("recommendation_traces")
    if traces is not None and len(traces):
        s.text("The same weighing on the KV utilisation of each real trace (section Real "
               "traces), with the same speed data:")
        s.table(make_table(traces, "Recommendation per real trace",
                           data="recommendation_traces"))
    return s


# ---- claims ------------------------------------------------------------------------------

VERDICT_CLASS = {HOLDS: "holds", FAILS: "fails", WITHIN_NOISE: "noise"}


def verdicts(results: Results, section: str) -> pd.DataFrame:
    """The verdicts (dataset ``claims``) the verdict table of ``section`` shows."""
    claims = results.get("claims")
    return claims[claims["section"] == section]


def claims_section(results: Results) -> Section:
    s = Section("claims", "Claims of the article, measured")
    claims = verdicts(results, ARTICLE)
    every = results.get("claims")
    s.text(f"{tally(every['verdict'], every['kind'])} on this page, the same count `pagebench "
           f"claims` prints; this table holds the article's {len(claims)}, the others sit in the "
           "sections they concern. Each verdict is computed from the data linked in its row, with "
           "the criterion shown; a claim the data contradicts is marked 'does not hold' with the "
           "numbers that contradict it, and a comparison whose repeats' spread straddles the "
           "criterion 'within noise'. The kind says what a verdict can carry: 'arithmetic' re-runs "
           "a formula or the article's own seeded script (true by construction when it holds), "
           "'measured' is a timing or an engine run, 'citation' checks a paper's number against a "
           "measurement of the same thing. Kernel claims are judged on GPU data when a GPU "
           "measured them.")
    s.table(claims_table(claims, "Claims", "claims"))
    return s


def claims_table(claims: pd.DataFrame, caption: str, data: str | None = None) -> Table:
    """Verdicts as a table: each coloured, the measured headline in the cell with every detail
    one click away (the claims section and the sections with verdicts of their own)."""
    rows, classes, details = [], [], []
    for c in claims.itertuples(index=False):
        rows.append([c.claim, c.kind, c.headline, c.device, c.verdict, c.criterion, c.data])
        classes.append(["", "kind", "measured", "device", "verdict " + VERDICT_CLASS.get(
            c.verdict, "unmeasured"), "criterion", "links"])
        details.append(["", "", c.measured if c.headline != c.measured else "", "", "", "",
                        ""])
    return Table(caption, ["claim", "kind", "measured", "device", "verdict", "criterion",
                           "data"], rows, data, classes, details)
