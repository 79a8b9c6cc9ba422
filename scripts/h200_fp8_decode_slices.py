"""H200: the fp8 Triton decode with each KV tile cut into per-warp slices (``slices=``, one
online softmax per slice, merged at the end) against the committed kernel and bf16, in one
process (docs/kernels.md, "fp8 KV caches").

    PYTHONPATH=. python3 scripts/h200_fp8_decode_slices.py OUT_DIR            # checks, times
    PYTHONPATH=. python3 scripts/h200_fp8_decode_slices.py OUT_DIR --smoke    # CPU dry run
    PYTHONPATH=. python3 scripts/h200_fp8_decode_slices.py --ncu-driver       # under ncu

Checks first: every variant's output, on NaN-poisoned scattered caches (lengths 1 to 2,999,
blocks 1/16/128, e4m3 and e5m2, one split and the default split count, q scaled by 1, 2^20 and
2^-20), against the float64 reference on the dequantised cache; then the timed cases
(Llama-3-8B shape, standard-normal K/V, per-head max / 448 scales) against float32 on the GPU.
Timing: CUDA graphs, L2 flushed, medians of 30; the committed kernel is timed again at the end
of each case (``committed_again``: the spread of one version). Writes ``slices_checks.csv`` and
``slices_times.csv``; prints a table last. ``--ncu-driver`` launches the split kernel of each
profiled configuration once between ``cudaProfilerStart``/``Stop`` (run it under
``ncu --profile-from-start off``), after warm-up launches outside that range.
"""

from __future__ import annotations

import csv
import os
import sys

import torch

from pagebench.config import ceil_div
from pagebench.defaults import SHAPES
from pagebench.kernels import triton_decode
from pagebench.kernels.fixtures import (make_paged_inputs, paged_case, quantized_inputs,
                                        relative_error)
from pagebench.kernels.reference import reference_decode
from pagebench.kernels.sweep import measure_copy_gbps
from pagebench.timing import environment, measure

SMOKE = "--smoke" in sys.argv
DEVICE = "cpu" if SMOKE else "cuda"
SHAPE = SHAPES["llama-3-8b"]  # 32 query / 8 KV heads x 128
SCALE = SHAPE[2] ** -0.5
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# name -> triton_paged_decode options; {} is the committed default
VARIANTS = {
    "committed": {},
    # run 1 (c11f70c) also timed slices of 4 (tile 64, 4 warps) with 2, 3 and 5 stages; run 2
    # (3c43c58) v_contig=8 (V's rows as 8-byte chunks), alone and with 2 warps x tile 32
    "slices2_w2": dict(slices=2, tile_n=32, num_warps=2),
    "slices2_w2_st3": dict(slices=2, tile_n=32, num_warps=2, num_stages=3),
    "w2_t32": dict(tile_n=32, num_warps=2),
    "w2_t32_st2": dict(tile_n=32, num_warps=2, num_stages=2),
    "w2_t32_st3": dict(tile_n=32, num_warps=2, num_stages=3),
    "w1_t16": dict(tile_n=16, num_warps=1),
    "w1_t16_st3": dict(tile_n=16, num_warps=1, num_stages=3),
}
BLOCK1_ONLY = ("w2_t32_st2", "w2_t32_st3")  # at larger blocks 2 stages are the default
CHECKED_E5M2 = ("committed", "w2_t32", "slices2_w2")
CASES = [(32, 4096, 1), (32, 4096, 16), (128, 4096, 16), (1, 65536, 1), (1, 65536, 16)]
# ncu: (name, cache, block, options) at 32 x 4096 (run 1: bf16, e4m3 blocks 1/16, slices4;
# run 2: e4m3, v_contig8, slices2_w2, w2_t32 at block 16)
PROFILED = [("e4m3_b1", E4M3, 1, {}), ("w2_t32_st3_b1", E4M3, 1, VARIANTS["w2_t32_st3"]),
            ("w1_t16_b16", E4M3, 16, VARIANTS["w1_t16"])]
if SMOKE:
    SHAPE, SCALE = (8, 2, 64), 64 ** -0.5
    CASES = [(2, 300, 1), (2, 300, 16)]


