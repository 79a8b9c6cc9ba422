"""Triton-paged / SDPA per point of a prefill sweep CSV (through graphs), in the sweep's order.

    python3 scripts/prefill_ratio_table.py reports/data/h200/kernels_prefill.csv [OTHER.csv]
"""
import sys

import pandas as pd


def ratios(path: str) -> pd.Series:
    d = pd.read_csv(path)
    d = d[d.cuda_graphs.astype(str) == "True"]
    key = ["model_shape", "batch", "query_len", "cached"]
    t = d[d.backend == "triton-paged"].set_index(key).time_us
    s = d[d.backend == "sdpa-contiguous"].set_index(key).time_us
    return (t / s).reindex(t.index)


table = pd.concat({path.rsplit("/", 1)[-1] + f"[{i}]": ratios(path)
                   for i, path in enumerate(sys.argv[1:])}, axis=1)
print(table.round(3).to_string())
