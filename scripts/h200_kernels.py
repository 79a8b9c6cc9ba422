"""H200 kernel run: equivalence at real sizes, copy ceiling, bf16 timing sweep, acceptance table.

    PYTHONPATH=. python3 scripts/h200_kernels.py --out $OUT            # everything
    PYTHONPATH=. python3 scripts/h200_kernels.py --out $OUT --smoke    # checks + a few points
    PYTHONPATH=. python3 scripts/h200_kernels.py --out $OUT --tune --skip-equivalence --no-sweep

Host (launch path) time per call: scripts/h200_host_probe.py.

On a copied tree whose .git may be stale (the device tool's), prefix PAGEBENCH_COMMIT=<short
hash of the tree sent> so that every row names the right commit.

Writes kernels.csv / kernels.json (tidy rows, pagebench.kernels.sweep.COLUMNS),
kernels_equivalence.csv and (--tune) kernels_tuning.csv to --out; prints a summary table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from pagebench.defaults import SHAPES
from pagebench.kernels import contiguous_decode, paged_decode, registered_backends
from pagebench.kernels.fixtures import TOLERANCE, make_paged_inputs, relative_error
from pagebench.kernels.reference import reference_contiguous, reference_decode
from pagebench.kernels.sweep import COLUMNS, measure_copy_gbps, run_sweep
from pagebench.timing import environment, measure

EQ_SHAPES = [(32, 8, 128), (14, 2, 64), (16, 2, 80), (12, 4, 96), (8, 1, 256), (16, 16, 128)]
EQ_BLOCK_SIZES = (1, 7, 16, 128)


def _checked(run, ref):
    """(relative error, error message): a failing backend is recorded, not fatal. The second
    call is checked: Triton's first call compiles, later ones launch the compiled kernel."""
    try:
        run()
        return relative_error(run(), ref), ""
    except Exception as e:  # noqa: BLE001
        message = str(e).strip().splitlines()
        return float("nan"), f"{type(e).__name__}: {message[0][:200] if message else ''}"


