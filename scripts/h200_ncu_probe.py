"""H200: one warm call of each kernel inside an NVTX range for Nsight Compute.

    ncu --set full --nvtx --nvtx-include "prof/" --clock-control none -f -o $OUT/prof \
        python3 scripts/h200_ncu_probe.py [--prefill 8x512x0,...] [--decode] \
        [--copy FILE [--copy-launch key=value,...]...]
    ncu --import $OUT/prof.ncu-rep --page raw --csv > $OUT/raw.csv

Prefill (Llama-3-8B shape, bf16, block 16) at each point (batch x queries x cached; default
8x512x0): the Triton paged prefill and causal SDPA, and with ``--copy`` another version of
``triton_prefill.py`` with each ``--copy-launch``'s options (as ``h200_prefill_ab.py`` takes
them); ``--decode``: the Triton paged decode and SDPA on a contiguous cache at 16 x 4,096. Each
is called three times first (compilation, plans), then once inside ``prof/<name>``.
"""
import argparse

import torch
from ab_harness import load_copy, parse_launch, parse_points

from pagebench.defaults import SHAPES
from pagebench.kernels import registry
from pagebench.kernels.fixtures import contiguous_case, paged_case, prefill_case
from pagebench.kernels.prefill_sweep import sdpa_causal
from pagebench.kernels.triton_decode import triton_paged_decode
from pagebench.kernels.triton_prefill import triton_paged_prefill

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--prefill", default="", help="batch x queries x cached, comma-separated")
parser.add_argument("--decode", action="store_true")
parser.add_argument("--copy", default="", help="a copy of triton_prefill.py to profile too")
parser.add_argument("--copy-launch", action="append", default=[],
                    help="options passed to the --copy's function (repeatable)")
args = parser.parse_args()
shape = SHAPES["llama-3-8b"]
scale = shape[2] ** -0.5
dt, dev = torch.bfloat16, "cuda"
copy = load_copy(args.copy, "prefill_copy") if args.copy else None
calls = {}
for point in parse_points(args.prefill, [] if args.decode else [(8, 512, 0)]):
    tag = "x".join(map(str, point))
    case = prefill_case(*point, shape, 16, dt, dev, seed=3)
    calls[f"triton_prefill_{tag}"] = lambda case=case: triton_paged_prefill(*case.args(), scale)
    for text in ([""] + args.copy_launch) if copy else []:
        opts = parse_launch(text) if text else {}
        calls[f"copy_prefill_{tag}_{text or 'default'}"] = (
            lambda case=case, opts=opts: copy.triton_paged_prefill(*case.args(), scale, **opts))
    calls[f"sdpa_prefill_{tag}"] = sdpa_causal(*point, shape, dt, dev, seed=3)
if args.decode:
    pc = paged_case(16, 4096, shape, 16, dt, dev, seed=16)
    calls["triton_decode_16x4096"] = lambda: triton_paged_decode(*pc.args(), scale)
    cc = contiguous_case(16, 4096, shape, dt, dev, seed=16)
    sdpa = registry.get_backend("sdpa").prepared_call("contiguous", cc.q, cc.k, cc.v, None, scale)
    calls["sdpa_decode_16x4096"] = sdpa
for name, fn in calls.items():
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prof")
    torch.cuda.nvtx.range_push(name)
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_pop()
print("done", list(calls))
