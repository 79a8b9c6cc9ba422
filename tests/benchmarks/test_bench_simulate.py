"""Simulator speed: the static count at 1,000,000 sequences x 5 block sizes (target < 2 s on
2 CPU cores) and the time-stepped simulation at 100,000 requests (target < 30 s)."""

from __future__ import annotations

import numpy as np
import pytest

from pagebench.defaults import BLOCK_SIZES, REFERENCE_LENGTHS, REFERENCE_MAX_LEN
from pagebench.sim.static import static_fragmentation


@pytest.fixture(scope="module")
def million_lengths():
    # lognormal(5.5, 0.9) as the article draws it, vectorised (this times the count, not the draw)
    rng = np.random.default_rng(0)
    return np.clip(rng.lognormal(5.5, 0.9, 1_000_000).astype(np.int64), 1, 4096)


def test_static_million_sequences(benchmark, million_lengths):
    result = benchmark(static_fragmentation, million_lengths, 4096, BLOCK_SIZES)
    assert result["num_seqs"] == 1_000_000
    paged = [r["utilisation"] for r in result["results"] if r["allocator"] == "paged"]
    # bigger block, more waste
    assert len(paged) == len(BLOCK_SIZES) and paged == sorted(paged, reverse=True)
    benchmark.extra_info.update(num_seqs=1_000_000, block_sizes=list(BLOCK_SIZES))


@pytest.mark.slow
def test_dynamic_100k_requests(benchmark):
    """Every allocator (paged at 5 block sizes) over 100,000 Poisson requests; with benchmarks
    disabled (CI) it checks the same call on 10,000 requests."""
    dynamic = pytest.importorskip("pagebench.sim.dynamic")
    from pagebench.sim.capacity import article_budget_tokens
    from pagebench.sim.trace import poisson_workload

    num_requests = 10_000 if benchmark.disabled else 100_000
    workload = poisson_workload(num_requests, 20.0, REFERENCE_LENGTHS, seed=0,
                                max_len=REFERENCE_MAX_LEN)
    budget = article_budget_tokens()
    result = benchmark.pedantic(dynamic.run_dynamic, args=(workload, budget),
                                kwargs=dict(block_sizes=BLOCK_SIZES, max_len=REFERENCE_MAX_LEN),
                                rounds=1, iterations=1)
    rows = {(r["allocator"], r["block_size"]) for r in result.summary}
    assert rows == {("naive", None), ("pow2", None), ("oracle", None)} | {
        ("paged", b) for b in BLOCK_SIZES}
    assert all(r["external_fragmentation_fraction"] == 0 for r in result.summary
               if r["allocator"] == "paged")
    benchmark.extra_info.update(num_requests=num_requests, block_sizes=list(BLOCK_SIZES))
