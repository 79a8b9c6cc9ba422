"""GPU check of scripts/prefill_paged_lazy_probe_kernel.py's options against float64 where running maxima
jump between key tiles (queries scaled by 8 and 200), beside the package's kernel."""
import dataclasses
import itertools

import torch
from ab_harness import load_copy

from pagebench.defaults import SHAPES
from pagebench.kernels.fixtures import make_paged_inputs, relative_error
from pagebench.kernels.reference import reference_prefill
from pagebench.kernels.triton_prefill import triton_paged_prefill

copy = load_copy("scripts/prefill_paged_lazy_probe_kernel.py", "prefill_copy")
gen = torch.Generator().manual_seed(11)
worst = {}
for shape_name, (lens, qlens), gain in itertools.product(
        ["llama-3-8b", "qwen2.5-0.5b"],
        [([1, 15, 16, 17, 300, 1000, 513, 64], [1, 15, 3, 17, 300, 0, 100, 64]),
         ([512] * 4 + [100, 37], [512, 512, 500, 1, 100, 37]), ([2048], [2048])],
        [1.0, 8.0, 200.0]):
    shape = SHAPES[shape_name]
    inp = make_paged_inputs(lens, *shape, 16, torch.bfloat16, "cuda", seed=5)
    q = (torch.randn(sum(qlens), shape[0], shape[2], generator=gen) * gain).to("cuda", torch.bfloat16)
    inp = dataclasses.replace(inp, q=q, query_lens=torch.tensor(qlens, dtype=torch.int32, device="cuda"))
    ref = reference_prefill(*inp.args(), shape[2] ** -0.5)
    for name, fn, kw in [("package", triton_paged_prefill, {}),
                         ("paged", copy.triton_paged_prefill, dict(paged=True)),
                         ("lazy", copy.triton_paged_prefill, dict(exp_bf16=True)),
                         ("paged+lazy", copy.triton_paged_prefill, dict(paged=True, exp_bf16=True)),
                         ("lazy 64-key", copy.triton_paged_prefill, dict(exp_bf16=True, tile_n=64)),
                         ("lazy 128 rows", copy.triton_paged_prefill,
                          dict(exp_bf16=True, rows=128, tile_n=64, num_warps=8, num_stages=2,
                               one_loop=False, table_ahead=False, maxnreg=128))]:
        err = relative_error(fn(*inp.args(), shape[2] ** -0.5, **kw), ref)
        worst[name] = max(worst.get(name, 0.0), err)
        print(shape_name, len(lens), gain, name, f"{err:.2e}", flush=True)
print("worst:", {k: f"{v:.2e}" for k, v in worst.items()})
