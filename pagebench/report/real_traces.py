"""The report's "Real traces" part: the article's memory claims re-judged on three public traces.

:func:`trace_sweeps` (run by ``pagebench report``) adds these frames to the results:

- ``real_traces_static``: utilisation per allocator and block size on each trace's final lengths
  (``max_model_len`` = the trace's default: the smallest power of two holding every request);
- ``real_traces_dynamic``: the time-stepped simulation per allocator at a *memory-bound* budget
  (half the oracle's peak token demand with unlimited memory, in whole 128-token blocks and at
  least twice ``max_model_len``), replayed at the default 20 ms per decode step; at the
  article's 12.4 GB budget these traces are never short of memory, so that budget judges
  nothing;
- ``real_traces_timeline``: the breakdown over time of those runs (memory plots per trace);
- ``real_traces_prefix``: prefix-cache hit rate of paged block 16 as the budget shrinks
  (Mooncake: the only trace with ``hash_ids``; the Azure traces say nothing about sharing);
- ``real_traces_engine`` (not with ``--quick``): the engine's hit rate beside the simulator's on
  a sample (``pagebench engine-bench trace``).

``--quick`` replays the first :data:`QUICK_REQUESTS` requests of each trace, not the whole.
:func:`claims` judges the static and dynamic claims on each trace, one row per claim.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagebench import defaults
from pagebench.report import plots
from pagebench.report.claims import FAILS, HOLDS, SIM, Claim, judge, pct
from pagebench.report.collect import Results
from pagebench.report.sections import Section, make_table

TRACES = ("azure-code", "azure-conv", "mooncake-conv")
STATIC_BLOCK_SIZES = defaults.ENGINE_BLOCK_SIZES
DYNAMIC_BLOCK_SIZES = (16, 128)
QUICK_REQUESTS = 2000
PREFIX_TRACE = "mooncake-conv"
# budgets of the prefix-cache sweep, as multiples of the article's 12.4 GB (1,009,104 slots)
PREFIX_BUDGET_MULTIPLES = (64.0, 8.0, 2.0, 1.0, 0.5, 0.25)


def _trace(name: str, quick: bool):
    from pagebench.sim.real_traces import read_timed_trace

    trace = read_timed_trace(name)
    return trace.head(QUICK_REQUESTS) if quick else trace


def memory_bound_budget(workload, max_model_len: int) -> int:
    """Half the oracle's peak token demand with unlimited memory (see the module doc)."""
    from pagebench.sim.dynamic import simulate_allocator

    unlimited = int(workload.length.sum())
    row, _ = simulate_allocator(workload, unlimited, "oracle", max_len=max_model_len)
    peak = row["peak_token_state_fraction"] * unlimited
    budget = int(np.ceil(peak / 2 / 128) * 128)
    return max(budget, 2 * max_model_len)


def trace_sweeps(results: Results, device: str = "cpu", quick: bool = False) -> None:
    from pagebench.sim.capacity import article_budget_tokens
    from pagebench.sim.dynamic import run_dynamic, simulate_allocator
    from pagebench.sim.static import static_fragmentation

    static, dynamic, timelines, prefix = [], [], [], []
    for name in TRACES:
        trace = _trace(name, quick)
        w = trace.to_workload()
        max_len = w.max_model_len
        info = {"trace": name, "source": trace.source, "num_requests": w.num_requests,
                "max_model_len": max_len, "num_clipped": w.num_clipped,
                "mean_prompt_len": float(w.prompt_len.mean()),
                "mean_output_len": float(w.output_len.mean())}
        res = static_fragmentation(w.length, max_len, STATIC_BLOCK_SIZES)
        static += [info | r for r in res["results"]]
        budget = memory_bound_budget(w, max_len)
        run = run_dynamic(w, budget, block_sizes=DYNAMIC_BLOCK_SIZES, max_len=max_len,
                          max_timeline_rows=300)
        dynamic += [info | {"step_ms": 20.0} | r for r in run.summary]
        tl = run.timeline_frame()
        tl = tl[(tl["allocator"] != "paged") | (tl["block_size"] == 16)]
        timelines.append(tl.assign(trace=name))
        if w.hash_ids is None:
            continue
        article = article_budget_tokens()
        for multiple in PREFIX_BUDGET_MULTIPLES + (None,):
            # None: unlimited memory (every token of the trace fits), the trace's own sharing
            b = int(w.length.sum()) if multiple is None else int(article * multiple)
            if b < int(np.ceil(w.length.max() / 16) * 16):
                continue
            row, _ = simulate_allocator(w, b, "paged", 16, max_len=max_len,
                                        prefix_caching=True)
            prefix.append(info | {"budget_tokens": b, "budget_vs_article": multiple,
                                  "unlimited": multiple is None,
                                  "prefix_cache_hit_rate": row["prefix_cache_hit_rate"],
                                  "prefix_blocks_saved": row["prefix_blocks_saved"],
                                  "num_preemptions": row["num_preemptions"],
                                  "free_fraction": row["free_fraction"]})
    source = "pagebench.sim (real traces, " + ("quick: first requests" if quick else
                                                "whole traces") + ")"
    static_frame = pd.DataFrame(static)
    static_frame["block_size"] = static_frame["block_size"].astype("Int64")
    results.add("real_traces_static", static_frame, source)
    dyn = pd.DataFrame(dynamic)
    dyn["block_size"] = dyn["block_size"].astype("Int64")
    results.add("real_traces_dynamic", dyn, source)
    results.add("real_traces_timeline", pd.concat(timelines, ignore_index=True), source)
    if prefix:
        results.add("real_traces_prefix", pd.DataFrame(prefix), source)
    if not quick:
        from pagebench.engine.bench import tiny_model
        from pagebench.engine.trace_replay import replay_trace

        model = tiny_model(device=device)
        rows = [replay_trace(model, name, 24, max_model_len=1024, max_output_len=16)
                for name in ("mooncake-conv", "azure-conv")]
        results.add("real_traces_engine", pd.DataFrame(rows),
                    "pagebench.engine.trace_replay (tiny random model)")


