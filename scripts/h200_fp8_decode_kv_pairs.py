"""fp8 decode: two KV heads per program (the default) against one, and nearby launches, with
bf16 in the same process (docs/kernels.md, "fp8 KV caches").

    PYTHONPATH=. python3 scripts/h200_fp8_decode_kv_pairs.py OUT_DIR            # on the GPU
    PYTHONPATH=. python3 scripts/h200_fp8_decode_kv_pairs.py OUT_DIR --smoke    # CPU dry run
    PYTHONPATH=. python3 scripts/h200_fp8_decode_kv_pairs.py OUT_DIR --stages   # pipelining depth

``--stages`` times the paired launch at 2 (its default before), 3, 4 and 5 stages and 64-token
tiles on 4 warps at 3, at blocks 16 and 128, instead of the variants below.

Checks after the timed cases: each variant's output against the float64 reference on the
dequantised cache (NaN-poisoned scattered caches, lengths 1 to 2,999, q scaled by 1 and 2^20,
one split and the default) at the block sizes it is timed at, e4m3, and e5m2 for the default. Each case:
bf16, every variant with an e4m3 cache (standard-normal K/V, per-head max / 448 scales), the
default again at the end (the spread of one version); CUDA graphs, L2 flushed, medians of 30;
each fp8 output's error against float32 on the dequantised cache. Writes ``kv_pairs_checks.csv``
and ``kv_pairs_times.csv``; prints a table last.
"""

from __future__ import annotations

import os
import sys

import torch

from pagebench.cli.options import write_results
from pagebench.defaults import SHAPES
from pagebench.kernels import triton_decode
from pagebench.kernels.fixtures import (make_paged_inputs, paged_case, quantized_inputs,
                                        relative_error)
from pagebench.kernels.reference import reference_decode, torch_paged_decode
from pagebench.kernels.sweep import measure_copy_gbps
from pagebench.timing import environment, measure

SMOKE = "--smoke" in sys.argv
DEVICE = "cpu" if SMOKE else "cuda"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# name -> triton_paged_decode options; {} is the default (two KV heads per program, FP8_LAUNCH)
VARIANTS = {
    "default": {},
    "one_kv_head": dict(kv_per_program=1),  # the default before pairs: (32, 2), block 1 (64, 4)
    "pair_t64_w4": dict(kv_per_program=2, tile_n=64, num_warps=4),
    "quad_t16_w2": dict(kv_per_program=4, tile_n=16, num_warps=2),
    "quad_t16_w4": dict(kv_per_program=4, tile_n=16, num_warps=4),
    "pair_st3": dict(kv_per_program=2, num_stages=3),  # block 1: table a tile ahead, not 5
}
BLOCK1_ONLY = ("pair_st3",)
# (shape name, batch, context, block, variants timed)
LLAMA_ALL = [name for name in VARIANTS if name not in BLOCK1_ONLY]
CASES = [("llama-3-8b", 32, 4096, 16, LLAMA_ALL), ("llama-3-8b", 128, 4096, 16, LLAMA_ALL),
         ("llama-3-8b", 1, 65536, 16, LLAMA_ALL), ("llama-3-8b", 32, 4096, 128, LLAMA_ALL),
         ("llama-3-8b", 32, 4096, 1, list(VARIANTS)),
         ("llama-3-8b", 1, 65536, 1, ["default", "one_kv_head", "pair_st3"]),
         ("qwen2.5-0.5b", 32, 4096, 16, ["default", "one_kv_head"]),
         ("qwen2.5-0.5b", 256, 4096, 16, ["default", "one_kv_head"])]
if "--stages" in sys.argv:
    VARIANTS = {"default": {}, **{f"pair_st{n}": dict(kv_per_program=2, num_stages=n)
                                  for n in (2, 3, 4, 5)},
                "pair_t64_w4_st3": dict(kv_per_program=2, tile_n=64, num_warps=4, num_stages=3)}
    BLOCK1_ONLY = ()
    STAGED = list(VARIANTS)
    CASES = [("llama-3-8b", batch, context, block, STAGED)
             for block in (16, 128) for batch, context in ((32, 4096), (128, 4096), (1, 65536))]
    CASES += [("llama-3-8b", 32, 4096, 1, ["default"])]
SHAPE_OF = dict(SHAPES)
REPEAT = 30
if SMOKE:
    SHAPE_OF = {"llama-3-8b": (16, 4, 32), "qwen2.5-0.5b": (14, 2, 16)}
    CASES = [(s, 2, 200, b, v) for s, _, _, b, v in CASES[3:5]] + [("qwen2.5-0.5b", 2, 100, 16,
                                                                    ["default", "one_kv_head"])]
    if "--stages" in sys.argv:
        CASES = [("llama-3-8b", 2, 200, 16, STAGED)]
    REPEAT = 2


def run_checks(rows):
    lengths = [1, 17, 2999, 64, 65] if not SMOKE else [1, 17, 70]
    checked = sorted({(s, b, name) for s, _, _, b, names in CASES for name in names})
    for shape_name, block in sorted({(s, b) for s, b, _ in checked}):
        shape = SHAPE_OF[shape_name]
        scale = shape[2] ** -0.5
        names = [n for s, b, n in checked if (s, b) == (shape_name, block)]
        inp = make_paged_inputs(lengths, *shape, block, torch.bfloat16, DEVICE, seed=block)
        for cache in (E4M3, E5M2):
            fp8 = quantized_inputs(inp, cache, seed=block)
            for qmul in (1.0, 2.0 ** 20):
                args = (fp8.q * qmul, *fp8.args()[1:])
                ref = reference_decode(*args, scale, **fp8.scales())
                for name in names if cache == E4M3 else ["default"]:
                    for splits in (None, 1):
                        row = dict(shape=shape_name, block=block, cache=str(cache)[6:],
                                   qmul=qmul, variant=name, splits=splits or "default",
                                   err=float("inf"), finite=False, error="")
                        try:
                            out = triton_decode.triton_paged_decode(
                                *args, scale, fp8.k_scale, fp8.v_scale, num_splits=splits,
                                **VARIANTS[name])
                            row.update(err=relative_error(out, ref),
                                       finite=bool(torch.isfinite(out).all()))
                        except Exception as e:  # noqa: BLE001 (a variant that fails is a result)
                            row["error"] = f"{type(e).__name__}: {e}"[:300]
                            print(name, row["error"], flush=True)
                        rows.append(row)


