"""`pagebench ab`: named kernel variants on the same tensors, checked, timed and compared with
the first (pagebench.measure.ab); every row carries the command that reproduces it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from pagebench.cli.kernels import DTYPE_BYTES
from pagebench.cli.options import (check_output_dir, dumps, format_table, int_list, integer,
                                   name_list, progress, write_results)

# measure.ab_variants.ROUTINE_OPS's keys, spelled here so --help imports no torch (tested)
ROUTINES = ("decode", "prefill", "mixed")
DEFAULT_OUT_DIR = os.path.join("reports", "ab")  # git-ignored (reports/* except reports/data/)
MIXED_DECODES = 8  # --routine mixed: one-token decodes beside the prefill chunks, by default
# --repeat and --rounds by device when not given
REPEAT = {"cpu": 5, "cuda": 20}
ROUNDS = {"cpu": 3, "cuda": 5}


def register(sub) -> None:
    p = sub.add_parser(
        "ab", help="A/B kernel variants on the same tensors: reference check, interleaved "
        "timing, ratio to the first, a reproduction command per row",
        description="Run named variants (a backend plus launch fields, from --variants FILE, "
        "or plain --backends) on the same tensors at every point: each variant's output is "
        "checked against the float64 reference (a wrong one is reported and not timed), the "
        "others are timed in interleaved rounds and compared with the first variant, the "
        "baseline. Rows (CSV and JSON in --out-dir) carry the commit, device, versions and "
        "the `pagebench ab` line that reruns that one point and variant. See docs/ab.md.")
    p.add_argument("--routine", choices=ROUTINES, default="decode",
                   help="decode (paged_decode), prefill (paged_prefill: each sequence's last "
                   "--query-len tokens) or mixed (prefill chunks and --decodes one-token "
                   "decodes in one paged_prefill call); default %(default)s")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--variants", metavar="FILE",
                       help="TOML or JSON file of [[variant]] records (name, backend, and "
                       "optionally launch fields and layout; an import list of Python files "
                       "that register backends); the first is the baseline")
    which.add_argument("--backends", type=name_list, metavar="A,B",
                       help="registered backends as variants, NAME-contiguous for a "
                       "backend's contiguous decode (the first is the baseline)")
    p.add_argument("--only", type=name_list, metavar="NAMES",
                   help="with --variants: run only these variants (in the file's order)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="default %(default)s")
    p.add_argument("--batch", type=int_list, default=[1], metavar="B,...",
                   help="sequences per call (prefill, mixed: prefill chunks); default 1")
    p.add_argument("--context", type=int_list, default=[256], metavar="C,...",
                   help="mean tokens per sequence; every --batch x --context is a point; "
                   "default 256")
    p.add_argument("--lengths", action="append", metavar="SPEC",
                   help="the batches' lengths, repeatable: uniform, lognormal:MU,SIGMA or "
                   "trace:NAME, rescaled to mean CONTEXT (as `pagebench bench`); default "
                   "uniform")
    p.add_argument("--query-len", type=integer(1),
                   help="prefill, mixed: new tokens per chunk (default: whole sequences)")
    p.add_argument("--decodes", type=integer(1),
                   help=f"mixed: one-token decodes in the call (default {MIXED_DECODES})")
    p.add_argument("--heads", default="32/8", metavar="Q/KV",
                   help="query and KV heads; default %(default)s")
    p.add_argument("--head-dim", type=integer(1, 1024), default=128,
                   help="default %(default)s")
    p.add_argument("--block-size", type=int_list, default=[16], metavar="N,...",
                   help="tokens per block (a list: more points); default 16")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES),
                   help="q's dtype (and the cache's); default bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--kv-dtype", help="the cache's dtype if not --dtype: fp8_e4m3 or fp8_e5m2 "
                   "(per-head scales; the reference dequantises them exactly)")
    p.add_argument("--kv-scales", choices=["head", "one"], default="head",
                   help="fp8 caches: a scale per KV head (default) or one for every head")
    p.add_argument("--seed", type=integer(0), default=0, help="inputs' seed; default 0")
    p.add_argument("--repeat", type=integer(1, 100_000),
                   help=f"timed calls per round (default {REPEAT['cpu']} on CPU, "
                   f"{REPEAT['cuda']} on CUDA)")
    p.add_argument("--rounds", type=integer(1, 1000),
                   help="rounds interleaving the variants; their min-max is each time's band "
                   f"(default {ROUNDS['cpu']} on CPU, {ROUNDS['cuda']} on CUDA)")
    p.add_argument("--cuda-graphs", choices=["only", "off", "both"], default="only",
                   help="CUDA: time calls that can be captured replayed from a CUDA graph "
                   "(only), eagerly (off) or both; default %(default)s")
    p.add_argument("--out-dir", default=DEFAULT_OUT_DIR, metavar="DIR",
                   help="where NAME.csv and NAME.json go: outside the checkout or in an "
                   "ignored folder; default %(default)s (git-ignored)")
    p.add_argument("--name", help="the files' name (default ab-ROUTINE-UTCTIME)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON, not a table")
    p.set_defaults(func=run_ab_command)


def parse_heads(text: str) -> tuple[int, int]:
    """``--heads 32/8`` -> (32, 8); a ValueError naming the option otherwise."""
    try:
        q, kv = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--heads: expected Q/KV, e.g. 32/8, got {text!r}") from None
    if not (1 <= kv <= q <= 1024) or q % kv:
        raise ValueError(f"--heads: need 1 <= KV <= Q <= 1024 and Q a multiple of KV, got "
                         f"{text!r}")
    return q, kv


def checkout_root() -> Path | None:
    """The git checkout this pagebench runs from, if it is one."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / ".git").exists() else None