# ---- section -------------------------------------------------------------------------------

STATIC_COLUMNS = ("trace", "allocator", "block_size", "utilisation", "wasted_slots_per_seq")
DYNAMIC_COLUMNS = ("trace", "label", "budget_tokens", "token_state_fraction_saturated",
                   "reserved_unused_fraction_saturated",
                   "internal_fragmentation_fraction_saturated",
                   "external_fragmentation_fraction_saturated", "saturated_step_fraction",
                   "mean_concurrency", "num_preemptions", "num_refused",
                   "refused_with_enough_free", "mean_wait_steps")
PREFIX_COLUMNS = ("trace", "budget_tokens", "budget_vs_article", "unlimited",
                  "prefix_cache_hit_rate",
                  "prefix_blocks_saved", "num_preemptions")
ENGINE_COLUMNS = ("trace", "num_requests", "max_model_len", "max_output_len", "num_prompt_tokens",
                  "engine_prefix_cache_hit_rate", "sim_prefix_cache_hit_rate",
                  "engine_num_preemptions", "engine_peak_blocks", "tokens_per_s", "device")


def section(results: Results) -> Section:
    s = Section("real-traces", "Real traces: Azure LLM 2023 (code, conversation) and Mooncake")
    static = results.get("real_traces_static")
    if static is None:
        s.nodata("real-trace simulations (see warnings)")
        return s
    traces = static.drop_duplicates("trace")
    s.text("Three public serving traces shipped with pagebench (pagebench/data/traces: Azure "
           "LLM inference trace 2023, CC-BY 4.0, Patel et al. ISCA 2024; Mooncake FAST'25 "
           "conversation trace, Apache-2.0, Qin et al. FAST 2025): "
           + "; ".join(f"{r.trace}: {int(r.num_requests):,} requests ({r.source}), mean prompt "
                       f"{r.mean_prompt_len:,.0f} / output {r.mean_output_len:,.0f} tokens, "
                       f"max_model_len {int(r.max_model_len):,}, {int(r.num_clipped)} clipped"
                       for r in traces.itertuples())
           + ". Arrivals replay at 20 ms per decode step.")
    wide = static.assign(run=[a if pd.isna(b) else f"paged {int(b)}" for a, b in
                              zip(static["allocator"], static["block_size"])])
    wide = wide.pivot_table(index="run", columns="trace", values="utilisation",
                            sort=False).reset_index()
    s.plot(plots.grouped_bars(wide, "run", [c for c in wide.columns if c != "run"],
                              "Static utilisation per allocator on each trace", "utilisation",
                              "bar chart of utilisation per allocator and trace"))
    s.table(make_table(static, "Static utilisation on each trace's final lengths",
                       list(STATIC_COLUMNS), "real_traces_static"))
    dyn = results.get("real_traces_dynamic")
    if dyn is not None:
        s.text("Time-stepped simulation at a memory-bound budget per trace (half the oracle's "
               "peak demand with unlimited memory): fractions over the steps where requests "
               "wait for memory. 'refused_with_enough_free' counts requests refused while the "
               "total free memory would have held them (external fragmentation).")
        s.table(make_table(dyn, "Time-stepped summary per trace and allocator",
                           list(DYNAMIC_COLUMNS), "real_traces_dynamic"))
    timeline = results.get("real_traces_timeline")
    if timeline is not None:
        for name in dict.fromkeys(timeline["trace"]):
            p = plots.breakdown_areas(timeline[timeline["trace"] == name])
            if p is not None:
                s.plot(plots.Plot(f"Memory over time: {name}", p.data_uri,
                                  f"memory breakdown over time on {name}"))
    prefix = results.get("real_traces_prefix")
    if prefix is None:
        s.nodata("prefix-cache budget sweep")
    else:
        s.text("Prefix caching (paged, block 16) on Mooncake, sharing blocks by the trace's "
               "hash_ids: the hit rate (prompt tokens served from cache / prompt tokens) as the "
               "budget shrinks. With unlimited memory it reaches the trace's own sharing "
               "(about 37% on the whole trace); the Azure traces carry no sharing information.")
        s.plot(hit_rate_plot(prefix))
        s.table(make_table(prefix, "Prefix-cache hit rate versus budget",
                           list(PREFIX_COLUMNS), "real_traces_prefix"))
    engine = results.get("real_traces_engine")
    if engine is not None:
        s.text("The engine on a sample of each trace (tiny random model, prompts clipped to "
               "max_model_len, token ids synthesised so that shared hash_ids are shared "
               "tokens): its own prefix cache's hit rate beside the simulator's on the same "
               "sample.")
        s.table(make_table(engine, "Engine replay of trace samples", list(ENGINE_COLUMNS),
                           "real_traces_engine"))
    return s


