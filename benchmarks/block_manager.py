"""Block manager costs: allocate / append / fork (copy-on-write) / free / prefix-cache hit.

Each timed body leaves the manager as ``setup`` left it (allocate is paired with free), so asv
may repeat it any number of times.
"""

from __future__ import annotations

from .common import cpu_median_us, defaults, require

BLOCK_SIZES = list(defaults.SHORT_BLOCK_SIZES)
PREFIX_CACHING = [False, True]


def _manager(num_blocks: int, block_size: int, prefix_caching: bool):
    bm = require("pagebench.engine.block_manager", "BlockManager")
    return bm.BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)


class AllocateFree:
    """A new prompt's blocks (all misses), then freeing them."""

    params = [BLOCK_SIZES, PREFIX_CACHING, [128, 2048]]
    param_names = ["block_size", "prefix_caching", "prompt_len"]

    def setup(self, block_size, prefix_caching, prompt_len):
        self.bm = _manager(8192, block_size, prefix_caching)
        self.prompt = list(range(prompt_len))
        self.n = 0

    def time_allocate_free(self, block_size, prefix_caching, prompt_len):
        # a fresh prompt each call, so prefix caching pays its hashing but never hits
        self.n += 1
        seq = ("s", self.n)
        self.bm.allocate(seq, [self.n] + self.prompt)
        self.bm.free(seq)


class PrefixHit:
    """Allocating a prompt whose whole block-aligned prefix is cached (hit path), then free."""

    params = [[16, 128], [512, 4096]]
    param_names = ["block_size", "prompt_len"]

    def setup(self, block_size, prompt_len):
        self.bm = _manager(8192, block_size, True)
        self.prompt = list(range(prompt_len + 1))
        self.bm.allocate("resident", self.prompt)
        self.bm.allocate("probe", self.prompt)
        if self.bm.num_cached_tokens("probe") != prompt_len // block_size * block_size:
            raise RuntimeError("prefix cache did not hit as expected")
        self.bm.free("probe")

    def time_prefix_hit_allocate_free(self, block_size, prompt_len):
        self.bm.allocate("probe", self.prompt)
        self.bm.free("probe")


class Append:
    """Decode-style growth: 1,024 appended tokens to one sequence, one call each."""

    params = [BLOCK_SIZES, PREFIX_CACHING]
    param_names = ["block_size", "prefix_caching"]
    tokens = 1024

    def setup(self, block_size, prefix_caching):
        self.bm = _manager(4096, block_size, prefix_caching)
        self.n = 0

    def _grow(self):
        self.n += 1
        seq, bm = self.n, self.bm
        bm.allocate(seq, [self.n])
        append = bm.append_token
        for t in range(self.tokens):
            append(seq, t)
        bm.free(seq)

    def time_append_1024(self, block_size, prefix_caching):
        self._grow()

    def track_append_tokens_per_s(self, block_size, prefix_caching):
        return self.tokens / (cpu_median_us(self._grow) * 1e-6)

    track_append_tokens_per_s.unit = "tokens/s"


class ForkCopyOnWrite:
    """Parallel sampling: fork a 1,000-token prompt n times, each child appends (copy-on-write
    of the shared partial block), then every child is freed."""

    params = [[16], [2, 8, 32]]
    param_names = ["block_size", "n"]

    def setup(self, block_size, n):
        self.bm = _manager(4096, block_size, False)
        self.bm.allocate("parent", list(range(1000)))
        self.children = [("child", i) for i in range(n)]

    def time_fork_append_free(self, block_size, n):
        bm = self.bm
        for child in self.children:
            bm.fork("parent", child)
            bm.append_token(child, 7)
        bm.take_copies()
        for child in self.children:
            bm.free(child)
