"""H200: the Triton paged decode against SDPA and against another version of itself, one process.

    PYTHONPATH=. python3 scripts/h200_decode_ab.py --out $OUT [--copy FILE] \
        [--launch num_splits=4 ...] [--shape qwen2.5-0.5b] [--points 16x4096x16,1x65536x16]
    PYTHONPATH=. python3 scripts/h200_decode_ab.py --device cpu   # tiny dry run

Variants at every point (batch x context x block size; Llama-3-8B shape unless ``--shape``):
the package's ``triton_paged_decode`` (bf16, shuffled tables, as the sweep's); with ``--copy
FILE`` another version of ``triton_decode.py`` (e.g. ``git show
REV:pagebench/kernels/triton_decode.py > FILE``); with each ``--launch`` the package's with
those ``decode_plan`` keywords forced. Each is checked against float64 on ragged NaN-poisoned
inputs at several split counts, and against float32 at every timed point before and after its
timing (the graph's replays must leave the kernel's state as they found it), then timed through
a CUDA graph (L2 flushed, median of ``--repeat``) beside SDPA on a contiguous cache, in
``--rounds`` rounds. Writes decode_ab.csv and decode_ab_checks.csv (device, versions, commit).
"""

from __future__ import annotations

import functools

import pandas as pd
import torch
from ab_harness import ab_parser, load_copy, parse_launch, parse_points, write_results

from pagebench.defaults import SHAPES
from pagebench.kernels import registry, triton_decode
from pagebench.kernels.fixtures import (contiguous_case, make_paged_inputs, paged_case,
                                        relative_error)
from pagebench.kernels.reference import reference_decode, torch_paged_decode
from pagebench.timing import environment, measure

RAGGED = [1, 15, 16, 17, 300, 1000, 513, 64]
RAGGED_SPLITS = [None, 2, 3, 7, 16, 64]
ALL_POINTS = [(1, 1024, 16), (1, 4096, 16), (1, 16384, 16), (1, 65536, 16), (4, 4096, 16),
              (16, 4096, 16), (32, 4096, 16), (64, 4096, 16), (128, 4096, 16), (256, 4096, 16),
              (16, 4096, 1), (16, 4096, 128)]


def main() -> None:
    args = ab_parser(__doc__.split("\n")[0], "triton_decode.py",
                     "forced decode_plan options, e.g. num_splits=4 (repeatable)",
                     "batch x context x block size, comma-separated (default: all)").parse_args()
    shape = SHAPES[args.shape]
    dev = args.device
    on_cuda = dev == "cuda"
    dtype = torch.bfloat16 if on_cuda else torch.float32
    scale = shape[2] ** -0.5
    points = parse_points(args.points, ALL_POINTS)
    chosen = {"triton default": (triton_decode.triton_paged_decode, {})}
    if args.copy:
        chosen["copy default"] = (load_copy(args.copy, "decode_copy").triton_paged_decode, {})
    for text in args.launch:
        chosen["triton " + text] = (triton_decode.triton_paged_decode, parse_launch(text))
    checks, rows = [], []

    def check(name, case_name, out, ref):
        checks.append(dict(variant=name, case=case_name, err=relative_error(out, ref),
                           nan=bool(torch.isnan(out).any())))
        print(checks[-1], flush=True)

    inp = make_paged_inputs(RAGGED if on_cuda else [1, 17, 40], *shape, 16, dtype, dev, seed=5)
    ref = reference_decode(*inp.args(), scale)
    for name, (fn, opts) in chosen.items():
        for splits in RAGGED_SPLITS:
            forced = opts if splits is None else {**opts, "num_splits": splits}
            for call in range(2):  # the second call reuses the plan (and its state)
                check(name, f"ragged splits={splits} call={call}",
                      fn(*inp.args(), scale, **forced), ref)
    del inp, ref

    timing = dict(device=dev, warmup=2 if on_cuda else 0, repeat=args.repeat if on_cuda else 1,
                  cuda_graph=on_cuda)
    for batch, context, block in points if on_cuda else [(2, 40, 16), (1, 300, 1)]:
        case = paged_case(batch, context, shape, block, dtype, dev, seed=batch)
        ref = torch_paged_decode(case.q.float(), case.k_cache.float(), case.v_cache.float(),
                                 case.block_tables, case.seq_lens, scale)
        calls = {name: functools.partial(fn, *case.args(), scale, **opts)
                 for name, (fn, opts) in chosen.items()}
        for name, call in calls.items():
            check(name, f"{batch}x{context}x{block} before", call(), ref)
        contiguous = contiguous_case(batch, context, shape, dtype, dev, seed=batch)
        sdpa = registry.get_backend("sdpa").prepared_call(
            "contiguous", contiguous.q, contiguous.k, contiguous.v, None, scale)
        point = dict(batch=batch, context=context, block_size=block)
        for rnd in range(args.rounds if on_cuda else 1):
            sdpa_us = measure(sdpa, **timing).median_us
            rows.append(dict(variant="sdpa", round=rnd, **point, time_us=sdpa_us,
                             sdpa_us=sdpa_us, ratio=1.0))
            for name, call in calls.items():
                t = measure(call, **timing)
                rows.append(dict(variant=name, round=rnd, **point, time_us=t.median_us,
                                 q20_us=t.q20_us, q80_us=t.q80_us, sdpa_us=sdpa_us,
                                 ratio=t.median_us / sdpa_us))
                print({k: rows[-1][k] for k in ("variant", "round", "batch", "context",
                                                "block_size", "time_us", "ratio")}, flush=True)
        for name, call in calls.items():
            check(name, f"{batch}x{context}x{block} after", call(), ref)
        del case, contiguous, ref, calls, sdpa
        if on_cuda:
            torch.cuda.empty_cache()
    env = environment(dev)
    times = pd.DataFrame(rows).assign(shape=args.shape, **env)
    errors = pd.DataFrame(checks).assign(shape=args.shape, **env)
    write_results(args.out, "decode_ab", times, errors)
    pd.set_option("display.width", 250)
    print("\nmean time / SDPA over rounds (same process, CUDA graphs, L2 flushed)")
    print(times.pivot_table(index="variant", columns=["batch", "context", "block_size"],
                            values="ratio", aggfunc="mean", sort=False).round(3).to_string())
    print(times.pivot_table(index="variant", columns=["batch", "context", "block_size"],
                            values="time_us", aggfunc="mean", sort=False).round(1).to_string())
    print("worst error per variant:", errors.groupby("variant")["err"].max().round(4).to_dict(),
          "any NaN:", bool(errors["nan"].any()))


if __name__ == "__main__":
    main()
