"""fp8 decode: the CUDA kernel (``pagebench.kernels.cuda_fp8_decode``, operands swapped, no
shared memory) against Triton's fp8 and bf16 decode, in the same process (docs/kernels.md).

    PYTHONPATH=. python3 scripts/h200_fp8_decode_cuda.py OUT_DIR          # on the GPU
    ... OUT_DIR --points 64x4096,128x4096 --blocks 16 --no-checks          # a subset
    ... OUT_DIR --splits                    # split counts, and the split kernel alone

First the checks: the CUDA kernel's output against the float64 reference on the dequantised
cache (NaN-poisoned scattered caches and table tails, lengths 1 to 2,999), over head dims
64/128/256, groups 4/7/8, blocks 1/3/16/128, int32 and int64 tables and lengths, bf16 and fp16
q (scaled by 1 and 2^20), e4m3 and e5m2, one split, the default and 5. Then the timed cases:
Triton bf16, Triton e4m3, and the CUDA kernel at several warps per SM, the Triton e4m3 again
at the end; CUDA graphs, L2 flushed, medians of 30. Writes ``cuda_checks.csv`` and
``cuda_times.csv``; prints a table last.
"""

from __future__ import annotations

import os
import sys

import torch

from pagebench.cli.options import write_results
from pagebench.defaults import SHAPES
from pagebench.kernels import cuda_fp8_decode, triton_decode
from pagebench.kernels.fixtures import (make_paged_inputs, paged_case, quantized_inputs,
                                        relative_error)
from pagebench.kernels.reference import reference_decode, torch_paged_decode
from pagebench.kernels.sweep import measure_copy_gbps
from pagebench.timing import environment, measure

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SHAPE_OF = dict(SHAPES)
CHECK_SHAPES = {"llama-3-8b": (32, 8, 128), "qwen2.5-0.5b": (14, 2, 64), "g8": (32, 4, 128),
                "d256": (16, 2, 256)}
CUDA_VARIANTS = {"cuda": {}, "cuda_mb4": dict(min_blocks=4),
                 "cuda_b2": dict(warps_per_block=2),
                 # a block's warps on one KV head's splits, merged in the block (or not: sw1)
                 "cuda_sw1": dict(split_warps=1), "cuda_sw4": dict(split_warps=4),
                 "cuda_sw2": dict(split_warps=2),
                 "cuda_sw2h1": dict(warps_per_block=2, split_warps=2),
                 "cuda_sw8": dict(warps_per_block=8, split_warps=8)}
# the split counts that timed best in the run before (about 8 warps per SM), per point
EARLIER_SPLITS = {(16, 4096): 9, (32, 4096): 5, (64, 4096): 2, (128, 4096): 3, (1, 65536): 132}
OTHER_BLOCKS = ["cuda", "cuda_sw1", "cuda_sw4"]
POINTS = [(16, 4096), (32, 4096), (64, 4096), (128, 4096), (1, 65536)]
REPEAT = 30


def run_checks(rows):
    lengths = [1, 17, 2999, 64, 65, 300]
    for shape_name, shape in CHECK_SHAPES.items():
        scale = shape[2] ** -0.5
        for block in (1, 3, 16, 128):
            for qdt in (torch.bfloat16, torch.float16):
                inp = make_paged_inputs(lengths, *shape, block, qdt, "cuda", seed=block)
                for cache in (E4M3, E5M2):
                    fp8 = quantized_inputs(inp, cache, seed=block)
                    index_dtypes = [torch.int32, torch.int64] if shape_name == "llama-3-8b" \
                        else [torch.int32]
                    for idx in index_dtypes:
                        for qmul in ((1.0, 2.0 ** 20) if qdt == torch.bfloat16 else (1.0,)):
                            q, k, v, tables, lens = fp8.args()
                            args = (q * qmul, k, v, tables.to(idx), lens.to(idx))
                            ref = reference_decode(*args, scale, **fp8.scales())
                            for splits in (None, 1, 5):
                                row = dict(shape=shape_name, block=block, q=str(qdt)[6:],
                                           cache=str(cache)[6:], index=str(idx)[6:], qmul=qmul,
                                           splits=splits or "default", err=float("inf"),
                                           finite=False, error="")
                                try:
                                    out = cuda_fp8_decode.cuda_fp8_paged_decode(
                                        *args, scale, fp8.k_scale, fp8.v_scale,
                                        num_splits=splits)
                                    row.update(err=relative_error(out, ref),
                                               finite=bool(torch.isfinite(out).all()))
                                except Exception as e:  # noqa: BLE001 (a failure is a result)
                                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                                    print(row, flush=True)
                                rows.append(row)
    # a strided cache view: every other block of a larger cache, and a cache offset by one block
    inp = make_paged_inputs(lengths, 32, 8, 128, 16, torch.bfloat16, "cuda", seed=5)
    fp8 = quantized_inputs(inp, E4M3, seed=5)
    q, k, v, tables, lens = fp8.args()
    big_k = torch.empty((2 * k.shape[0] + 1, *k.shape[1:]), device="cuda", dtype=k.dtype)
    big_v = torch.empty_like(big_k)
    big_k[1::2], big_v[1::2] = k, v
    ref = reference_decode(q, k, v, tables, lens, 128 ** -0.5, **fp8.scales())
    out = cuda_fp8_decode.cuda_fp8_paged_decode(q, big_k[1::2], big_v[1::2], tables, lens,
                                                128 ** -0.5, fp8.k_scale, fp8.v_scale)
    rows.append(dict(shape="llama-3-8b strided view", block=16, q="bfloat16", cache="e4m3fn",
                     index="int32", qmul=1.0, splits="default", err=relative_error(out, ref),
                     finite=bool(torch.isfinite(out).all()), error=""))


