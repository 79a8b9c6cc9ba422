"""What a user's call costs: the public ``paged_decode`` against the backend called directly and
against SDPA on a contiguous cache (one GPU call, under a minute).

    PYTHONPATH=. python3 scripts/h200_public_call.py --out $OUT --commit <hash>

bf16, 32 query / 8 KV heads x 128, block 16, scattered tables, no CUDA graph. ``time_us``:
``triton.testing.do_bench`` median (L2 flushed before each repeat, so a call's host work is
hidden up to the flush's length); ``host_us``: host time per call with the GPU kept busy (calls
only enqueue; not measured for ``validate="always"``, which waits for the GPU). Writes public_call_overhead.csv and prints a table last.
"""

from __future__ import annotations

import argparse
import os

import pandas as pd
import torch
import triton

from pagebench.defaults import BLOCK_SIZE, SHAPES
from pagebench.kernels import contiguous_decode, get_backend, paged_decode
from pagebench.kernels.fixtures import contiguous_case, paged_case
from pagebench.timing import enqueue_us, environment

SHAPE = SHAPES["llama-3-8b"]
POINTS = ((1, 1024), (8, 4096))


def host_us(fn) -> float:
    return enqueue_us(fn, calls=200, busy_cycles=300_000_000)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    env = environment("cuda")
    if args.commit:
        env["commit"] = args.commit
    scale = SHAPE[2] ** -0.5
    triton_decode = get_backend("triton").decode
    sdpa = get_backend("sdpa").contiguous
    rows = []
    for batch, context in POINTS:
        paged = paged_case(batch, context, SHAPE, BLOCK_SIZE, torch.bfloat16, "cuda").args()
        q, k, v, lens = contiguous_case(batch, context, SHAPE, torch.bfloat16, "cuda").args()
        calls = {
            "paged_decode triton (public, validate=cached)":
                lambda: paged_decode(*paged, backend="triton"),
            "paged_decode triton (public, validate=always)":
                lambda: paged_decode(*paged, backend="triton", validate="always"),
            "triton backend (direct)": lambda: triton_decode(*paged, scale),
            "contiguous_decode sdpa (public)":
                lambda: contiguous_decode(q, k, v, lens, backend="sdpa"),
            "sdpa backend (direct)": lambda: sdpa(q, k, v, None, scale),
        }
        for name, fn in calls.items():
            median, q20, q80 = triton.testing.do_bench(fn, warmup=25, rep=200,
                                                       quantiles=[0.5, 0.2, 0.8])
            rows.append(dict(env, batch=batch, context=context, num_q_heads=SHAPE[0],
                             num_kv_heads=SHAPE[1], head_dim=SHAPE[2], block_size=BLOCK_SIZE,
                             dtype="bfloat16", cuda_graph=False, call=name,
                             time_us=median * 1e3, q20_us=q20 * 1e3, q80_us=q80 * 1e3,
                             host_us=None if "always" in name else host_us(fn)))
        del paged, q, k, v, lens
    df = pd.DataFrame(rows)
    sdpa_us = df[df.call == "sdpa backend (direct)"].set_index(["batch", "context"]).time_us
    df["time_vs_sdpa"] = [t / sdpa_us[(b, c)] for t, b, c in zip(df.time_us, df.batch, df.context)]
    df.to_csv(os.path.join(args.out, "public_call_overhead.csv"), index=False)
    print(df[["batch", "context", "call", "time_us", "host_us", "time_vs_sdpa"]]
          .to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
