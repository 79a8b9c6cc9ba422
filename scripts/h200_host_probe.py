"""Where a triton-paged call's host time goes (one GPU call, about a minute).

    PYTHONPATH=. python3 scripts/h200_host_probe.py --out $OUT

Times, per call and with the GPU kept busy (so launches only enqueue): the whole wrapper, its
pieces (Triton's JIT launch, the compiled kernel launched directly, the allocations), SDPA, and
the same timed as the sweep times them (L2 flush, CUDA events, no graph). Writes a cProfile
sorted by own time (host_profile.txt) and prints a table last.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys

import torch

from pagebench.defaults import SHAPES
from pagebench.kernels import reference, triton_decode
from pagebench.kernels.fixtures import contiguous_case, paged_case
from pagebench.timing import enqueue_us, environment, measure


def host_us(fn) -> float:
    return enqueue_us(fn, calls=300, busy_cycles=400_000_000)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    env = environment("cuda")
    print(json.dumps(env), flush=True)
    shape = SHAPES["llama-3-8b"]
    scale = shape[2] ** -0.5
    rows = []
    for batch, context in ((1, 1024), (8, 4096), (64, 4096), (1, 65536)):
        case = paged_case(batch, context, shape, 16, torch.bfloat16, "cuda", seed=5).args()
        q, k, v, _ = contiguous_case(batch, context, shape, torch.bfloat16, "cuda", seed=5).args()
        fns = {
            "wrapper": lambda: triton_decode.triton_paged_decode(*case, scale),
            "wrapper 1 split": lambda: triton_decode.triton_paged_decode(*case, scale,
                                                                         num_splits=1),
            "sdpa": lambda: reference.sdpa_contiguous_decode(q, k, v, None, scale),
            "empty x2": lambda: (torch.empty(batch, 32, 8, 128, device="cuda"),
                                 torch.empty(batch, 32, 8, 2, device="cuda")),
        }
        # the one-split kernel: through Triton's JIT launch, and the compiled kernel directly
        plan = triton_decode.decode_plan(*case, scale, num_splits=1)
        out = torch.empty_like(case[0])
        tensors = (*case, out, out)
        split = plan.split
        split(*tensors)
        fns["jit launch"] = lambda: split.kernel[split.grid](*tensors, *split.scalars,
                                                             **split.kwargs)
        fns["direct launch"] = lambda: split(*tensors)
        for name, fn in fns.items():
            rows.append(dict(batch=batch, context=context, what=name, host_us=host_us(fn)))
        for name in ("wrapper", "sdpa"):
            t = measure(fns[name], device="cuda", warmup=5, repeat=50)
            tg = measure(fns[name], device="cuda", warmup=5, repeat=50, cuda_graph=True)
            rows.append(dict(batch=batch, context=context, what=name + " timed (sweep way)",
                             host_us=t.median_us, graph_us=tg.median_us))
        if batch == 1 and context == 1024:
            prof = cProfile.Profile()
            torch.cuda._sleep(400_000_000)
            prof.enable()
            for _ in range(300):
                fns["wrapper"]()
            prof.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            st = pstats.Stats(prof, stream=text)
            st.sort_stats("tottime").print_stats(40)
            st.sort_stats("cumulative").print_stats(40)
            with open(os.path.join(args.out, "host_profile.txt"), "w") as f:
                f.write(text.getvalue())
        del case, q, k, v
    with open(os.path.join(args.out, "host_probe.json"), "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)
    for r in rows:
        extra = f"  graph {r['graph_us']:.1f}" if "graph_us" in r else ""
        print(f"{r['batch']:>3}x{r['context']:<6} {r['what']:<28} {r['host_us']:8.1f} us{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
