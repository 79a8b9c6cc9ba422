"""The report's sections: each turns tidy frames into text, tables and plots, or says "no data".

A section never raises for missing data; it shows a "no data" note naming what is missing. All
strings here are plain text: the template escapes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from pagebench.report import derive, plots
from pagebench.report.claims import FAILS, HOLDS, Verdict, tally
from pagebench.report.collect import Results
from pagebench.results import devices


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

    def dataset(self, results: Results, name: str, caption: str, columns=None) -> None:
        """The dataset ``name`` as a table linked to its CSV (nothing if it has no rows)."""
        self.table(make_table(results.get(name), caption, columns, name))

    def plot(self, plot: plots.Plot | None, missing: str = "") -> None:
        if plot is not None:
            self.items.append(Item("plot", plot=plot))
        elif missing:
            self.nodata(missing)

    @property
    def plots(self) -> list[plots.Plot]:
        return [i.plot for i in self.items if i.kind == "plot"]


# ---- formatting --------------------------------------------------------------------------

DEVICE_COLUMNS = ("machine", "device_label")  # hold labels of pagebench.results.devices
PERCENT_COLUMNS = ("utilisation", "fraction", "hit_rate", "usage")
# shown once per dataset in the environment section, not in every table (all kept in the CSVs)
PROVENANCE_COLUMNS = ("device", "device_name", "torch_version", "triton_version",
                      "pagebench_version", "python_version", "commit", "source", "experiment",
                      "timing_method")


def fmt(value, column: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or (hasattr(value, "is_integer") and not isinstance(value, float)
                                  and str(value).lstrip("-").isdigit()):
        return f"{int(value):,}"
    if isinstance(value, float) or hasattr(value, "dtype"):
        try:
            x = float(value)
        except (TypeError, ValueError):
            return str(value)
        if any(key in column for key in PERCENT_COLUMNS) and 0 <= x <= 1.0000001:
            return f"{100 * x:.1f}%"
        if x.is_integer() and abs(x) < 1e15:
            return f"{int(x):,}"
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.3g}"
    return str(value)


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


# ---- sections ----------------------------------------------------------------------------

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
    srcs = []
    for name, frame in sorted(results.frames.items()):
        labels = ", ".join(dict.fromkeys(frame["machine"].dropna().astype(str))) \
            if "machine" in frame.columns else ""
        srcs.append([name, str(len(frame)), labels,
                     "; ".join(dict.fromkeys(results.sources.get(name, [])))])
    if srcs:
        s.table(Table("Data sources (every dataset is a CSV beside this page)",
                      ["dataset", "rows", "devices", "from"], srcs))
    methods = set()
    for frame in results.frames.values():
        if "timing_method" in frame.columns:
            methods.update(frame["timing_method"].dropna().astype(str))
    s.text("Timing: one primitive (pagebench.timing.measure): CPU perf_counter after warm-up, "
           "median; CUDA events after warm-up with L2 flushed between repeats, median, batch-1 "
           "cases also replayed from a CUDA graph."
           + (" Methods in the data: " + "; ".join(sorted(methods)) + "." if methods else ""))
    return s


def devices_table(results: Results) -> Table | None:
    """One row per device label: what the device is, the versions and commits its data was
    measured with, and the datasets that hold it."""
    info: dict[str, dict[str, dict]] = {}
    for name, frame in sorted(results.frames.items()):
        if "machine" not in frame.columns:
            continue
        for label, g in frame.groupby(frame["machine"].astype(str), sort=False):
            d = info.setdefault(label, {k: {} for k in ("device", "device_name", "cpu_count",
                                                        "torch_version", "triton_version",
                                                        "commit", "datasets")})
            d["datasets"][name] = None
            for col in ("device", "device_name", "cpu_count", "torch_version",
                        "triton_version", "commit"):
                if col in g.columns:
                    values = (fmt(v) for v in g[col].dropna().unique())
                    if col == "commit":  # asv keeps 10 hex digits, the rest 7
                        values = (v[:7] for v in values)
                    d[col].update(dict.fromkeys(values))
    if not info:
        return None
    rows = [[label] + [", ".join(v for v in d[col] if v) for col in d] for label, d in info.items()]
    return Table("Devices: the full description behind each label",
                 ["device", "kind", "name / architecture", "CPUs", "torch", "triton", "commit",
                  "datasets"], rows, classes=[["device"] + [""] * 7] * len(rows))


DYNAMIC_COLUMNS = ("label", "budget_tokens", "num_requests", "token_state_fraction_saturated",
                   "reserved_unused_fraction_saturated",
                   "internal_fragmentation_fraction_saturated",
                   "external_fragmentation_fraction_saturated", "token_state_fraction",
                   "mean_concurrency", "peak_concurrency", "tokens_per_step", "num_preemptions",
                   "refused_with_enough_free", "stranded_free_fraction")
CAPACITY_COLUMNS = ("model", "gpu_memory", "max_model_len", "kv_cache_bytes", "num_blocks",
                    "cacheable_tokens", "max_concurrency_naive", "max_concurrency_pow2",
                    "max_concurrency_paged", "paged_vs_naive")


def memory(results: Results) -> Section:
    s = Section("memory", "Memory: how much reserved KV memory holds tokens")
    static = results.get("memory_static")
    if static is None:
        s.nodata("static fragmentation simulation (see warnings)")
    else:
        r = static.iloc[0]
        s.text(f"Workload {r['workload']}: {int(r['num_seqs']):,} sequences, seed "
               f"{int(r['seed'])}, max_model_len {int(r['max_len']):,}, "
               f"{int(r['tokens_stored']):,} tokens stored. Naive reserves max_model_len per "
               "sequence, pow2 the next power of two, oracle exactly the final length (needs "
               "to know it in advance), paged ceil(len / block) blocks.")
        s.plot(plots.utilisation_bars(static))
        s.dataset(results, "memory_static", "Utilisation per allocator", ["allocator",
                  "block_size", "allocated_slots", "utilisation", "wasted_slots_per_seq"])
    sweep = results.get("memory_max_len")
    if sweep is None:
        s.nodata("max_model_len sweep")
    else:
        s.text("Raising max_model_len: naive reservation's utilisation falls in proportion, "
               "paged does not move.")
        s.plot(plots.max_len_lines(sweep))
        wide = sweep.pivot_table(index="max_len", columns="label", values="utilisation",
                                 sort=False).reset_index()
        wide.columns = [str(c) if c == "max_len" else f"{c} utilisation" for c in wide.columns]
        s.table(make_table(wide, "Utilisation versus max_model_len", data="memory_max_len"))
    s.dataset(results, "block_waste", "Tail waste per sequence as the BlockManager allocates it "
              "(prompt then token by token)", ["block_size", "num_seqs", "max_waste_slots",
                                               "bound_slots", "mean_waste_slots"])
    summary = results.get("memory_dynamic_summary")
    timeline = results.get("memory_dynamic_timeline")
    if summary is None and timeline is None:
        s.nodata("time-stepped simulation (pagebench.sim.dynamic)")
    else:
        s.text("Time-stepped simulation: requests arrive, grow one token per step and finish in "
               "a fixed KV budget. Contiguous allocators place reservations first-fit, so holes "
               "(external fragmentation) appear; paged allocation preempts when the pool runs "
               "dry. Breakdown of the budget: token states, reserved-but-unused, internal and "
               "external fragmentation.")
        s.plot(plots.breakdown_areas(timeline), "memory breakdown timeline")
        s.dataset(results, "memory_dynamic_summary", "Time-stepped summary per allocator "
                  "(fractions are mean shares of the budget; 'saturated' = over steps where "
                  "requests wait for memory)", DYNAMIC_COLUMNS)
    return s


def capacity(results: Results) -> Section:
    s = Section("capacity", "Capacity: blocks, cacheable tokens, concurrency")
    s.dataset(results, "kv_geometry", "KV geometry of the presets (bf16)")
    s.dataset(results, "capacity_article", "The article's arithmetic: Qwen2.5-0.5B, 16 GB card, "
              "12.4 GB of cache, 4,096-token sequences", ("model", "kv_cache_bytes",
              "bytes_per_token", "bytes_per_block", "num_blocks", "cacheable_tokens",
              "max_model_len", "max_concurrency_naive", "max_concurrency_paged",
              "paged_vs_naive"))
    cap = results.get("capacity")
    if cap is None:
        s.nodata("capacity planner (pagebench.sim.capacity)")
    else:
        label = cap["model"].astype(str) + "\n" + cap["gpu_memory"].astype(str) + ", " \
            + cap["max_model_len"].astype(str)
        s.plot(plots.grouped_bars(cap.assign(case=label), "case",
                                  {"max_concurrency_naive": "naive reservation",
                                   "max_concurrency_paged": "paged (block 16)"},
                                  "Concurrent sequences: naive reservation versus paging",
                                  "concurrent sequences",
                                  "bar chart of naive versus paged concurrency",
                                  xlabel="model, GPU memory, max_model_len"))
        s.dataset(results, "capacity", "Capacity planner cases (gpu_memory_utilization 0.9, "
                  "block 16, lengths lognormal(5.5, 0.9))", CAPACITY_COLUMNS)
    return s


def kernels(results: Results) -> Section:
    s = Section("kernels", "Kernels: what paging costs per step, and what batching buys")
    eq = results.get("kernels_equivalence")
    if eq is not None:
        ok = eq["ok"].astype(str).str.lower().isin(("true", "1"))
        keys = [k for k in ("machine", "backend", "dtype") if k in eq.columns]
        summary = eq.assign(passed=ok).groupby(keys, as_index=False).agg(
            cases=("passed", "size"), passed=("passed", "sum"),
            **({"max_rel_err": ("rel_err", "max")} if "rel_err" in eq.columns else {}))
        s.text(f"Equivalence against a float64 contiguous reference: {int(ok.sum())} of "
               f"{len(eq)} cases within tolerance.")
        s.table(make_table(summary, "Paged kernels versus the float64 reference",
                           data="kernels_equivalence"))
    raw = derive.kernel_rows(results.get("kernels"))
    if raw is None:
        s.nodata("kernel sweep (run without --quick on this machine, or commit "
                 "reports/data/<gpu>/kernels.csv)")
        return s
    labels = raw.groupby("device_label").size()
    fresh = any(devices.THIS_RUN in str(d) for d in labels.index)
    s.text("Devices in this data: " + "; ".join(f"{d} ({n} rows)" for d, n in labels.items())
           + (" (\"this run\": measured by the run that built this page; the others are "
              "committed data)" if fresh else "") + ". Each device is described under "
           "Environment. CPU timings show the harness works; GPU behaviour needs GPU data.")
    ratio = derive.batch1_ratio(results.get("kernels"))
    if ratio.empty:
        s.nodata("batch-1 paged versus contiguous pairs")
    else:
        s.text("Batch 1: fastest paged backend / fastest contiguous backend, per block size and "
               "context. Above 1 means paging costs time.")
        s.plot(plots.lines(ratio.assign(panel=ratio["device_label"] + " · " + ratio["shape"]),
                           "block_size", "ratio", "context",
                           "Batch-1 paged / contiguous time versus block size",
                           "block size (tokens)", "paged / contiguous time (×)",
                           "line chart of batch-1 time ratio", legend_title="context (tokens)",
                           logx=True, hlines={"contiguous": 1.0}, panel="panel"))
        s.table(make_table(ratio, "Batch-1 paged/contiguous ratio", data="kernels_batch1_ratio"))
    tput = derive.throughput(results.get("kernels"))
    if tput.empty:
        s.nodata("throughput versus batch size")
    else:
        s.text("Attention-kernel throughput versus batch size (tokens/s = batch / step time) "
               "for each block size of the fastest paged backend and the contiguous baselines, "
               "at the context where batch was swept (every backend in the CSV). Attention "
               "alone reads each sequence's own K/V, so it scales with batch only while "
               "launch-bound; the engine section shows whole-model throughput.")
        shown = tput[tput["primary"]]
        s.plot(plots.lines(shown.assign(panel=shown["device_label"] + " · " + shown["shape"]
                                        + " · context " + shown["context"].astype(int)
                                        .map("{:,}".format)),
                           "batch", "tokens_per_s", "series",
                           "Decode throughput versus batch size", "batch size (sequences)",
                           "decode tokens/s (attention only)",
                           "line chart of throughput versus batch",
                           legend_title="backend (bs: block size)", logx=True, logy=True,
                           panel="panel"))
        s.table(make_table(tput, "Throughput versus batch", ["device_label", "shape", "context",
                           "series", "batch", "time_us", "tokens_per_s"], "kernels_throughput"))
    bw = derive.bandwidth(results.get("kernels"))
    if bw.empty:
        s.nodata("achieved bandwidth (needs gbps and copy_gbps columns)")
    else:
        for label, g in bw.groupby("device_label"):
            ceiling = pd.to_numeric(g.get("copy_gbps"), errors="coerce").dropna() \
                if "copy_gbps" in g.columns else pd.Series(dtype=float)
            hl = {f"copy ceiling {ceiling.median():,.0f} GB/s": float(ceiling.median())} \
                if len(ceiling) else None
            s.plot(plots.lines(g.assign(panel=g["shape"]), "batch", "gbps", "backend",
                               f"Achieved GB/s versus the copy ceiling: {label}",
                               "batch size (sequences)", "K/V bytes read / time (GB/s)",
                               "line chart of achieved bandwidth", legend_title="backend",
                               logx=True, hlines=hl, panel="panel"))
        s.table(make_table(bw, "Achieved bandwidth (block 16 paged and contiguous)",
                           ["device_label", "shape", "backend", "block_size", "batch", "context",
                            "time_us", "gbps", "copy_gbps"], "kernels_bandwidth"))
    cost = derive.kernel_cost_per_block(results.get("kernels"))
    if not cost.empty:
        s.plot(plots.lines(cost, "block_size", "relative_time", "device_label",
                           "Paged kernel time per block size (1.0 = best block size)",
                           "block size (tokens)",
                           "kernel time / best block size's (median over cases)",
                           "line chart of kernel cost per block size", legend_title="device",
                           logx=True))
        s.table(make_table(cost, "Kernel cost per block size", data="kernels_block_cost"))
    prefill_part(s, results)
    return s


def prefill_part(s: Section, results: Results) -> None:
    """Paged prefill (whole prompts, chunks after a cached prefix) against causal SDPA."""
    eq = results.get("kernels_prefill_equivalence")
    if eq is not None:
        ok = eq["ok"].astype(str).str.lower().isin(("true", "1"))
        s.text(f"Paged prefill against the float64 reference: {int(ok.sum())} of {len(eq)} cases "
               "within tolerance.")
    summary = derive.prefill_summary(results.get("kernels_prefill"))
    if summary.empty:
        s.nodata("prefill timings (pagebench bench --prefill --out ..., or commit "
                 "reports/data/<gpu>/kernels_prefill.csv)")
        return
    s.text("Prefill: batch sequences, each a chunk of query_len new tokens after cached ones "
           "(0: a whole prompt), causal. Times in us; \"graph\" columns are replayed from a "
           "CUDA graph (kernel time without the host's launch work). sdpa-contiguous is causal "
           "SDPA on a contiguous cache (FlashAttention where the GPU has it): the bar a paged "
           "prefill kernel is measured against; torch-paged gathers each sequence first.")
    s.table(make_table(summary, "Paged prefill versus causal SDPA on a contiguous cache",
                       data="kernels_prefill_summary"))


def cases(frame: pd.DataFrame, keys: list[str], values, how: str = "mean", sort: bool = False,
          words=lambda key, v: str(v)) -> pd.DataFrame:
    """``values`` aggregated per ``keys`` (device first), each row named in ``case``: one line
    per key, the device's label first (the bar labels of a grouped bar chart)."""
    g = frame.groupby(keys, as_index=False, sort=sort, dropna=False)[values].agg(how)
    return g.assign(case=["\n".join(words(k, v) for k, v in zip(keys, row))
                          for row in g[keys].itertuples(index=False)])


