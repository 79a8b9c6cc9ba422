"""Decode before and after the ragged split-KV change, in one GPU process, on the same tensors.

OLD is a copy of the previous kernel modules (``triton_decode.py`` and ``cuda_fp8_decode.py``
from the commit named by ``OLD_COMMIT``) imported from ``OLD_DIR`` as ``old_triton_decode``
and ``old_cuda_fp8_decode``; NEW is this checkout's package. First a correctness pass
(NaN-poisoned caches against the float64 reference: ragged and uniform lengths, bf16 and fp8
e4m3 caches, blocks 1/16/128, int32 and int64 tables, a strided q, a CUDA-graph replay), then
CUDA-graph medians with L2 flushed (``pagebench.measure.timing.measure``, as the sweeps time): Llama-3-8B
and Qwen2.5-7B heads, bf16, block 16, uniform batches and ragged ones (lognormal and the
azure-conv trace, mean 2k tokens, up to 32k), FlashInfer beside them where it imports, and the
fp8 CUDA decode. Rows go to ``OUT/decode_ragged.csv`` as they are measured; a table is printed
last. Run: ``OLD_DIR=... OUT=... python3 scripts/gpu_decode_ragged.py`` (see the command in
docs/kernels.md, "Ragged batches").
"""

from __future__ import annotations

import csv
import importlib
import os
import sys
import time
from pathlib import Path

import torch

from pagebench.kernels import cuda_fp8_decode as new_cuda
from pagebench.kernels import triton_decode as new_triton
from pagebench.measure.kernel_cases import make_paged_inputs, quantized_inputs, relative_error
from pagebench.kernels.ragged import batch_lengths
from pagebench.kernels.reference import reference_decode
from pagebench.measure.timing import environment, measure

OUT = Path(os.environ.get("OUT", "/tmp/gpu_decode_ragged"))
OUT.mkdir(parents=True, exist_ok=True)
sys.path.insert(0, os.environ.get("OLD_DIR", "gpu_old"))
old_triton = importlib.import_module("old_triton_decode")
old_cuda = importlib.import_module("old_cuda_fp8_decode")
DEADLINE = time.monotonic() + float(os.environ.get("DEADLINE_S", "200"))
CUDA = torch.cuda.is_available()  # without: a dry run at CPU sizes, Triton interpreted
DEV = "cuda" if CUDA else "cpu"
SHAPES = ({"llama-3-8b": (32, 8, 128), "qwen2.5-7b": (28, 4, 128)} if CUDA
          else {"tiny": (4, 2, 32)})
E4M3 = torch.float8_e4m3fn
BF16 = torch.bfloat16 if CUDA else torch.float32
REPEAT = 30 if CUDA else 2
CHECK_LENGTHS = ([1, 16, 17, 300, 5000, 8192], [3000] * 4) if CUDA else ([1, 16, 17, 90],
                                                                         [40] * 2)
try:
    from pagebench.kernels import flashinfer as fi

    HAS_FI = fi.flashinfer_available()
except Exception as e:  # noqa: BLE001 -- reported, then measured without it
    print("flashinfer:", type(e).__name__, e)
    HAS_FI = False


# every row: the device, versions, commit (PAGEBENCH_COMMIT for a copy of the tree without .git)
# and the run's start, as every pagebench row carries them, and the old kernels' commit
ENV = {**environment(DEV), "old_commit": os.environ.get("OLD_COMMIT", "")}
ROWS: list[dict] = []


