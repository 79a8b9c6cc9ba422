"""A/B runs of paged-attention kernels: named variants on the same tensors, point by point.

At each point (batch, context, lengths, block size) one case is built, and every variant
(:mod:`pagebench.measure.ab_variants`) is first checked against the float64 reference on the
same tensors: its relative error on up to :data:`CHECK_SEQS` of the sequences (up to
:data:`CHECK_ROWS` query rows of each) against the kernels' ``TOLERANCE`` for the query
dtype (an fp8 cache's reference dequantises it exactly).
A variant that fails, raises or does not support the input gets a row that says so and is
not timed. The others are timed as the sweeps time (``timing.measure``: warm-up, median of
``repeat`` calls; on CUDA events with L2 flushed, from a CUDA graph where the call can be
captured; on a CPU wall clock on one thread) in ``rounds`` rounds that interleave the variants
(each round starts one variant later), so drift reaches every variant alike. A variant's time
is the median of its round medians, its band their min-max; its ratio to the baseline (the
first variant) is judged as "faster than the baseline" by ``analysis.noise.against``: holds
when the whole ratio band is below 1, does not hold when it is above, else within noise.

The routines: ``decode`` (one new query per sequence, ``paged_decode``), ``prefill`` (each
sequence's last ``query_len`` tokens, all of them by default, ``paged_prefill``) and ``mixed``
(``batch`` prefill chunks and ``decodes`` one-token decodes in one ``paged_prefill`` call, as
a chunked-prefill serving step sends them). A decode variant of the contiguous layout runs
the backend's contiguous kernel on the same K/V, copied out of the blocks once per point.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagebench.analysis.noise import Band, against
from pagebench.config import dtype_name
from pagebench.kernels import registry
from pagebench.measure.kernel_cases import (TOLERANCE, make_paged_inputs, quantized_inputs,
                                        relative_error)
from pagebench.kernels.quant import check_kv_scales, is_fp8
from pagebench.kernels.ragged import batch_lengths
from pagebench.kernels.reference import cumulative_offsets, gather_kv, reference_decode
from pagebench.measure.kernel_sweep import graph_modes
from pagebench.kernels.validate import check_decode, check_prefill
from pagebench.measure.ab_variants import ROUTINE_OPS, Variant, variant_call, variant_op
from pagebench.measure.timing import cpu_threads, environment, measure

# checked against the float64 reference per point: sequences, and query rows of each (evenly
# spaced, first and last included)
CHECK_SEQS = 8
CHECK_ROWS = 16
WARMUP = 3  # untimed calls before a variant's first round (1 before each later round)
CPU_NOTE = ("CPU wall clock: interpreted Triton and PyTorch references, a check of the "
            "variants and the driver, not kernel speed")
# the printed table (`options.format_table` columns; ``table_rows`` adds the text ones)
TABLE = [("variant", "variant", 0), ("batch", "batch", 0), ("context", "context", 0),
         ("lengths", "lengths", 0), ("block_size", "block", 0), ("cuda_graphs", "graph", 0),
         ("error_text", "error", 0, "relative error against the float64 reference"),
         ("check", "check", 0, "ok, wrong (error above tolerance), error, unsupported"),
         ("time_us", "time (us)", 1, "median of the rounds' medians"),
         ("ratio_text", "x baseline (min-max)", 0, "time / the baseline's, over the rounds"),
         ("faster", "faster than baseline", 0, "the ratio band below 1: holds")]


@dataclass(frozen=True)
class Point:
    batch: int  # sequences (prefill: chunks; mixed: prefill chunks beside the decodes)
    context: int  # mean tokens per sequence
    lengths: str  # a kernels.ragged spec: uniform, lognormal:MU,SIGMA, trace:NAME
    block_size: int


@dataclass(frozen=True)
class Setup:
    """What every point of a run shares."""
    routine: str
    device: str
    shape: tuple[int, int, int]  # (num_q_heads, num_kv_heads, head_dim)
    dtype: torch.dtype
    kv_dtype: torch.dtype
    query_len: int | None = None  # prefill, mixed: new tokens per chunk (None: whole sequences)
    decodes: int = 0  # mixed: one-token decodes in the call
    one_scale: bool = False  # fp8: one scale for every head (FlashInfer's)
    seed: int = 0
    repeat: int = 5
    rounds: int = 3
    cuda_graphs: str = "only"  # measure.kernel_sweep.graph_modes

    @property
    def op(self) -> str:
        return ROUTINE_OPS[self.routine]


def build_case(setup: Setup, point: Point):
    """The point's paged inputs (``measure.kernel_cases.PagedInputs``) and each sequence's query
    count: ``batch + decodes`` sequences with lengths of ``point.lengths`` around
    ``point.context``, blocks shuffled in the cache; for prefill and mixed, q holds each
    chunk's queries (the decodes' one each)."""
    lens = batch_lengths(point.lengths, point.batch + setup.decodes, point.context,
                         seed=setup.seed)
    case = make_paged_inputs(lens, *setup.shape, point.block_size, setup.dtype, setup.device,
                             seed=setup.seed, extra_blocks=0, extra_table_cols=0, poison=False)
    query_lens = [1] * len(lens)
    if setup.op == "prefill":
        query_lens = [min(setup.query_len or n, n) for n in lens[:point.batch]] + \
            [1] * setup.decodes
        case = with_queries(case, query_lens, setup.seed + 1)
    if is_fp8(setup.kv_dtype):  # each head's largest value maps to the format's
        case = quantized_inputs(case, setup.kv_dtype, spread=1.0, one_scale=setup.one_scale)
    check = check_decode if setup.op == "decode" else check_prefill
    check(*case.args(), None, "always")
    check_kv_scales(case.k_cache, case.k_scale, case.v_scale)
    return case, query_lens


def with_queries(case, query_lens: list[int], seed: int):
    """``case`` as a prefill input: ``query_lens[s]`` random queries for sequence s, packed."""
    num_q, head_dim = case.q.shape[1:]
    device = case.q.device
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(sum(query_lens), num_q, head_dim, generator=gen, device=device,
                    dtype=case.q.dtype)
    return dataclasses.replace(case, q=q,
                               query_start_loc=cumulative_offsets(query_lens, device))


def contiguous_args(case) -> tuple:
    """``contiguous_decode``'s tensors holding ``case``'s K/V: (q, k, v, seq_lens), the caches
    ``[num_seqs, longest, num_kv_heads, head_dim]``; seq_lens None when every sequence fills
    them (no mask, as the sweep times a uniform batch)."""
    k, v, _ = gather_kv(case.k_cache, case.v_cache, case.block_tables, case.seq_lens)
    longest = int(case.seq_lens.max())
    k, v = (x[:, :, :longest].transpose(1, 2).contiguous() for x in (k, v))
    full = bool((case.seq_lens == longest).all())
    return case.q, k, v, None if full else case.seq_lens


def evenly_spaced(n: int, most: int) -> list[int]:
    """Up to ``most`` of ``range(n)``, evenly spaced, first and last included."""
    if n <= most:
        return list(range(n))
    step = (n - 1) / (most - 1)
    return sorted({round(i * step) for i in range(most)})


def reference_rows(case, query_lens: list[int],
                   seqs: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the float64 reference of the checked query rows, their indices in q): up to
    :data:`CHECK_ROWS` rows of each sequence in ``seqs`` (``query_lens``: each sequence's
    query count), each row a query at its position seeing the keys up to it, so that a long
    chunk costs the reference no more than a few decodes."""
    rows, owners, lengths = [], [], []
    start = 0
    for s, (query_len, length) in enumerate(zip(query_lens, case.seq_lens.tolist())):
        if s in seqs:
            for j in evenly_spaced(query_len, CHECK_ROWS):
                rows.append(start + j)
                owners.append(s)
                lengths.append(length - query_len + j + 1)  # the row's position, plus one
        start += query_len
    device = case.q.device
    rows, owners = torch.tensor(rows, device=device), torch.tensor(owners, device=device)
    ref = reference_decode(case.q[rows], case.k_cache, case.v_cache, case.block_tables[owners],
                           torch.tensor(lengths, dtype=torch.int32), case.q.shape[-1] ** -0.5,
                           **case.scales())
    return ref, rows


