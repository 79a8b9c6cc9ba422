"""Time-stepped KV-memory simulation: where the budget goes while requests come and go.

Model
-----
Memory is a fixed budget of ``budget_tokens`` token slots. Time advances in decode steps.
Request ``i`` (see :class:`~pagebench.sim.trace.Workload`) arrives at step ``arrival[i]`` with
a prompt of ``P`` tokens, will generate ``O`` tokens, and runs ``n`` parallel samples. If it is
admitted at step ``a`` each sample holds ``P + (t - a) + 1`` tokens at step ``t`` (the prompt
and the first output token in the admission step, one more token per step after), reaches its
final length ``L = P + O`` at step ``a + O - 1`` and frees its memory at the end of that step.

Each step, in order: (1) arrivals join the back of the waiting queue; (2) running requests grow
(paged: a request whose last block is full takes a new one; if the pool is dry the newest
running request is preempted by recompute: its blocks are freed and it rejoins the *front* of
the queue, to recompute its prompt and generated tokens when re-admitted); (3) waiting requests
are admitted first-come first-served while memory allows, stopping at the first that does not
fit (no admissions in a step that preempted, as in vLLM); (4) the memory breakdown of the step
is recorded; (5) requests that produced their last token release their memory. The step loops
live in :mod:`pagebench.sim.dynamic_loops`; this module validates, summarises and tabulates.

Allocators
----------
- ``naive`` (reserve-max), ``pow2``, ``oracle``: contiguous. At admission each sample
  reserves one run of ``reserved_slots(allocator, L)`` slots (``max_len``; the next power of two
  of ``L``; exactly ``L``), placed first-fit in one address space of ``budget_tokens`` slots.
  Runs are freed whole, so holes appear between live runs.
- ``paged``: ``budget_tokens // block_size`` blocks; a sample holds
  ``ceil(tokens / block_size)`` blocks, taken one at a time as it grows. With ``cow=True`` and
  ``n > 1`` the samples share the prompt's full blocks (copy-on-write: the partly filled last
  prompt block is copied for all but one sample, counted in ``cow_copies``).
  With ``prefix_caching=True`` (one sample per request) full prompt blocks are shared between
  requests by the workload's ``hash_ids`` and kept cached after their requests end, under the
  rule and LRU policy of :mod:`pagebench.sim.prefix_cache`: at admission a request takes the
  leading cached blocks of its prompt (never its last prompt token) and allocates the rest;
  cached blocks that no running request holds are evicted, least recently used first, when
  an allocation needs them (before anyone is preempted) and count as ``free`` below. A
  workload without ``hash_ids`` shares nothing (hit rate 0).

Memory breakdown (token slots; the five parts sum to ``budget_tokens`` at every step)
-------------------------------------------------------------------------------------
- ``token_state``: slots holding the KV of a token that exists now (with copy-on-write a
  shared prompt token counts once).
- ``reserved_unused``: contiguous only: slots a running request reserved and *will* fill
  before it finishes (``L - tokens`` per sample). Paging reserves nothing ahead: always 0.
- ``internal_frag``: slots allocated to a running request that it will *never* fill:
  contiguous ``reservation - L`` per sample; paged the unfilled tail of each sample's last
  block (at most ``block_size - 1`` per sample) plus the ``budget_tokens % block_size`` slots
  that do not make a whole block.
- ``external_frag``: free slots that cannot be used because they are split into holes too
  small: at a step where the request at the head of the queue is refused although the total
  free memory is at least its reservation, *all* free slots count as external fragmentation
  (no hole is large enough for it). At any other step it is 0. Paged runs never have any,
  because any free block serves any request.
- ``free``: the remaining free slots.

These are the four categories of the vLLM paper's Figure 2 (token states, reservation,
internal and external fragmentation) plus free memory. ``stranded_free`` (contiguous only,
reported as a mean fraction) is the free memory outside the largest hole at every step,
whether or not a request is waiting: how much free memory a single new reservation could
not reach. Contiguous allocators give each of the ``n`` samples its own run (no sharing).

Summary row (one per allocator run; ``run_dynamic(...).summary``)
-----------------------------------------------------------------
``allocator``, ``block_size`` (None for contiguous), ``label`` (``naive``, ``paged-16``),
``budget_tokens``, ``num_requests``, ``cow``, ``num_steps`` (first arrival to last finish);
``token_state_fraction``, ``reserved_unused_fraction``, ``internal_fragmentation_fraction``,
``external_fragmentation_fraction``, ``free_fraction``: mean share of the budget over all steps
(they sum to 1); the same with ``_saturated``: over the steps where at least one request waits
(memory is the limit; None if there is no such step), ``saturated_step_fraction`` their share;
``allocated_utilisation``: token states / allocated slots (token states + reserved + internal);
``stranded_free_fraction``; ``peak_token_state_fraction``; ``mean_concurrency`` and
``peak_concurrency`` (running requests), ``mean_running_seqs`` (samples); ``tokens_per_step``:
output tokens of the whole workload / ``num_steps``; ``num_preemptions``,
``recomputed_tokens`` (KV tokens dropped by preemption, to be prefilled again);
``num_refused``: requests refused at the head of the queue at least once (memory, not the
``max_num_seqs`` cap); ``refused_with_enough_free``: those refused at least once while the total
free memory would have held them; ``cow_copies``; ``mean_wait_steps``, ``max_wait_steps``
(arrival to first admission). With ``prefix_caching``: ``prefix_caching`` (True for paged
rows), ``prefix_cache_hit_rate`` (prompt tokens taken from the cache at each request's first
admission / all prompt tokens) and ``prefix_blocks_saved`` (blocks taken from the cache instead
of allocated, over all admissions, re-admissions after preemption included); None on
contiguous rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pagebench.config import ceil_div
from pagebench.defaults import (REFERENCE_LENGTHS, REFERENCE_MAX_LEN, REFERENCE_NUM_REQUESTS,
                                REFERENCE_SEED)
from pagebench.sim.columns import DYNAMIC_LEGEND, legend_lines
from pagebench.errors import ConfigError
from pagebench.sim.dynamic_loops import (WINDOW_FIELDS, RunStats, Window, simulate_contiguous,
                                         simulate_paged)
from pagebench.sim.trace import MAX_TRACE_VALUE, Workload

CONTIGUOUS = ("naive", "pow2", "oracle")
ALLOCATORS = CONTIGUOUS + ("paged",)
CATEGORIES = ("token_state", "reserved_unused", "internal_frag", "external_frag", "free")
# budgets (token slots) whose per-step records and sums stay inside int64
MAX_BUDGET_TOKENS = 1 << 62
TIMELINE_COLUMNS = ("step", "allocator", "block_size", "label", "budget_tokens") + CATEGORIES + (
    "concurrency", "running_seqs", "waiting")


def _windows(records: list[Window]) -> dict[str, np.ndarray]:
    """The records as int64 columns named by :class:`Window`'s fields."""
    table = np.array(records, dtype=np.int64).reshape(-1, len(WINDOW_FIELDS))
    return {name: table[:, j] for j, name in enumerate(WINDOW_FIELDS)}