def plan_facts(args, scale, options):
    plan = triton_decode.decode_plan(*args, scale, **options)
    kernel = next(iter(plan.split.compiled.values()), (None,))[0]
    kw = plan.split.kwargs
    return dict(kv_per_program=kw["KV_PER_PROGRAM"], tile_n=kw["TILE_N"],
                num_warps=kw["num_warps"], num_stages=kw["num_stages"],
                splits=plan.num_splits, n_regs=getattr(kernel, "n_regs", None),
                shared=kernel.metadata.shared if kernel is not None else None)


def time_case(rows, shape_name, batch, context, block, names, copy_gbps, env):
    shape = SHAPE_OF[shape_name]
    scale = shape[2] ** -0.5
    base = paged_case(batch, context, shape, block, torch.bfloat16, DEVICE, seed=batch)
    fp8 = quantized_inputs(base, E4M3, spread=1.0)
    scales = (fp8.k_scale, fp8.v_scale)
    # float32 on the dequantised cache, as the fp8 sweep's error column (fp8_sweep.dequantised_output)
    ref = (torch_paged_decode(fp8.q.float(), *fp8.args()[1:], scale, **fp8.scales())
           if not SMOKE else None)
    timed = [("bf16", base.args(), (), {})]
    timed += [(name, fp8.args(), scales, VARIANTS[name]) for name in names]
    timed += [("default_again", fp8.args(), scales, VARIANTS["default"])]
    bf16_us = None
    for name, args, sc, options in timed:

        def call():
            return triton_decode.triton_paged_decode(*args, scale, *sc, **options)
        try:
            out = call()
            err = relative_error(out, ref) if ref is not None and sc else None
            t = measure(call, device=DEVICE, warmup=3, repeat=REPEAT, cuda_graph=not SMOKE)
        except Exception as e:  # noqa: BLE001 (a variant that fails is a result)
            print(shape_name, batch, context, block, name, f"{type(e).__name__}: {e}"[:300],
                  flush=True)
            continue
        nbytes = 2 * batch * context * shape[1] * shape[2] * (1 if sc else 2)
        bf16_us = t.median_us if name == "bf16" else bf16_us
        rows.append(dict(model_shape=shape_name, batch=batch, context=context, block=block,
                         cache="bf16" if not sc else "float8_e4m3fn", variant=name,
                         options=";".join(f"{k}={v}" for k, v in options.items()),
                         **plan_facts(args, scale, options),
                         time_us=t.median_us, q20_us=t.q20_us, q80_us=t.q80_us,
                         over_bf16=t.median_us / bf16_us,
                         copy_fraction=nbytes / t.median_us / 1e3 / copy_gbps,
                         err_vs_f32=err, copy_gbps=copy_gbps,
                         env=f"torch {env['torch_version']} triton {env['triton_version']} "
                             f"{env['device_name']}",
                         commit=os.environ.get("PAGEBENCH_COMMIT", env.get("commit"))))
    del base, fp8
    if not SMOKE:
        torch.cuda.empty_cache()


def write(path, rows):
    if rows:
        write_results(path, rows)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    if not SMOKE:
        torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference stays float32
    env = environment(DEVICE)
    copy_gbps = measure_copy_gbps(DEVICE) if not SMOKE else 1.0
    times: list[dict] = []
    for case in CASES:
        time_case(times, *case, copy_gbps, env)
        write(os.path.join(out_dir, "kv_pairs_times.csv"), times)
    checks: list[dict] = []
    run_checks(checks)
    write(os.path.join(out_dir, "kv_pairs_checks.csv"), checks)
    worst: dict = {}
    for r in checks:
        key = (r["shape"], r["variant"], r["cache"])
        worst[key] = max(worst.get(key, 0.0), r["err"] if r["finite"] else float("inf"))
    print(f"copy {copy_gbps:.0f} GB/s; worst check error per variant:")
    for (shape_name, name, cache), err in sorted(worst.items()):
        print(f"  {shape_name:13s} {name:12s} {cache:14s} {err:.2e}")
    print(f"{'case':>18s} {'variant':>13s} {'us':>7s} {'/bf16':>6s} {'copy':>5s} {'kvp':>3s} "
          f"{'tile':>4s} {'w':>2s} {'st':>2s} {'spl':>4s} {'regs':>4s} {'err':>8s}")
    for r in times:
        case = f"{r['model_shape'][:5]} {r['batch']}x{r['context']} b{r['block']}"
        err = f"{r['err_vs_f32']:.1e}" if r["err_vs_f32"] is not None else ""
        print(f"{case:>18s} {r['variant']:>13s} {r['time_us']:7.1f} {r['over_bf16']:6.3f} "
              f"{r['copy_fraction']:5.2f} {r['kv_per_program']:3d} {r['tile_n']:4d} "
              f"{r['num_warps']:2d} {r['num_stages']:2d} {r['splits']:4d} "
              f"{str(r['n_regs']):>4s} {err:>8s}")


if __name__ == "__main__":
    main()