@dataclass
class Outcome:
    """A variant's check at one point, and its call when the check passed."""
    check: str  # "ok", "wrong" (error above tolerance), "error" (raised), "unsupported"
    rel_error: float | None = None
    message: str = ""
    call: Callable[[], object] | None = None


def check_variant_output(setup: Setup, point: Point, case, variant: Variant, ref, rows,
                         tolerance: float, contiguous: Callable[[], tuple]) -> Outcome:
    """``variant`` run once on ``case`` (``contiguous()``: its tensors as a contiguous cache):
    its error on the checked rows against ``ref``."""
    backend = registry.get_backend(variant.backend)
    op = variant_op(variant, setup.routine)
    paged = op != "contiguous"
    if not paged and setup.kv_dtype != setup.dtype:
        return Outcome("unsupported", message=f"a contiguous cache holds {dtype_name(setup.dtype)}"
                       f", not {dtype_name(setup.kv_dtype)}")
    if not backend.supports(op, setup.device, setup.dtype, point.block_size if paged else None,
                            setup.shape[2], setup.kv_dtype if paged else None):
        return Outcome("unsupported", message=f"{variant.backend} {op} does not take this "
                       f"input: {backend.capabilities(setup.device)}")
    try:
        args, scales = (case.args(), case.scales()) if paged else (contiguous(), {})
        call = variant_call(variant, op, args, setup.shape[2] ** -0.5, scales)
        err = relative_error(call()[rows], ref)
    except Exception as e:  # noqa: BLE001 -- one variant's failure is its row, not the run's end
        return Outcome("error", message=_one_line(e))
    if not err < tolerance:  # NaN fails too
        return Outcome("wrong", err, f"relative error {err:.3g} is not below the tolerance "
                       f"{tolerance:g}: not timed")
    return Outcome("ok", err, call=call)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())[:200]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def time_rounds(calls: dict[str, Callable[[], object]], setup: Setup,
                graph: bool) -> dict[str, list]:
    """Each call timed (``timing.measure``) once per round, the rounds interleaving the
    calls, each round starting one call later: name -> the rounds' ``Timing``s."""
    names = list(calls)
    out: dict[str, list] = {n: [] for n in names}
    on_cuda = torch.device(setup.device).type == "cuda"
    for r in range(setup.rounds):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        for name in order:
            with cpu_threads(None if on_cuda else 1):  # one thread: steadier on a shared CPU
                out[name].append(measure(calls[name], device=setup.device,
                                         warmup=WARMUP if r == 0 else 1, repeat=setup.repeat,
                                         cuda_graph=graph))
    return out