def time_case(rows, shape_name, batch, context, block, variants, copy_gbps, env):
    shape = SHAPE_OF[shape_name]
    scale = shape[2] ** -0.5
    base = paged_case(batch, context, shape, block, torch.bfloat16, "cuda", seed=batch)
    fp8 = quantized_inputs(base, E4M3, spread=1.0)
    sc = (fp8.k_scale, fp8.v_scale)
    ref = torch_paged_decode(fp8.q.float(), *fp8.args()[1:], scale, **fp8.scales())
    bargs, fargs = base.args(), fp8.args()
    timed = [("triton_bf16", lambda: triton_decode.triton_paged_decode(*bargs, scale)),
             ("triton_e4m3", lambda: triton_decode.triton_paged_decode(*fargs, scale, *sc))]
    for name in variants:
        options = CUDA_VARIANTS.get(name, {})
        if name == "cuda_earlier":
            if (batch, context) not in EARLIER_SPLITS:
                continue
            options = dict(num_splits=EARLIER_SPLITS[(batch, context)])
        timed.append((name, lambda o=options: cuda_fp8_decode.cuda_fp8_paged_decode(
            *fargs, scale, *sc, **o)))
    timed.append(("triton_e4m3_again", timed[1][1]))
    bf16_us = None
    for name, call in timed:
        try:
            out = call()
            err = relative_error(out, ref) if name != "triton_bf16" else None
            t = measure(call, device="cuda", warmup=3, repeat=REPEAT, cuda_graph=True)
        except Exception as e:  # noqa: BLE001 (a variant that fails is a result)
            print(shape_name, batch, context, block, name, f"{type(e).__name__}: {e}"[:300],
                  flush=True)
            continue
        nbytes = 2 * batch * context * shape[1] * shape[2] * (2 if name == "triton_bf16" else 1)
        bf16_us = t.median_us if name == "triton_bf16" else bf16_us
        gbps = nbytes / t.median_us / 1e3
        rows.append(dict(model_shape=shape_name, batch=batch, context=context, block=block,
                         cache="bf16" if name == "triton_bf16" else "float8_e4m3fn",
                         variant=name, time_us=t.median_us, q20_us=t.q20_us, q80_us=t.q80_us,
                         over_bf16=t.median_us / bf16_us, copy_fraction=gbps / copy_gbps,
                         err_vs_f32=err, copy_gbps=copy_gbps, **env))
    timed.clear()
    torch.cuda.empty_cache()


