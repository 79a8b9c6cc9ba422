"""Simulator speed: the static count at 1,000,000 sequences x 5 block sizes (target < 2 s on
2 CPU cores) and the time-stepped simulation at 100,000 requests (target < 30 s)."""

from __future__ import annotations

import numpy as np
import pytest

from pagebench.sim.static import static_fragmentation

BLOCK_SIZES = (1, 8, 16, 32, 128)


@pytest.fixture(scope="module")
def million_lengths():
    # lognormal(5.5, 0.9) as the article draws it, vectorised (this times the count, not the draw)
    rng = np.random.default_rng(0)
    return np.clip(rng.lognormal(5.5, 0.9, 1_000_000).astype(np.int64), 1, 4096)


def test_static_million_sequences(benchmark, million_lengths):
    result = benchmark(static_fragmentation, million_lengths, 4096, BLOCK_SIZES)
    assert result["num_seqs"] == 1_000_000
    paged = [r["utilisation"] for r in result["results"] if r["allocator"] == "paged"]
    assert len(paged) == 5 and paged == sorted(paged, reverse=True)  # bigger block, more waste
    benchmark.extra_info.update(num_seqs=1_000_000, block_sizes=list(BLOCK_SIZES))
