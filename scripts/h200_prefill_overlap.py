"""H200: prefill launch variants against SDPA in one process (CUDA graphs), each checked first.

    PYTHONPATH=. python3 scripts/h200_prefill_overlap.py --out $OUT
    PYTHONPATH=. python3 scripts/h200_prefill_overlap.py --device cpu   # tiny dry run

bf16 part: at each point the package's launch (``default``) and variants of it, each a set of
``triton_paged_prefill`` launch options written ``key=value`` joined by ``/``
(``ahead`` = ``scores_ahead=True`` on the point's default launch; ``rows`` is left to the
wrapper unless named). fp8 part (e4m3 caches, per
KV-head scales): the fp8 launch ``prefill_launch`` picks against the bf16 one (its fields passed
explicitly) at the same points. Every variant is checked against float64 on ragged NaN-poisoned
inputs (bf16 and e4m3) and against float32 at every timed point, then timed through a CUDA
graph (L2 flushed, median of ``--repeat``) beside causal SDPA on a contiguous cache, in
``--rounds`` rounds. Writes prefill_overlap.csv and prefill_overlap_checks.csv.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os

import pandas as pd
import torch

from pagebench.defaults import BLOCK_SIZE, SHAPES
from pagebench.kernels import triton_prefill
from pagebench.kernels.fixtures import (make_paged_inputs, prefill_case, quantized_inputs,
                                        relative_error)
from pagebench.kernels.prefill_sweep import causal_flops, sdpa_causal
from pagebench.kernels.reference import reference_prefill, torch_paged_prefill
from pagebench.timing import measure

SHAPE = SHAPES["llama-3-8b"]
RAGGED = [([1, 15, 16, 17, 300, 1000, 513, 64], [1, 15, 3, 17, 300, 0, 100, 64]),
          ([512] * 4 + [100, 37], [512, 512, 500, 1, 100, 37])]
BF16_POINTS = [(1, 512, 0), (1, 2048, 0), (1, 8192, 0), (8, 512, 0), (32, 128, 0), (1, 512, 3584)]
FP8_POINTS = [(1, 2048, 0), (1, 8192, 0), (8, 512, 0), (1, 512, 3584)]
# extra variants (beyond default and ahead) and the points they are timed at
EXTRA = {"ahead/num_stages=2": [(8, 512, 0), (32, 128, 0), (1, 512, 0)],
         "ahead/rows=64/tile_n=64/num_warps=4/num_stages=3/one_loop=True/table_ahead=True/maxnreg=None":
         [(1, 2048, 0), (1, 8192, 0)]}


def parse_value(text: str):
    if text in ("True", "False"):
        return text == "True"
    return None if text == "None" else int(text)


def options(name: str, launch: dict) -> dict:
    """Launch options of a variant name on top of the point's default ``launch``."""
    if name == "default":
        return dict(launch)
    opts = dict(launch)
    for part in name.split("/"):
        if part == "ahead":
            opts["scores_ahead"] = True
        elif part != "fp8-launch":
            key, _, value = part.partition("=")
            opts[key] = parse_value(value)
    return opts


