"""H200: launch variants of the Triton paged prefill against SDPA, one run, CUDA graphs.

    PYTHONPATH=. python3 scripts/h200_prefill_variants.py --out $OUT [--variants NAME,...]
        [--before FILE]
    PYTHONPATH=. python3 scripts/h200_prefill_variants.py --device cpu   # a dry run, tiny sizes

A variant is named by its launch (``triton_prefill.PrefillLaunch``'s fields):
``[ahead-](one|split)-ROWSxTILE[wWARPS]sSTAGES[-rMAXNREG]``, e.g. ``ahead-one-64x32s3-r168``
(one walk over the keys, block ids a tile ahead, 64 rows, 32-key tiles, 4 warps, 3 stages, 168
registers a thread); ``default`` is the launch ``prefill_launch`` picks. ``--before FILE``
adds the default launch of another copy of ``triton_prefill.py`` (e.g. ``git show
b4d809a:pagebench/kernels/triton_prefill.py > before.py``) as the variant ``before``.

Each variant is checked against float64 on ragged, NaN-poisoned inputs (whole prompts, chunks,
an empty query) and against float32 at every timed point, then timed at the prefill sweep's
points (Llama-3-8B shape, bf16, block 16) beside causal SDPA on a contiguous cache, and the
default once more at the end of each point (the spread between two timings of one kernel).
Writes kernels_prefill_tuning_variants.csv and kernels_prefill_tuning_variants_checks.csv; prints
time / SDPA per point.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import re

import pandas as pd
import torch

from pagebench.defaults import BLOCK_SIZE, SHAPES
from pagebench.kernels import triton_prefill
from pagebench.kernels.fixtures import make_paged_inputs, prefill_case, relative_error
from pagebench.kernels.prefill_sweep import FULL_PREFILL_POINTS, causal_flops, sdpa_causal
from pagebench.kernels.reference import reference_prefill, torch_paged_prefill
from pagebench.timing import measure

SHAPE = SHAPES["llama-3-8b"]
NAME = re.compile(r"(ahead-)?(one|split)-(\d+)x(\d+)(?:w(\d+))?s(\d+)(?:-r(\d+))?$")
RAGGED = [([1, 15, 16, 17, 300, 1000, 513, 64], [1, 15, 3, 17, 300, 0, 100, 64]),
          ([2048, 77, 129], [2048, 77, 1])]
SMOKE_RAGGED, SMOKE_POINTS = [([1, 17, 40], [1, 0, 40])], [(2, 16, 0), (1, 8, 20)]


def launch_options(name: str) -> dict:
    """``triton_paged_prefill`` keyword arguments of a variant name ({} for ``default``)."""
    if name == "default":
        return {}
    m = NAME.match(name)
    if m is None:
        raise ValueError(f"--variants: cannot read {name!r} (see the module docstring)")
    ahead, walk, rows, tile, warps, stages, maxnreg = m.groups()
    return dict(rows=int(rows), tile_n=int(tile), num_warps=int(warps or 4),
                num_stages=int(stages), one_loop=walk == "one", table_ahead=bool(ahead),
                maxnreg=int(maxnreg) if maxnreg else None)


def variants(names: list[str], before: str | None) -> dict:
    out = {name: (triton_prefill.triton_paged_prefill, launch_options(name)) for name in names}
    if before:
        spec = importlib.util.spec_from_file_location("prefill_before", before)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out = {"before": (module.triton_paged_prefill, {}), **out}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--variants", default="default,split-64x64s2,ahead-one-64x64s3,"
                        "one-64x32s2-r128,ahead-one-64x32s3-r168,split-128x64s3,"
                        "split-128x64w8s2-r128")
    parser.add_argument("--before", help="another triton_prefill.py, timed as 'before'")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    dev, on_cuda = args.device, args.device == "cuda"
    chosen = variants(args.variants.split(","), args.before)
    scale = SHAPE[2] ** -0.5
    gen = torch.Generator().manual_seed(7)
    checks, rows = [], []
    for lens, qlens in RAGGED if on_cuda else SMOKE_RAGGED:
        inp = make_paged_inputs(lens, *SHAPE, BLOCK_SIZE, torch.bfloat16, dev, seed=5)
        q = torch.randn(sum(qlens), SHAPE[0], SHAPE[2], generator=gen).to(dev, torch.bfloat16)
        call = (q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens,
                torch.tensor(qlens, dtype=torch.int32, device=dev))
        ref = reference_prefill(*call, scale)
        for name, (fn, options) in chosen.items():
            checks.append(dict(variant=name, case=f"ragged{len(lens)}",
                               err=relative_error(fn(*call, scale, **options), ref)))
    timing = dict(device=dev, warmup=2 if on_cuda else 0, repeat=20 if on_cuda else 1,
                  cuda_graph=on_cuda)
    for point in FULL_PREFILL_POINTS if on_cuda else SMOKE_POINTS:
        sdpa_us = measure(sdpa_causal(*point, SHAPE, torch.bfloat16, dev, seed=3),
                          **timing).median_us
        call = prefill_case(*point, SHAPE, BLOCK_SIZE, torch.bfloat16, dev, seed=3).args()
        ref = torch_paged_prefill(*[t.float() if t.is_floating_point() else t for t in call],
                                  scale)
        timed = [*chosen.items(), ("default-again", chosen.get("default", (None, None)))]
        for name, (fn, options) in timed:
            if fn is None:
                continue
            err = relative_error(fn(*call, scale, **options), ref)
            t = measure(functools.partial(fn, *call, scale, **options), **timing)
            rows.append(dict(variant=name, batch=point[0], query_len=point[1], cached=point[2],
                             time_us=t.median_us, q20_us=t.q20_us, q80_us=t.q80_us,
                             sdpa_us=sdpa_us, ratio=t.median_us / sdpa_us, err=err,
                             tflops=causal_flops(*point, SHAPE[0], SHAPE[2]) / t.median_us / 1e6))
        del call, ref
        if on_cuda:
            torch.cuda.empty_cache()
    times, errors = pd.DataFrame(rows), pd.DataFrame(checks)
    stem = os.path.join(args.out, "kernels_prefill_tuning_variants")
    times.to_csv(stem + ".csv", index=False)
    errors.to_csv(stem + "_checks.csv", index=False)
    worst = pd.concat([times, errors]).groupby("variant")["err"].max()
    table = times.pivot_table(index="variant", columns=["batch", "query_len", "cached"],
                              values="ratio", sort=False)
    table["worst err"] = worst
    print(table.round(3).to_string())


if __name__ == "__main__":
    main()