def gpu_reference(case, k_scale, v_scale):
    """float32 decode on the dequantised cache (every sequence ``context`` tokens long)."""
    q, k_cache, v_cache, tables, lens = case
    context, block = int(lens[0]), k_cache.shape[1]
    blocks = tables[:, :ceil_div(context, block)].long()
    batch, q_heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    for s in range(batch):  # one sequence at a time: float32 K/V of 128 x 4096 would be 4 GB
        k = (k_cache[blocks[s]].float() * k_scale[:, None]).reshape(-1, kv_heads, dim)[:context]
        v = (v_cache[blocks[s]].float() * v_scale[:, None]).reshape(-1, kv_heads, dim)[:context]
        qs = q[s].float().view(kv_heads, q_heads // kv_heads, dim)
        p = torch.softmax(torch.einsum("hgd,nhd->hgn", qs, k) * SCALE, dim=-1)
        out[s] = torch.einsum("hgn,nhd->hgd", p, v).reshape(q_heads, dim)
    return out


def run_checks(rows):
    lengths = [1, 17, 2999, 64, 65] if not SMOKE else [1, 17, 70]
    for block in (1, 16, 128):
        for cache in (E4M3, E5M2):
            inp = make_paged_inputs(lengths, *SHAPE, block, torch.bfloat16, DEVICE, seed=block)
            fp8 = quantized_inputs(inp, cache, seed=block)
            for qmul in (1.0, 2.0 ** 20, 2.0 ** -20):
                args = (fp8.q * qmul, *fp8.args()[1:])
                ref = reference_decode(*args, SCALE, **fp8.scales())
                for name, options in VARIANTS.items():
                    if (cache == E5M2 and name not in CHECKED_E5M2
                            or block > 1 and name in BLOCK1_ONLY):
                        continue
                    for splits in (None, 1):
                        row = dict(block=block, cache=str(cache).replace("torch.", ""),
                                   qmul=qmul, variant=name, splits=splits or "default",
                                   err=float("inf"), finite=False, error="")
                        try:
                            out = triton_decode.triton_paged_decode(
                                *args, SCALE, fp8.k_scale, fp8.v_scale, num_splits=splits,
                                **options)
                            row.update(err=relative_error(out, ref),
                                       finite=bool(torch.isfinite(out).all()))
                        except Exception as e:  # noqa: BLE001 (a variant that fails is a result)
                            row["error"] = f"{type(e).__name__}: {e}"[:300]
                            print(name, row["error"], flush=True)
                        rows.append(row)


def plan_facts(args, options):
    plan = triton_decode.decode_plan(*args, SCALE, **options)
    kernel = next(iter(plan.split.compiled.values()), (None,))[0]
    regs = getattr(kernel, "n_regs", None)
    shared = kernel.metadata.shared if kernel is not None else None
    return plan.num_splits, regs, shared


def run_times(rows, copy_gbps, env):
    for batch, context, block in CASES:
        base = paged_case(batch, context, SHAPE, block, torch.bfloat16, DEVICE, seed=batch)
        fp8 = quantized_inputs(base, E4M3, spread=1.0)
        scales = (fp8.k_scale, fp8.v_scale)
        ref = gpu_reference(fp8.args(), *scales) if not SMOKE else None
        timed = [("bf16", base.args(), (), {})]
        timed += [(name, fp8.args(), scales, options) for name, options in VARIANTS.items()
                  if block == 1 or name not in BLOCK1_ONLY]
        timed += [("committed_again", fp8.args(), scales, VARIANTS["committed"])]
        bf16_us = None
        for name, args, sc, options in timed:

            def call():
                return triton_decode.triton_paged_decode(*args, SCALE, *sc, **options)
            try:
                out = call()
                err = relative_error(out, ref) if ref is not None and sc else None
                t = measure(call, device=DEVICE, warmup=3, repeat=30 if not SMOKE else 3,
                            cuda_graph=not SMOKE)
            except Exception as e:  # noqa: BLE001 (a variant that fails is a result)
                print(batch, context, block, name, f"{type(e).__name__}: {e}"[:300], flush=True)
                continue
            nbytes = 2 * batch * context * SHAPE[1] * SHAPE[2] * (1 if sc else 2)
            splits, regs, shared = plan_facts(args, options)
            bf16_us = t.median_us if name == "bf16" else bf16_us
            rows.append(dict(batch=batch, context=context, block=block,
                             cache="bf16" if not sc else "float8_e4m3fn", variant=name,
                             options=";".join(f"{k}={v}" for k, v in options.items()),
                             splits=splits, n_regs=regs, shared=shared,
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


def ncu_driver():
    """Each PROFILED configuration's split kernel: warmed up, then launched once inside the
    profiler range (32 x 4096, the combine kernel is launched too; filter it out in ncu)."""
    cases = {}
    for name, cache, block, options in PROFILED:
        base = paged_case(32, 4096, SHAPE, block, torch.bfloat16, DEVICE, seed=32)
        if cache is None:
            args, sc = base.args(), ()
        else:
            fp8 = quantized_inputs(base, cache, spread=1.0)
            args, sc = fp8.args(), (fp8.k_scale, fp8.v_scale)
        for _ in range(3):
            triton_decode.triton_paged_decode(*args, SCALE, *sc, **options)
        cases[name] = (args, sc, options)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, (args, sc, options) in cases.items():
        torch.cuda.nvtx.range_push(name)
        triton_decode.triton_paged_decode(*args, SCALE, *sc, **options)
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled:", ", ".join(cases))


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main():
    if "--ncu-driver" in sys.argv:
        ncu_driver()
        return
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    if not SMOKE:
        torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference stays float32
    env = environment(DEVICE)
    checks: list[dict] = []
    run_checks(checks)
    write(os.path.join(out_dir, "slices_checks.csv"), checks)
    worst = {}
    for r in checks:
        key = (r["variant"], r["cache"])
        worst[key] = max(worst.get(key, 0.0), r["err"] if r["finite"] else float("inf"))
    copy_gbps = measure_copy_gbps(DEVICE) if not SMOKE else 1.0
    times: list[dict] = []
    run_times(times, copy_gbps, env)
    write(os.path.join(out_dir, "slices_times.csv"), times)
    print(f"copy {copy_gbps:.0f} GB/s; worst check error per variant:")
    for (name, cache), err in sorted(worst.items()):
        print(f"  {name:16s} {cache:14s} {err:.2e}")
    print(f"{'case':>16s} {'variant':>16s} {'us':>8s} {'/bf16':>6s} {'copy':>5s} {'splits':>6s} "
          f"{'regs':>4s} {'err':>8s}")
    for r in times:
        case = f"{r['batch']}x{r['context']} b{r['block']}"
        err = f"{r['err_vs_f32']:.1e}" if r["err_vs_f32"] is not None else ""
        print(f"{case:>16s} {r['variant']:>16s} {r['time_us']:8.1f} {r['over_bf16']:6.3f} "
              f"{r['copy_fraction']:5.2f} {r['splits']:6d} {str(r['n_regs']):>4s} {err:>8s}")


if __name__ == "__main__":
    main()
