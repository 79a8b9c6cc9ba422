"""H200: fp8 decode variants against the committed kernel and bf16 in one process
(docs/kernels.md, "fp8 KV caches"): the tile loop on CUDA cores (no ``tl.dot``; per-tile
reductions or one running softmax per token slot) and two KV heads per program (``tl.dot``).

    PYTHONPATH=. python3 scripts/h200_fp8_decode_cuda_cores.py OUT_DIR            # GPU
    PYTHONPATH=. python3 scripts/h200_fp8_decode_cuda_cores.py OUT_DIR --smoke    # CPU dry run

Every variant is timed at 32 x 4096 block 16 first; the fastest ``TOP`` then at the other
cases. Checks: each timed variant against the float64 reference on the dequantised cache
(NaN-poisoned scattered caches, lengths 1 to 2,999, q scaled by 1 and 2^20, one split and
the default), at the block sizes it is timed at, e4m3 (and e5m2 for the committed kernel and
the fastest variant). Timing: CUDA graphs, L2 flushed, medians of 30; the committed kernel is
timed again at the end of each case.
"""

from __future__ import annotations

import csv
import os
import sys
import time

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


def cc(tile_n, warps, stages=None, slots=False):
    """A CUDA-core variant's options (per-tile reductions, or per-slot softmax)."""
    return dict(cuda_cores="slots" if slots else True, tile_n=tile_n, num_warps=warps,
                num_stages=stages)


VARIANTS = {
    "committed": {},
    "cc_t16_w1": cc(16, 1), "cc_t32_w2": cc(32, 2), "cc_t16_w2": cc(16, 2),
    "cc_t32_w4": cc(32, 4), "cc_t64_w4": cc(64, 4), "cc_t64_w8": cc(64, 8),
    "cc_t32_w2_st1": cc(32, 2, 1), "cc_t32_w2_st3": cc(32, 2, 3), "cc_t32_w2_st4": cc(32, 2, 4),
    "slots_t8_w2": cc(8, 2, slots=True), "slots_t16_w4": cc(16, 4, slots=True),
    "slots_t32_w8": cc(32, 8, slots=True), "slots_t16_w4_st3": cc(16, 4, 3, slots=True),
    "pair_t16_w2": dict(kv_per_program=2, tile_n=16, num_warps=2),
    "pair_t32_w2": dict(kv_per_program=2, tile_n=32, num_warps=2),
    "pair_t32_w4": dict(kv_per_program=2, tile_n=32, num_warps=4),
    "pair_t64_w4": dict(kv_per_program=2, tile_n=64, num_warps=4),
    "pair_t32_w2_st3": dict(kv_per_program=2, tile_n=32, num_warps=2, num_stages=3),
    "t64_w2": dict(tile_n=64, num_warps=2),  # the committed kernel, pair_t32_w2's tile shape
}
FAMILIES = ("cc_", "slots_", "pair_", "t64_")
FIRST = (32, 4096, 16)
CASES = [(128, 4096, 16), (1, 65536, 16), (32, 4096, 1), (32, 4096, 128), (1, 65536, 1),
         (128, 4096, 128)]
TOP = 5
REPEAT = 30
if SMOKE:
    SHAPE, SCALE = (8, 2, 64), 64 ** -0.5
    FIRST, CASES, TOP, REPEAT = (2, 300, 16), [(2, 300, 1)], 4, 2
    VARIANTS = {k: v for k, v in VARIANTS.items()
                if k in ('committed', 'cc_t32_w2', 'slots_t16_w4', 'pair_t32_w2', 't64_w2')}


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


def run_checks(rows, names, block, caches):
    lengths = [1, 17, 2999, 64, 65] if not SMOKE else [1, 17, 70]
    for cache in caches:
        inp = make_paged_inputs(lengths, *SHAPE, block, torch.bfloat16, DEVICE, seed=block)
        fp8 = quantized_inputs(inp, cache, seed=block)
        for qmul in (1.0, 2.0 ** 20):
            args = (fp8.q * qmul, *fp8.args()[1:])
            ref = reference_decode(*args, SCALE, **fp8.scales())
            for name in names:
                for splits in (None, 1):
                    row = dict(block=block, cache=str(cache).replace("torch.", ""), qmul=qmul,
                               variant=name, splits=splits or "default", err=float("inf"),
                               finite=False, error="")
                    try:
                        out = triton_decode.triton_paged_decode(
                            *args, SCALE, fp8.k_scale, fp8.v_scale, num_splits=splits,
                            **VARIANTS[name])
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


