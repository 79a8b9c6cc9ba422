"""Does the distance between the K and the V cache in memory change a decode's time? The same
decode (same values, same tables) with K and V carved from one allocation, V starting ``gap``
bytes after K ends, for several gaps, each timed twice, in one process (H200 notes in
docs/kernels.md, "Timing"):

    PYTHONPATH=. python3 scripts/h200_kv_placement.py OUT_DIR          # on the GPU

Writes ``kv_placement.csv`` and prints a table last.
"""

from __future__ import annotations

import os
import sys

import torch

from pagebench.cli.options import write_results
from pagebench.defaults import SHAPES
from pagebench.kernels import cuda_fp8_decode, triton_decode
from pagebench.kernels.fixtures import paged_case, quantized_inputs
from pagebench.timing import environment, measure

SHAPE = dict(SHAPES)["llama-3-8b"]
SCALE = SHAPE[2] ** -0.5
MB = 2**20
GAPS = [0, 4096, 64 * 1024, MB, 2 * MB, 3 * MB, 6 * MB, 30 * MB, 128 * MB + 4096]


def placed(k, v, gap):
    """Copies of k and v in one buffer: v starts ``gap`` bytes after k ends (2 MB aligned k)."""
    kb, vb = k.numel() * k.element_size(), v.numel() * v.element_size()
    buf = torch.empty(kb + gap + vb, dtype=torch.uint8, device=k.device)
    k2 = buf[:kb].view(k.dtype).view(k.shape)
    v2 = buf[kb + gap:].view(v.dtype).view(v.shape)
    k2.copy_(k)
    v2.copy_(v)
    return k2, v2


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    env = environment("cuda")
    rows = []
    for batch, context in ((64, 4096), (128, 4096), (1, 65536)):
        base = paged_case(batch, context, SHAPE, 16, torch.bfloat16, "cuda", seed=batch)
        fp8 = quantized_inputs(base, torch.float8_e4m3fn, spread=1.0)
        q, k, v, tables, lens = base.args()
        fq, fk, fv, _, _ = fp8.args()
        sc = (fp8.k_scale, fp8.v_scale)
        for kernel in ("bf16 triton", "e4m3 cuda"):
            for gap in GAPS:
                k2, v2 = placed(k, v, gap) if kernel == "bf16 triton" else placed(fk, fv, gap)

                def call(k2=k2, v2=v2, kernel=kernel):
                    if kernel == "bf16 triton":
                        return triton_decode.triton_paged_decode(q, k2, v2, tables, lens, SCALE)
                    return cuda_fp8_decode.cuda_fp8_paged_decode(fq, k2, v2, tables, lens,
                                                                 SCALE, *sc)
                for rep in range(2):
                    t = measure(call, device="cuda", repeat=30, cuda_graph=True)
                    rows.append(dict(batch=batch, context=context, kernel=kernel, gap=gap,
                                     rep=rep, k_ptr_mod_1g=k2.data_ptr() % 2**30,
                                     v_minus_k=v2.data_ptr() - k2.data_ptr(),
                                     time_us=t.median_us, q20_us=t.q20_us, q80_us=t.q80_us,
                                     **env))
                    print(batch, context, kernel, gap, rep, f"{t.median_us:.1f}", flush=True)
                del k2, v2, call
                torch.cuda.empty_cache()
        write_results(os.path.join(out_dir, "kv_placement.csv"), rows)


if __name__ == "__main__":
    main()