def band(timings: list) -> Band:
    """A variant's time: the median of its round medians within their min-max (±NO_SPREAD
    assumed for one round)."""
    medians = sorted(t.median_us for t in timings)
    mid = statistics.median(medians)
    return Band.point(mid) if len(medians) < 2 else Band.of(mid, medians[0], medians[-1])


def run_point(setup: Setup, point: Point, variants: list[Variant],
              command: Callable[[Point, Variant, bool], str], env: dict) -> list[dict]:
    """The rows of one point: one per variant and CUDA-graph mode (see the module docstring)."""
    case, query_lens = build_case(setup, point)
    seqs = evenly_spaced(len(query_lens), CHECK_SEQS)
    ref, rows = reference_rows(case, query_lens, seqs)
    tolerance = TOLERANCE[setup.dtype]
    copies: list[tuple] = []  # the contiguous copy, made for the first variant that needs it

    def contiguous() -> tuple:
        if not copies:
            copies.append(contiguous_args(case))
        return copies[0]

    outcomes = {v.name: check_variant_output(setup, point, case, v, ref, rows, tolerance,
                                             contiguous) for v in variants}
    shared = {**point_columns(setup, point, env, case.seq_lens, query_lens),
              "tolerance": tolerance, "checked_seqs": len(seqs), "checked_rows": len(rows)}
    on_cuda = torch.device(setup.device).type == "cuda"
    modes = {v.name: graph_modes(setup.cuda_graphs, variant_op(v, setup.routine)
                                 in registry.get_backend(v.backend).graph_capturable, on_cuda)
             for v in variants}
    records = []
    for graph in sorted({g for m in modes.values() for g in m}):
        timed = [v for v in variants if graph in modes[v.name]]
        calls = {v.name: outcomes[v.name].call for v in timed if outcomes[v.name].call}
        bands = {n: band(t) for n, t in time_rounds(calls, setup, graph).items()}
        for v in timed:
            records.append({**shared, "cuda_graphs": graph,
                            **variant_columns(v, variants[0], outcomes[v.name], bands),
                            "command": command(point, v, graph)})
    return records