def check_out_dir(path: str) -> None:
    """``--out-dir`` can take files and, inside this checkout, is git-ignored (results never
    land among tracked files)."""
    check_output_dir("--out-dir", path)
    root = checkout_root()
    real = Path(path).resolve()
    if root is None or not real.is_relative_to(root):
        return
    try:
        ignored = subprocess.run(["git", "-C", str(root), "check-ignore", "-q",
                                  str(real / "x.csv")], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return  # no git to ask: nothing says the folder is tracked
    if ignored.returncode == 1:
        raise ValueError(f"--out-dir: {path} is inside the checkout and not git-ignored; "
                         f"give a folder outside it or an ignored one (default "
                         f"{DEFAULT_OUT_DIR})")


def setup_from(args):
    """The run's ``measure.ab.Setup`` and points, every option checked."""
    import torch

    from pagebench.kernels.quant import kv_dtype_from_name
    from pagebench.kernels.ragged import check_lengths_spec
    from pagebench.measure.ab import Point, Setup

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda requested but no CUDA device is available")
    if args.only and not args.variants:
        raise ValueError("--only: selects variants of a --variants file")
    if args.routine == "decode" and args.query_len is not None:
        raise ValueError("--query-len: prefill and mixed only (a decode has one query)")
    if args.routine != "mixed" and args.decodes is not None:
        raise ValueError("--decodes: --routine mixed only")
    q_heads, kv_heads = parse_heads(args.heads)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    kv_dtype = kv_dtype_from_name(args.kv_dtype, dtype, "--kv-dtype")
    lengths = [check_lengths_spec(s) for s in args.lengths or ["uniform"]]
    setup = Setup(routine=args.routine, device=args.device,
                  shape=(q_heads, kv_heads, args.head_dim), dtype=dtype, kv_dtype=kv_dtype,
                  query_len=args.query_len,
                  decodes=(args.decodes or MIXED_DECODES) if args.routine == "mixed" else 0,
                  one_scale=args.kv_scales == "one", seed=args.seed,
                  repeat=args.repeat or REPEAT[args.device],
                  rounds=args.rounds or ROUNDS[args.device], cuda_graphs=args.cuda_graphs)
    points = [Point(b, c, spec, bs) for b in args.batch for c in args.context
              for spec in lengths for bs in args.block_size]
    return setup, points


def reproduction(setup, args, out_dir: str):
    """``command(point, variant, graph)``: the `pagebench ab` line that reruns one point and
    variant with every setting spelled out (a default that changes later changes nothing)."""
    from pagebench.config import dtype_name

    def command(point, variant, graph: bool) -> str:
        argv = ["pagebench", "ab", "--routine", setup.routine]
        if args.variants:
            argv += ["--variants", str(Path(args.variants).resolve()), "--only", variant.name]
        else:
            argv += ["--backends", variant.name]
        argv += ["--device", setup.device, "--batch", str(point.batch),
                 "--context", str(point.context), "--lengths", point.lengths,
                 "--block-size", str(point.block_size),
                 "--heads", f"{setup.shape[0]}/{setup.shape[1]}",
                 "--head-dim", str(setup.shape[2]), "--dtype", dtype_name(setup.dtype)]
        if setup.kv_dtype != setup.dtype:
            argv += ["--kv-dtype", dtype_name(setup.kv_dtype), "--kv-scales",
                     "one" if setup.one_scale else "head"]
        if setup.query_len is not None:
            argv += ["--query-len", str(setup.query_len)]
        if setup.routine == "mixed":
            argv += ["--decodes", str(setup.decodes)]
        argv += ["--seed", str(setup.seed), "--repeat", str(setup.repeat),
                 "--rounds", str(setup.rounds)]
        if setup.device == "cuda":
            argv += ["--cuda-graphs", "only" if graph else "off"]
        return shlex.join(argv + ["--out-dir", out_dir])

    return command


def run_name(routine: str, out_dir: str) -> str:
    """``ab-ROUTINE-UTCTIME``, with ``-2``, ``-3``... if that name is taken in ``out_dir``."""
    import datetime

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = name = f"ab-{routine}-{stamp}"
    n = 1
    while any(os.path.exists(os.path.join(out_dir, name + ext)) for ext in (".csv", ".json")):
        n += 1
        name = f"{base}-{n}"
    return name


def run_ab_command(args) -> int:
    from pagebench.measure.ab import TABLE, run_ab, table_rows
    from pagebench.measure.ab_variants import named_variants, read_variants

    setup, points = setup_from(args)
    if args.variants:
        variants = read_variants(args.variants, args.routine, args.only)
    else:
        variants = named_variants(args.backends, args.routine)
    check_out_dir(args.out_dir)
    if args.name is not None and (not args.name.strip() or os.sep in args.name
                                  or args.name.startswith(".")):
        raise ValueError(f"--name: a file name without folders, got {args.name!r}")
    out_dir = os.path.abspath(args.out_dir)
    name = args.name or run_name(args.routine, out_dir)
    rows: list[dict] = []

    def done(row: dict) -> None:
        rows.append(row)
        bar.update()

    # the rows measured so far are written even when a later point fails (memory, a crash)
    # or the run is interrupted
    try:
        with progress(len(points) * len(variants), "ab") as bar:
            run_ab(setup, points, variants, reproduction(setup, args, out_dir), done)
    finally:
        if rows:
            csv_path, json_path = (os.path.join(out_dir, name + ext) for ext in (".csv", ".json"))
            write_results(csv_path, rows)
            write_results(json_path, rows, {"variants": [vars(v) for v in variants],
                                            "rows": rows})
    if args.json:
        print(dumps(rows))
    else:
        print(format_table(table_rows(rows), TABLE))
    wrong = [f"{r['variant']} (batch {r['batch']}, context {r['context']}: {r['check']})"
             for r in rows if r["check"] != "ok"]
    if wrong:
        print(f"pagebench ab: not checked ok, not timed: {'; '.join(wrong)}", file=sys.stderr)
        return 1
    return 0
