"""Deterministic memory tracks: the numbers a change must not move by accident.

Utilisation per allocator and block size on the article's reference workload (static count and
time-stepped simulation), and the capacity planner's cacheable tokens and concurrency for a
Qwen2.5-0.5B on a 16 GiB budget. These are ``track_*`` values, not timings: asv plots them over
the history like any benchmark, and ``asv compare`` flags a change in them.
"""

from __future__ import annotations

from .common import REFERENCE_MAX_LEN, SkipCase, defaults, reference_lengths, require

ALLOCATORS = ["naive", "pow2", "oracle", *(f"paged-{b}" for b in defaults.BLOCK_SIZES)]


class StaticUtilisation:
    """Tokens stored / slots reserved (%) on the reference workload (lognormal(5.5, 0.9),
    2,000 sequences, seed 0: ``pagebench.defaults``)."""

    params = [ALLOCATORS]
    param_names = ["allocator"]

    def setup_cache(self):
        # asv passes a None cache to setup as no argument at all: an empty dict means "absent"
        try:
            static = require("pagebench.sim.static", "static_fragmentation")
            lengths = reference_lengths()
        except (SkipCase, ImportError):
            return {}
        result = static.static_fragmentation(lengths, REFERENCE_MAX_LEN, defaults.BLOCK_SIZES)
        return {f"{r['allocator']}-{r['block_size']}" if r["block_size"] else r["allocator"]:
                100.0 * r["utilisation"] for r in result["results"]}

    def setup(self, utilisation, allocator):
        if allocator not in utilisation:
            raise SkipCase("pagebench.sim.static is not in this commit")

    def track_utilisation(self, utilisation, allocator):
        return utilisation[allocator]

    track_utilisation.unit = "%"


class DynamicMemory:
    """Time-stepped simulation, 10,000 Poisson requests (20 per step) with the reference lengths
    in the article's KV budget: the share of the budget holding token states, and external
    fragmentation (%), per allocator, averaged over the run."""

    params = [ALLOCATORS]
    param_names = ["allocator"]
    timeout = 600

    def setup_cache(self):
        from .common import dynamic_results

        return dynamic_results(10_000) or {}

    def setup(self, results, allocator):
        if not results:
            raise SkipCase("pagebench.sim.dynamic is not in this commit")
        if allocator not in results:
            raise SkipCase(f"{allocator} is not simulated in this commit")

    def track_token_state_pct(self, results, allocator):
        return 100.0 * results[allocator]["token_state_fraction"]

    track_token_state_pct.unit = "%"

    def track_external_fragmentation_pct(self, results, allocator):
        return 100.0 * results[allocator]["external_fragmentation_fraction"]

    track_external_fragmentation_pct.unit = "%"


class Capacity:
    """Capacity planner, Qwen2.5-0.5B in bf16 on a 16 GiB card at 0.9 utilisation, max model
    length 4,096, the reference length distribution."""

    params = [list(defaults.ENGINE_BLOCK_SIZES)]
    param_names = ["block_size"]

    def setup_cache(self):
        from .common import capacity_plans

        return capacity_plans(self.params[0]) or {}

    def setup(self, plans, block_size):
        if not plans:
            raise SkipCase("pagebench.sim.capacity is not in this commit")

    def track_cacheable_tokens(self, plans, block_size):
        return plans[block_size]["cacheable_tokens"]

    track_cacheable_tokens.unit = "tokens"

    def track_max_concurrency_paged(self, plans, block_size):
        return plans[block_size]["max_concurrency_paged"]

    track_max_concurrency_paged.unit = "sequences"

    def track_max_concurrency_naive(self, plans, block_size):
        return plans[block_size]["max_concurrency_naive"]

    track_max_concurrency_naive.unit = "sequences"


def real_trace_results() -> dict:
    """allocator label -> summary row of the first 2,000 Mooncake requests in the article's
    budget, paged block 16 with prefix caching (and its hit rate with an unlimited budget, the
    trace's own sharing); empty when this commit has no real traces."""
    from .common import real_trace_workload

    try:
        dynamic = require("pagebench.sim.dynamic", "run_dynamic")
        capacity = require("pagebench.sim.capacity", "article_budget_tokens")
        w = real_trace_workload()
    except (SkipCase, ImportError):
        return {}
    budget = capacity.article_budget_tokens()
    run = dynamic.run_dynamic(w, budget, block_sizes=(16,), max_len=w.max_model_len,
                              prefix_caching=True)
    out = {r["label"]: dict(r) for r in run.summary}
    unlimited = dynamic.run_dynamic(w, int(w.length.sum()), allocators=("paged",),
                                    block_sizes=(16,), max_len=w.max_model_len,
                                    prefix_caching=True)
    out["paged-16"]["unlimited_hit_rate"] = unlimited.summary[0]["prefix_cache_hit_rate"]
    return out


class RealTraceCases:
    """The first 2,000 requests of the Mooncake conversation trace in the article's budget,
    one case per allocator (no benchmarks of its own: the two classes below)."""

    params = [["naive", "pow2", "oracle", "paged-16"]]
    param_names = ["allocator"]
    timeout = 600

    def setup_cache(self):
        return real_trace_results()

    def setup(self, results, allocator):
        if allocator not in results:
            raise SkipCase("real traces are not in this commit")


class RealTraceMemory(RealTraceCases):
    """Token-state share (%) per allocator."""

    def track_token_state_pct(self, results, allocator):
        return 100.0 * results[allocator]["token_state_fraction"]

    track_token_state_pct.unit = "%"


class RealTracePrefixCache(RealTraceCases):
    """The same run's prefix-cache hit rate (%) of paged block 16, in the article's budget and
    with an unlimited one. The contiguous allocators have no prefix cache: their cases are
    skipped in ``setup`` (asv shows them as n/a), kept in the grid so that the table lines up
    with RealTraceMemory's."""

    def setup(self, results, allocator):
        super().setup(results, allocator)
        if allocator != "paged-16":
            raise SkipCase("prefix caching is a paged feature")

    def track_prefix_hit_rate_pct(self, results, allocator):
        return 100.0 * results[allocator]["prefix_cache_hit_rate"]

    track_prefix_hit_rate_pct.unit = "%"

    def track_unlimited_prefix_hit_rate_pct(self, results, allocator):
        return 100.0 * results[allocator]["unlimited_hit_rate"]

    track_unlimited_prefix_hit_rate_pct.unit = "%"
