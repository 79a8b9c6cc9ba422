import os, torch, pandas as pd
from pagebench.kernels import reference, triton_decode
from pagebench.kernels.reference import reference_decode
from pagebench.kernels.sweep import SHAPES, _contiguous_case, _paged_case
from pagebench.kernels.testing import relative_error
from pagebench.timing import environment, measure
env = environment("cuda"); rows = []
for shape_name, b, c in [("qwen2.5-0.5b", 1, 16384), ("qwen2.5-0.5b", 1, 65536), ("llama-3-8b", 1, 16384), ("llama-3-8b", 1, 65536), ("qwen2.5-0.5b", 2, 16384)]:
    shape = SHAPES[shape_name]; scale = shape[2] ** -0.5
    case = _paged_case(b, c, shape, 16, torch.bfloat16, "cuda", seed=5)
    new = lambda: triton_decode.triton_paged_decode(*case, scale)
    old = lambda: triton_decode.triton_paged_decode(*case, scale, tile_n=64, num_warps=4)
    err = relative_error(new(), reference_decode(*case, scale))
    q, k, v, _ = _contiguous_case(b, c, shape, torch.bfloat16, "cuda", seed=5)
    sd = lambda: reference.sdpa_contiguous_decode(q, k, v, None, scale)
    t = {n: measure(f, device="cuda", warmup=3, repeat=40, cuda_graph=True).median_us for n, f in (("rule", new), ("old", old), ("sdpa", sd))}
    plan = triton_decode.decode_plan(*case, scale)
    rows.append({**env, "model_shape": shape_name, "batch": b, "context": c, "splits": plan.num_splits, "rel_err": err, **{f"{k}_us": v for k, v in t.items()}})
    print(rows[-1]["model_shape"], b, c, plan.num_splits, f"err {err:.1e}", " ".join(f"{k} {v:.1f}" for k, v in t.items()), f"rule/sdpa {t['rule']/t['sdpa']:.2f} old/sdpa {t['old']/t['sdpa']:.2f}", flush=True)
    del case, q, k, v
pd.DataFrame(rows).to_csv(os.path.join(os.environ["OUT"], "kernels_long_context.csv"), index=False)
