"""The Triton paged prefill before and after ``query_start_loc`` (one GPU, one process).

Runbook for ``reports/data/<machine>/prefill_old_new.csv`` (read by docs/kernels.md, no dataset
of the report): the kernel as it was on main before the change (``--old``: that
``triton_prefill.py``, which takes ``query_lens`` and scans them) against this checkout's
(``query_start_loc``; a tile's sequence found by one vector load of the offsets up to
``VECTOR_SEARCH_SEQS`` sequences, by a binary search above), on the same tensors, Llama-3-8B
heads (32 q / 8 kv, head dim 128), bf16, blocks of 16 and 128:

1. correctness: each kernel's output written over NaN-poisoned memory (unused cache slots are
   NaN too), against a float64 reference computed on the GPU, on ragged batches (chunks
   after a prefix, whole prompts, single queries; the new kernel also with sequences without
   queries) and on every timed point;
   2. timing: CUDA-event medians of CUDA-graph replays after warm-up (``pagebench.measure.timing``),
   at whole prompts (1 x 2k, 1 x 8k, 8 x 512, 64 x 256, 128 x 128) and chunks after a cached prefix
   (8 x 256 after 2k). Variants: ``old`` (its default launch), ``old-scan`` (its default without the
   work list, where it takes one), ``new`` (the default launch), ``new-binary`` (the default launch
   with the binary search where the default takes the vector search), ``new-tile_n-32`` (the 128-row
   launch with 32-key tiles, which do not spill) and, for each schedule the new default takes,
   ``new-no-<schedule>`` (that schedule off), which decide which search, tile and schedules stay;
3. the registers and spills of each new kernel compiled (Triton's ``n_regs``/``n_spills``).

Run from the repository root on a CUDA machine (``--old``: a commit of this repository, whose
``triton_prefill.py`` is read with ``git show``, or a copy of that file; 614cada is main before
``query_start_loc``)::

    python scripts/prefill_old_vs_new.py --old 614cada --out /tmp/prefill_old_new

(``--smoke``: the same on a CPU, interpreted, at tiny sizes, timed once: a check of the script,
a few minutes.) It prints a table (old/new ratio per point) last and writes
``prefill_old_new.csv`` (one row per point and variant, with the device, versions and commit)
to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's pagebench
# isort: split
from pagebench.kernels import triton_prefill
from pagebench.kernels.reference import cumulative_offsets
from pagebench.kernels.triton_prefill import (LONG_CHUNK_TILE_N, MAX_ROWS, prefill_launch,
                                               search_width, triton_paged_prefill)
from pagebench.measure.kernel_cases import TOLERANCE, make_paged_inputs, relative_error
from pagebench.measure.timing import environment, measure


@dataclasses.dataclass
class Setup:
    device: str = "cuda"
    shape: tuple = (32, 8, 128)  # Llama-3-8B: query heads, KV heads, head dim
    dtype: torch.dtype = torch.bfloat16
    block_sizes: tuple = (16, 128)
    # (batch, query_len, cached): whole prompts, then chunks after a cached prefix
    points: tuple = ((1, 2048, 0), (1, 8192, 0), (8, 512, 0), (64, 256, 0), (128, 128, 0),
                     (8, 256, 2048))
    # (seq_lens, query_lens): ragged batches checked against float64
    ragged: tuple = (([300, 1, 77, 1000], [300, 1, 20, 128]),
                     ([2048, 513, 64], [2048, 200, 1]),
                     ([129, 4000, 17, 17, 900], [1, 700, 17, 5, 899]))
    rules: dict = dataclasses.field(default_factory=dict)  # prefill_launch's device keywords


# --smoke: the script's own logic on a CPU, interpreted, at tiny sizes, with the launches the
# rules pick on an H100 (132 SMs, Hopper) forced
SMOKE = Setup(device="cpu", shape=(8, 2, 64), dtype=torch.float16, block_sizes=(16,),
              points=((1, 40, 0), (40, 8, 0), (3, 20, 30)), ragged=(([30, 1, 9], [30, 1, 5]),),
              rules=dict(sm_count=1, hopper=True))
SCHEDULES = ("one_loop", "table_ahead", "lazy_rescale")
CHECK_REFERENCE_QUERIES = 2048  # a timed point is checked against float64 up to this many


def load_old(old: str):
    """main's ``triton_prefill`` module, loaded under another name from the file ``old`` or, if
    there is no such file, from that file at commit ``old`` of this repository."""
    path = old
    if not Path(old).is_file():
        root = Path(__file__).resolve().parent.parent
        source = subprocess.run(["git", "-C", str(root), "show",
                                 f"{old}:pagebench/kernels/triton_prefill.py"],
                                capture_output=True, text=True)
        if source.returncode != 0:
            print(f"--old {old}: neither a file nor a commit with the kernel "
                  f"({source.stderr.strip()})", file=sys.stderr)
            raise SystemExit(2)
        path = Path(tempfile.mkdtemp()) / "old_triton_prefill.py"
        path.write_text(source.stdout, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("old_triton_prefill", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def reference64(q, k_cache, v_cache, tables, seq_lens, starts, scale):
    """Causal paged prefill in float64 on q's device, one sequence at a time."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    block_size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    bounds = starts.tolist()
    for s, n in enumerate(seq_lens.tolist()):
        a, b = bounds[s], bounds[s + 1]
        if a == b:
            continue
        ids = tables[s, :math.ceil(n / block_size)].long()
        k = k_cache[ids].flatten(0, 1)[:n].double().repeat_interleave(group, 1)  # [n, Hq, D]
        v = v_cache[ids].flatten(0, 1)[:n].double().repeat_interleave(group, 1)
        qs = q[a:b].double()
        scores = torch.einsum("thd,nhd->htn", qs, k) * scale
        visible = torch.arange(n, device=q.device)[None, :] <= torch.arange(
            n - (b - a), n, device=q.device)[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[a:b] = torch.einsum("htn,nhd->thd", scores.softmax(-1), v)
    return out


def poisoned_call(fn):
    """``fn()`` after the caching allocator's free memory of the output's size was filled with
    NaN, so rows a kernel leaves unwritten read NaN."""
    def run(q):
        junk = torch.full(q.shape, float("nan"), device=q.device, dtype=q.dtype)
        del junk
        return fn()
    return run


def case(setup, seq_lens, query_lens, block_size, seed=0):
    device, (q_heads, kv_heads, head_dim) = setup.device, setup.shape
    inp = make_paged_inputs(seq_lens, q_heads, kv_heads, head_dim, block_size, setup.dtype,
                            device, seed=seed, poison_value=float("nan"))
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    q = torch.randn(sum(query_lens), q_heads, head_dim, device=device, dtype=setup.dtype,
                    generator=gen)
    lens = torch.tensor(query_lens, dtype=torch.int32, device=device)
    return q, inp, lens, cumulative_offsets(query_lens, device)


def calls(setup, old, q, inp, lens, starts, scale):
    """The variants at one input: name -> a no-argument call, and the new default launch
    (the rules' choice for a CUDA device; on a CPU, ``--smoke``, it is forced)."""
    args = (q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens)
    total, num_seqs = q.shape[0], lens.shape[0]
    (q_heads, kv_heads, head_dim), cuda = setup.shape, torch.device("cuda")
    max_keys = inp.block_tables.shape[1] * inp.k_cache.shape[1]
    launch = prefill_launch(head_dim, setup.dtype, cuda, group=q_heads // kv_heads,
                            kv_heads=kv_heads, total=total, sequences=num_seqs,
                            max_keys=max_keys, **setup.rules)
    forced = {} if q.is_cuda else {"launch": launch}
    variants = {"old": lambda: old.triton_paged_prefill(*args, lens, scale),
                "new": lambda: triton_paged_prefill(*args, starts, scale, **forced)}
    group_rows = max(16, 1 << (max(64, q_heads // kv_heads) - 1).bit_length())
    old_choice = old.prefill_launch(
        head_dim, setup.dtype, cuda, mean_chunk=-(-total // num_seqs),
        programs=old._grid_size(total, num_seqs, group_rows // (q_heads // kv_heads), kv_heads,
                                max_keys),
        max_keys=max_keys, sequences=num_seqs, sm_count=setup.rules.get("sm_count"))
    if old_choice.work_list:
        variants["old-scan"] = lambda: old.triton_paged_prefill(*args, lens, scale,
                                                                work_list=False)
    if search_width(num_seqs):
        variants["new-binary"] = binary_search(lambda: triton_paged_prefill(*args, starts, scale,
                                                                            **forced))
    if launch.tile_n == LONG_CHUNK_TILE_N and launch.rows == MAX_ROWS:
        narrow = dataclasses.replace(launch, tile_n=32)  # the 128-row launch without its spill
        variants["new-tile_n-32"] = lambda: triton_paged_prefill(*args, starts, scale,
                                                                 launch=narrow)
    for field in SCHEDULES:
        if getattr(launch, field):
            off = dataclasses.replace(launch, **{field: False},
                                      **({"table_ahead": False} if field == "one_loop" else {}))
            variants[f"new-no-{field}"] = (
                lambda off=off: triton_paged_prefill(*args, starts, scale, launch=off))
    return variants, launch


def binary_search(fn):
    """``fn`` with the kernel's sequence found by the binary search whatever the sequence count
    (the kernel's constexpr is set at the launch, so a CUDA graph captured here keeps it)."""
    def run():
        width = triton_prefill.VECTOR_SEARCH_SEQS
        triton_prefill.VECTOR_SEARCH_SEQS = 0
        try:
            return fn()
        finally:
            triton_prefill.VECTOR_SEARCH_SEQS = width
    return run


def check(name, out, ref, dtype) -> tuple[bool, float]:
    nan = bool(torch.isnan(out).any())
    err = relative_error(out, ref)
    ok = not nan and err < TOLERANCE[dtype]
    print(f"  check {name:>24}: error {err:.2e}{' NaN' if nan else ''} {'ok' if ok else 'FAIL'}",
          flush=True)
    return ok, err


def record_compiled(module: str) -> list:
    """A list that collects (constexprs and options, compiled kernel) of every launch Triton
    makes of a kernel defined in ``module`` from now on (the first launch of each
    specialisation: later ones skip Triton's launch path)."""
    from triton.runtime.jit import JITFunction

    seen, run = [], JITFunction.run

    def recorded(self, *args, **kwargs):
        kernel = run(self, *args, **kwargs)
        if self.fn.__module__ == module:
            seen.append((kwargs, kernel))
        return kernel
    JITFunction.run = recorded
    return seen


def check_ragged(setup, old, scale) -> int:
    """Failures on the ragged batches: every variant, then the new kernel with every other
    sequence's queries left out (no queries: equal offsets)."""
    failures = 0
    for block_size in setup.block_sizes:
        for seed, (seq_lens, query_lens) in enumerate(setup.ragged):
            q, inp, lens, starts = case(setup, seq_lens, query_lens, block_size, seed)
            tensors = (inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens)
            ref = reference64(q, *tensors, starts, scale)
            variants, _ = calls(setup, old, q, inp, lens, starts, scale)
            print(f" block {block_size} seq_lens {seq_lens} query_lens {query_lens}")
            for name, fn in variants.items():
                failures += not check(name, poisoned_call(fn)(q), ref, setup.dtype)[0]
            some = [n if i % 2 else 0 for i, n in enumerate(query_lens)]
            bounds = starts.tolist()
            q_some = torch.cat([q[bounds[i]:bounds[i + 1]] for i, n in enumerate(some) if n])
            some_starts = cumulative_offsets(some, setup.device)
            out = poisoned_call(lambda: triton_paged_prefill(q_some, *tensors, some_starts,
                                                             scale))(q_some)
            failures += not check(f"new, queries {some}", out,
                                  reference64(q_some, *tensors, some_starts, scale),
                                  setup.dtype)[0]
    return failures


def time_points(setup, old, scale, repeat, writer, env) -> tuple[list, int]:
    """Rows of every timed variant at every point (each checked first), and the failures."""
    rows, failures = [], 0
    for block_size in setup.block_sizes:
        for batch, query_len, cached in setup.points:
            q, inp, lens, starts = case(setup, [cached + query_len] * batch,
                                        [query_len] * batch, block_size, seed=3)
            variants, launch = calls(setup, old, q, inp, lens, starts, scale)
            ref = None
            if batch * query_len <= CHECK_REFERENCE_QUERIES:
                ref = reference64(q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens,
                                  starts, scale)
            print(f" block {block_size} {batch} x {query_len} after {cached}: {launch}",
                  flush=True)
            base = None
            for name, fn in variants.items():
                out = poisoned_call(fn)(q)
                if ref is None:  # long points: against the old kernel's output
                    base = out.double() if name == "old" else base
                    ok, err = check(name + " vs old", out, base, setup.dtype)
                else:
                    ok, err = check(name, out, ref, setup.dtype)
                failures += not ok
                t = measure(fn, device=setup.device, warmup=3 if q.is_cuda else 0,
                            repeat=repeat, cuda_graph=q.is_cuda)
                row = dict(block_size=block_size, batch=batch, query_len=query_len,
                           cached=cached, variant=name,
                           launch=repr(launch) if name.startswith("new") else "",
                           time_us=round(t.median_us, 2), error=f"{err:.2e}", **env)
                rows.append(row)
                writer.writerow(row)
                print(f"   {name:>24}: {t.median_us:9.1f} us", flush=True)
            del q, inp, ref, base
            if setup.device == "cuda":
                torch.cuda.empty_cache()
    return rows, failures


def print_table(rows) -> None:
    print("\nold/new (> 1: the new kernel is faster); other variants as variant/new (> 1: "
          "slower than new)")
    print(f"{'block':>5} {'point':>14} {'old us':>9} {'new us':>9} {'old/new':>8}  others")
    by_point = {}
    for r in rows:
        by_point.setdefault((r["block_size"], r["batch"], r["query_len"], r["cached"]),
                            {})[r["variant"]] = r["time_us"]
    for (block, batch, query_len, cached), times in by_point.items():
        new = times["new"]
        others = " ".join(f"{k}={v / new:.3f}" for k, v in times.items()
                          if k not in ("old", "new"))
        point = f"{batch}x{query_len}" + (f"+{cached}" if cached else "")
        print(f"{block:>5} {point:>14} {times['old']:9.1f} {new:9.1f} "
              f"{times['old'] / new:8.3f}  {others}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True,
                        help="a commit (e.g. 614cada) or a copy of its triton_prefill.py")
    parser.add_argument("--out", required=True, help="directory for prefill_old_new.csv")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed replays a variant (default 30; --smoke: 1)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on a CPU (interpreted)")
    args = parser.parse_args()
    setup = SMOKE if args.smoke else Setup()
    if setup.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    old = load_old(args.old)
    compiled = record_compiled("pagebench.kernels.triton_prefill")
    env = environment(setup.device)
    scale = setup.shape[2] ** -0.5
    print(f"{env['device_name']} torch {env['torch_version']} triton {env['triton_version']} "
          f"commit {env['commit']}", flush=True)
    started = time.perf_counter()
    print("correctness, ragged batches (float64):", flush=True)
    failures = check_ragged(setup, old, scale)
    print(f"  ({time.perf_counter() - started:.0f} s)\ntimed points:", flush=True)
    path = out_dir / "prefill_old_new.csv"
    columns = ["block_size", "batch", "query_len", "cached", "variant", "launch", "time_us",
               "error", *env]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        repeat = args.repeat or (1 if args.smoke else 30)
        rows, failed = time_points(setup, old, scale, repeat, writer, env)
    failures += failed
    print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)

    print("\nnew kernels compiled ([ROWS, TILE_N, BLOCK_SIZE, ONE_LOOP, TABLE_AHEAD, LAZY, VOTE, "
          "SEARCH_WIDTH, num_warps, num_stages, maxnreg], n_regs, n_spills):")
    spills = 0
    keys = ("ROWS", "TILE_N", "BLOCK_SIZE", "ONE_LOOP", "TABLE_AHEAD", "LAZY", "VOTE",
            "SEARCH_WIDTH", "num_warps", "num_stages", "maxnreg")
    for kwargs, kernel in compiled:
        regs, n_spills = getattr(kernel, "n_regs", None), getattr(kernel, "n_spills", 0)
        print(f"  {[kwargs.get(k) for k in keys]} regs {regs} spills {n_spills}")
        spills += bool(n_spills)
    print_table(rows)
    print(f"\nfailures: {failures}; kernels that spilled: {spills}; csv: {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
