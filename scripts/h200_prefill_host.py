"""H200: the host work of a Triton paged prefill call, against another version of the kernel
file and against SDPA (one process, about a minute).

    PYTHONPATH=. python3 scripts/h200_prefill_host.py --out $OUT [--copy FILE]

Llama-3-8B shape (32 query / 8 KV heads x 128), bf16, block 16, at whole prompts and a chunk
after a cached prefix. Per call: ``host_us``, host time with the GPU kept busy (calls only
enqueue; 200 calls a run, garbage collection off, the variants in turn, ``--rounds`` rounds of
three runs each, the median over all); ``eager_us``, the call's time without a graph
(CUDA events, L2 flushed, median of 20: host work shows where it exceeds the GPU's);
``graph_us``, replayed from a CUDA graph. Variants: ``triton_paged_prefill`` (the package's),
the same from ``--copy FILE`` (e.g. ``git show REV:pagebench/kernels/triton_prefill.py``),
the public ``paged_prefill(..., backend="triton")`` (argument checks included) and causal
SDPA on a contiguous cache. The copy's output must equal the package's bit for bit. Writes
prefill_host.csv and prints a table last.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

import pandas as pd
import torch
from ab_harness import load_copy, parse_points

from pagebench.defaults import BLOCK_SIZE, SHAPES
from pagebench.kernels import paged_prefill
from pagebench.kernels.fixtures import prefill_case
from pagebench.kernels.prefill_sweep import sdpa_causal
from pagebench.kernels.triton_prefill import triton_paged_prefill
from pagebench.timing import environment, measure

POINTS = "1x512x0,1x2048x0,8x512x0,64x512x0,128x128x0,1x512x3584"


def host_us(fn, calls=200, runs=3) -> list[float]:
    """Host time per call while the GPU is busy, so that calls only enqueue: one per run."""
    fn()
    samples = []
    gc.disable()
    try:
        for _ in range(runs):
            torch.cuda.synchronize()
            torch.cuda._sleep(400_000_000)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    finally:
        gc.enable()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--copy", default="", help="another triton_prefill.py to time too")
    parser.add_argument("--points", default=POINTS, help="batch x queries x cached, ...")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    shape = SHAPES["llama-3-8b"]
    scale = shape[2] ** -0.5
    copy = load_copy(args.copy, "prefill_copy") if args.copy else None
    rows = []
    for point in parse_points(args.points, []):
        case = prefill_case(*point, shape, BLOCK_SIZE, torch.bfloat16, "cuda", seed=3)
        calls = {"triton_paged_prefill": lambda: triton_paged_prefill(*case.args(), scale),
                 "paged_prefill (public)": lambda: paged_prefill(*case.args(), scale,
                                                                 backend="triton"),
                 "sdpa": sdpa_causal(*point, shape, torch.bfloat16, "cuda", seed=3)}
        if copy is not None:
            calls["copy"] = lambda: copy.triton_paged_prefill(*case.args(), scale)
            same = torch.equal(calls["copy"](), calls["triton_paged_prefill"]())
            assert same, f"{point}: the copy's output differs from the package's"
        host = {name: [] for name in calls}
        for _ in range(args.rounds):  # the variants in turn, so that drift reaches all alike
            for name, fn in calls.items():
                host[name] += host_us(fn)
        for name, fn in calls.items():
            rows.append(dict(call=name, batch=point[0], query_len=point[1], cached=point[2],
                             host_us=statistics.median(host[name]), host_min_us=min(host[name]),
                             host_max_us=max(host[name]),
                             eager_us=measure(fn, device="cuda", cuda_graph=False).median_us,
                             graph_us=measure(fn, device="cuda", cuda_graph=True).median_us))
            print(rows[-1], flush=True)
    df = pd.DataFrame(rows).assign(**environment("cuda"))
    os.makedirs(args.out, exist_ok=True)
    df.to_csv(os.path.join(args.out, "prefill_host.csv"), index=False)
    pd.set_option("display.width", 200)
    print(df.pivot_table(index=["batch", "query_len", "cached"], columns="call",
                         values=["host_us", "eager_us", "graph_us"], sort=False)
          .round(1).to_string())


if __name__ == "__main__":
    main()