def engine(results: Results) -> Section:
    s = Section("engine", "Engine: sharing, prefix caching, and the capacity cliff")
    names = ("engine_cow", "engine_prefix", "engine_pool", "engine_batch", "engine_compare",
             "engine_equal_memory", "engine")
    cow = results.get("engine_cow")
    if cow is None:
        s.nodata("copy-on-write comparison (pagebench.engine.bench.cow_comparison)")
    else:
        s.text("Copy-on-write: one prompt, n = 1 versus n = 4 completions. The prompt's blocks "
               "are shared; only divergent tokens take new blocks.")
        key = "variant" if "variant" in cow.columns else "n"
        g = cases(cow, ["machine", key], ["peak_blocks"],
                  words=lambda k, v: f"n={v}" if k == "n" else str(v))
        s.plot(plots.grouped_bars(g, "case", {"peak_blocks": "peak blocks"},
                                  "KV blocks: n = 1 versus n = 4", "peak KV blocks",
                                  "bar chart of blocks for n=1 and n=4",
                                  xlabel="device and request"))
        s.dataset(results, "engine_cow", "Copy-on-write comparison")
    pre = results.get("engine_prefix")
    if pre is None:
        s.nodata("prefix caching comparison (pagebench.engine.bench.prefix_cache_comparison)")
    else:
        s.text("Prefix caching: requests sharing a system prompt, caching on versus off.")
        panels = {"num_computed_prompt_tokens": "prompt tokens computed (tokens)",
                  "peak_blocks": "peak KV blocks (blocks)"}
        on = pre["enable_prefix_caching"].astype(str).str.lower().isin(("true", "1"))
        g = cases(pre.assign(caching=on.map({True: "on", False: "off"})),
                  ["machine", "caching"], list(panels), sort=True,
                  words=lambda k, v: f"caching {v}" if k == "caching" else str(v))
        s.plot(plots.bar_panels(g, "case", panels, "Prefix caching on versus off",
                                "device and prefix caching",
                                "bar charts of prefix caching effect"))
        s.dataset(results, "engine_prefix", "Prefix caching comparison")
    pool = results.get("engine_pool")
    if pool is None:
        s.nodata("pool size sweep (pagebench.engine.bench.pool_size_sweep)")
    else:
        s.text("Pool size sweep: as the pool shrinks, preemptions start and throughput falls "
               "— the capacity cliff.")
        s.plot(plots.twin_lines(pool, "num_blocks", "tokens_per_s", "num_preemptions",
                                "Throughput and preemptions versus pool size",
                                "pool size (KV blocks)", "line chart of the capacity cliff",
                                left_label="generated tokens/s (solid)",
                                right_label="preemptions (dashed)", hue="machine"))
        s.dataset(results, "engine_pool", "Pool size sweep")
    batch = results.get("engine_batch")
    if batch is None:
        s.nodata("engine throughput versus batch (pagebench.engine.bench.throughput_vs_batch)")
    else:
        s.table(make_table(engine_batch_part(s, batch), "Engine throughput versus batch",
                           data="engine_batch"))
    cmp_ = results.get("engine_compare")
    if cmp_ is not None:
        s.text("The engine against transformers' own generation on the same model and requests: "
               "continuous batching with its paged cache (generate_batch) and generate on the "
               "whole left-padded batch (contiguous cache).")
        rows = cmp_[cmp_["tokens_per_s"].notna()]
        requests = [c for c in ("batch", "num_requests") if c in rows.columns]
        rows = rows.assign(requests=rows[requests].bfill(axis=1).iloc[:, 0] if requests else "")
        g = cases(rows, ["machine", "method", "requests"], "tokens_per_s", "median",
                  words=lambda k, v: (f"{v:g} requests" if v != "" else "")
                  if k == "requests" else str(v))
        s.plot(plots.grouped_bars(g, "case", {"tokens_per_s": "tokens/s"},
                                  "Engine versus transformers: tokens/s", "generated tokens/s",
                                  "bar chart of engine versus transformers throughput",
                                  xlabel="device, generation method and requests", logy=True))
        s.dataset(results, "engine_compare", "Engine versus transformers")
    eq = results.get("engine_equal_memory")
    if eq is not None:
        s.text("Equal KV memory: the paged engine against transformers' padded generate, which "
               "reserves prompt + max_tokens slots per sequence.")
        g = cases(eq, ["machine", "method"], "tokens_per_s", "max", sort=True)
        s.plot(plots.grouped_bars(g, "case", {"tokens_per_s": "tokens/s"},
                                  "Same KV memory: tokens/s", "generated tokens/s",
                                  "bar chart of throughput at equal memory",
                                  xlabel="device and generation method"))
        s.dataset(results, "engine_equal_memory", "Equal-memory comparison")
    other = results.get("engine")
    if other is not None:
        for exp, part in other.groupby(other["experiment"].astype(str), sort=False) \
                if "experiment" in other.columns else [("other", other)]:
            s.table(make_table(part, f"Engine results: {exp}", data="engine"))
    if all(results.get(n) is None for n in names):
        s.text("No engine data: run `pagebench report` without --quick, or commit "
               "reports/data/<machine>/engine_*.csv.")
    return s


