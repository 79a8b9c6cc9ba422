"""H200 prefill run: paged-prefill equivalence at real sizes, a Triton launch grid, the sweep.

    PYTHONPATH=. python3 scripts/h200_prefill.py --out $OUT

(prefix PAGEBENCH_COMMIT=<short hash> on a copied tree whose .git is stale). Writes
kernels_prefill_equivalence.csv, kernels_prefill_tuning.csv and kernels_prefill.csv (tidy rows,
pagebench.kernels.prefill_sweep.PREFILL_COLUMNS) to --out; prints a summary table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import pandas as pd
import torch

from pagebench.defaults import SHAPES
from pagebench.kernels import paged_prefill, registered_backends
from pagebench.kernels.fixtures import (TOLERANCE, make_paged_inputs, prefill_case,
                                        relative_error)
from pagebench.kernels.prefill_sweep import FULL_PREFILL_POINTS, run_prefill_sweep
from pagebench.kernels.reference import reference_prefill
from pagebench.timing import environment, measure

EQ_SHAPES = [(32, 8, 128), (14, 2, 64), (16, 2, 80), (8, 1, 256)]


def equivalence(device="cuda") -> list[dict]:
    """Each paged-prefill backend vs float64, NaN-poisoned caches, whole prompts and chunks."""
    rows = []
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape in EQ_SHAPES:
            for bs in (1, 7, 16, 128):
                lens = [1, max(1, bs - 1), bs, bs + 1, 700, 1500,
                        int(torch.randint(2, 1500, (1,), generator=gen))]
                qlens = [1, max(1, bs - 1), 1, bs + 1, 700, 600, 1 + lens[-1] // 3]
                inp = make_paged_inputs(lens, shape[0], shape[1], shape[2], bs, dtype, device,
                                        seed=len(rows))
                q = torch.randn(sum(qlens), shape[0], shape[2], generator=gen).to(device, dtype)
                ql = torch.tensor(qlens, dtype=torch.int32, device=device)
                args = (q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, ql)
                ref = reference_prefill(*args)
                for name, b in registered_backends().items():
                    if b.prefill is None or not b.supports("prefill", device, dtype, bs, shape[2]):
                        continue
                    try:
                        out = paged_prefill(*args, backend=name)
                        err = relative_error(out, ref)
                        error = "NaN in output" if torch.isnan(out).any() else ""
                    except Exception as e:  # noqa: BLE001
                        err, error = float("nan"), f"{type(e).__name__}: {str(e)[:200]}"
                    rows.append({"dtype": str(dtype)[6:], "shape": str(shape), "block_size": bs,
                                 "backend": f"{name}-paged", "rel_err": err,
                                 "tolerance": TOLERANCE[dtype],
                                 "ok": err < TOLERANCE[dtype] and not error, "error": error})
    return rows


TUNE = [(64, 64, 4), (128, 64, 8), (128, 32, 4), (128, 128, 8), (64, 32, 4), (256, 64, 8)]


def tuning(device="cuda") -> list[dict]:
    """Triton prefill (rows, tile_n, num_warps) at the sweep's points, Llama shape, block 16,
    through CUDA graphs (kernel time)."""
    from pagebench.kernels.triton_prefill import triton_paged_prefill

    shape = SHAPES["llama-3-8b"]
    scale = shape[2] ** -0.5
    rows = []
    for point in FULL_PREFILL_POINTS:
        case = prefill_case(*point, shape, 16, torch.bfloat16, device, seed=3).args()
        for r, tile, warps in TUNE:
            fn = lambda: triton_paged_prefill(*case, scale, rows=r, tile_n=tile,  # noqa: E731
                                              num_warps=warps)
            try:
                t = measure(fn, device=device, warmup=2, repeat=10, cuda_graph=True)
            except Exception as e:  # noqa: BLE001
                print("tune failed", point, r, tile, warps, type(e).__name__, str(e)[:100])
                continue
            rows.append({"batch": point[0], "query_len": point[1], "cached": point[2],
                         "rows": r, "tile_n": tile, "num_warps": warps, "time_us": t.median_us})
        best = min((x for x in rows if (x["batch"], x["query_len"], x["cached"]) == point),
                   key=lambda x: x["time_us"], default=None)
        print("tune", point, best, flush=True)
        del case
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--skip-equivalence", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    env = environment("cuda")
    print(json.dumps(env), flush=True)
    t0 = time.time()
    if not args.skip_equivalence:
        eq = pd.DataFrame(equivalence())
        eq.to_csv(os.path.join(args.out, "kernels_prefill_equivalence.csv"), index=False)
        print(eq.groupby(["backend", "dtype"]).rel_err.max().unstack().to_string(
            float_format=lambda x: f"{x:.1e}"))
        print(f"prefill equivalence: {len(eq)} checks, all ok: {bool(eq.ok.all())} "
              f"({time.time() - t0:.0f}s)", flush=True)
        for r in eq[~eq.ok].to_dict("records"):
            print("FAILED", r)
    if not args.no_tune:
        pd.DataFrame(tuning()).to_csv(os.path.join(args.out, "kernels_prefill_tuning.csv"),
                                      index=False)
        print(f"tuning done ({time.time() - t0:.0f}s)", flush=True)
    df = run_prefill_sweep("cuda", quick=False)
    df.to_csv(os.path.join(args.out, "kernels_prefill.csv"), index=False)
    print(f"sweep: {len(df)} rows ({time.time() - t0:.0f}s)")
    key = ["model_shape", "batch", "query_len", "cached"]
    p = df.pivot_table(index=key, columns=["backend", "cuda_graph"], values="time_us")
    p.columns = [f"{b}{' graph' if g else ''}" for b, g in p.columns]
    if "triton-paged" in p:
        p["torch/triton"] = p["torch-paged"] / p["triton-paged"]
        p["triton/sdpa"] = p["triton-paged"] / p["sdpa-contiguous"]
        p["triton/sdpa graph"] = p["triton-paged graph"] / p["sdpa-contiguous graph"]
        graph = df[(df.backend == "triton-paged") & df.cuda_graph.astype(bool)]
        p["triton TFLOP/s graph"] = graph.set_index(key).tflops
    print(p.round(2).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