@plots.styled
def hit_rate_plot(prefix: pd.DataFrame) -> plots.Plot | None:
    """Hit rate (%) against the budget in multiples of the article's; unlimited as a line."""
    import matplotlib.pyplot as plt

    finite = prefix[~prefix["unlimited"].astype(bool)]
    if finite.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    for i, (name, g) in enumerate(finite.groupby("trace", sort=False)):
        g = g.sort_values("budget_vs_article")
        ax.plot(g["budget_vs_article"], 100 * g["prefix_cache_hit_rate"], marker="o",
                color=f"C{i}", label=plots.label(name))
        for rate in prefix[(prefix["trace"] == name) & prefix["unlimited"].astype(bool)][
                "prefix_cache_hit_rate"]:
            ax.axhline(100 * rate, color=f"C{i}", linestyle="--", linewidth=1)
            ax.annotate(f"unlimited memory: {100 * rate:.1f}%", (0.02, 100 * rate),
                        xycoords=("axes fraction", "data"), fontsize=7, va="bottom")
    ticks = sorted(finite["budget_vs_article"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t:g}×" for t in ticks])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("KV budget (multiples of the article's 12.4 GB = 1,009,104 slots)")
    ax.set_ylabel("prompt tokens from cache (%)")
    ax.legend(fontsize=7)
    return plots.to_plot(fig, "Prefix-cache hit rate versus KV budget (paged, block 16)",
                         "line chart of the prefix-cache hit rate against the KV budget")


# ---- claims --------------------------------------------------------------------------------

def _verdicts(parts: list[tuple[str, bool | None, str]]) -> tuple[str, str]:
    """(verdict, measured) over traces: holds only if it holds on every measured trace."""
    judged = [(n, ok, text) for n, ok, text in parts if ok is not None]
    measured = "; ".join(f"{n}: {text}" + ("" if ok is None else f" ({judge(ok)})")
                         for n, ok, text in parts)
    if not judged:
        return "not measured here", measured or "no data"
    return (HOLDS if all(ok for _, ok, _ in judged) else FAILS), measured


def paged_and_naive(frame: pd.DataFrame, column: str):
    """Per trace, in order: (trace, paged block 16's value, naive's value) of ``column``, for
    the traces that have both rows."""
    for name, g in frame.groupby("trace", sort=False):
        bs = pd.to_numeric(g["block_size"], errors="coerce")
        paged = g[(g["allocator"] == "paged") & (bs == 16)][column]
        naive = g[g["allocator"] == "naive"][column]
        if not (paged.empty or naive.empty):
            yield name, float(paged.iloc[0]), float(naive.iloc[0])


def static_claim(results: Results) -> Claim:
    c = Claim("real_traces_static", "On real traces: paged (block 16) keeps about 96% or more "
              "of KV memory as token state, far above naive reservation.",
              "static utilisation on each trace's final lengths: paged block 16 >= 96% and "
              "naive < 50%", data=["real_traces_static"])
    frame = results.get("real_traces_static")
    if frame is None:
        return c
    parts = [(name, p >= 0.96 and n < 0.5, f"paged {pct(p)}, naive {pct(n)}")
             for name, p, n in paged_and_naive(frame, "utilisation")]
    c.verdict, c.measured = _verdicts(parts)
    c.device = SIM
    return c


def dynamic_claim(results: Results) -> Claim:
    c = Claim("real_traces_dynamic", "On real traces under memory pressure: naive reservation "
              "keeps 20–40% of KV memory as token state, paging about 96%.",
              "time-stepped simulation at a memory-bound budget, memory-bound steps: "
              "reserve-max within 20–40% and paged block 16 within 93–100%",
              data=["real_traces_dynamic"])
    frame = results.get("real_traces_dynamic")
    if frame is None:
        return c
    parts = []
    for name, p, n in paged_and_naive(frame, "token_state_fraction_saturated"):
        if p != p or n != n:
            parts.append((name, None, "never memory-bound"))
            continue
        parts.append((name, 0.20 <= n <= 0.40 and 0.93 <= p <= 1.0,
                      f"reserve-max {pct(n)}, paged {pct(p)}"))
    c.verdict, c.measured = _verdicts(parts)
    c.device = SIM
    return c


def claims(results: Results) -> list[Claim]:
    return [static_claim(results), dynamic_claim(results)]