def engine_batch_part(s: Section, batch: pd.DataFrame) -> pd.DataFrame:
    """Engine tokens/s versus batch: a line per block size (GPU runs: per mode as well, named
    in a ``series`` column of the frame returned), a panel per device."""
    hue = "block_size"
    if "mode" in batch.columns:  # GPU runs: default (graphs) lines, other modes their own
        mode = batch["mode"].fillna("").astype(str)
        batch = batch.assign(series=batch[hue].astype(str).where(
            mode.isin(["", "graphs"]), batch[hue].astype(str) + " " + mode))
        hue = "series"
    s.text("Error bars: min and max over repeats, where the data has them. On a GPU the "
           "engine replays decode steps from CUDA graphs of compiled layers; 'eager' rows "
           "run every step from Python.")
    for y, title in (("tokens_per_s", "Engine throughput versus batch size (end to end)"),
                     ("decode_tokens_per_s", "Engine decode throughput versus batch size")):
        if y in batch.columns and batch[y].notna().any():
            s.plot(plots.lines(batch[batch[y].notna()], "batch", y, hue, title,
                               "batch size (sequences)", "generated tokens/s",
                               f"line chart of {title.lower()}",
                               legend_title="block size (tokens)", logx=True, logy=True,
                               panel="machine", spread=(f"{y}_min", f"{y}_max")))
    return batch