def default_launch(case, fp8: bool) -> dict:
    """``prefill_launch``'s choice for this input, as keyword options of the wrapper."""
    q, block_tables = case.q, case.block_tables
    num_seqs, total = case.query_lens.shape[0], q.shape[0]
    group = q.shape[1] // case.k_cache.shape[2]
    tokens = max(16, 64) // group  # the wrapper sizes the grid for 64-row programs
    programs = (total // tokens + num_seqs) * case.k_cache.shape[2]
    launch = triton_prefill.prefill_launch(
        q.shape[2], q.dtype, q.device, mean_chunk=-(-total // num_seqs), programs=programs,
        max_keys=block_tables.shape[1] * case.k_cache.shape[1], fp8=fp8)
    return {k: v for k, v in dataclasses.asdict(launch).items() if k != "rows"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    dev = args.device
    on_cuda = dev == "cuda"
    scale = SHAPE[2] ** -0.5
    dtype = torch.bfloat16 if on_cuda else torch.float32
    e4m3 = torch.float8_e4m3fn
    gen = torch.Generator().manual_seed(7)
    checks, rows = [], []
    bf16_variants = ["default", "ahead", *EXTRA]
    fp8_variants = ["fp8-launch", "default", "ahead"]  # default/ahead: the bf16 launch

    def check(kind, name, case_name, out, ref):
        checks.append(dict(kind=kind, variant=name, case=case_name, err=relative_error(out, ref)))
        print(checks[-1], flush=True)

    ragged = RAGGED if on_cuda else [([1, 17, 40], [1, 0, 40])]
    for lens, qlens in ragged:
        inp = make_paged_inputs(lens, *SHAPE, BLOCK_SIZE, dtype, dev, seed=5)
        q = torch.randn(sum(qlens), SHAPE[0], SHAPE[2], generator=gen).to(dev, dtype)
        inp = dataclasses.replace(inp, q=q, query_lens=torch.tensor(qlens, dtype=torch.int32,
                                                                    device=dev))
        quant = quantized_inputs(inp, e4m3, seed=5) if on_cuda else None
        for kind, case in (("bf16", inp), ("e4m3", quant)):
            if case is None:
                continue
            ref = reference_prefill(*case.args(), scale, **case.scales())
            base = default_launch(case, fp8=False)
            for name in bf16_variants if kind == "bf16" else fp8_variants:
                launch = default_launch(case, fp8=True) if name == "fp8-launch" else base
                out = triton_prefill.triton_paged_prefill(*case.args(), scale, **case.scales(),
                                                          **options(name, launch))
                check(kind, name, f"ragged{len(lens)}", out, ref)

    timing = dict(device=dev, warmup=2 if on_cuda else 0, repeat=args.repeat if on_cuda else 1,
                  cuda_graph=on_cuda)
    cpu_points = [(2, 16, 0), (1, 8, 20)]
    plan = [("bf16", p) for p in (BF16_POINTS if on_cuda else cpu_points)]
    plan += [("e4m3", p) for p in (FP8_POINTS if on_cuda else cpu_points[:1])]
    for kind, point in plan:
        case = prefill_case(*point, SHAPE, BLOCK_SIZE, dtype, dev, seed=3)
        if kind == "e4m3":
            case = quantized_inputs(case, e4m3, spread=1.0)
        base = default_launch(case, fp8=False)
        if kind == "bf16":
            names = [n for n in bf16_variants if n not in EXTRA or point in EXTRA[n]
                     or not on_cuda]
        else:
            names = fp8_variants
        calls = {}
        for name in names:
            launch = default_launch(case, fp8=True) if name == "fp8-launch" else base
            calls[name] = functools.partial(triton_prefill.triton_paged_prefill, *case.args(),
                                            scale, **case.scales(), **options(name, launch))
        ref = torch_paged_prefill(*[t.float() if t.is_floating_point() and t.element_size() > 1
                                    else t for t in case.args()], scale, **case.scales())
        for name, fn in calls.items():
            check(kind, name, str(point), fn(), ref)
        del ref
        sdpa = sdpa_causal(*point, SHAPE, dtype, dev, seed=3)
        for rnd in range(args.rounds if on_cuda else 1):
            sdpa_us = measure(sdpa, **timing).median_us
            rows.append(dict(kind=kind, variant="sdpa", round=rnd, batch=point[0],
                             query_len=point[1], cached=point[2], time_us=sdpa_us,
                             sdpa_us=sdpa_us, ratio=1.0))
            for name, fn in calls.items():
                t = measure(fn, **timing)
                rows.append(dict(kind=kind, variant=name, round=rnd, batch=point[0],
                                 query_len=point[1], cached=point[2], time_us=t.median_us,
                                 q20_us=t.q20_us, q80_us=t.q80_us, sdpa_us=sdpa_us,
                                 ratio=t.median_us / sdpa_us,
                                 tflops=causal_flops(*point, SHAPE[0], SHAPE[2])
                                 / t.median_us / 1e6,
                                 launch=str(options(name, default_launch(case, True)
                                                    if name == "fp8-launch" else base))))
                print({k: rows[-1][k] for k in ("kind", "variant", "round", "batch", "query_len",
                                                "cached", "time_us", "ratio")}, flush=True)
        del case, calls
        if on_cuda:
            torch.cuda.empty_cache()
    times, errors = pd.DataFrame(rows), pd.DataFrame(checks)
    stem = os.path.join(args.out, "prefill_overlap")
    times.to_csv(stem + ".csv", index=False)
    errors.to_csv(stem + "_checks.csv", index=False)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 40)
    worst = errors.groupby(["kind", "variant"])["err"].max()
    for kind in ("bf16", "e4m3"):
        part = times[times.kind == kind]
        if part.empty:
            continue
        table = part.pivot_table(index="variant", columns=["batch", "query_len", "cached"],
                                 values="ratio", aggfunc="mean", sort=False)
        table["worst err"] = worst[kind].reindex(table.index) if kind in worst else None
        print(f"\n{kind}: mean time / SDPA over rounds (same process, CUDA graphs, L2 flushed)")
        print(table.round(3).to_string())
        print(part.pivot_table(index=["variant", "round"], columns=["batch", "query_len",
                                                                    "cached"],
                               values="time_us", sort=False).round(1).to_string())


if __name__ == "__main__":
    main()