def _breakdown(paged: bool, tokens, allocated, final, ext, free) -> dict:
    """Memory by CATEGORIES from token states and the slots allocated (paged: whole blocks;
    contiguous: reservations, of which ``final`` slots the requests will fill). Steps or sums
    over steps alike."""
    return {
        "token_state": tokens,
        "reserved_unused": np.zeros_like(tokens) if paged else final - tokens,
        "internal_frag": allocated - tokens if paged else allocated - final,
        "external_frag": ext,
        "free": free,
    }


def _summarise(win, paged: bool, budget: int, w: Workload, stats: RunStats) -> dict:
    start, end = win["start"], win["end"]
    width = (end - start + 1).astype(np.float64)
    steps = float(width.sum())
    # tokens at step t: token_base + running (t + 1); summed over the window from the count at
    # its first step (exact in int64), so that late windows lose nothing to cancellation
    # (token_base is about -running x start: 1e10 steps in, float64 sums went negative)
    first = (win["token_base"] + win["running_seqs"] * (start + 1)).astype(np.float64)
    tokens = width * first + win["running_seqs"] * (width * (width - 1) / 2)
    totals = _breakdown(paged, tokens, width * win["allocated"], width * win["final"],
                        width * win["external_frag"], width * win["free"])
    saturated = win["waiting"] > 0
    sat_steps = float(width[saturated].sum())
    row = {"num_steps": int(steps)}
    names = {"token_state": "token_state_fraction", "reserved_unused": "reserved_unused_fraction",
             "internal_frag": "internal_fragmentation_fraction",
             "external_frag": "external_fragmentation_fraction", "free": "free_fraction"}
    for cat, name in names.items():
        row[name] = float(totals[cat].sum() / (steps * budget))
    for cat, name in names.items():
        row[name + "_saturated"] = (float(totals[cat][saturated].sum() / (sat_steps * budget))
                                    if sat_steps else None)
    held = totals["token_state"] + totals["reserved_unused"] + totals["internal_frag"]
    row["allocated_utilisation"] = float(tokens.sum() / held.sum()) if held.sum() else None
    row["stranded_free_fraction"] = float((width * win["stranded_free"]).sum() / (steps * budget))
    peak_tokens = win["token_base"] + win["running_seqs"] * (end + 1)
    row["peak_token_state_fraction"] = float(peak_tokens.max() / budget)
    row["saturated_step_fraction"] = sat_steps / steps
    row["mean_concurrency"] = float((width * win["concurrency"]).sum() / steps)
    row["peak_concurrency"] = int(win["concurrency"].max())
    row["mean_running_seqs"] = float((width * win["running_seqs"]).sum() / steps)
    row["tokens_per_step"] = float((w.output_len * w.n).sum() / steps)
    row["num_preemptions"] = stats.num_preemptions
    row["recomputed_tokens"] = stats.recomputed_tokens
    row["num_refused"] = stats.refused
    row["refused_with_enough_free"] = stats.refused_with_enough_free
    row["cow_copies"] = stats.cow_copies
    row["mean_wait_steps"] = float((stats.first_admit - w.arrival).mean())
    row["max_wait_steps"] = int((stats.first_admit - w.arrival).max())
    return row


