"""H200: structural variants of the Triton paged prefill against SDPA, one process, CUDA graphs.

    PYTHONPATH=.:scripts python3 scripts/h200_prefill_probe.py --out $OUT [--variants A,B]
    PYTHONPATH=.:scripts python3 scripts/h200_prefill_probe.py --device cpu   # tiny dry run

Variants: ``default`` (the package's kernel and launch); ``pkg:OPTS`` (the package's kernel
with launch options); ``probe:OPTS`` (``prefill_probe_kernel.probe_prefill``: tiles paired,
both walks merged into one loop, diagnostics). ``OPTS`` is ``key=value`` joined by ``/``, e.g.
``probe:merge=1/num_stages=2/maxnreg=168``. A variant with ``diag`` is timed only, not checked
(its result is wrong by design). Every other variant is checked against float64 on ragged
NaN-poisoned inputs and against float32 at every timed point, then timed through a CUDA graph
(L2 flushed, median of ``--repeat``) beside causal SDPA on a contiguous cache, in ``--rounds``
rounds (the spread between rounds is the noise). Writes prefill_probe.csv and
prefill_probe_checks.csv; prints time / SDPA per point and variant.
"""

from __future__ import annotations

import argparse
import functools
import os

import pandas as pd
import torch
from prefill_probe_kernel import COMPILED, probe_prefill, resources

from pagebench.defaults import BLOCK_SIZE, SHAPES
from pagebench.kernels import triton_prefill
from pagebench.kernels.fixtures import make_paged_inputs, prefill_case, relative_error
from pagebench.kernels.prefill_sweep import causal_flops, sdpa_causal
from pagebench.kernels.reference import reference_prefill, torch_paged_prefill
from pagebench.timing import measure

SHAPE = SHAPES["llama-3-8b"]
RAGGED = [([1, 15, 16, 17, 300, 1000, 513, 64], [1, 15, 3, 17, 300, 0, 100, 64]),
          ([512] * 4 + [100, 37], [512, 512, 500, 1, 100, 37])]
POINTS = "1x512+0,1x2048+0,1x8192+0,8x512+0,32x128+0,1x512+3584"


def parse_value(text: str):
    if text in ("True", "False"):
        return text == "True"
    return None if text == "None" else int(text)


def variant(name: str):
    """(function, keyword options) of a variant name."""
    if name == "default":
        return triton_prefill.triton_paged_prefill, {}
    kind, _, opts = name.partition(":")
    options = {k: parse_value(v) for k, v in (o.split("=") for o in opts.split("/") if o)}
    if kind == "pkg":
        return triton_prefill.triton_paged_prefill, options
    if kind == "probe":
        return probe_prefill, options
    raise ValueError(f"--variants: cannot read {name!r}")


def parse_points(text: str):
    out = []
    for p in text.split(","):
        bq, _, cached = p.partition("+")
        b, q = bq.split("x")
        out.append((int(b), int(q), int(cached or 0)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--variants", default="default")
    parser.add_argument("--points", default=POINTS, help="BxQ+CACHED,...")
    parser.add_argument("--only", default="", help="VARIANT@POINTS;...: time VARIANT only there")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    dev, on_cuda = args.device, args.device == "cuda"
    names = args.variants.split(",")
    chosen = {name: variant(name) for name in names}
    only = {}
    for item in filter(None, args.only.split(";")):
        name, _, pts = item.partition("@")
        only[name] = set(parse_points(pts))
    scale = SHAPE[2] ** -0.5
    gen = torch.Generator().manual_seed(7)
    checks, rows = [], []
    dtype = torch.bfloat16 if on_cuda else torch.float32
    for lens, qlens in RAGGED if on_cuda else [([1, 17, 40], [1, 0, 40])]:
        inp = make_paged_inputs(lens, *SHAPE, BLOCK_SIZE, dtype, dev, seed=5)
        q = torch.randn(sum(qlens), SHAPE[0], SHAPE[2], generator=gen).to(dev, dtype)
        call = (q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens,
                torch.tensor(qlens, dtype=torch.int32, device=dev))
        ref = reference_prefill(*call, scale)
        for name, (fn, options) in chosen.items():
            if "diag" in options:
                continue
            checks.append(dict(variant=name, case=f"ragged{len(lens)}",
                               err=relative_error(fn(*call, scale, **options), ref)))
            print(checks[-1], flush=True)
    points = parse_points(args.points) if on_cuda else [(2, 16, 0), (1, 8, 20)]
    timing = dict(device=dev, warmup=2 if on_cuda else 0, repeat=args.repeat if on_cuda else 1,
                  cuda_graph=on_cuda)
    for point in points:
        sdpa = sdpa_causal(*point, SHAPE, dtype, dev, seed=3)
        call = prefill_case(*point, SHAPE, BLOCK_SIZE, dtype, dev, seed=3).args()
        ref = torch_paged_prefill(*[t.float() if t.is_floating_point() else t for t in call],
                                  scale)
        here = {n: v for n, v in chosen.items() if n not in only or point in only[n]}
        for name, (fn, options) in here.items():
            if "diag" not in options:
                err = relative_error(fn(*call, scale, **options), ref)
                checks.append(dict(variant=name, case=f"{point}", err=err))
        for rnd in range(args.rounds if on_cuda else 1):
            sdpa_us = measure(sdpa, **timing).median_us
            rows.append(dict(variant="sdpa", round=rnd, batch=point[0], query_len=point[1],
                             cached=point[2], time_us=sdpa_us, sdpa_us=sdpa_us, ratio=1.0))
            for name, (fn, options) in here.items():
                t = measure(functools.partial(fn, *call, scale, **options), **timing)
                rows.append(dict(variant=name, round=rnd, batch=point[0], query_len=point[1],
                                 cached=point[2], time_us=t.median_us, q20_us=t.q20_us,
                                 q80_us=t.q80_us, sdpa_us=sdpa_us,
                                 ratio=t.median_us / sdpa_us,
                                 tflops=causal_flops(*point, SHAPE[0], SHAPE[2])
                                 / t.median_us / 1e6))
                print(rows[-1], flush=True)
        del call, ref
        if on_cuda:
            torch.cuda.empty_cache()
    times, errors = pd.DataFrame(rows), pd.DataFrame(checks)
    stem = os.path.join(args.out, "prefill_probe")
    if COMPILED:
        res = pd.DataFrame([dict(launch=str(k), **resources(c)) for k, c in COMPILED.items()])
        res.to_csv(stem + "_resources.csv", index=False)
        print(res.to_string())
    times.to_csv(stem + ".csv", index=False)
    errors.to_csv(stem + "_checks.csv", index=False)
    table = times.pivot_table(index="variant", columns=["batch", "query_len", "cached"],
                              values="ratio", aggfunc="mean", sort=False)
    table["worst err"] = errors.groupby("variant")["err"].max() if len(errors) else None
    pd.set_option("display.width", 250)
    print("\nmean time / SDPA over rounds (same process, CUDA graphs, L2 flushed)")
    print(table.round(3).to_string())
    print("\nmedian us per round")
    print(times.pivot_table(index=["variant", "round"], columns=["batch", "query_len", "cached"],
                            values="time_us", sort=False).round(1).to_string())


if __name__ == "__main__":
    main()
