"""One walk over a kernel sweep's points and variants (decode, prefill and fp8 sweeps).

A sweep times variants (backends, cache dtypes ...) at points (a shape, batch, context, block
size ...). What differs between sweeps is what a point's inputs are, what is timed on them and
what a row holds; the walk is the same: build each point's inputs once, time every variant on
them, turn each measurement into a row, then drop the inputs before the next point (on a GPU
the next point's inputs then fit where these were). :func:`run_sweep` is that walk; each sweep
passes the four callbacks that say what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any


def run_sweep(points: Iterable, variants: Callable[[Any], list],
              build_case: Callable[[Any], Any],
              time_variant: Callable[[Any, Any, Any], Iterator],
              make_row: Callable[[Any, Any, Any, Any], dict], *,
              progress: Callable[[dict], None] | None = None,
              release: Callable[[], None] | None = None) -> list[dict]:
    """Rows of every variant timed at every point, in point order, then variant order, then
    the order ``time_variant`` yields its measurements.

    - ``variants(point)``: what is timed at ``point``; a point with none builds no inputs;
    - ``build_case(point)``: the inputs every variant at ``point`` shares, or None for a point
      not measured (the callback records why);
    - ``time_variant(point, case, variant)``: one measurement per row it yields (e.g. eagerly,
      then replayed from a CUDA graph), none for a variant that cannot be timed there (the
      callback records why);
    - ``make_row(point, case, variant, measurement)``: the row;
    - ``progress(row)``: told of each row as it is made; ``release()``: called once a point's
      inputs are dropped (``torch.cuda.empty_cache`` on a GPU).
    """
    rows: list[dict] = []
    for point in points:
        chosen = variants(point)
        if not chosen:
            continue
        case = build_case(point)
        if case is None:
            continue
        for variant in chosen:
            for measurement in time_variant(point, case, variant):
                rows.append(make_row(point, case, variant, measurement))
                if progress:
                    progress(rows[-1])
        del case
        if release:
            release()
    return rows