def benchmarks(results: Results) -> Section:
    s = Section("benchmarks", "Benchmark histories (asv, pytest-benchmark)")
    asv = results.get("asv")
    if asv is None:
        s.nodata("asv results (run `asv run`; results are read from asv's results_dir)")
    else:
        latest = asv.sort_values("date").groupby(["machine", "benchmark", "params"],
                                                 as_index=False).last()
        s.text(f"asv: {asv['commit'].nunique()} commit(s) on {asv['machine'].nunique()} "
               "device(s). One plot per benchmark: its value at each commit measured, one "
               "panel per device, one line per parameter set; the latest values are in the "
               "table below and every commit in the CSV.")
        for bench, g in asv.groupby("benchmark", sort=True):
            s.plot(plots.history(g, str(bench), f"line chart of {bench} over commits"))
        s.table(make_table(latest, "asv, latest per benchmark", ["machine", "commit",
                           "benchmark", "params", "value", "unit"], "asv"))
    if results.get("pytest_benchmark") is None:
        s.nodata("pytest-benchmark JSON (run `make bench`)")
    s.dataset(results, "pytest_benchmark", "pytest-benchmark", ["machine", "commit",
              "benchmark", "params", "median_us", "iqr_us", "rounds"])
    return s


def recommendation(results: Results) -> tuple[Section, dict | None]:
    s = Section("recommendation", "Recommendation")
    rec = derive.recommend(results.get("memory_static"), results.get("kernels"))
    if rec is None:
        s.nodata("needs the static memory curve (and kernel data for the speed side)")
        return s, None
    if rec["kernel_measured"]:
        s.text(f"Block size {rec['block_size']}: it holds {rec['utilisation']:.1%} of KV slots "
               f"as tokens and its paged kernel runs at {rec['relative_kernel_time']:.2f}× the "
               f"best block size's time on {rec['kernel_device']}, the best product of "
               "capacity (utilisation) and speed (1 / kernel time) among the block sizes "
               "measured. Within 2% of it: block sizes "
               + ", ".join(map(str, rec["within_2pct"])) + ".")
    else:
        s.text(f"Memory alone favours block size {rec['block_size']} "
               f"({rec['utilisation']:.1%}), but no kernel data was measured, so the cost of "
               "small blocks in the attention kernel is unknown here: treat this as incomplete.")
    if rec["kernel_measured"]:
        curve = rec["table"].assign(**{"utilisation %": rec["table"]["utilisation"] * 100})
        s.plot(plots.twin_lines(curve, "block_size", "utilisation %",
                                "relative_kernel_time", "What a block size buys (utilisation) "
                                "and costs (paged kernel time, 1.0 = best block size)",
                                "block size (tokens)", "line chart of utilisation and kernel "
                                "time versus block size",
                                left_label="KV slots holding tokens (%)",
                                right_label="paged kernel time / best block size's (×)",
                                logx=True))
    s.table(make_table(rec["table"], "Score = utilisation / relative kernel time",
                       data="recommendation"))
    return s, rec