def time_case(rows, case, names, copy_gbps, env):
    batch, context, block = case
    base = paged_case(batch, context, SHAPE, block, torch.bfloat16, DEVICE, seed=batch)
    fp8 = quantized_inputs(base, E4M3, spread=1.0)
    scales = (fp8.k_scale, fp8.v_scale)
    ref = gpu_reference(fp8.args(), *scales) if not SMOKE else None
    timed = [("bf16", base.args(), (), {})]
    timed += [(name, fp8.args(), scales, VARIANTS[name]) for name in names]
    timed += [("committed_again", fp8.args(), scales, VARIANTS["committed"])]
    bf16_us = None
    for name, args, sc, options in timed:

        def call():
            return triton_decode.triton_paged_decode(*args, SCALE, *sc, **options)
        try:
            t0 = time.perf_counter()
            out = call()
            err = relative_error(out, ref) if ref is not None and sc else None
            t = measure(call, device=DEVICE, warmup=3, repeat=REPEAT, cuda_graph=not SMOKE)
            wall = time.perf_counter() - t0
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
                         err_vs_f32=err, copy_gbps=copy_gbps, wall_s=round(wall, 1),
                         env=f"torch {env['torch_version']} triton {env['triton_version']} "
                             f"{env['device_name']}",
                         commit=os.environ.get("PAGEBENCH_COMMIT", env.get("commit"))))
        print(f"{batch}x{context} b{block} {name}: {t.median_us:.1f} us "
              f"({t.median_us / bf16_us:.3f} of bf16) wall {wall:.1f}s", flush=True)
    del base, fp8
    if not SMOKE:
        torch.cuda.empty_cache()


def write(path, rows):
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    if not SMOKE:
        torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference stays float32
    env = environment(DEVICE)
    copy_gbps = measure_copy_gbps(DEVICE) if not SMOKE else 1.0
    times: list[dict] = []
    checks: list[dict] = []
    try:
        time_case(times, FIRST, list(VARIANTS), copy_gbps, env)
        fp8_rows = [r for r in times if r["variant"] not in ("bf16", "committed",
                                                             "committed_again")]
        ranked = [r["variant"] for r in sorted(fp8_rows, key=lambda r: r["time_us"])]
        best = [next(n for n in ranked if n.startswith(f)) for f in FAMILIES
                if any(n.startswith(f) for n in ranked)]  # each family's fastest
        best += [n for n in ranked if n not in best][:max(0, TOP - len(best))]
        print("fastest:", best, flush=True)
        run_checks(checks, ["committed"] + best, FIRST[2], (E4M3,))
        run_checks(checks, ["committed", best[0]], FIRST[2], (E5M2,))
        write(os.path.join(out_dir, "cc_times.csv"), times)
        for case in CASES:
            time_case(times, case, ["committed"] + best, copy_gbps, env)
            write(os.path.join(out_dir, "cc_times.csv"), times)
        for block in sorted({c[2] for c in CASES} - {FIRST[2]}):
            run_checks(checks, ["committed"] + best, block, (E4M3,))
    finally:
        write(os.path.join(out_dir, "cc_times.csv"), times)
        write(os.path.join(out_dir, "cc_checks.csv"), checks)
    worst = {}
    for r in checks:
        key = (r["variant"], r["cache"])
        worst[key] = max(worst.get(key, 0.0), r["err"] if r["finite"] else float("inf"))
    print(f"copy {copy_gbps:.0f} GB/s; worst check error per variant:")
    for (name, cache), err in sorted(worst.items()):
        print(f"  {name:16s} {cache:14s} {err:.2e}")
    print(f"{'case':>14s} {'variant':>16s} {'us':>7s} {'/bf16':>6s} {'copy':>5s} {'spl':>4s} "
          f"{'regs':>4s} {'err':>8s}")
    for r in times:
        case = f"{r['batch']}x{r['context']} b{r['block']}"
        err = f"{r['err_vs_f32']:.1e}" if r["err_vs_f32"] is not None else ""
        print(f"{case:>14s} {r['variant']:>16s} {r['time_us']:7.1f} {r['over_bf16']:6.3f} "
              f"{r['copy_fraction']:5.2f} {r['splits']:4d} {str(r['n_regs']):>4s} {err:>8s}")


if __name__ == "__main__":
    main()
