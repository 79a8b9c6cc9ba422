"""Simulator costs: the static fragmentation count (vectorised) and the time-stepped simulation."""

from __future__ import annotations

from .common import (REFERENCE_LENGTHS, REFERENCE_MAX_LEN, SkipCase, defaults, reference_lengths,
                     require)

BLOCK_SIZES = defaults.BLOCK_SIZES


class Static:
    """`static_fragmentation` over every allocator and 5 block sizes."""

    params = [[10_000, 1_000_000]]
    param_names = ["num_seqs"]
    timeout = 300

    def setup_cache(self):
        # sampling 1,000,000 lognormal lengths is a Python loop: do it once per run, not per repeat
        try:
            return {n: reference_lengths(n).tolist() for n in self.params[0]}
        except ImportError:  # no simulator in this commit; {} (asv drops a None cache)
            return {}

    def setup(self, lengths, num_seqs):
        import numpy as np

        if num_seqs not in lengths:
            raise SkipCase("pagebench.sim is not in this commit")
        self.static = require("pagebench.sim.static", "static_fragmentation")
        self.lengths = np.asarray(lengths[num_seqs], dtype=np.int64)

    def time_static_fragmentation(self, lengths, num_seqs):
        self.static.static_fragmentation(self.lengths, REFERENCE_MAX_LEN, BLOCK_SIZES)


class SampleLengths:
    params = [[100_000]]
    param_names = ["num_seqs"]

    def setup(self, num_seqs):
        self.workloads = require("pagebench.sim.workloads", "sample_lengths")

    def time_sample_lognormal(self, num_seqs):
        self.workloads.sample_lengths(REFERENCE_LENGTHS, num_seqs, seed=0,
                                    max_len=REFERENCE_MAX_LEN)


class Dynamic:
    """The time-stepped simulation: Poisson arrivals, every allocator over one budget."""

    params = [[1_000, 10_000]]
    param_names = ["num_requests"]
    timeout = 600
    number = 1
    repeat = (1, 3, 30.0)

    def setup(self, num_requests):
        from .common import dynamic_runner

        self.run = dynamic_runner(num_requests)

    def time_dynamic(self, num_requests):
        self.run()


class RealTrace:
    """The time-stepped simulation on the first 2,000 requests of the Mooncake conversation
    trace: every allocator, and paged block 16 with prefix caching, in the article's budget."""

    params = [[False, True]]
    param_names = ["prefix_caching"]
    timeout = 600
    number = 1
    repeat = (1, 3, 30.0)

    def setup(self, prefix_caching):
        from .common import real_trace_workload

        self.dynamic = require("pagebench.sim.dynamic", "run_dynamic")
        capacity = require("pagebench.sim.capacity", "article_budget_tokens")
        self.workload = real_trace_workload()
        self.budget = capacity.article_budget_tokens()
        self.allocators = ("paged",) if prefix_caching else self.dynamic.ALLOCATORS

    def time_real_trace(self, prefix_caching):
        self.dynamic.run_dynamic(self.workload, self.budget, allocators=self.allocators,
                                 block_sizes=(16,), max_len=self.workload.max_model_len,
                                 prefix_caching=prefix_caching)
