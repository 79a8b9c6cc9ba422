"""H200: the Triton paged prefill against SDPA and against another version of itself, one process.

    PYTHONPATH=. python3 scripts/h200_prefill_ab.py --out $OUT [--copy FILE]
    PYTHONPATH=. python3 scripts/h200_prefill_ab.py --out $OUT --shape qwen2.5-0.5b \
        --points 1x2048x0,1x8192x0 --launch rows=64,one_loop=True,table_ahead=True
    PYTHONPATH=. python3 scripts/h200_prefill_ab.py --device cpu   # tiny dry run

Variants (``variants``), at every point of the prefill sweep (Llama-3-8B shape, block 16, unless
``--shape`` / ``--points`` (batch x queries x cached) say otherwise): the package's launch on
bf16 caches and (unless ``--bf16-only``) on e4m3 caches (per KV-head scales) and e4m3 with the
launch fp8 caches took before; with ``--copy FILE`` another version of ``triton_prefill.py``
(e.g. ``git show REV:pagebench/kernels/triton_prefill.py > FILE``) with its own launches (on
e4m3 too unless ``--bf16-only``), and with each ``--copy-launch`` the copy on bf16 with those
keywords; with
each ``--launch`` the package's kernel on bf16 with those launch options forced
(``triton_paged_prefill``'s keywords; the others stay its choice); with ``--sdpa-peers``
(torch ``SDPBackend`` names, e.g. ``FLASH_ATTENTION``) SDPA forced onto each of those backends
too, as peers beside the default choice (on the H200, cuDNN's kernel; a backend with no kernel
for the inputs is left out, with its reason printed). Each is checked against
float64 on ragged NaN-poisoned inputs and against float32 at every timed point (e4m3: on the
dequantised cache), then timed through a CUDA graph (L2 flushed, median of ``--repeat``)
beside causal SDPA on a contiguous bf16 cache, in ``--rounds`` rounds. Writes prefill_ab.csv
and prefill_ab_checks.csv (with device, versions and commit).
"""

from __future__ import annotations

import dataclasses
import functools

import pandas as pd
import torch
from ab_harness import ab_parser, load_copy, parse_launch, parse_points, write_results

from pagebench.defaults import BLOCK_SIZE, SHAPES
from pagebench.kernels import triton_prefill
from pagebench.kernels.fixtures import (make_paged_inputs, prefill_case, quantized_inputs,
                                        relative_error)
from pagebench.kernels.prefill_sweep import FULL_PREFILL_POINTS, causal_flops, sdpa_causal
from pagebench.kernels.reference import reference_prefill, torch_paged_prefill
from pagebench.timing import environment, measure

RAGGED = [([1, 15, 16, 17, 300, 1000, 513, 64], [1, 15, 3, 17, 300, 0, 100, 64]),
          ([512] * 4 + [100, 37], [512, 512, 500, 1, 100, 37])]
E4M3 = torch.float8_e4m3fn
# The launch fp8 caches took before (two walks, 2 stages; 128 rows, 4 warps, 3 stages from 2,048
# queries a chunk; maxnreg 255: no cap, as the compiler's own choice would be)
EARLIER_FP8 = dict(tile_n=64, num_warps=4, num_stages=2, one_loop=False, table_ahead=False,
                   maxnreg=255)
EARLIER_FP8_LONG = dict(EARLIER_FP8, num_stages=3)


def earlier_fp8(case) -> dict:
    long = case.q.shape[0] >= 2048 * case.query_lens.shape[0]
    return EARLIER_FP8_LONG if long else EARLIER_FP8


