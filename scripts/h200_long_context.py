"""H200: the decode launch defaults at long contexts over few (sequence, KV head) pairs, against
the general launch (tile 64, 4 warps) and SDPA, through CUDA graphs; each result is checked
against float64.

    PYTHONPATH=. python3 scripts/h200_long_context.py   # writes $OUT/long_context_launch.csv
"""

from __future__ import annotations

import os

import pandas as pd
import torch

from pagebench.defaults import SHAPES
from pagebench.kernels import reference, triton_decode
from pagebench.kernels.fixtures import contiguous_case, paged_case, relative_error
from pagebench.kernels.reference import reference_decode
from pagebench.timing import environment, measure

POINTS = [("qwen2.5-0.5b", 1, 16384), ("qwen2.5-0.5b", 1, 65536), ("llama-3-8b", 1, 16384),
          ("llama-3-8b", 1, 65536), ("qwen2.5-0.5b", 2, 16384)]


def main() -> None:
    env = environment("cuda")
    rows = []
    for shape_name, batch, context in POINTS:
        shape = SHAPES[shape_name]
        scale = shape[2] ** -0.5
        case = paged_case(batch, context, shape, 16, torch.bfloat16, "cuda", seed=5).args()
        q, k, v, _ = contiguous_case(batch, context, shape, torch.bfloat16, "cuda", seed=5).args()
        variants = {
            "rule": lambda: triton_decode.triton_paged_decode(*case, scale),
            "old": lambda: triton_decode.triton_paged_decode(*case, scale, tile_n=64,
                                                             num_warps=4),
            "sdpa": lambda: reference.sdpa_contiguous_decode(q, k, v, None, scale),
        }
        err = relative_error(variants["rule"](), reference_decode(*case, scale))
        t = {name: measure(fn, device="cuda", warmup=3, repeat=40, cuda_graph=True).median_us
             for name, fn in variants.items()}
        splits = triton_decode.decode_plan(*case, scale).num_splits
        rows.append({**env, "model_shape": shape_name, "batch": batch, "context": context,
                     "splits": splits, "rel_err": err, **{f"{n}_us": x for n, x in t.items()}})
        print(shape_name, batch, context, splits, f"err {err:.1e}",
              " ".join(f"{n} {x:.1f}" for n, x in t.items()),
              f"rule/sdpa {t['rule'] / t['sdpa']:.2f} old/sdpa {t['old'] / t['sdpa']:.2f}",
              flush=True)
        del case, q, k, v
    pd.DataFrame(rows).to_csv(os.path.join(os.environ.get("OUT", "."),
                                           "long_context_launch.csv"), index=False)


if __name__ == "__main__":
    main()
