"""`pagebench simulate` (static fragmentation) and its options."""

from __future__ import annotations

import json


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise ValueError(f"expected comma-separated integers, got {text!r}")
    return values


def register(sub) -> None:
    p = sub.add_parser("simulate", help="allocator utilisation on a length distribution",
                       description="Compare KV-cache allocators (naive reserve-max, pow2, "
                       "oracle, paged per block size) on a sequence-length distribution.")
    p.add_argument("--lengths", default="lognormal:5.5,0.9",
                   help="lognormal:MU,SIGMA | uniform:A,B | fixed:N | FILE (default: %(default)s)")
    p.add_argument("--num-seqs", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--block-sizes", type=int_list, default=[1, 8, 16, 32, 128])
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run_simulate)


def run_simulate(args) -> int:
    from pagebench.sim.static import format_static_table, static_fragmentation
    from pagebench.sim.workloads import sample_lengths

    lengths = sample_lengths(args.lengths, args.num_seqs, args.seed, args.max_len)
    result = static_fragmentation(lengths, args.max_len, args.block_sizes)
    print(json.dumps(result, indent=2) if args.json else format_static_table(result))
    return 0