def equivalence(device, long_len=5003, shapes=EQ_SHAPES, block_sizes=EQ_BLOCK_SIZES,
                dtypes=(torch.float32, torch.float16, torch.bfloat16)) -> list[dict]:
    """Every paged backend and contiguous baseline vs the float64 reference, poisoned caches."""
    rows = []
    gen = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        for shape in shapes:
            for bs in block_sizes:
                lens = [1, max(1, bs - 1), bs, bs + 1, long_len * 4 // 5, long_len]
                lens += torch.randint(1, long_len, (2,), generator=gen).tolist()
                inputs = {}
                for name, b in registered_backends().items():
                    if b.decode is None or not b.supports("decode", device, dtype, bs, shape[2]):
                        continue
                    if name == "flex" and (shape not in EQ_SHAPES[:2] or bs not in (16, 128)):
                        continue  # each new shape recompiles flex_attention: check a few
                    if b.nan_safe not in inputs:  # one input (and reference) per poison kind
                        poison = float("nan") if b.nan_safe else 300.0
                        inp = make_paged_inputs(lens, *shape, bs, dtype, device, seed=bs,
                                                poison_value=poison)
                        inp.ref = reference_decode(*inp.args())
                        inputs[b.nan_safe] = inp
                    inp = inputs[b.nan_safe]
                    err, error = _checked(lambda: paged_decode(*inp.args(), backend=name), inp.ref)
                    rows.append({"dtype": str(dtype)[6:], "shape": str(shape), "block_size": bs,
                                 "backend": f"{name}-paged", "rel_err": err,
                                 "tolerance": TOLERANCE[dtype],
                                 "ok": err < TOLERANCE[dtype], "error": error})
            # contiguous baselines (masked: ragged lengths)
            lens_t = torch.tensor([1, 17, long_len * 4 // 5, long_len], dtype=torch.int32)
            k = torch.randn(4, long_len, shape[1], shape[2], generator=gen).to(dtype)
            v = torch.randn(4, long_len, shape[1], shape[2], generator=gen).to(dtype)
            q = torch.randn(4, shape[0], shape[2], generator=gen).to(dtype)
            for name, b in registered_backends().items():
                if b.contiguous is None or not b.supports("contiguous", device, dtype, None, shape[2]):
                    continue
                for s, n in enumerate(lens_t.tolist()):  # slots past each length: poisoned
                    k[s, n:] = float("nan") if b.nan_safe else 300.0
                    v[s, n:] = float("nan") if b.nan_safe else 300.0
                ref = reference_contiguous(q, k, v, lens_t)
                err, error = _checked(lambda: contiguous_decode(
                    q.to(device), k.to(device), v.to(device), lens_t.to(device), backend=name), ref)
                rows.append({"dtype": str(dtype)[6:], "shape": str(shape), "block_size": None,
                             "backend": f"{name}-contiguous", "rel_err": err,
                             "tolerance": TOLERANCE[dtype], "ok": err < TOLERANCE[dtype],
                             "error": error})
    return rows


GRID_CONFIGS = [(64, 4, 2), (64, 4, 3), (64, 8, 2), (128, 4, 2), (128, 8, 3), (32, 4, 2)]
GRID_SPLITS = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 32, 48, 64, 128]
GRID_POINTS = {
    "llama-3-8b": [(1, 1024), (1, 4096), (1, 16384), (1, 65536), (2, 4096), (4, 4096),
                   (8, 4096), (16, 4096), (32, 4096), (64, 4096), (128, 4096), (256, 4096)],
    "qwen2.5-0.5b": [(1, 1024), (1, 65536), (8, 4096), (16, 4096), (32, 4096), (64, 4096),
                     (256, 4096)],
}


def tuning_grid(device, repeat=15) -> list[dict]:
    """Triton launch grid through CUDA graphs (kernel time, no Python launch cost): every
    (tile_n, num_warps, num_stages) x num_splits at each point, bf16, block 16, beside SDPA
    (both GQA layouts) and, at short batch-1 contexts, Flex. One row per measurement."""
    from pagebench.kernels import reference, triton_decode
    from pagebench.kernels.flex import flex_block_mask, flex_paged_decode
    from pagebench.kernels.fixtures import contiguous_case, paged_case
    from pagebench.kernels.sweep import kv_bytes

    def compiled(plan):  # the split kernel the plan launched (registers, shared memory)
        return next(iter(plan.split.compiled.values()), (None,))[0]

    rows = []
    for shape_name, points in GRID_POINTS.items():
        shape = SHAPES[shape_name]
        scale = shape[2] ** -0.5
        for batch, context in points:
            nb = kv_bytes(batch, context, shape[1], shape[2], torch.bfloat16)
            base = {"model_shape": shape_name, "batch": batch, "context": context}

            def timed(fn, **info):
                try:
                    t = measure(fn, device=device, warmup=3, repeat=repeat, cuda_graph=True)
                except Exception as e:  # noqa: BLE001
                    print("grid failed", base, info, type(e).__name__, str(e)[:120], flush=True)
                    torch.cuda.synchronize()
                    return None
                rows.append({**base, **info, "time_us": t.median_us,
                             "gbps": nb / t.median_us / 1e3})
                return rows[-1]

            q, k, v, _ = contiguous_case(batch, context, shape, torch.bfloat16, device, seed=4).args()
            for mode in ("gqa", "groups"):
                timed(lambda: reference.sdpa_contiguous_decode(q, k, v, None, scale, mode),
                      backend=f"sdpa-{mode}")
            del q, k, v
            case = paged_case(batch, context, shape, 16, torch.bfloat16, device, seed=4).args()
            if batch == 1 and context <= 4096:
                mask = flex_block_mask(case[3], case[4], case[1].shape[0], 16)
                timed(lambda: flex_paged_decode(*case, scale, block_mask=mask), backend="flex")
            default = triton_decode.decode_plan(*case, scale).num_splits  # the model's choice
            timed(lambda: triton_decode.triton_paged_decode(*case, scale), backend="triton",
                  num_splits=default, heuristic=True)
            for tile_n, warps, stages in GRID_CONFIGS:
                for splits in GRID_SPLITS:
                    if splits > max(1, context // tile_n):
                        continue
                    options = dict(num_splits=splits, tile_n=tile_n, num_warps=warps,
                                   num_stages=stages)
                    row = timed(lambda: triton_decode.triton_paged_decode(*case, scale, **options),
                                backend="triton", tile_n=tile_n, num_warps=warps,
                                num_stages=stages, num_splits=splits,
                                programs=batch * shape[1] * splits)
                    kernel = compiled(triton_decode.decode_plan(*case, scale, **options))
                    if row is not None and kernel is not None:
                        row.update(n_regs=kernel.n_regs, shared=kernel.metadata.shared)
            del case
            torch.cuda.empty_cache()
            best = min((r for r in rows if r.get("num_splits") and not r.get("heuristic")
                        and r["batch"] == batch and r["context"] == context
                        and r["model_shape"] == shape_name), key=lambda r: r["time_us"])
            now = [r for r in rows if r.get("heuristic") and r["batch"] == batch
                   and r["context"] == context and r["model_shape"] == shape_name]
            sd = min(r["time_us"] for r in rows if r["backend"].startswith("sdpa")
                     and r["batch"] == batch and r["context"] == context
                     and r["model_shape"] == shape_name)
            print(f"grid {shape_name} {batch}x{context}: sdpa {sd:.1f} us; heuristic "
                  f"{now[0]['time_us'] if now else float('nan'):.1f} us ({default} splits); best "
                  f"{best['time_us']:.1f} us tile {best['tile_n']} warps {best['num_warps']} "
                  f"stages {best['num_stages']} splits {best['num_splits']} "
                  f"(regs {best['n_regs']}, smem {best['shared']})", flush=True)
    return rows


def acceptance(df) -> list[str]:
    """The issue's acceptance ratios (llama shape, bf16, block 16)."""
    d = df[(df.model_shape == "llama-3-8b")]
    lines = []

    def t(backend, batch, context, bs, graph=False):
        sel = d[(d.backend == backend) & (d.batch == batch) & (d.context == context)
                & (d.cuda_graph == graph)]
        sel = sel[sel.block_size == bs] if bs is not None else sel[sel.block_size.isna()]
        return float(sel.time_us.iloc[0]) if len(sel) else float("nan")

    lines.append(f"{'batch x ctx':>12} {'graph':>5} {'triton':>8} {'sdpa':>8} {'t/sdpa':>6} "
                 f"{'tri-ctg':>8} {'flex':>8} {'flex/t':>6} {'torch':>8} {'torch/t':>7} {'GB/s':>6}")
    for batch, context in sorted(set(zip(d.batch, d.context))):
        for graph in (False, True):
            tri = t("triton-paged", batch, context, 16, graph)
            if tri != tri:
                continue
            sd = t("sdpa-contiguous", batch, context, None, graph)
            tc = t("triton-contiguous", batch, context, None, graph)
            fl = t("flex-paged", batch, context, 16, graph)
            to = t("torch-paged", batch, context, 16, graph)
            sel = d[(d.backend == "triton-paged") & (d.batch == batch) & (d.context == context)
                    & (d.block_size == 16) & (d.cuda_graph == graph)]
            lines.append(f"{batch:>5}x{context:<6} {str(graph):>5} {tri:8.1f} {sd:8.1f} "
                         f"{tri / sd:6.2f} {tc:8.1f} {fl:8.1f} {fl / tri:6.2f} {to:8.1f} "
                         f"{to / tri:7.2f} {float(sel.gbps.iloc[0]):6.0f}")
    lines.append("block-size curve, triton-paged through a CUDA graph (us): " + "; ".join(
        f"{b}x{c}: " + ", ".join(f"bs{bs:g}={t('triton-paged', b, c, bs, graph=True):.1f}"
                                 for bs in sorted(d.block_size.dropna().unique()))
        for b, c in ((1, 65536), (8, 4096), (64, 4096), (256, 4096))))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--skip-equivalence", action="store_true")
    ap.add_argument("--tune", action="store_true",
                    help="first the Triton launch grid (kernels_tuning.csv), through CUDA graphs")
    ap.add_argument("--no-sweep", action="store_true",
                    help="stop after equivalence / tuning")
    ap.add_argument("--device", default="cuda", help="cpu: a tiny dry run of this script")
    ap.add_argument("--eq-quick", action="store_true", help="fewer shapes in the equivalence run")
    args = ap.parse_args()
    device = args.device
    os.makedirs(args.out, exist_ok=True)
    env = environment(device)
    print(json.dumps(env), flush=True)
    meta = {"environment": env, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    t0 = time.time()
    if not args.skip_equivalence:
        import pandas as pd
        eq_kwargs = dict(shapes=EQ_SHAPES[:2]) if args.eq_quick else {}
        eq = pd.DataFrame(equivalence(device, 5003 if device == "cuda" else 40, **eq_kwargs))
        eq.to_csv(os.path.join(args.out, "kernels_equivalence.csv"), index=False)
        worst = eq.groupby(["backend", "dtype"]).rel_err.max().unstack()
        print(worst.to_string(float_format=lambda x: f"{x:.1e}"), flush=True)
        meta["equivalence_all_ok"] = bool(eq.ok.all())
        meta["equivalence_failures"] = eq[~eq.ok].to_dict("records")
        print(f"equivalence: {len(eq)} checks, all ok: {bool(eq.ok.all())} "
              f"({time.time() - t0:.0f}s)", flush=True)
    if args.tune and device == "cuda":
        import pandas as pd
        tune = pd.DataFrame(tuning_grid(device))
        tune.to_csv(os.path.join(args.out, "kernels_tuning.csv"), index=False)
        print(f"tuning grid: {len(tune)} rows ({time.time() - t0:.0f}s)", flush=True)
    if args.no_sweep:
        return 0
    copy = measure_copy_gbps(device) if device == "cuda" else float("nan")
    meta["copy_gbps"] = copy
    print(f"copy bandwidth (read+write): {copy:.0f} GB/s", flush=True)
    skipped = []
    kwargs = {}
    if args.smoke:
        kwargs = dict(points=[(1, 4096), (8, 4096), (64, 4096), (256, 4096), (1, 65536)],
                      block_sizes=(1, 16), shapes={"llama-3-8b": SHAPES["llama-3-8b"]})
    if device != "cuda":
        kwargs = dict(points=[(1, 64), (8, 64)], block_sizes=(1, 16), repeat=2,
                      shapes={"llama-3-8b": SHAPES["llama-3-8b"]}, exclude=())
    partial = os.path.join(args.out, "kernels_partial.csv")  # rows so far, if the run is cut

    def progress(row):
        import pandas as pd
        pd.DataFrame([row]).to_csv(partial, mode="a", header=not os.path.exists(partial),
                                   index=False)
    df = run_sweep(device, quick=False, copy_gbps=copy, skipped=skipped, progress=progress,
                   **kwargs)
    os.remove(partial)
    df.to_csv(os.path.join(args.out, "kernels.csv"), index=False)
    meta["skipped"] = [list(map(str, s)) for s in skipped]
    meta["seconds"] = time.time() - t0
    with open(os.path.join(args.out, "kernels.json"), "w") as f:
        json.dump({"meta": meta, "columns": COLUMNS, "rows": df.to_dict("records")}, f, indent=1,
                  default=str)
    print(f"sweep: {len(df)} rows, {len(skipped)} skipped, {time.time() - t0:.0f}s total")
    for s in skipped[:20]:
        print("skipped", s)
    print("\n".join(acceptance(df)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
