"""What the paged kernels' host code shares: the split-KV wave model and the row layout the
kernels read.

Split-KV (flash-decoding) cuts each (sequence, KV head)'s tokens into splits, one program (a
Triton program, a CUDA warp) per split, and merges their partial outputs afterwards. Too few
splits leave the GPU idle when the batch is small; too many add per-program overhead, partials
to merge, and programs that spill into a wave of their own. ``wave_splits`` weighs these for a
batch whose sequences all fill the table; each kernel passes its own step size and overhead
constants.
"""

from __future__ import annotations

import functools

import torch

from pagebench.config import ceil_div


@functools.lru_cache(maxsize=4096)
def wave_splits(units: int, capacity: int, step: int, slots: int, *, overhead_steps: int,
                merge_per_step: int, max_splits: int, merged: int = 1) -> tuple[int, int]:
    """(splits, tokens per split) for ``units`` (sequence, KV head) pairs of ``capacity``
    tokens each, read ``step`` tokens at a time.

    ``units x splits`` programs (rounded up to whole groups of ``merged`` splits, which a CUDA
    block merges itself) run ``slots`` at a time, so the split kernel takes about ``waves x
    (steps per split + overhead_steps)`` step times, and the merge one more per
    ``merge_per_step`` partials (a partial per ``merged`` splits). The cheapest split count
    wins, the fewest splits on ties; a count whose last split would be empty is never
    returned (the splits that hold tokens are counted instead).
    """
    steps = ceil_div(capacity, step)
    best, best_cost = (1, max(1, steps) * step), None
    for splits in range(1, min(max_splits, steps) + 1):
        per_split = ceil_div(steps, splits)
        used = ceil_div(steps, per_split)  # splits that then hold any tokens
        parts = ceil_div(used, merged)
        cost = ceil_div(units * parts * merged, slots) * (per_split + overhead_steps)
        cost += ceil_div(parts, merge_per_step) if parts > 1 else 0
        if best_cost is None or cost < best_cost:
            best, best_cost = (used, per_split * step), cost
    return best


def unit_stride_rows(q: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor):
    """(q, block_tables, seq_lens) in the layout the kernels read: q's and the tables' rows of
    unit stride, contiguous lengths (a copy only of a tensor that is not already so)."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    seq_lens = seq_lens if seq_lens.is_contiguous() else seq_lens.contiguous()
    return q, tables, seq_lens