VERDICT_CLASS = {HOLDS: "holds", FAILS: "fails"}


def claims_section(claims: list[Verdict]) -> Section:
    s = Section("claims", "Claims of the article, measured")
    s.text(f"{tally(claims)}. Each verdict is computed from the data linked in its row, with "
           "the criterion shown; a claim the data contradicts is marked 'does not hold' with "
           "the numbers that contradict it. Kernel claims are judged on GPU data when a GPU "
           "measured them.")
    s.table(claims_table(claims, "Claims", "claims"))
    return s


def claims_table(claims: list[Verdict], caption: str, data: str | None = None) -> Table:
    """Claims as a table: each verdict coloured, the measured headline in the cell with every
    detail one click away (the claims section and the sections with verdicts of their own)."""
    rows, classes, details = [], [], []
    for c in claims:
        rows.append([c.claim, c.summary, c.device, c.verdict, c.criterion, " ".join(c.data)])
        classes.append(["", "measured", "device", "verdict " + VERDICT_CLASS.get(
            c.verdict, "unmeasured"), "criterion", "links"])
        details.append(["", c.measured if c.summary != c.measured else "", "", "", "", ""])
    return Table(caption, ["claim", "measured", "device", "verdict", "criterion", "data"],
                 rows, data, classes, details)
