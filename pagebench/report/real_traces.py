"""The report's "Real traces" part: the article's memory claims re-judged on three public traces.

The rows come from :func:`pagebench.sim.real_traces.study_traces` (run by
:func:`pagebench.suite.real_traces`): ``real_traces_static``, ``real_traces_dynamic``
and ``real_traces_timeline`` (:mod:`pagebench.sim.real_load`: a sample served at a real KV
budget, at the rate where memory binds; ``real_traces_goodput`` is drawn in the Serving section), ``real_traces_prefix`` (Mooncake's hash_ids) and, without
``--quick``, ``real_traces_engine`` (the engine's hit rate beside the simulator's on a sample).
:mod:`pagebench.analysis.real_traces` judges the article's claims on each trace.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from pagebench.report import plots
from pagebench.report.sections import Section, View
from pagebench.results import Results


def traces_text(static: pd.DataFrame) -> str:
    return ("Three public serving traces shipped with pagebench (pagebench/data/traces: Azure "
            "LLM inference trace 2023, CC-BY 4.0, Patel et al. ISCA 2024; Mooncake FAST'25 "
            "conversation trace, Apache-2.0, Qin et al. FAST 2025): "
            + "; ".join(f"{r.trace}: {int(r.num_requests):,} requests ({r.source}), mean prompt "
                        f"{r.mean_prompt_len:,.0f} / output {r.mean_output_len:,.0f} tokens, "
                        f"max_model_len {int(r.max_model_len):,}, {int(r.num_clipped)} clipped"
                        for r in static.drop_duplicates("trace").itertuples())
            + ". The prefix-cache sweep replays arrivals at 20 ms per decode step.")


LOAD_TEXT = (
    "The first requests of each trace (the same sample in every run mode) served by the "
    "serving simulator (the engine's scheduler, each step costing what the step-cost model "
    "says: step_cost) in a real KV budget: the capacity planner's Llama-3-8B (bf16) on one "
    "H100 80 GiB at gpu_memory_utilization 0.9, vLLM V1's limits (1,024 sequences, 8,192 "
    "tokens a step). Arrivals are compressed by time_scale, the smallest power of two at which "
    "paged block 16 is memory-bound (a request refused for want of blocks, or a preemption) "
    "for a quarter of the run's time, or 1,024 where none is. Reservations (naive: "
    "max_model_len, pow2, oracle: exact length) hold their slots from admission to finish. "
    "token_state_fraction: time-weighted share of the budget holding written KV entries, over "
    "the run and (_saturated) over its memory-bound time; empty: never memory-bound.")


def static_plot(static: pd.DataFrame) -> plots.Plot | None:
    """Utilisation per allocator (paged: per block size), a bar per trace."""
    wide = static.assign(run=[a if pd.isna(b) else f"paged {int(b)}" for a, b in
                              zip(static["allocator"], static["block_size"])])
    wide = wide.pivot_table(index="run", columns="trace", values="utilisation",
                            sort=False).reset_index()
    return plots.bars(wide, "run", {c: c for c in wide.columns if c != "run"},
                      "Static utilisation per allocator on each trace", "run",
                      "bar chart of utilisation per allocator and trace", ylabel="utilisation")


def timeline_plots(timeline: pd.DataFrame) -> list[plots.Plot | None]:
    """The memory breakdown over time, one plot per trace."""
    out = []
    for name, g in timeline.groupby("trace", sort=False):
        p = plots.breakdown_areas(g)
        out.append(p and replace(p, title=f"Memory over time: {name}",
                                 alt=f"memory breakdown over time on {name}"))
    return out


VIEWS = (
    View("real_traces_static", "Static utilisation on each trace's final lengths",
         ("trace", "allocator", "block_size", "utilisation", "wasted_slots_per_seq"),
         text=traces_text, plot=static_plot, missing="real-trace simulations (see warnings)",
         needed=True),
    View("real_traces_dynamic", "Each allocator serving the trace at a real KV budget",
         ("trace", "label", "budget_tokens", "request_rate", "time_scale",
          "token_state_fraction", "token_state_fraction_saturated", "saturated_step_fraction",
          "num_preemptions", "duration_s", "step_cost"), text=LOAD_TEXT),
    View("real_traces_timeline", plot=timeline_plots),
    View("real_traces_prefix", "Prefix-cache hit rate versus budget",
         ("trace", "budget_tokens", "budget_vs_article", "unlimited", "prefix_cache_hit_rate",
          "prefix_blocks_saved", "num_preemptions"), text="Prefix caching (paged, block 16) on "
         "Mooncake, sharing blocks by the trace's hash_ids: the hit rate (prompt tokens served "
         "from cache / prompt tokens) as the budget shrinks. With unlimited memory it reaches "
         "the trace's own sharing (about 37% on the whole trace); the Azure traces carry no "
         "sharing information.", plot=plots.hit_rate_vs_budget,
         missing="prefix-cache budget sweep"),
    View("real_traces_engine", "Engine replay of trace samples",
         ("trace", "num_requests", "max_model_len", "max_output_len", "num_prompt_tokens",
          "engine_prefix_cache_hit_rate", "sim_prefix_cache_hit_rate", "engine_num_preemptions",
          "engine_peak_blocks", "tokens_per_s", "device"), text="The engine on a sample of each "
         "trace (tiny random model, prompts clipped to max_model_len, token ids synthesised so "
         "that shared hash_ids are shared tokens): its own prefix cache's hit rate beside the "
         "simulator's on the same sample."),
)


def section(results: Results) -> Section:
    return Section("real-traces", "Real traces: Azure LLM 2023 (code, conversation) and "
                   "Mooncake").show(results, VIEWS)