def time_splits(rows, env):
    """Block 16, Llama shape: the CUDA kernel at fixed split counts and at its own without the
    combine kernel (its share of the time), against Triton bf16, in one process."""
    shape = SHAPE_OF["llama-3-8b"]
    scale = shape[2] ** -0.5
    for (batch, context), counts in {(1, 65536): (33, 66, 99, 132, 165, 198, 264, 330, 396, 512),
                                     (32, 4096): (1, 2, 3, 4, 5, 6, 8, 10)}.items():
        base = paged_case(batch, context, shape, 16, torch.bfloat16, "cuda", seed=batch)
        fp8 = quantized_inputs(base, E4M3, spread=1.0)
        bargs, fargs, sc = base.args(), fp8.args(), (fp8.k_scale, fp8.v_scale)
        chosen = cuda_fp8_decode.choose_splits(batch * shape[1], context, 1584)[0]
        sw4 = dict(split_warps=4)
        timed = [("triton_bf16", None, lambda: triton_decode.triton_paged_decode(*bargs, scale)),
                 ("cuda_sw1", None, lambda: cuda_fp8_decode.cuda_fp8_paged_decode(
                     *fargs, scale, *sc, split_warps=1)),
                 ("cuda_sw4", None, lambda: cuda_fp8_decode.cuda_fp8_paged_decode(
                     *fargs, scale, *sc, **sw4))]
        timed += [(f"cuda_splits{n}", n, lambda n=n: cuda_fp8_decode.cuda_fp8_paged_decode(
            *fargs, scale, *sc, num_splits=n, split_warps=1)) for n in counts]
        timed += [(f"cuda_sw4_splits{n}", n, lambda n=n: cuda_fp8_decode.cuda_fp8_paged_decode(
            *fargs, scale, *sc, num_splits=n, **sw4)) for n in counts]
        for name, n, call in timed:
            rows.append(dict(batch=batch, context=context, variant=name, splits=n or chosen,
                             time_us=measure(call, device="cuda", repeat=REPEAT,
                                             cuda_graph=True).median_us, **env))
        forced_runs = [(0, "cuda_no_combine", 1), (1, "cuda_combine_per_head", 1),
                       (2, "cuda_combine_wide", 1), (0, "cuda_sw4_no_combine", 2),
                       (1, "cuda_sw4_combine_per_head", 2), (2, "cuda_sw4_combine_wide", 2)]
        for forced, label, which in forced_runs:
            cuda_fp8_decode.COMBINE = forced  # 0: the split kernel alone
            try:
                t = measure(timed[which][2], device="cuda", repeat=REPEAT, cuda_graph=True)
            finally:
                cuda_fp8_decode.COMBINE = None
            rows.append(dict(batch=batch, context=context, variant=label, splits=chosen,
                             time_us=t.median_us, **env))
        bf16 = rows[-len(timed) - len(forced_runs)]["time_us"]
        for r in rows[-len(timed) - len(forced_runs):]:
            r["over_bf16"] = r["time_us"] / bf16
            print(f"{batch}x{context} {r['variant']:>16s} splits {r['splits']:4d} "
                  f"{r['time_us']:7.1f} us {r['over_bf16']:.3f}", flush=True)


def write(path, rows):
    if rows:
        write_results(path, rows)


def option(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    global POINTS
    out_dir = sys.argv[1]
    POINTS = [tuple(map(int, p.split("x"))) for p in option("--points", "").split(",") if p] \
        or POINTS
    blocks = [int(b) for b in option("--blocks", "16,1,128").split(",")]
    os.makedirs(out_dir, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference stays float32
    env = environment("cuda")
    if "--splits" in sys.argv:
        rows: list[dict] = []
        time_splits(rows, env)
        write(os.path.join(out_dir, "cuda_splits.csv"), rows)
        return
    checks: list[dict] = []
    if "--no-checks" not in sys.argv:
        run_checks(checks)
    write(os.path.join(out_dir, "cuda_checks.csv"), checks)
    worst: dict = {}
    for r in checks:
        key = (r["shape"], r["cache"])
        worst[key] = max(worst.get(key, 0.0), r["err"] if r["finite"] else float("inf"))
    print("worst check error:", {f"{s}/{c}": f"{e:.2e}" for (s, c), e in worst.items()},
          flush=True)
    copy_gbps = measure_copy_gbps("cuda")
    times: list[dict] = []
    for batch, context in POINTS:
        for block in blocks:
            names = [*CUDA_VARIANTS, "cuda_earlier"] if block == 16 else OTHER_BLOCKS
            time_case(times, "llama-3-8b", batch, context, block, names, copy_gbps, env)
            write(os.path.join(out_dir, "cuda_times.csv"), times)
    if "--points" not in sys.argv:
        time_case(times, "qwen2.5-0.5b", 32, 4096, 16, ["cuda", "cuda_b2"], copy_gbps, env)
        time_case(times, "qwen2.5-0.5b", 1, 65536, 16, ["cuda", "cuda_b2"], copy_gbps, env)
        write(os.path.join(out_dir, "cuda_times.csv"), times)
    print(f"copy {copy_gbps:.0f} GB/s")
    print(f"{'case':>22s} {'variant':>18s} {'us':>8s} {'/bf16':>6s} {'copy':>5s} {'err':>8s}")
    for r in times:
        case = f"{r['model_shape'][:5]} {r['batch']}x{r['context']} b{r['block']}"
        err = f"{r['err_vs_f32']:.1e}" if r["err_vs_f32"] is not None else ""
        print(f"{case:>22s} {r['variant']:>18s} {r['time_us']:8.1f} {r['over_bf16']:6.3f} "
              f"{r['copy_fraction']:5.2f} {err:>8s}")


if __name__ == "__main__":
    main()
