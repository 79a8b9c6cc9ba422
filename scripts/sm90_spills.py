"""Registers, spills and serialised wgmma of the Triton prefill for sm_90, without a GPU.

    TRITON_INTERPRET=0 PYTHONPATH=. python3 scripts/sm90_spills.py [--shape S] [--points P]
        [--launch key=val,...] [--arch 90]

Compiles the kernels ``prefill_launch`` picks on an H200 (132 SMs) at each point (batch x
queries x cached; default: the prefill sweep's points and several long prompts) with Triton's
compiler and the ``ptxas`` it ships, and prints what ``ptxas -v`` reports: a change that adds
spills or serialises the MMAs shows here before any GPU time is spent (docs/kernels.md, "The
rows' offsets read again after the walk"). ``--launch`` forces options as
``triton_paged_prefill``'s keywords do.
"""

from __future__ import annotations

import argparse
import os

os.environ["TRITON_INTERPRET"] = "0"  # compile, not interpret: before Triton is imported

import pandas as pd
from ab_harness import parse_launch, parse_points

from pagebench.defaults import SHAPES
from pagebench.kernels.offline_compile import prefill_reports
from pagebench.kernels.prefill_sweep import FULL_PREFILL_POINTS

SEVERAL_LONG = [(2, 2048, 0), (2, 4096, 0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="llama-3-8b", choices=sorted(SHAPES))
    parser.add_argument("--points", default="", help="batch x queries x cached, comma-separated")
    parser.add_argument("--launch", default="", help="forced options, e.g. scan=1,reread=False")
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args()
    points = parse_points(args.points, FULL_PREFILL_POINTS + SEVERAL_LONG)
    launch = parse_launch(args.launch) if args.launch else {}
    rows = prefill_reports(SHAPES[args.shape], points, arch=args.arch, **launch)
    print(pd.DataFrame(rows).convert_dtypes().to_string(index=False, na_rep="-"))


if __name__ == "__main__":
    main()