def add(row: dict) -> None:
    ROWS.append({**ENV, **row})
    columns = list(dict.fromkeys(k for r in ROWS for k in r))
    with (OUT / "decode_ragged.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(ROWS)


def calls(inp, scale, fp8: bool, fi_ok: bool) -> dict:
    """name -> no-argument call on ``inp``."""
    args = inp.args()
    sc = inp.scales() if fp8 else {}
    ks, vs = (inp.k_scale, inp.v_scale) if fp8 else (None, None)
    out = {"old-triton": lambda: old_triton.triton_paged_decode(*args, scale, ks, vs),
           "new-triton": lambda: new_triton.triton_paged_decode(*args, scale, **sc)}
    if fp8 and CUDA:
        out["old-cuda-fp8"] = lambda: old_cuda.cuda_fp8_paged_decode(*args, scale, ks, vs)
        out["new-cuda-fp8"] = lambda: new_cuda.cuda_fp8_paged_decode(*args, scale, ks, vs)
    if fi_ok and HAS_FI and not fp8:
        group = inp.q.shape[1] // inp.k_cache.shape[2]
        for name, tc in (("flashinfer", False), ("flashinfer-tc", True)):
            if tc or group in fi.CUDA_CORE_GROUPS:
                try:
                    out[name] = fi.prepare_decode(*args, scale, tensor_cores=tc)
                except Exception as e:  # noqa: BLE001 -- a row says why
                    print(f"{name}: {type(e).__name__}: {e}")
    return out


def correctness() -> None:
    """NaN-poisoned inputs against the float64 reference; a graph replay against eager."""
    failures = 0
    first = next(iter(SHAPES))
    for shape_name, shape in SHAPES.items():
        for block in (1, 16, 128):
            for cache in (BF16, E4M3):
                for lengths in CHECK_LENGTHS:
                    if block != 16 and (len(set(lengths)) == 1 or shape_name != first):
                        continue  # blocks 1 and 128 on the first shape's ragged batch
                    index = torch.int64 if block == 1 else torch.int32
                    inp = make_paged_inputs(lengths, *shape, block, BF16, DEV, seed=block)
                    if cache == E4M3:
                        inp = quantized_inputs(inp, E4M3, seed=block)
                    wide = torch.randn(len(lengths), shape[0], 2 * shape[2], device=DEV,
                                       dtype=BF16)
                    q = wide[:, :, :shape[2]]  # a strided view: rows of 2 x head_dim
                    q.copy_(inp.q)
                    args = (q, inp.k_cache, inp.v_cache, inp.block_tables.to(index),
                            inp.seq_lens.to(index))
                    sc = inp.scales() if cache == E4M3 else {}
                    scale = shape[2] ** -0.5
                    ref = reference_decode(*args, scale, **sc)
                    outs = {"new-triton": new_triton.triton_paged_decode(*args, scale, **sc),
                            "old-triton": old_triton.triton_paged_decode(*args, scale, **sc)}
                    if cache == E4M3 and CUDA:
                        outs["new-cuda-fp8"] = new_cuda.cuda_fp8_paged_decode(
                            *args, scale, inp.k_scale, inp.v_scale)
                    if CUDA:
                        graph = torch.cuda.CUDAGraph()
                        new_triton.triton_paged_decode(*args, scale, **sc)
                        with torch.cuda.graph(graph):
                            replayed = new_triton.triton_paged_decode(*args, scale, **sc)
                        graph.replay()
                        torch.cuda.synchronize()
                        outs["new-triton-graph"] = replayed
                    for name, out in outs.items():
                        err = relative_error(out, ref)
                        ok = bool(torch.isfinite(out).all()) and err < 2e-2
                        failures += not ok
                        add(dict(kind="check", model_shape=shape_name, block_size=block,
                                 kv_dtype=str(cache).split(".")[-1], lengths=str(lengths),
                                 index=str(index).split(".")[-1], backend=name,
                                 rel_error=err, ok=ok))
    print(f"correctness: {failures} failures in {len(ROWS)} checks")


def timing_point(shape_name, batch, context, spec, fp8=False, fi_ok=True) -> None:
    shape = SHAPES[shape_name]
    lens = batch_lengths(spec, batch, context, seed=batch, max_len=16 * context)
    inp = make_paged_inputs(lens, *shape, 16, BF16, DEV, seed=batch, extra_blocks=0,
                            extra_table_cols=0, poison=False)
    if fp8:
        inp = quantized_inputs(inp, E4M3, seed=batch, spread=1.0)
    scale = shape[2] ** -0.5
    plan = new_triton.decode_plan(*inp.args(), scale)  # the new default's grid and splits
    new_plan = dict(new_grid="ragged" if plan.split.kwargs["ADAPTIVE"] else "uniform",
                    new_splits=plan.num_splits, new_max_splits=plan.max_splits)
    ref = None
    for name, fn in calls(inp, scale, fp8, fi_ok).items():
        if time.monotonic() > DEADLINE:
            return
        try:
            out = fn()
            if ref is None:
                ref = out.float()
            err = relative_error(out, ref)
            t = measure(fn, device=DEV, warmup=2, repeat=REPEAT, cuda_graph=CUDA)
            add(dict(kind="time", model_shape=shape_name, batch=batch, context=context,
                     lengths=spec, max_len=max(lens), tokens=sum(lens), block_size=16,
                     kv_dtype="float8_e4m3fn" if fp8 else "bfloat16", backend=name,
                     time_us=t.median_us, q20_us=t.q20_us, q80_us=t.q80_us,
                     err_vs_first=err, **(new_plan if name == "new-triton" else {})))
        except Exception as e:  # noqa: BLE001 -- a row says why
            add(dict(kind="time", model_shape=shape_name, batch=batch, context=context,
                     lengths=spec, backend=name, error=f"{type(e).__name__}: {e}"[:200]))


def table() -> None:
    times: dict = {}
    for r in ROWS:
        if r.get("kind") == "time" and r.get("time_us"):
            key = (r["model_shape"], r["kv_dtype"], r["batch"], r["context"], r["lengths"])
            times.setdefault(key, {})[r["backend"]] = r["time_us"]
    grids = {(r["model_shape"], r["kv_dtype"], r["batch"], r["context"], r["lengths"]):
             r["new_grid"] for r in ROWS if r.get("new_grid")}
    print(f"{'shape':11} {'kv':5} {'batch':>5} {'ctx':>6} {'lengths':18} {'old':>9} {'new':>9} "
          f"{'new/old':>7} {'fi best':>9} {'new/fi':>6}")
    for (shape, kv, batch, ctx, spec), t in times.items():
        for k in (["triton", "cuda-fp8"] if kv.startswith("float8") else ["triton"]):
            old, new = t.get(f"old-{k}"), t.get(f"new-{k}")
            fi_best = min([t[n] for n in ("flashinfer", "flashinfer-tc") if n in t], default=None)
            print(f"{shape:11} {kv[:5]:5} {batch:>5} {ctx:>6} {spec[:18]:18} "
                  f"{old or float('nan'):9.1f} {new or float('nan'):9.1f} "
                  f"{(new / old) if old and new else float('nan'):7.3f} "
                  f"{fi_best or float('nan'):9.1f} "
                  f"{(new / fi_best) if fi_best and new else float('nan'):6.3f}  {k}"
                  f" {grids.get((shape, kv, batch, ctx, spec), '') if k == 'triton' else ''}")


def main() -> None:
    print(ENV, "flashinfer:", HAS_FI)
    t0 = time.monotonic()
    # PARTS: which timing parts run (default all); CHECKS=0 skips the correctness pass
    parts = set(os.environ.get("PARTS", "ragged,uniform,fp8").split(","))
    shapes = [s for s in SHAPES if s in os.environ.get("SHAPES", ",".join(SHAPES)).split(",")]
    if os.environ.get("CHECKS", "1") != "0":
        correctness()
        print(f"correctness took {time.monotonic() - t0:.0f} s")
    ragged = [(s, b, 2048 if CUDA else 32, spec)
              for spec in ("lognormal:0,0.8", "trace:azure-conv") for s in shapes
              for b in ((8, 32, 128) if CUDA else (4,))] if "ragged" in parts else []
    uniform = [(s, b, c, "uniform") for s in shapes for b in ((1, 8, 64) if CUDA else (2,))
               for c in ((1024, 8192, 32768) if CUDA else (64,))] if "uniform" in parts else []
    for point in ragged:
        timing_point(*point)
    for point in uniform:
        timing_point(*point, fi_ok=point[1] >= 8)
    for s in (shapes if "fp8" in parts else []):
        for b in ((1, 32) if CUDA else (2,)):
            timing_point(s, b, 4096 if CUDA else 64, "uniform", fp8=True)
    print(f"all took {time.monotonic() - t0:.0f} s")
    table()


if __name__ == "__main__":
    main()
