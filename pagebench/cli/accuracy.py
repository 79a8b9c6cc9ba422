"""`pagebench kv-accuracy`: what a KV cache dtype costs the shipped trained model's predictions
(dataset ``kv_accuracy``; :mod:`pagebench.measure.kv_accuracy`)."""

from __future__ import annotations

from pagebench.cli.options import (add_output_options, check_output_file, dumps, format_table,
                                   int_list, integer, write_results)

COLUMNS = [("kv_dtype", "KV dtype", 0), ("reference_dtype", "reference", 0),
           ("block_size", "block", 0), ("perplexity", "perplexity", 4),
           ("perplexity_reference", "reference perplexity", 4),
           ("top1_agreement", "top-1 agreement", 4), ("tokens", "tokens", 0)]


def register(sub) -> None:
    p = sub.add_parser(
        "kv-accuracy", help="perplexity and top-1 agreement of the shipped trained model per "
        "KV cache dtype and block size (CPU: about a minute)",
        description="Run held-out windows of the Python standard library's sources through the "
        "engine's paged cache (every attention read back from the cache) with the shipped "
        "trained model: bf16 against fp32, fp8_e4m3 and fp8_e5m2 caches against bf16, per "
        "block size; one row of dataset kv_accuracy each.")
    p.add_argument("--windows", type=integer(1, 4096), default=8,
                   help="held-out windows (default: %(default)s)")
    p.add_argument("--length", type=integer(2, 1024), default=512,
                   help="tokens per window, at most the model's 1,024 (default: %(default)s)")
    p.add_argument("--block-sizes", type=int_list, default=[1, 16, 128],
                   help="comma-separated block sizes (default: 1,16,128)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model runs (default: %(default)s)")
    add_output_options(p, "rows (dataset kv_accuracy)")
    p.set_defaults(func=run)


def run(args) -> int:
    check_output_file("--out", args.out)
    from pagebench.measure.kv_accuracy import accuracy_rows

    rows = accuracy_rows(args.windows, args.length, tuple(args.block_sizes), device=args.device)
    write_results(args.out, rows)
    print(dumps(rows) if args.json else format_table(rows, COLUMNS))
    return 0