def forced_sdpa(sdpa, backend: str):
    """``sdpa`` (a call of ``F.scaled_dot_product_attention``) on torch's ``backend`` alone."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = getattr(SDPBackend, backend)

    def call():
        with sdpa_kernel([chosen]):
            return sdpa()
    return call


def variants(copy, launches: list[dict], copy_launches: list[dict], fp8: bool):
    """label -> (cache dtype or None for q's, prefill function, options(case))."""
    pkg = triton_prefill.triton_paged_prefill
    none = lambda case: {}  # noqa: E731
    out = {"bf16 default": (None, pkg, none)}
    if copy is not None:
        out["copy default"] = (None, copy.triton_paged_prefill, none)
    for label, fn, forced in ([("bf16 ", pkg, launch) for launch in launches]
                              + [("copy ", copy.triton_paged_prefill, launch)
                                 for launch in copy_launches]):
        out[label + ",".join(f"{k}={v}" for k, v in forced.items())] = (
            None, fn, functools.partial(lambda forced, case: forced, forced))
    if fp8:
        out["e4m3 default"] = (E4M3, pkg, none)
        out["e4m3 earlier"] = (E4M3, pkg, earlier_fp8)
        if copy is not None:
            out["copy e4m3"] = (E4M3, copy.triton_paged_prefill, none)
    return out


def main() -> None:
    parser = ab_parser(__doc__.split("\n")[0], "triton_prefill.py",
                       "forced launch options on bf16, e.g. rows=64,one_loop=True (repeatable)",
                       "batch x queries x cached, comma-separated (default: all)")
    parser.add_argument("--bf16-only", action="store_true", help="no e4m3 variants")
    parser.add_argument("--sdpa-peers", default="",
                        help="SDPBackend names to force SDPA onto, comma-separated")
    parser.add_argument("--copy-launch", action="append", default=[],
                        help="options passed to the --copy's function on bf16 (repeatable)")
    args = parser.parse_args()
    if args.copy_launch and not args.copy:
        parser.error("--copy-launch: needs --copy")
    shape = SHAPES[args.shape]
    sdpa_peers = [name for name in args.sdpa_peers.split(",") if name]
    launches = [parse_launch(text) for text in args.launch]
    points = parse_points(args.points, FULL_PREFILL_POINTS)
    dev = args.device
    on_cuda = dev == "cuda"
    scale = shape[2] ** -0.5
    dtype = torch.bfloat16 if on_cuda else torch.float32
    copy = load_copy(args.copy, "prefill_copy") if args.copy else None
    chosen = variants(copy, launches, [parse_launch(t) for t in args.copy_launch],
                      not args.bf16_only)
    gen = torch.Generator().manual_seed(7)
    checks, rows = [], []

    def cast(inp, cache):
        return inp if cache is None else quantized_inputs(inp, cache, seed=5)

    def check(name, case_name, out, ref):
        checks.append(dict(variant=name, case=case_name, err=relative_error(out, ref)))
        print(checks[-1], flush=True)

    for lens, qlens in RAGGED if on_cuda else [([1, 17, 40], [1, 0, 40])]:
        inp = make_paged_inputs(lens, *shape, BLOCK_SIZE, dtype, dev, seed=5)
        q = torch.randn(sum(qlens), shape[0], shape[2], generator=gen).to(dev, dtype)
        inp = dataclasses.replace(inp, q=q, query_lens=torch.tensor(qlens, dtype=torch.int32,
                                                                    device=dev))
        for name, (cache, fn, opts) in chosen.items():
            case = cast(inp, cache)
            check(name, f"ragged{len(lens)}",
                  fn(*case.args(), scale, **case.scales(), **opts(case)),
                  reference_prefill(*case.args(), scale, **case.scales()))

    timing = dict(device=dev, warmup=2 if on_cuda else 0, repeat=args.repeat if on_cuda else 1,
                  cuda_graph=on_cuda)
    for point in points if on_cuda else [(2, 16, 0), (1, 8, 20)]:
        plain = prefill_case(*point, shape, BLOCK_SIZE, dtype, dev, seed=3)
        calls = {}
        for cache in {v[0] for v in chosen.values()}:
            case = plain if cache is None else quantized_inputs(plain, cache, spread=1.0)
            ref = torch_paged_prefill(*[t.float() if t.is_floating_point()
                                        and t.element_size() > 1 else t for t in case.args()],
                                      scale, **case.scales())
            for name, (c, fn, opts) in chosen.items():
                if c == cache:
                    calls[name] = functools.partial(fn, *case.args(), scale, **case.scales(),
                                                    **opts(case))
                    check(name, str(point), calls[name](), ref)
            del ref
        sdpa = sdpa_causal(*point, shape, dtype, dev, seed=3)
        peers = {}
        default = sdpa() if sdpa_peers else None  # what each peer is checked against
        for name in sdpa_peers:
            fn = forced_sdpa(sdpa, name)
            try:
                out = fn()
            except RuntimeError as err:  # e.g. no kernel of that backend takes these inputs
                print(f"sdpa {name} left out at {point}: {str(err).splitlines()[0]}", flush=True)
                continue
            peers[f"sdpa {name}"] = fn
            check(f"sdpa {name}", str(point), out, default)
        calls = peers | calls
        del default
        for rnd in range(args.rounds if on_cuda else 1):
            sdpa_us = measure(sdpa, **timing).median_us
            rows.append(dict(variant="sdpa", round=rnd, batch=point[0], query_len=point[1],
                             cached=point[2], time_us=sdpa_us, sdpa_us=sdpa_us, ratio=1.0))
            for name, fn in calls.items():
                t = measure(fn, **timing)
                rows.append(dict(variant=name, round=rnd, batch=point[0], query_len=point[1],
                                 cached=point[2], time_us=t.median_us, q20_us=t.q20_us,
                                 q80_us=t.q80_us, sdpa_us=sdpa_us, ratio=t.median_us / sdpa_us,
                                 tflops=causal_flops(*point, shape[0], shape[2])
                                 / t.median_us / 1e6))
                print({k: rows[-1][k] for k in ("variant", "round", "batch", "query_len",
                                                "cached", "time_us", "ratio")}, flush=True)
        del plain, calls
        if on_cuda:
            torch.cuda.empty_cache()
    env = environment(dev)  # device, versions, commit (PAGEBENCH_COMMIT on a copied tree)
    times = pd.DataFrame(rows).assign(shape=args.shape, **env)
    errors = pd.DataFrame(checks).assign(shape=args.shape, **env)
    write_results(args.out, "prefill_ab", times, errors)
    pd.set_option("display.width", 250)
    table = times.pivot_table(index="variant", columns=["batch", "query_len", "cached"],
                              values="ratio", aggfunc="mean", sort=False)
    print("\nmean time / SDPA over rounds (same process, CUDA graphs, L2 flushed)")
    print(table.round(3).to_string())
    print("worst error per variant:", errors.groupby("variant")["err"].max().round(4).to_dict())
    print(times.pivot_table(index=["variant", "round"], columns=["batch", "query_len", "cached"],
                            values="time_us", sort=False).round(1).to_string())


if __name__ == "__main__":
    main()