def point_columns(setup: Setup, point: Point, env: dict, seq_lens, query_lens) -> dict:
    """A row's columns that every variant at the point shares."""
    prefill = setup.op == "prefill"
    return {
        **env, "dirty": env["commit"].endswith("-dirty"), "routine": setup.routine,
        "num_q_heads": setup.shape[0], "num_kv_heads": setup.shape[1],
        "head_dim": setup.shape[2], "dtype": dtype_name(setup.dtype),
        "kv_dtype": dtype_name(setup.kv_dtype), "batch": point.batch, "context": point.context,
        "lengths": point.lengths, "block_size": point.block_size,
        "query_len": setup.query_len, "decodes": setup.decodes if prefill else None,
        "tokens": int(seq_lens.sum()), "query_tokens": sum(query_lens) if prefill else None,
        "seed": setup.seed, "rounds": setup.rounds, "repeat": setup.repeat,
        "note": None if torch.device(setup.device).type == "cuda" else CPU_NOTE,
    }


def variant_columns(variant: Variant, base: Variant, outcome: Outcome,
                    bands: dict[str, Band]) -> dict:
    """A row's columns of one variant: what it is, its check, its time and its ratio to the
    baseline ``base`` (``bands``: the timed variants' time bands, by name)."""
    mine, theirs = bands.get(variant.name), bands.get(base.name)
    ratio = mine / theirs if mine is not None and theirs is not None else None

    def part(b: Band | None, attr: str):
        return None if b is None else getattr(b, attr)

    return {
        "variant": variant.name, "backend": variant.backend, "layout": variant.layout,
        "launch": json.dumps(variant.launch, sort_keys=True), "baseline": base.name,
        "check": outcome.check, "rel_error": outcome.rel_error, "message": outcome.message,
        "time_us": part(mine, "value"), "time_lo_us": part(mine, "lo"),
        "time_hi_us": part(mine, "hi"), "ratio": part(ratio, "value"),
        "ratio_lo": part(ratio, "lo"), "ratio_hi": part(ratio, "hi"),
        "faster": None if ratio is None or variant.name == base.name
        else against(ratio, 1.0, above=False),
    }


def table_rows(rows: list[dict]) -> list[dict]:
    """``rows`` with the text columns of :data:`TABLE`: the error in scientific notation, the
    ratio with its band."""
    out = []
    for r in rows:
        err, ratio = r["rel_error"], r["ratio"]
        out.append({**r, "error_text": None if err is None else f"{err:.1e}",
                    "ratio_text": None if ratio is None
                    else f"{ratio:.3f} ({r['ratio_lo']:.3f}-{r['ratio_hi']:.3f})"})
    return out


def run_ab(setup: Setup, points: list[Point], variants: list[Variant],
           command: Callable[[Point, Variant, bool], str],
           progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Every point's rows (:func:`run_point`); ``command(point, variant, graph)``: the line
    that reproduces one row; ``progress``: called with each row."""
    if not variants:
        raise ValueError("variants: an A/B run needs at least one variant")
    graph_modes(setup.cuda_graphs, False, False)  # a bad mode fails before any work
    env = environment(setup.device)
    rows = []
    for point in points:
        for row in run_point(setup, point, variants, command, env):
            rows.append(row)
            if progress:
                progress(row)
        if torch.device(setup.device).type == "cuda":
            torch.cuda.empty_cache()
    return rows
