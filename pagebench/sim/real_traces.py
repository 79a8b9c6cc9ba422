"""Real serving traces: the Azure LLM 2023 and Mooncake formats, and the traces shipped by name.

A :class:`Trace` is what a file says: arrival times in seconds from the first request, prompt
and output lengths, and (Mooncake) the ``hash_ids`` of each prompt's 512-token blocks.
:meth:`Trace.to_workload` replays it in the time-stepped simulator at ``step_ms`` milliseconds
per decode step, clipping requests longer than ``max_model_len``.

Formats, detected from the columns:

- Azure (CSV): ``TIMESTAMP`` (wall clock, ``2023-11-16 18:17:03.9799600``), ``ContextTokens``,
  ``GeneratedTokens``;
- Mooncake (JSONL): ``timestamp`` (milliseconds), ``input_length``, ``output_length``,
  ``hash_ids`` (``ceil(input_length / 512)`` integers);
- anything else: the step-based schema of :func:`pagebench.sim.trace.read_trace`.

Files may be gzip-compressed (``.gz``). The shipped traces live in ``pagebench/data/traces``
(see the README there for their sources, licences and attribution).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from pagebench.defaults import ENGINE_BLOCK_SIZES
from pagebench.errors import ConfigError, check_positive_int
from pagebench.sim.trace import (HASH_BLOCK_TOKENS, MAX_TRACE_VALUE, Workload, open_text,
                                 read_trace)

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "traces"
# name -> file in DATA_DIR
NAMED_TRACES = {
    "azure-code": "azure_llm_2023_code.csv.gz",
    "azure-conv": "azure_llm_2023_conv.csv.gz",
    "mooncake-conv": "mooncake_conversation.jsonl.gz",
}
# One decode step of the replay: 20 ms, i.e. 50 steps per second.
DEFAULT_STEP_MS = 20.0
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_COLUMNS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True)
class Trace:
    """Requests as a trace file gives them, in file order.

    ``arrival_s`` (float64, seconds from the earliest request), ``prompt_len`` and
    ``output_len`` (int64, >= 1), ``hash_ids`` (Mooncake: one int64 array per request, else
    None), ``source`` (the trace's name or path).
    """

    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    hash_ids: tuple | None
    source: str

    @property
    def num_requests(self) -> int:
        return int(self.prompt_len.size)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s.max() - self.arrival_s.min())

    def sample(self, num_requests: int, seed: int = 0) -> Trace:
        """``num_requests`` requests drawn without replacement, kept in arrival order, their
        arrivals shifted so that the first is at 0 (the whole trace if it has no more)."""
        check_positive_int("num_requests", num_requests)
        if num_requests >= self.num_requests:
            return self
        rng = np.random.default_rng(seed)
        keep = np.sort(rng.choice(self.num_requests, num_requests, replace=False))
        arrival = self.arrival_s[keep]
        ids = None if self.hash_ids is None else tuple(self.hash_ids[i] for i in keep.tolist())
        return Trace(arrival - arrival.min(), self.prompt_len[keep], self.output_len[keep], ids,
                     f"{self.source} (sample of {num_requests:,}, seed {seed})")

    @property
    def default_max_model_len(self) -> int:
        """The smallest power of two that holds the longest request: clips nothing."""
        return 1 << (int((self.prompt_len + self.output_len).max()) - 1).bit_length()

    def head(self, num_requests: int) -> Trace:
        """The first ``num_requests`` requests by arrival (the whole trace if it has no more):
        unlike :meth:`sample`, this keeps the conversations' reuse within the window."""
        check_positive_int("num_requests", num_requests)
        if num_requests >= self.num_requests:
            return self
        keep = np.argsort(self.arrival_s, kind="stable")[:num_requests]
        ids = None if self.hash_ids is None else tuple(self.hash_ids[i] for i in keep.tolist())
        return Trace(self.arrival_s[keep], self.prompt_len[keep], self.output_len[keep], ids,
                     f"{self.source} (first {num_requests:,} requests)")

    def to_workload(self, step_ms: float = DEFAULT_STEP_MS, max_model_len: int | None = None,
                    max_output_len: int | None = None) -> Workload:
        """The trace in decode steps of ``step_ms`` ms (arrival step = floor(seconds * 1000 /
        step_ms)), with every request clipped to ``max_model_len`` tokens by
        :func:`clip_lengths` (default :attr:`default_max_model_len`), its output first cut to
        ``max_output_len`` tokens if given (short replays on a CPU)."""
        if not (isinstance(step_ms, (int, float)) and math.isfinite(step_ms) and step_ms > 0):
            raise ConfigError(f"step_ms: must be a positive number of milliseconds, "
                              f"got {step_ms!r}")
        if max_model_len is None:
            max_model_len = self.default_max_model_len
        output = self.output_len
        if max_output_len is not None:
            check_positive_int("max_output_len", max_output_len)
            output = np.minimum(output, max_output_len)
        prompt, output, clipped = clip_lengths(self.prompt_len, output, max_model_len)
        clipped |= output != self.output_len
        ids = self.hash_ids
        if ids is not None and clipped.any():
            keep = -(-prompt // HASH_BLOCK_TOKENS)
            ids = tuple(h[:k] for h, k in zip(ids, keep.tolist()))
        if not self.duration_s * 1000.0 / step_ms <= MAX_TRACE_VALUE:
            raise ConfigError(f"step_ms: {step_ms:g} ms per step makes the trace's "
                              f"{self.duration_s:g} s more than {MAX_TRACE_VALUE} steps")
        # rounded first: 0.06 s at 20 ms is step 3, not 2.9999999
        arrival = np.floor(np.round(self.arrival_s * (1000.0 / step_ms), 9)).astype(np.int64)
        return Workload(arrival, prompt, output, np.ones_like(prompt),
                        source=f"{self.source} at {step_ms:g} ms/step", hash_ids=ids,
                        duration_s=self.duration_s, max_model_len=int(max_model_len),
                        num_clipped=int(clipped.sum()),
                        read_means=(float(self.prompt_len.mean()),
                                    float(self.output_len.mean())))


def clip_lengths(prompt_len, output_len, max_model_len: int):
    """Fit every request into ``max_model_len`` tokens: the output keeps its length (at most
    ``max_model_len - 1``) and the prompt is cut from its end, so a shared prefix stays shared.
    Returns ``(prompt_len, output_len, clipped)`` (``clipped``: bool mask of changed requests)."""
    if not isinstance(max_model_len, (int, np.integer)) or max_model_len < 2:
        raise ConfigError(f"max_model_len: must be an integer >= 2, got {max_model_len!r}")
    prompt_len, output_len = np.asarray(prompt_len), np.asarray(output_len)
    # a limit above every request clips nothing (and may not fit int64)
    limit = min(int(max_model_len), int((prompt_len + output_len).max(initial=2)))
    output = np.minimum(output_len, limit - 1)
    prompt = np.minimum(prompt_len, limit - output)
    return prompt, output, (prompt != prompt_len) | (output != output_len)


def trace_path(name_or_path: str) -> tuple[Path, str]:
    """``(file, source)`` of a named trace (:data:`NAMED_TRACES`) or a file path."""
    if name_or_path in NAMED_TRACES:
        return DATA_DIR / NAMED_TRACES[name_or_path], name_or_path
    return Path(name_or_path), str(name_or_path)


def trace_format(path) -> str:
    """``"azure"``, ``"mooncake"`` or ``"steps"`` (the generic schema), from the columns."""
    try:
        with open_text(path) as f:
            first = next((line for line in f if line.strip()), "")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise ConfigError(f"trace: cannot read {path}: {e}") from e
    if first.lstrip().startswith("{"):
        try:
            columns = set(json.loads(first))
        except (json.JSONDecodeError, TypeError):
            return "steps"  # read_trace reports the bad line
    else:
        columns = {c.strip() for c in next(csv.reader([first]), [])}
    if set(AZURE_COLUMNS) <= columns:
        return "azure"
    if set(MOONCAKE_COLUMNS) <= columns:
        return "mooncake"
    return "steps"


def read_timed_trace(name_or_path: str) -> Trace:
    """A :class:`Trace` from a named trace or an Azure/Mooncake file (see the module doc)."""
    path, source = trace_path(name_or_path)
    fmt = trace_format(path)
    if fmt == "steps":
        raise ConfigError(f"trace: {path} has neither the Azure columns "
                          f"({', '.join(AZURE_COLUMNS)}) nor the Mooncake ones "
                          f"({', '.join(MOONCAKE_COLUMNS)})")
    reader = read_azure if fmt == "azure" else read_mooncake
    return reader(path, source)


def load_workload(name_or_path: str, *, step_ms: float | None = None,
                  max_model_len: int | None = None,
                  steps_per_unit: float | None = None) -> Workload:
    """The simulator's workload for ``--trace NAME|FILE``.

    Timed traces (Azure, Mooncake) replay at ``step_ms`` (default :data:`DEFAULT_STEP_MS`)
    with clipping to ``max_model_len`` (default :attr:`Trace.default_max_model_len`). Step-based
    files go to :func:`~pagebench.sim.trace.read_trace` (``steps_per_unit``, and
    ``max_model_len`` as a limit, not a clip).
    """
    path, _ = trace_path(name_or_path)
    if trace_format(path) == "steps":
        if step_ms is not None:
            raise ConfigError(f"step_ms: {path} gives arrivals in steps, not seconds; "
                              f"use steps_per_unit to scale them")
        return read_trace(str(path), max_model_len,
                          1.0 if steps_per_unit is None else steps_per_unit)
    if steps_per_unit is not None:
        raise ConfigError(f"steps_per_unit: {path} gives arrivals in seconds; use step_ms")
    return read_timed_trace(name_or_path).to_workload(
        DEFAULT_STEP_MS if step_ms is None else step_ms, max_model_len)


def _bad(path, lineno, message):
    return ConfigError(f"trace: {path} line {lineno}: {message}")


def _length(path, lineno, name, raw) -> int:
    """A token count >= 1 from a CSV cell or JSON value."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise _bad(path, lineno, f"{name} is not a number: {raw!r}") from None
    if isinstance(raw, bool) or not math.isfinite(value) or value != int(value):
        raise _bad(path, lineno, f"{name} must be an integer: {raw!r}")
    if value < 1:
        raise _bad(path, lineno, f"{name} must be >= 1, got {raw!r}")
    if value > MAX_TRACE_VALUE:
        raise _bad(path, lineno, f"{name} must be <= {MAX_TRACE_VALUE}, got {raw!r}")
    return int(value)


def _finish(path, source, arrival, prompt, output, hash_ids=None) -> Trace:
    if not prompt:
        raise ConfigError(f"trace: {path} has a header but no requests")
    arrival = np.asarray(arrival, dtype=np.float64)
    return Trace(arrival - arrival.min(), np.asarray(prompt, dtype=np.int64),
                 np.asarray(output, dtype=np.int64), hash_ids, source)


def read_azure(path, source: str | None = None) -> Trace:
    """An Azure LLM inference trace (CSV: TIMESTAMP, ContextTokens, GeneratedTokens)."""
    arrival, prompt, output = [], [], []
    with open_text(path) as f:
        reader = csv.reader(f)
        header = [c.strip() for c in next(reader, [])]
        missing = [c for c in AZURE_COLUMNS if c not in header]
        if missing:
            raise _bad(path, 1, f"missing column {', '.join(missing)}")
        t_col, p_col, o_col = (header.index(c) for c in AZURE_COLUMNS)
        for row in reader:
            lineno = reader.line_num
            if not row or not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise _bad(path, lineno, f"expected {len(header)} fields, got {len(row)}")
            try:
                when = datetime.fromisoformat(row[t_col].strip())
            except ValueError:
                raise _bad(path, lineno, f"TIMESTAMP is not a date and time: "
                                         f"{row[t_col]!r}") from None
            if when.tzinfo is not None:
                when = when.astimezone(timezone.utc).replace(tzinfo=None)
            arrival.append(when)
            prompt.append(_length(path, lineno, "ContextTokens", row[p_col]))
            output.append(_length(path, lineno, "GeneratedTokens", row[o_col]))
    first = min(arrival, default=None)  # differences of datetimes: exact to the microsecond
    return _finish(path, source or str(path), [(t - first).total_seconds() for t in arrival],
                   prompt, output)


def read_mooncake(path, source: str | None = None) -> Trace:
    """A Mooncake trace (JSONL: timestamp in ms, input_length, output_length, hash_ids)."""
    arrival, prompt, output, hash_ids = [], [], [], []
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise _bad(path, lineno, f"invalid JSON ({e})") from None
            if not isinstance(row, dict):
                raise _bad(path, lineno, "expected a JSON object")
            missing = [c for c in MOONCAKE_COLUMNS if c not in row]
            if missing:
                raise _bad(path, lineno, f"missing {', '.join(missing)}")
            t = row["timestamp"]
            if (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)
                    or not 0 <= t <= MAX_TRACE_VALUE):
                raise _bad(path, lineno, f"timestamp must be a number of ms in "
                                         f"0..{MAX_TRACE_VALUE}, got {t!r}")
            p = _length(path, lineno, "input_length", row["input_length"])
            ids = row["hash_ids"]
            if not isinstance(ids, list) or not all(
                    isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 63
                    for x in ids):
                raise _bad(path, lineno, "hash_ids must be a list of integers in 0..2**63-1")
            blocks = -(-p // HASH_BLOCK_TOKENS)
            if len(ids) != blocks:
                raise _bad(path, lineno, f"hash_ids has {len(ids)} ids for input_length {p} "
                                         f"(expected {blocks}, one per {HASH_BLOCK_TOKENS} tokens)")
            arrival.append(t / 1000.0)
            prompt.append(p)
            output.append(_length(path, lineno, "output_length", row["output_length"]))
            hash_ids.append(np.asarray(ids, dtype=np.int64))
    return _finish(path, source or str(path), arrival, prompt, output, tuple(hash_ids))


# ---- the report's study of the shipped traces ------------------------------------------------

STUDY_TRACES = ("azure-code", "azure-conv", "mooncake-conv")
STUDY_STATIC_BLOCK_SIZES = ENGINE_BLOCK_SIZES
# budgets of the prefix-cache sweep, as multiples of the article's 12.4 GB (1,009,104 slots)
PREFIX_BUDGET_MULTIPLES = (64.0, 8.0, 2.0, 1.0, 0.5, 0.25)
# requests of each trace served at the real budget (sim.real_load), the first by arrival, in
# every run mode (report, report --quick, claims --simulate): one sample, one verdict
STUDY_LOAD_REQUESTS = 2000


def study_traces(num_requests: int | None = None, names=STUDY_TRACES,
                 prefix_budget_multiples=PREFIX_BUDGET_MULTIPLES, step_cost=None,
                 step_cost_source: str | None = None,
                 load_requests: int = STUDY_LOAD_REQUESTS) -> dict:
    """The article's memory claims replayed on real traces (the first ``num_requests`` of each,
    or all). A DataFrame per kind:

    - ``static``: utilisation per allocator and block size on each trace's final lengths
      (``max_model_len`` = the trace's default);
    - ``dynamic``, ``timeline``, ``goodput``: the first ``load_requests`` (and at most
      ``num_requests``) requests served at a real KV budget by :mod:`pagebench.sim.real_load`
      with ``step_cost`` (default :data:`~pagebench.sim.step_cost.H200_ENGINE_STEP_COST`),
      whichever way the report runs: the same sample gives the same verdicts;
    - ``prefix``: prefix-cache hit rate of paged block 16 as the budget shrinks, for traces
      with ``hash_ids`` (Mooncake; the Azure traces say nothing about sharing).
    """
    import pandas as pd

    from pagebench.sim.capacity import article_budget_tokens
    from pagebench.sim.dynamic import simulate_allocator
    from pagebench.sim.real_load import real_budget_tokens, study_trace
    from pagebench.sim.static import static_fragmentation
    from pagebench.sim.step_cost import H200_ENGINE_STEP_COST, H200_ENGINE_STEP_COST_SOURCE

    if step_cost is None:
        step_cost, step_cost_source = H200_ENGINE_STEP_COST, H200_ENGINE_STEP_COST_SOURCE
    load_requests = min(load_requests, num_requests or load_requests)
    budget = real_budget_tokens()
    out = {"static": [], "dynamic": [], "timeline": [], "goodput": [], "prefix": []}
    for name in names:
        whole = read_timed_trace(name)
        trace = whole if num_requests is None else whole.head(num_requests)
        w = trace.to_workload()
        max_len = w.max_model_len
        info = {"trace": name, "source": trace.source, "num_requests": w.num_requests,
                "max_model_len": max_len, "num_clipped": w.num_clipped,
                "mean_prompt_len": float(w.prompt_len.mean()),
                "mean_output_len": float(w.output_len.mean())}
        res = static_fragmentation(w.length, max_len, STUDY_STATIC_BLOCK_SIZES)
        out["static"] += [info | r for r in res["results"]]
        # the sample and its max_model_len (the whole trace's) are those of every run mode
        sample, load_len = whole.head(load_requests), whole.default_max_model_len
        lw = sample.to_workload(max_model_len=load_len)
        load_info = {"trace": name, "source": sample.source, "num_requests": lw.num_requests,
                     "num_clipped": lw.num_clipped, "mean_prompt_len": float(lw.prompt_len.mean()),
                     "mean_output_len": float(lw.output_len.mean()),
                     "step_cost": step_cost_source}
        load = study_trace(sample.arrival_s, lw.prompt_len, lw.output_len, load_len, step_cost,
                           budget)
        out["dynamic"] += [load_info | r for r in load["memory"]]
        out["goodput"] += [load_info | r for r in load["goodput"]]
        out["timeline"] += [pd.DataFrame(t).assign(trace=name) for t in load["timeline"]
                            if t["allocator"] != "paged" or t["block_size"] == 16]
        if w.hash_ids is None:
            continue
        for multiple in tuple(prefix_budget_multiples) + (None,):
            # None: unlimited memory (every token of the trace fits), the trace's own sharing
            budget_p = int(w.length.sum()) if multiple is None else \
                int(article_budget_tokens() * multiple)
            if budget_p < int(np.ceil(w.length.max() / 16) * 16):
                continue
            row, _ = simulate_allocator(w, budget_p, "paged", 16, max_len=max_len,
                                        prefix_caching=True)
            out["prefix"].append(info | {
                "budget_tokens": budget_p, "budget_vs_article": multiple,
                "unlimited": multiple is None} | {k: row[k] for k in (
                    "prefix_cache_hit_rate", "prefix_blocks_saved", "num_preemptions",
                    "free_fraction")})
    frames = {kind: pd.DataFrame(rows) for kind, rows in out.items() if kind != "timeline"}
    for kind in ("static", "dynamic", "goodput"):
        frames[kind]["block_size"] = frames[kind]["block_size"].astype("Int64")
    frames["timeline"] = pd.concat(out["timeline"], ignore_index=True)
    return frames