def _timeline(win, paged: bool, every: int, with_key: bool) -> dict[str, np.ndarray]:
    """Rows at steps ``t`` with ``t % every == 0`` (all steps for ``every == 1``)."""
    start, end = win["start"], win["end"]
    first = ceil_div(start, every) * every
    counts = np.maximum(0, (end - first) // every + 1)
    idx = np.repeat(np.arange(start.size), counts)
    offsets = np.arange(idx.size) - np.repeat(np.cumsum(counts) - counts, counts)
    step = first[idx] + offsets * every
    tokens = win["token_base"][idx] + win["running_seqs"][idx] * (step + 1)
    cols = {
        "step": step,
        **_breakdown(paged, tokens, win["allocated"][idx], win["final"][idx],
                     win["external_frag"][idx], win["free"][idx]),
        "concurrency": win["concurrency"][idx],
        "running_seqs": win["running_seqs"][idx],
        "waiting": win["waiting"][idx],
    }
    if with_key:
        cols["running_key"] = win["running_key"][idx]
    return cols


def _validate(w, budget, allocators, block_sizes, max_len, max_num_seqs, cow=False,
              prefix_caching=False):
    if not isinstance(w, Workload):
        raise ConfigError(f"workload: expected a Workload, got {type(w).__name__}")
    if prefix_caching:
        if cow:
            raise ConfigError("prefix_caching: not with cow (prefix caching models one sample "
                              "per request)")
        if int(w.n.max()) > 1:
            raise ConfigError(f"prefix_caching: models one sample per request; the workload "
                              f"asks for n > 1 on {int((w.n > 1).sum()):,} requests")
    if not isinstance(budget, (int, np.integer)) or not 1 <= budget <= MAX_BUDGET_TOKENS:
        raise ConfigError(f"budget_tokens: must be an integer in 1..{MAX_BUDGET_TOKENS}, got "
                          f"{budget!r}")
    unknown = [a for a in allocators if a not in ALLOCATORS]
    if unknown or not allocators:
        raise ConfigError(f"allocators: unknown {unknown or allocators}; use {', '.join(ALLOCATORS)}")
    if "paged" in allocators:
        if not block_sizes or any(not isinstance(b, (int, np.integer))
                                  or not 1 <= b <= MAX_TRACE_VALUE for b in block_sizes):
            raise ConfigError(f"block_sizes: need integers in 1..{MAX_TRACE_VALUE}, got "
                              f"{block_sizes!r}")
    if not isinstance(max_len, (int, np.integer)) or not 2 <= max_len <= MAX_TRACE_VALUE:
        raise ConfigError(f"max_len: must be an integer in 2..{MAX_TRACE_VALUE}, got "
                          f"{max_len!r}")
    if int(w.length.max()) > max_len:
        raise ConfigError(f"max_len: a request of {int(w.length.max())} tokens exceeds "
                          f"max_len={max_len}")
    if max_num_seqs is not None and (not isinstance(max_num_seqs, int)
                                     or max_num_seqs < int(w.n.max())):
        raise ConfigError(f"max_num_seqs: must be an integer >= the largest n "
                          f"({int(w.n.max())}), got {max_num_seqs!r}")


@dataclass
class DynamicResult:
    """Output of :func:`run_dynamic`.

    ``summary``: one dict per allocator run (tidy rows; fractions are shares of the budget).
    ``timeline``: tidy rows, one per recorded step and allocator run, with the columns of
    ``TIMELINE_COLUMNS`` (breakdown in token slots; they sum to ``budget_tokens``).
    """

    budget_tokens: int
    workload: dict
    summary: list[dict]
    timeline_columns: dict[str, np.ndarray] = field(repr=False)
    timeline_every: int = 1

    @property
    def timeline(self) -> list[dict]:
        cols = self.timeline_columns
        keys = list(cols)
        lists = [cols[k].tolist() for k in keys]
        return [dict(zip(keys, values)) for values in zip(*lists)]

    def summary_frame(self):
        import pandas as pd

        return pd.DataFrame(self.summary)

    def timeline_frame(self):
        import pandas as pd

        return pd.DataFrame(self.timeline_columns)

    def to_dict(self) -> dict:
        return {"budget_tokens": self.budget_tokens, "workload": self.workload,
                "timeline_every": self.timeline_every, "results": self.summary}


def label(allocator: str, block_size: int | None) -> str:
    """Short name of an allocator run: ``naive``, ``oracle``, ``paged-16``."""
    return f"{allocator}-{block_size}" if allocator == "paged" else allocator


def _run_one(workload, budget, allocator, block_size, max_len, cow, max_num_seqs,
             prefix_caching=False):
    paged = allocator == "paged"
    if paged:
        records, stats = simulate_paged(workload, budget, int(block_size), cow, max_num_seqs,
                                         prefix_caching)
    else:
        records, stats = simulate_contiguous(workload, budget, allocator, max_len, max_num_seqs)
    win = _windows(records)
    row = {"allocator": allocator, "block_size": int(block_size) if paged else None,
           "label": label(allocator, block_size), "budget_tokens": budget,
           "num_requests": workload.num_requests, "cow": bool(cow and paged)}
    row |= _summarise(win, paged, budget, workload, stats)
    if prefix_caching:
        row["prefix_caching"] = paged
        prompt_tokens = int(workload.prompt_len.sum())
        row["prefix_cache_hit_rate"] = stats.prefix_hit_tokens / prompt_tokens if paged else None
        row["prefix_blocks_saved"] = stats.prefix_blocks_saved if paged else None
    return row, win


def simulate_allocator(workload: Workload, budget_tokens: int, allocator: str,
                       block_size: int | None = None, *, max_len: int = 4096, cow: bool = False,
                       max_num_seqs: int | None = None, timeline_every: int = 1,
                       with_running_key: bool = False,
                       prefix_caching: bool = False) -> tuple[dict, dict[str, np.ndarray]]:
    """One allocator on one workload: ``(summary row, timeline columns)``; see the module doc.

    The timeline columns here are those of ``TIMELINE_COLUMNS`` without ``allocator``,
    ``block_size`` and ``budget_tokens`` (plus ``running_key`` when asked: an
    order-independent fingerprint of which requests run and how many tokens each holds).
    """
    _validate(workload, budget_tokens, (allocator,), (block_size,) if allocator == "paged"
              else (), max_len, max_num_seqs, cow, prefix_caching)
    _check_every(timeline_every)
    row, win = _run_one(workload, int(budget_tokens), allocator, block_size, max_len, cow,
                        max_num_seqs, prefix_caching)
    return row, _timeline(win, allocator == "paged", int(timeline_every), with_running_key)


def _check_every(every):
    if not isinstance(every, (int, np.integer)) or isinstance(every, bool) or every < 1:
        raise ConfigError(f"timeline_every: must be a positive integer, got {every!r}")


def run_dynamic(workload: Workload, budget_tokens: int, allocators=ALLOCATORS,
                block_sizes=(16,), *, max_len: int = 4096, cow: bool = False,
                max_num_seqs: int | None = None, timeline_every: int | None = None,
                max_timeline_rows: int = 2000, with_running_key: bool = False,
                prefix_caching: bool = False, progress=None) -> DynamicResult:
    """Simulate every allocator (``paged`` once per block size) on ``workload``.

    ``timeline_every``: record every k-th step in the timeline (summaries always use every
    step); ``None`` picks the smallest k that keeps the longest run within
    ``max_timeline_rows`` rows. All runs share the same sampled steps.
    Returns a :class:`DynamicResult`; ``block_size`` is None (summary) or 0 (timeline) for
    contiguous allocators, and both carry a ``label`` such as ``paged-16``. ``progress``, if
    given, is called with each run's label when it is done.
    """
    allocators = tuple(allocators)
    block_sizes = tuple(int(b) if isinstance(b, (int, np.integer)) else b for b in block_sizes)
    _validate(workload, budget_tokens, allocators, block_sizes, max_len, max_num_seqs, cow,
              prefix_caching)
    if timeline_every is not None:
        _check_every(timeline_every)
    plans = [(a, None) for a in dict.fromkeys(allocators) if a != "paged"]
    if "paged" in allocators:
        plans += [("paged", b) for b in dict.fromkeys(block_sizes)]
    runs = []
    for a, b in plans:
        runs.append(_run_one(workload, int(budget_tokens), a, b, max_len, cow, max_num_seqs,
                             prefix_caching))
        if progress:
            progress(label(a, b))
    every = timeline_every
    if every is None:
        longest = max(row["num_steps"] for row, _ in runs)
        every = max(1, math.ceil(longest / max_timeline_rows)) if max_timeline_rows else 1
    rows, parts = [], []
    for (allocator, bs), (row, win) in zip(plans, runs):
        rows.append(row)
        cols = _timeline(win, allocator == "paged", int(every), with_running_key)
        size = cols["step"].size
        parts.append({"step": cols["step"], "allocator": np.full(size, allocator, dtype=object),
                      "block_size": np.full(size, bs or 0, dtype=np.int64),
                      "label": np.full(size, label(allocator, bs), dtype=object),
                      "budget_tokens": np.full(size, int(budget_tokens), dtype=np.int64)}
                     | {k: v for k, v in cols.items() if k != "step"})
    timeline = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return DynamicResult(int(budget_tokens), workload.describe(), rows, timeline, int(every))


# The reference workload: the article's lengths arriving faster than any allocator serves them,
# in the article's 12.4 GB of Qwen2.5-0.5B cache (1,009,104 token slots).
REFERENCE = dict(lengths=REFERENCE_LENGTHS, rate=20.0, prompt_fraction=0.3,
                 max_len=REFERENCE_MAX_LEN, seed=REFERENCE_SEED)


def reference_run(num_requests: int = REFERENCE_NUM_REQUESTS, block_sizes=(16,),
                  **kwargs) -> DynamicResult:
    """:func:`run_dynamic` on :data:`REFERENCE` with the article's budget
    (``pagebench simulate --dynamic`` with no options). ``kwargs`` go to :func:`run_dynamic`
    (``allocators``, ``cow``, ``max_timeline_rows`` ...)."""
    from pagebench.sim.capacity import article_budget_tokens
    from pagebench.sim.trace import poisson_workload

    ref = REFERENCE
    workload = poisson_workload(num_requests, ref["rate"], ref["lengths"],
                                prompt_fraction=ref["prompt_fraction"], seed=ref["seed"],
                                max_len=ref["max_len"])
    return run_dynamic(workload, article_budget_tokens(), block_sizes=block_sizes,
                       max_len=ref["max_len"], **kwargs)


def format_dynamic_table(result: DynamicResult) -> str:
    """Human-readable summary of a :class:`DynamicResult` (fractions of the budget)."""
    wl = result.workload
    clipped = (f", {wl['num_clipped']:,} clipped to max_model_len {wl['max_model_len']:,}"
               if wl.get("num_clipped") else "")
    lines = [f"{wl['num_requests']:,} requests ({wl['source']}), mean length "
             f"{wl['mean_length']:.0f} tokens{clipped}; budget {result.budget_tokens:,} token "
             f"slots", "",
             "mean share of the budget over all steps:",
             f"{'allocator':<18}{'tokens':>8}{'reserved':>10}{'internal':>10}{'external':>10}"
             f"{'free':>7}{'util':>7}{'conc':>8}{'peak':>6}{'tok/step':>10}{'refused':>9}"
             f"{'waited':>8}{'frag-ref':>9}{'wait':>8}{'preempt':>9}{'steps':>9}"]
    for r in result.summary:
        name = r["label"]
        lines.append(
            f"{name:<18}{r['token_state_fraction']:>8.1%}{r['reserved_unused_fraction']:>10.1%}"
            f"{r['internal_fragmentation_fraction']:>10.1%}"
            f"{r['external_fragmentation_fraction']:>10.1%}{r['free_fraction']:>7.1%}"
            f"{r['allocated_utilisation'] or 0:>7.1%}{r['mean_concurrency']:>8.1f}"
            f"{r['peak_concurrency']:>6}{r['tokens_per_step']:>10.1f}"
            + (f"{'-':>9}{r['num_refused']:>8,}" if r["allocator"] == "paged"
               else f"{r['num_refused']:>9,}{'-':>8}")
            + f"{r['refused_with_enough_free']:>9,}{r.get('mean_wait_steps') or 0:>8.1f}"
            f"{r['num_preemptions']:>9,}{r['num_steps']:>9,}")
    lines += ["", "while requests wait (memory-bound steps):",
              f"{'allocator':<18}{'tokens':>8}{'reserved':>10}{'internal':>10}{'external':>10}"
              f"{'free':>7}{'share of steps':>16}"]
    for r in result.summary:
        name = r["label"]
        if r["token_state_fraction_saturated"] is None:
            lines.append(f"{name:<18}  (never saturated)")
            continue
        lines.append(
            f"{name:<18}{r['token_state_fraction_saturated']:>8.1%}"
            f"{r['reserved_unused_fraction_saturated']:>10.1%}"
            f"{r['internal_fragmentation_fraction_saturated']:>10.1%}"
            f"{r['external_fragmentation_fraction_saturated']:>10.1%}"
            f"{r['free_fraction_saturated']:>7.1%}{r['saturated_step_fraction']:>16.1%}")
    cached = [r for r in result.summary if r.get("prefix_cache_hit_rate") is not None]
    if cached:
        lines += ["", "prefix caching (prompt tokens served from cache / prompt tokens):"]
        lines += [f"{r['label']:<18}hit rate {r['prefix_cache_hit_rate']:.1%}, "
                  f"{r['prefix_blocks_saved']:,} blocks taken from the cache" for r in cached]
    lines += ["", "columns:", *legend_lines(DYNAMIC_LEGEND)]
    return "\n".join(lines)
