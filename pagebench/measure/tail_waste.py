"""Tail waste as the real BlockManager leaves it: slots in a sequence's blocks minus its tokens.

Each sequence's first half is allocated as a prompt and the rest appended one token at a time,
so every path that grows a block table is exercised; the bound is ``block_size - 1`` slots.
"""

from __future__ import annotations

import numpy as np

from pagebench.config import ceil_div
from pagebench.defaults import BLOCK_SIZES
from pagebench.engine.block_manager import BlockManager
from pagebench.results.datasets import BLOCK_WASTE


def tail_waste_rows(lengths, block_sizes=BLOCK_SIZES) -> list[dict]:
    """One row per block size: the largest and mean tail waste over ``lengths``."""
    lengths = [int(n) for n in lengths]
    rows = []
    for bs in block_sizes:
        # a pool as large as the longest sequence; each sequence is freed once measured
        manager = BlockManager(ceil_div(max(lengths), bs), bs)
        waste = []
        for i, n in enumerate(lengths):
            prompt = max(1, n // 2)
            manager.allocate(i, list(range(prompt)))
            for t in range(prompt, n):
                manager.append_token(i, t)
            waste.append(len(manager.block_table(i)) * bs - manager.num_tokens(i))
            manager.free(i)
        waste = np.asarray(waste)
        rows.append(BLOCK_WASTE.row(block_size=bs, num_seqs=len(lengths),
                                    max_waste_slots=int(waste.max()),
                                    mean_waste_slots=float(waste.mean()), bound_slots=bs - 1))
    return rows
