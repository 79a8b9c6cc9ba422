"""H200: fp8 KV caches against bf16 (decode, prefill, accuracy, engine) and the block-table
layout as an axis (contiguous, shuffled, aged), the Triton kernels timed through CUDA graphs.

    PYTHONPATH=. python3 scripts/h200_fp8.py   # writes $OUT/kernels_fp8.csv,
                                                 # kernels_layout.csv, fp8_engine.csv
    PYTHONPATH=. python3 scripts/h200_fp8.py --smoke   # tiny sizes on the CPU: a dry run

Decode at the Llama-3-8B shape (32/8 heads x 128), blocks 1/16/128, batch 32/64/128 x 4096
and 1 x 65536: bf16 vs e4m3 (and e5m2 at block 16), each with its bytes read, GB/s and the
fraction of the measured copy bandwidth (fp8 counted in fp8 bytes); the fp8 output's relative
error against the bf16 cache's output and, as a correctness check, against the torch backend
in float32 on the dequantised cache. Prefill: whole prompts and a chunk after a cached prefix.
K/V are standard normal (no outlier channels), scales the per-head max / 448.
Layouts: Triton bf16 decode at 1 x 65536, 64 x 4096, 256 x 4096, blocks 1/16/128, each point
with its unique K/V footprint and whether it fits in L2. Engine: the random-weight
Qwen2.5-0.5B, bf16 vs fp8_e4m3 cache at equal memory: blocks, greedy agreement, logit error.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import pandas as pd
import torch

from pagebench.defaults import SHAPES, SHORT_BLOCK_SIZES
from pagebench.kernels import triton_decode, triton_prefill
from pagebench.kernels.fixtures import (TABLE_LAYOUTS, adjacent_fraction, layout_tables,
                                        relative_error)
from pagebench.kernels.quant import calibrated_scales, quantize
from pagebench.kernels.reference import torch_paged_decode, torch_paged_prefill
from pagebench.kernels.sweep import footprint_bytes, kv_bytes, l2_bytes, measure_copy_gbps
from pagebench.timing import environment, measure

SHAPE = SHAPES["llama-3-8b"]
DECODE_POINTS = [(32, 4096), (64, 4096), (128, 4096), (1, 65536)]
BLOCKS = SHORT_BLOCK_SIZES
PREFILL_POINTS = [(1, 2048, 0), (1, 8192, 0), (8, 512, 3584)]  # batch, query_len, cached
LAYOUT_POINTS = [(1, 65536), (64, 4096), (256, 4096)]
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
OUT = os.environ.get("OUT", ".")
START = time.perf_counter()
ENGINE_AFTER_S = 150  # the engine comparison runs only if the kernels took less (device budget)
DEVICE = "cuda"
if "--smoke" in sys.argv:  # the same code at CPU sizes, Triton interpreted
    DEVICE, SHAPE, BLOCKS = "cpu", (4, 2, 16), (1, 16)
    DECODE_POINTS, PREFILL_POINTS, LAYOUT_POINTS = [(2, 64)], [(1, 32, 16)], [(2, 64)]


def timed(fn) -> float:
    fn()  # compiles outside the graph capture
    return measure(fn, device=DEVICE, warmup=3 if DEVICE == "cuda" else 0,
                   repeat=20 if DEVICE == "cuda" else 1, cuda_graph=DEVICE == "cuda").median_us


def empty_cache() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def fp8_cache(k, v, dtype):
    """Quantised copies of bf16 caches, with scales = each head's max / the format's max."""
    flat_k, flat_v = k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])
    ks, vs = calibrated_scales(flat_k, dtype, 1.0), calibrated_scales(flat_v, dtype, 1.0)
    return quantize(k, ks, dtype), quantize(v, vs, dtype), ks, vs


def decode_rows(env, copy_gbps):
    rows = []
    num_q, num_kv, head_dim = SHAPE
    scale = head_dim ** -0.5
    for batch, context in DECODE_POINTS:
        for block in BLOCKS:
            tables, num_blocks = layout_tables("shuffled", batch, context, block, seed=batch)
            tables = tables.to(DEVICE)
            lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
            gen = torch.Generator(device=DEVICE).manual_seed(batch)
            shape = (num_blocks, block, num_kv, head_dim)
            k = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, generator=gen)
            v = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, generator=gen)
            q = torch.randn(batch, num_q, head_dim, device=DEVICE, dtype=torch.bfloat16,
                            generator=gen)
            base = triton_decode.triton_paged_decode(q, k, v, tables, lens, scale)
            dtypes = [torch.bfloat16, E4M3] + ([E5M2] if block == 16 else [])
            for dtype in dtypes:
                if dtype == torch.bfloat16:
                    args, scales = (q, k, v, tables, lens), {}
                else:
                    kq, vq, ks, vs = fp8_cache(k, v, dtype)
                    args, scales = (q, kq, vq, tables, lens), dict(k_scale=ks, v_scale=vs)
                fn = functools.partial(triton_decode.triton_paged_decode, *args, scale, **scales)
                out = fn()
                row = dict(op="decode", cache_dtype=str(dtype).replace("torch.", ""),
                           batch=batch, context=context, block_size=block, launch="default")
                if scales:
                    ref = torch_paged_decode(q.float(), *args[1:], scale,
                                             scales["k_scale"], scales["v_scale"])
                    row["err_vs_dequantised"] = relative_error(out, ref)
                    row["err_vs_bf16_cache"] = relative_error(out, base)
                    del ref
                nbytes = kv_bytes(batch, context, num_kv, head_dim, dtype)
                launches = {"default": fn}
                if dtype == E4M3 and block == 16:  # fp8 tiles hold half the bytes: a larger one
                    launches["tile128x8"] = lambda: triton_decode.triton_paged_decode(
                        *args, scale, **scales, tile_n=128, num_warps=8)
                for launch, run in launches.items():
                    t = timed(run)
                    rows.append({**env, **row, "launch": launch, "time_us": t,
                                 "kv_bytes": nbytes, "gbps": nbytes / t / 1e3,
                                 "copy_gbps": copy_gbps,
                                 "copy_fraction": nbytes / t / 1e3 / copy_gbps})
                    print(f"decode {row['cache_dtype']:>13} {batch:>3} x {context:<6} block "
                          f"{block:<3} {launch:>9} {t:8.1f} us  "
                          f"{rows[-1]['copy_fraction']:.2f} of copy"
                          + (f"  err vs bf16 {row['err_vs_bf16_cache']:.1e}"
                             f" vs dequantised {row['err_vs_dequantised']:.1e}" if scales else ""),
                          flush=True)
                args = None  # frees the fp8 copies before the next dtype's
            del k, v, q, base
            empty_cache()
    return rows


def prefill_rows(env):
    rows = []
    num_q, num_kv, head_dim = SHAPE
    scale, block = head_dim ** -0.5, 16
    for batch, qlen, cached in PREFILL_POINTS:
        context = qlen + cached
        tables, num_blocks = layout_tables("shuffled", batch, context, block, seed=qlen)
        tables = tables.to(DEVICE)
        lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
        qlens = torch.full((batch,), qlen, dtype=torch.int32, device=DEVICE)
        gen = torch.Generator(device=DEVICE).manual_seed(qlen)
        shape = (num_blocks, block, num_kv, head_dim)
        k = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        v = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        q = torch.randn(batch * qlen, num_q, head_dim, device=DEVICE, dtype=torch.bfloat16,
                        generator=gen)
        base = triton_prefill.triton_paged_prefill(q, k, v, tables, lens, qlens, scale)
        for dtype in (torch.bfloat16, E4M3):
            if dtype == torch.bfloat16:
                args, scales = (q, k, v, tables, lens, qlens), {}
            else:
                kq, vq, ks, vs = fp8_cache(k, v, dtype)
                args, scales = (q, kq, vq, tables, lens, qlens), dict(k_scale=ks, v_scale=vs)
            fn = functools.partial(triton_prefill.triton_paged_prefill, *args, scale, **scales)
            out = fn()
            row = dict(op="prefill", cache_dtype=str(dtype).replace("torch.", ""),
                       batch=batch, query_len=qlen, cached=cached, context=context,
                       block_size=block)
            if scales:
                ref = torch_paged_prefill(q.float(), *args[1:], scale, scales["k_scale"],
                                          scales["v_scale"])
                row["err_vs_dequantised"] = relative_error(out, ref)
                row["err_vs_bf16_cache"] = relative_error(out, base)
            t = timed(fn)
            rows.append({**env, **row, "time_us": t})
            print(f"prefill {row['cache_dtype']:>13} {batch} x {qlen} after {cached}: {t:8.1f} us"
                  + (f"  err vs bf16 {row['err_vs_bf16_cache']:.1e}" if scales else ""),
                  flush=True)
        del k, v, q, base
        empty_cache()
    return rows


def layout_rows(env, aged):
    rows = []
    num_q, num_kv, head_dim = SHAPE
    scale, l2 = head_dim ** -0.5, l2_bytes(DEVICE)
    for batch, context in LAYOUT_POINTS:
        for block in BLOCKS:
            aged_tables, pool = aged[(batch, context, block)].result()
            gen = torch.Generator(device=DEVICE).manual_seed(batch)
            shape = (pool, block, num_kv, head_dim)  # the aged pool is the largest
            k = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, generator=gen)
            v = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, generator=gen)
            q = torch.randn(batch, num_q, head_dim, device=DEVICE, dtype=torch.bfloat16,
                            generator=gen)
            lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
            for layout in TABLE_LAYOUTS:
                tables = aged_tables if layout == "aged" else \
                    layout_tables(layout, batch, context, block, seed=batch)[0]
                tables = tables.to(DEVICE)
                t = timed(lambda: triton_decode.triton_paged_decode(q, k, v, tables, lens,
                                                                    scale))
                foot = footprint_bytes(tables, block, num_kv, head_dim, torch.bfloat16)
                rows.append({**env, "backend": "triton-paged", "cache_dtype": "bfloat16",
                             "batch": batch, "context": context, "block_size": block,
                             "table_layout": layout, "adjacent_fraction": adjacent_fraction(
                                 tables), "time_us": t, "footprint_bytes": foot,
                             "l2_bytes": l2, "fits_l2": foot <= l2,
                             "gbps": foot / t / 1e3})
                print(f"layout {layout:>10} {batch:>3} x {context:<6} block {block:<3} "
                      f"{t:8.1f} us adjacent {rows[-1]['adjacent_fraction']:.2f}", flush=True)
            k = v = q = None  # frees this point's caches before the next point's
            empty_cache()
    return rows


def engine_rows(env):
    from pagebench.engine import LLMEngine, SamplingParams
    from pagebench.engine.bench import preset_model, random_prompts

    if DEVICE != "cuda" or time.perf_counter() - START > ENGINE_AFTER_S:
        print("engine comparison skipped (CPU, or past the time budget)", flush=True)
        return []
    model = preset_model("qwen2.5-0.5b", dtype=torch.bfloat16, device=DEVICE)
    prompts = random_prompts(32, 16, 512, model.config.vocab_size, seed=11)
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    results = {}
    for kv_dtype in ("auto", "fp8_e4m3"):
        # eager both: this compares cache dtypes, not graph capture (tests/test_decode_graphs.py
        # checks fp8 replay equals eager steps), and capturing costs device time
        engine = LLMEngine(model, kv_cache_memory="4GiB", kv_cache_dtype=kv_dtype,
                           enforce_eager=True)
        logits = []
        execute = engine.runner.execute

        def recording(seqs, blocks, execute=execute, logits=logits):
            out, rows = execute(seqs, blocks)
            if len(logits) < 4:
                logits.append(out.clone())
            return out, rows

        engine.runner.execute = recording
        t0 = time.perf_counter()
        outs = engine.generate(prompts, params)
        results[kv_dtype] = dict(blocks=engine.num_blocks, seconds=time.perf_counter() - t0,
                                 tokens=[o.outputs[0].token_ids for o in outs], logits=logits)
        del engine
    base, fp8 = results["auto"], results["fp8_e4m3"]
    same = total = 0
    for a, b in zip(base["tokens"], fp8["tokens"]):
        total += len(a)
        for x, y in zip(a, b):
            if x != y:
                break
            same += 1
    logit_err = [relative_error(b, a) for a, b in zip(base["logits"], fp8["logits"])
                 if a.shape == b.shape]
    first_token = sum(a[0] == b[0] for a, b in zip(base["tokens"], fp8["tokens"])) / len(prompts)
    row = {**env, "model": "qwen2.5-0.5b (random weights)", "kv_cache_memory": "4GiB",
           "blocks_bf16": base["blocks"], "blocks_fp8": fp8["blocks"],
           "blocks_ratio": fp8["blocks"] / base["blocks"], "num_prompts": len(prompts),
           "max_tokens": 32, "greedy_agreement": same / total,
           "first_token_agreement": first_token,
           "logit_rel_err_first_steps": max(logit_err) if logit_err else float("nan"),
           "seconds_bf16": base["seconds"], "seconds_fp8": fp8["seconds"]}
    print("engine", {k: row[k] for k in ("blocks_ratio", "greedy_agreement",
                                         "first_token_agreement", "logit_rel_err_first_steps")},
          flush=True)
    return [row]


def main() -> None:
    # aged tables come from a block manager serving a trace: built on the host's cores
    # while the GPU times the fp8 kernels
    pool = ProcessPoolExecutor(max_workers=min(9, os.cpu_count() or 1),
                               mp_context=multiprocessing.get_context("fork"))  # before CUDA
    aged = {(b, c, bs): pool.submit(layout_tables, "aged", b, c, bs, seed=b)
            for b, c in LAYOUT_POINTS for bs in BLOCKS}
    env = environment(DEVICE)
    copy_gbps = measure_copy_gbps(DEVICE) if DEVICE == "cuda" else float("nan")
    print(f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    parts = [("kernels_fp8", lambda: decode_rows(env, copy_gbps) + prefill_rows(env)),
             ("kernels_layout", lambda: layout_rows(env, aged)),
             ("fp8_engine", lambda: engine_rows(env))]
    frames = {}
    for name, run in parts:
        try:
            rows = run()
        except Exception as e:  # noqa: BLE001 -- keep what the other parts measured
            import traceback
            traceback.print_exc()
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
            continue
        if not rows:
            continue
        frames[name] = pd.DataFrame(rows)
        frames[name].to_csv(os.path.join(OUT, f"{name}.csv"), index=False)
        print(f"{name}: {len(rows)} rows, {time.perf_counter() - START:.0f} s", flush=True)
    pool.shutdown(cancel_futures=True)
    summary(frames)


def summary(frames) -> None:
    """The short table: fp8 / bf16 per decode point, layout spread per point (as the report
    computes them)."""
    from pagebench.report.fp8 import decode_ratios, layout_spread

    pd.set_option("display.width", 200)
    ratios = decode_ratios(frames.get("kernels_fp8"))
    if ratios is not None:
        print(ratios.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    spread = layout_spread(frames.get("kernels_layout"))
    if spread is not None:
        print(spread.to_string(index=False, float_format=lambda x: f"{x:.3g}"))


if __name__ == "__main__":
    main()
