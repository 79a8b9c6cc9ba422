""":func:`analyse`: everything computed from the datasets, added to the same ``Results``.

In order: the derived tables (kernel curves, prefill ratios, fp8 and tensor-parallel tables),
the recommended block size, then every claim's verdict (the article's, judged in the claims
table, and those of the fp8 and parallel sections: the ``section`` column says which). A table
or claim that fails on odd data becomes a warning naming it, never an exception.
"""

from __future__ import annotations

import pandas as pd

from pagebench.analysis import advice, claims, derive, fp8, parallel, real_traces, serving
from pagebench.results import Results
from pagebench.results.derived import ARTICLE

# the report section whose verdict table shows each claim
SECTION_CLAIMS = ((ARTICLE, claims.CLAIMS + real_traces.CLAIMS), (fp8.SECTION, fp8.CLAIMS),
                  (parallel.SECTION, parallel.CLAIMS))
EVERY_CLAIM = tuple(claim for _, section_claims in SECTION_CLAIMS for claim in section_claims)
# derived tables beside the kernel ones: name -> function of the results
TABLES = {"kernels_prefill_summary": lambda r: derive.prefill_summary(r.get("kernels_prefill")),
          "kernels_prefill_vs_fastest":
              lambda r: derive.prefill_versus_fastest(r.get("kernels_prefill")),
          **fp8.TABLES, **parallel.TABLES, **serving.TABLES}


def analyse(results: Results) -> None:
    """Add the derived tables, the recommendation and the verdicts (dataset ``claims``) to
    ``results``; run it after the last :meth:`~pagebench.results.Results.add`, which clears
    them."""
    for name in derive.KERNEL_TABLES:
        derive.table(results, name)
    for name, compute in TABLES.items():
        derive.table(results, name, compute)
    try:
        rec = recommend(results)
    except Exception as e:  # noqa: BLE001 -- no recommendation must not lose the verdicts
        results.warn(f"section recommendation: failed ({type(e).__name__}: {e})")
        rec = None
    results.add_derived("recommendation", pd.DataFrame() if rec is None else rec[1])
    derive.table(results, "recommendation_traces", recommend_per_trace)
    verdicts = [claims.verdict_frame(claims.evaluate(results, section_claims), section)
                for section, section_claims in SECTION_CLAIMS]
    results.add_derived("claims", pd.concat(verdicts, ignore_index=True))
    results.recommendation = None if rec is None else rec[0]


# the dataset of KV utilisation the recommendation reads: a workload given to `pagebench
# report --lengths/--trace`, else the article's lengths
WORKLOAD_DATASETS = ("workload_static", "memory_static")


def utilisation_of(static: pd.DataFrame) -> dict[int, float]:
    paged = static[static["allocator"] == "paged"].dropna(subset=["block_size"])
    return {int(b): float(u) for b, u in zip(paged["block_size"], paged["utilisation"])}


def recommend_per_trace(results: Results) -> pd.DataFrame:
    """The recommendation on each real trace's KV utilisation (dataset
    ``real_traces_static``), with the same speed data: one row per trace."""
    static = results.get("real_traces_static")
    rows = []
    for trace, g in [] if static is None else static.groupby("trace", sort=False):
        rec = advice.choose_block_size(utilisation_of(g), str(trace),
                                       results.get("engine_batch"), results.get("kernels"))
        if rec is not None:
            rows.append({"trace": trace, "block_size": rec[0].block_size,
                         "tied": ", ".join(map(str, rec[0].tied)),
                         "recommendation": rec[0].words()})
    return pd.DataFrame(rows)


def recommend(results: Results):
    """:func:`pagebench.analysis.advice.choose_block_size` on the report's workload (the first
    of :data:`WORKLOAD_DATASETS` present) with the engine's and the kernels' data."""
    static = next((results.get(n) for n in WORKLOAD_DATASETS if results.get(n) is not None),
                  None)
    if static is None or len(static) == 0:
        return None
    workload = ", ".join(sorted(set(static["workload"].astype(str)))) if "workload" in static \
        else "unnamed workload"
    return advice.choose_block_size(utilisation_of(static), workload, results.get("engine_batch"),
                                    results.get("kernels"))
