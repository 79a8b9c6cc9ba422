"""H200: one warm call of each kernel inside an NVTX range for Nsight Compute.

    ncu --set full --nvtx --nvtx-include "prof/" --clock-control none -f -o $OUT/prof \
        python3 scripts/h200_ncu_probe.py [prefill] [decode]
    ncu --import $OUT/prof.ncu-rep --page raw --csv > $OUT/raw.csv

prefill: the Triton paged prefill and causal SDPA at 8 x 512 (Llama-3-8B shape, bf16, block
16); decode: the Triton paged decode and SDPA on a contiguous cache at 16 x 4,096. Each is
called three times first (compilation, plans), then once inside ``prof/<name>``.
"""
import sys
import torch
from pagebench.defaults import SHAPES
from pagebench.kernels import registry
from pagebench.kernels.fixtures import contiguous_case, paged_case, prefill_case
from pagebench.kernels.prefill_sweep import sdpa_causal
from pagebench.kernels.triton_decode import triton_paged_decode
from pagebench.kernels.triton_prefill import triton_paged_prefill

which = sys.argv[1:] or ["prefill", "decode"]
shape = SHAPES["llama-3-8b"]
scale = shape[2] ** -0.5
dt, dev = torch.bfloat16, "cuda"
calls = {}
if "prefill" in which:
    case = prefill_case(8, 512, 0, shape, 16, dt, dev, seed=3)
    calls["triton_prefill_8x512"] = lambda: triton_paged_prefill(*case.args(), scale)
    calls["sdpa_prefill_8x512"] = sdpa_causal(8, 512, 0, shape, dt, dev, seed=3)
if "decode" in which:
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
