"""`pagebench recommend`: the block size, the sequences that fit, the latency-bound rate and one
fp8 verdict for a user's own workload, each answer naming the data behind it.

It measures nothing: utilisation and capacity are computed here on the workload (sim), speed,
serving and accuracy are read from one GPU's committed measurements (``--device-data``), and
:mod:`pagebench.analysis.advice` weighs them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pagebench import defaults
from pagebench.cli.options import (check_input_dir, check_output_file, dumps, format_table,
                                   int_list, integer, name_list, number, write_results)
from pagebench.sim.columns import LENGTHS_FILE_HELP, TRACE_FILE_HELP

KV_DTYPES = ("auto", "fp8_e4m3")  # auto: the model's dtype (bf16)
DEFAULT_MODEL, DEFAULT_GPU_MEMORY = "qwen2.5-0.5b", "16GiB"  # capacity's defaults
DEFAULT_SLO_MS = 50.0
# the block-size table: (key, header, decimals, meaning); the legend prints the meanings
COLUMNS = (
    ("block_size", "block", 0, "tokens per KV block"),
    ("utilisation", "util", 3, "KV slots holding tokens on this workload at its final lengths "
     "(tokens / slots reserved)"),
    ("speed", "speed", 3, "decode speed relative to the fastest block size (engine tokens/s on "
     "the GPU of --device-data; else 1 / kernel time); - : not measured"),
    ("speed_range", "speed range", None, "the repeats' min..max of that speed"),
    ("score", "score", 3, "utilisation x speed: the tokens/s a block size buys in the same "
     "memory, relative"),
    ("score_range", "score range", None, "utilisation x the speed range; ranges that overlap "
     "the best's are a tie (no winner within noise)"),
    ("verdict", "verdict", None, "best, tied (within noise of the best), or excluded (by "
     "--multiple-of or --backend)"),
)
# one column per cache dtype: sequences of this workload that fit
FIT_MEANING = ("sequences of this workload that fit at once at their final lengths in the KV "
               "cache of --model on --gpu-memory (capacity planner, paged at this block size)")


def legend() -> str:
    """The meaning of every column of the table, one line each (printed under it and in
    ``--help``)."""
    lines = [f"  {header:<12} {meaning}" for _, header, _, meaning in COLUMNS]
    lines.append(f"  {'fit <dtype>':<12} {FIT_MEANING}")
    return "\n".join(lines)


def register(sub) -> None:
    import argparse

    p = sub.add_parser(
        "recommend", help="block size, capacity and an fp8 verdict for your own workload",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Answer, for your lengths or trace: which block size (with its "
        "uncertainty), how many sequences fit per block size and KV cache dtype, the "
        "latency-bound request rate (where serving data exists), and whether an fp8 KV cache is "
        "worth it (capacity, decode and prefill speed, measured accuracy). Nothing is "
        "measured: speed comes from one GPU's committed data, each line names it.",
        epilog="columns of the block-size table:\n" + legend())
    src = p.add_mutually_exclusive_group()
    src.add_argument("--lengths", metavar="FILE", default=None,
                     help="your requests or lengths; " + LENGTHS_FILE_HELP + " (default: the "
                     f"article's lengths, {defaults.REFERENCE_LENGTHS})")
    src.add_argument("--trace", metavar="NAME|FILE", default=None,
                     help="azure-code, azure-conv, mooncake-conv (shipped) or a FILE; "
                     + TRACE_FILE_HELP)
    p.add_argument("--model", default=None, metavar="CONFIG|PRESET",
                   help=f"preset or config.json (default {DEFAULT_MODEL})")
    p.add_argument("--gpu-memory", default=None,
                   help=f"GPU memory, e.g. 80GB or 141GiB (default {DEFAULT_GPU_MEMORY})")
    p.add_argument("--kv-dtype", type=name_list, default=list(KV_DTYPES),
                   help="KV cache dtypes to size (default auto,fp8_e4m3; auto: the model's)")
    p.add_argument("--max-len", "--max-model-len", type=integer(2, 2**40), default=None,
                   help="max_model_len (default: the smallest power of two, at least "
                   f"{defaults.REFERENCE_MAX_LEN}, that holds the longest request)")
    p.add_argument("--block-sizes", type=int_list, default=None,
                   help=f"block sizes weighed (default {','.join(map(str, defaults.BLOCK_SIZES))}"
                   "; only those with speed data are scored once any has it)")
    limit = p.add_mutually_exclusive_group()
    limit.add_argument("--multiple-of", type=integer(1, 4096), default=None, metavar="N",
                       help="the attention backend takes only block sizes that are multiples "
                       "of N (e.g. 16); others are excluded")
    limit.add_argument("--backend", default=None, metavar="NAME",
                       help="exclude the block sizes this registered kernel backend cannot take "
                       "(e.g. flex: multiples of 16; see `pagebench bench --list-backends`)")
    p.add_argument("--device-data", metavar="DIR", default=None,
                   help="one GPU's committed measurements (default: the first directory under "
                   "reports/data/ with GPU engine or kernel rows)")
    p.add_argument("--latency-slo-ms", type=number(0, 1e7), default=DEFAULT_SLO_MS,
                   help="latency target for the latency-bound rate (default %(default)g ms)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.add_argument("--out", metavar="FILE", default=None,
                   help="also write the block-size table to FILE (JSON if .json: the whole "
                   "answer; else CSV)")
    p.add_argument("--html", metavar="FILE", default=None,
                   help="also write a short self-contained HTML page of the answer")
    p.set_defaults(func=run_recommend)


# ---- the device's data -------------------------------------------------------------------

def device_dir(args) -> Path | None:
    """``--device-data``, else the directory under the committed data whose GPU rows answer
    most of the question: engine tokens/s per batch (what decides the block size), then decode
    kernel times, then fp8 kernel times; the first by name among equals (None: no GPU rows)."""
    if args.device_data is not None:
        check_input_dir("--device-data", args.device_data)
        return Path(args.device_data)
    from pagebench.results.collect import default_data_dir

    root = default_data_dir()
    best, best_score = None, (0, 0, 0)
    for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        results = read_device(d)
        score = tuple(int(gpu_rows(results.get(n))) for n in
                      ("engine_batch", "kernels", "kernels_fp8"))
        if score > best_score:
            best, best_score = d, score
    return best


def gpu_rows(frame) -> bool:
    return frame is not None and "device" in frame and \
        frame["device"].astype(str).str.startswith("cuda").any()


def read_device(directory: Path):
    from pagebench.results import Results
    from pagebench.results.read import load_data_dir

    results = Results()
    load_data_dir(results, directory)
    return results


def extra_table(directory: Path | None, prefix: str, device=None):
    """Dataset ``prefix`` as read with the device's data, else the rows of
    ``<directory>/<prefix>*.csv``, else, for the committed data, of every machine's
    ``<prefix>*.csv`` (accuracy is measured on a CPU, serving on whichever GPU ran it: each
    row names its device), one frame; None where there is none."""
    import pandas as pd

    from pagebench.results.collect import default_data_dir
    from pagebench.results.datasets import DATASETS
    from pagebench.results.read import read_table

    if device is not None and prefix in DATASETS and device.get(prefix) is not None:
        return device.get(prefix)
    files = sorted(directory.glob(f"{prefix}*.csv")) if directory is not None else []
    root = default_data_dir()
    if not files and directory is not None and directory.resolve().parent == root.resolve():
        files = sorted(root.glob(f"*/{prefix}*.csv"))
    frames = [read_table(f) for f in files]
    return pd.concat(frames, ignore_index=True) if frames else None


# ---- the answer --------------------------------------------------------------------------

def block_constraint(args):
    """(block size -> allowed, its words) of ``--multiple-of`` or ``--backend`` (None, None:
    every block size)."""
    if args.multiple_of:
        n = args.multiple_of
        return (lambda b: b % n == 0), f"--multiple-of {n}: multiples of {n} only"
    if args.backend:
        from pagebench.kernels.registry import get_backend

        backend = get_backend(args.backend)
        return backend.supports_block_size, f"backend {args.backend}: {backend.block_sizes}"
    return None, None


def capacity(args, lengths, max_len: int, block_sizes, workload: str) -> tuple[dict, str]:
    """{(block size, kv dtype): sequences that fit} from the capacity planner, and its words."""
    from pagebench.sim.capacity import capacity_plan

    model = args.model or DEFAULT_MODEL
    memory = args.gpu_memory or DEFAULT_GPU_MEMORY
    fits = {}
    for dtype in args.kv_dtype:
        for b in block_sizes:
            plan = capacity_plan(model, gpu_memory=memory, max_model_len=max_len, block_size=b,
                                 kv_dtype=None if dtype == "auto" else dtype, lengths=lengths)
            fits[(b, dtype)] = plan["max_concurrency_paged"]
    return fits, (f"capacity planner: {model} on {memory} at 0.9 utilisation, max_model_len "
                  f"{max_len:,}, {workload}")


def answer(args) -> dict:
    import numpy as np

    from pagebench.analysis import advice
    from pagebench.sim.static import static_fragmentation

    for dtype in args.kv_dtype:
        if dtype not in KV_DTYPES:
            raise ValueError(f"--kv-dtype: {dtype!r} is not one of {', '.join(KV_DTYPES)}")
    from pagebench.sim.user_workload import load

    w = load(args.lengths, args.trace, args.max_len)
    workload, lengths, max_len = w.name, w.lengths, w.max_model_len(args.max_len)
    block_sizes = args.block_sizes or list(defaults.BLOCK_SIZES)
    static = static_fragmentation(lengths, max_len, block_sizes)
    util = {int(r["block_size"]): r["utilisation"] for r in static["results"]
            if r["allocator"] == "paged"}
    directory = device_dir(args)
    device = read_device(directory) if directory is not None else None
    get = (lambda name: device.get(name)) if device is not None else (lambda name: None)
    fits, fit_words = capacity(args, lengths, max_len, block_sizes, workload)
    # the batch the engine data is read at: what this workload keeps running in this memory
    running = fits.get((defaults.BLOCK_SIZE, args.kv_dtype[0])) or next(iter(fits.values()))
    allowed, constraint = block_constraint(args)
    choice = advice.choose_block_size(util, workload, get("engine_batch"), get("kernels"),
                                      allowed, constraint, running)
    if choice is None:
        flag = "--backend" if args.backend else "--multiple-of"
        raise ValueError(f"{flag}: no block size of --block-sizes is allowed ({constraint})")
    rec, table = choice
    rows = []
    for r in table.to_dict("records"):
        b = int(r["block_size"])
        verdict = ("excluded" if not r["allowed"] else "best" if b == rec.block_size
                   else "tied" if b in rec.tied else "")
        rows.append({"block_size": b, "utilisation": r["utilisation"],
                     "speed": None if np.isnan(r["speed"]) else r["speed"],
                     "speed_low": r["speed_low"], "speed_high": r["speed_high"],
                     "score": r["score"], "score_low": r["score_low"],
                     "score_high": r["score_high"], "verdict": verdict,
                     **{f"fit_{d}": fits[(b, d)] for d in args.kv_dtype}})
    share = w.prompt_share
    at = {d: fits[(rec.block_size, d)] for d in args.kv_dtype}
    fp8 = advice.fp8_verdict(at, f"{fit_words}, block {rec.block_size}", get("kernels_fp8"),
                             extra_table(directory, "kv_accuracy", device), share)
    serving = extra_table(directory, "serve_bench", device)
    rate, rate_words = advice.latency_bound_rate(serving, args.latency_slo_ms, rec.block_size)
    if serving is None:
        rate_words = (f"no serving data (no serve_bench*.csv in {shown_path(directory)})"
                      if directory is not None else "no serving data (no GPU data found)")
    return {
        "workload": {"name": workload, "num_requests": int(lengths.size),
                     "mean_length": float(lengths.mean()), "max_length": int(lengths.max()),
                     "prompt_share": share, "max_model_len": max_len},
        "device_data": None if directory is None else shown_path(directory),
        "block_size": {"best": rec.block_size, "tied": list(rec.tied),
                       "no_winner": rec.no_winner, "words": rec.words(), "basis": rec.basis,
                       "excluded": list(rec.excluded), "constraint": rec.constraint,
                       "utilisation_data": f"sim.static on {workload}"},
        "table": rows,
        "capacity": {"data": fit_words, "at_best_block": at},
        "latency_bound_rate": {"requests_per_s": rate, "data": rate_words,
                               "slo_ms": args.latency_slo_ms},
        "fp8": {"verdict": fp8.verdict, "evidence": fp8.evidence, "missing": fp8.missing,
                "numbers": fp8.numbers},
    }


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory where it lies under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def span(low, high, digits: int = 3) -> str:
    if low is None or high is None or low != low or high != high:
        return "-"
    return f"{low:.{digits}f}..{high:.{digits}f}"


def table_rows(doc: dict) -> list[dict]:
    return [r | {"speed_range": span(r["speed_low"], r["speed_high"]),
                 "score_range": span(r["score_low"], r["score_high"])} for r in doc["table"]]


def format_answer(doc: dict) -> str:
    w, b = doc["workload"], doc["block_size"]
    share = "" if w["prompt_share"] is None else f", {w['prompt_share']:.0%} of tokens prompt"
    dtypes = [k[4:] for k in doc["table"][0] if k.startswith("fit_")]
    columns = [(k, h, d if d is not None else 0) for k, h, d, _ in COLUMNS] + [
        (f"fit_{d}", f"fit {d}", 0) for d in dtypes]
    lines = [f"workload: {w['name']}; mean {w['mean_length']:,.0f} tokens, longest "
             f"{w['max_length']:,}{share}; max_model_len {w['max_model_len']:,}",
             f"device data: {doc['device_data'] or 'none found'}", "",
             "Block size: " + (b["words"] if b["no_winner"] else str(b["best"])),
             f"  utilisation: {b['utilisation_data']}",
             f"  speed: {b['basis']}"]
    if b["excluded"]:
        lines.append(f"  excluded ({b['constraint']}): " + ", ".join(map(str, b["excluded"])))
    lines += ["", format_table(table_rows(doc), columns), "", "columns:", legend(), "",
              f"Sequences that fit at block {b['best']}: " + ", ".join(
                  f"{n:,} ({d})" for d, n in doc["capacity"]["at_best_block"].items()),
              f"  data: {doc['capacity']['data']}", ""]
    rate = doc["latency_bound_rate"]
    lines.append("Latency-bound rate: " + (
        f"{rate['requests_per_s']:g} requests/s ({rate['data']})"
        if rate["requests_per_s"] is not None else rate["data"]))
    f = doc["fp8"]
    lines += ["", f"fp8 KV cache: {f['verdict']}"] + [f"  {e}" for e in f["evidence"]] + [
        f"  missing: {m}" for m in f["missing"]]
    return "\n".join(lines)


def run_recommend(args) -> int:
    check_output_file("--out", args.out)
    check_output_file("--html", args.html)
    doc = answer(args)
    if args.out:
        write_results(args.out, table_rows(doc), doc)
    if args.html:
        from pagebench.report.advice_page import write_page

        write_page(doc, args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    print(dumps(doc) if args.json else format_answer(doc))
    return 0
