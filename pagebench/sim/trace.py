"""Request workloads for the time-stepped simulator: Poisson arrivals or a trace file.

A workload is a table of requests sorted by arrival step, each with a prompt length, an output
length and a number of parallel samples ``n`` (all samples of a request share its prompt and,
in this model, its output length). Time is measured in decode steps.

Trace files (CSV with a header, or JSONL) need three columns, under any of the names of
:mod:`pagebench.sim.columns`: an arrival (steps, >= 0; floats are floored), a prompt length and
an output length; and optionally ``n`` (parallel samples, default 1).
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from dataclasses import dataclass

import numpy as np

from pagebench.defaults import MAX_SAMPLES, REFERENCE_LENGTHS, REFERENCE_MAX_LEN
from pagebench.errors import ConfigError, check_positive_int
from pagebench.sim.columns import ARRIVAL_COLUMNS, OUTPUT_COLUMNS, PROMPT_COLUMNS
from pagebench.sim.workloads import sample_lengths

# The largest token count or arrival step a trace may hold: far beyond any real request, held
# exactly as a float, and small enough that the simulators' sums and products of such values
# stay inside int64.
MAX_TRACE_VALUE = 1 << 40
HASH_BLOCK_TOKENS = 512  # Mooncake's hash_ids name prompt blocks of this many tokens


@dataclass(frozen=True)
class Workload:
    """Requests sorted by ``arrival`` (int64 arrays of equal length).

    ``length = prompt_len + output_len`` is each sample's final length in tokens.
    ``hash_ids`` (optional, one int64 array per request): the prompt's 512-token blocks, named
    so that equal leading ids mean a shared prefix (the Mooncake trace format; see
    :mod:`pagebench.sim.prefix_cache`). Workloads replayed from timed traces also carry the
    trace's ``duration_s``, the ``max_model_len`` they were clipped to, how many requests that
    clipped (``num_clipped``) and the mean prompt and output lengths as read (``read_means``).
    """

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    n: np.ndarray
    source: str = "custom"
    hash_ids: tuple | None = None
    duration_s: float | None = None
    max_model_len: int | None = None
    num_clipped: int = 0
    read_means: tuple[float, float] | None = None

    def __post_init__(self):
        arrays = [np.asarray(getattr(self, f), dtype=np.int64)
                  for f in ("arrival", "prompt_len", "output_len", "n")]
        if arrays[0].ndim != 1 or arrays[0].size == 0:
            raise ConfigError("workload: needs at least one request")
        if any(a.shape != arrays[0].shape for a in arrays):
            raise ConfigError("workload: arrival, prompt_len, output_len and n differ in length")
        for name, a, low in zip(("arrival", "prompt_len", "output_len", "n"), arrays, (0, 1, 1, 1)):
            if a.min() < low:
                raise ConfigError(f"workload: every {name} must be >= {low}, got {int(a.min())}")
        if arrays[3].max() > MAX_SAMPLES:
            raise ConfigError(f"workload: every n must be <= {MAX_SAMPLES}, got "
                              f"{int(arrays[3].max())}")
        order = np.argsort(arrays[0], kind="stable")
        for f, a in zip(("arrival", "prompt_len", "output_len", "n"), arrays):
            object.__setattr__(self, f, a[order])
        if self.hash_ids is not None:
            if len(self.hash_ids) != order.size:
                raise ConfigError("workload: hash_ids needs one entry per request")
            ids = tuple(_hash_ids(self.hash_ids[i], i, int(arrays[1][i]))  # arrays: as given
                        for i in order.tolist())
            object.__setattr__(self, "hash_ids", ids)

    @property
    def num_requests(self) -> int:
        return int(self.arrival.size)

    @property
    def length(self) -> np.ndarray:
        return self.prompt_len + self.output_len

    def describe(self) -> dict:
        length = self.length
        prompt_mean, output_mean = self.read_means or (float(self.prompt_len.mean()),
                                                       float(self.output_len.mean()))
        return {"source": self.source, "num_requests": self.num_requests,
                "mean_prompt_len": prompt_mean, "mean_output_len": output_mean,
                "mean_length": float(length.mean()), "max_length": int(length.max()),
                "mean_n": float(self.n.mean()),
                "last_arrival_step": int(self.arrival[-1]),
                "duration_s": self.duration_s, "max_model_len": self.max_model_len,
                "num_clipped": self.num_clipped}


def _hash_ids(ids, request: int, prompt_len: int) -> np.ndarray:
    """Request ``request``'s hash ids as int64, one or more per 512-token span of its prompt."""
    try:
        ids = np.asarray(ids, dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as e:
        raise ConfigError(f"hash_ids: request {request}: expected integers ({e})") from None
    if ids.ndim != 1:
        raise ConfigError(f"hash_ids: request {request}: expected a one-dimensional list, got "
                          f"shape {ids.shape}")
    spans = -(-prompt_len // HASH_BLOCK_TOKENS)
    if ids.size < spans:
        raise ConfigError(f"hash_ids: request {request} has {ids.size} hash_ids for a prompt of "
                          f"{prompt_len} tokens (needs {spans}, one per {HASH_BLOCK_TOKENS})")
    return ids


def poisson_workload(num_requests: int, rate: float, lengths: str = REFERENCE_LENGTHS, *,
                     prompt_fraction: float = 0.3, prompt_lengths: str | None = None,
                     output_lengths: str | None = None, n: int = 1, seed: int = 0,
                     max_len: int = REFERENCE_MAX_LEN) -> Workload:
    """``num_requests`` requests arriving as a Poisson process of ``rate`` requests per step.

    Lengths: by default each request's final length is drawn from ``lengths`` (a
    :func:`~pagebench.sim.workloads.sample_lengths` spec, at most ``max_len``) and split into
    a prompt of ``round(prompt_fraction * length)`` tokens (at least 1) and the rest as output
    (at least 1): a drawn length of 1 becomes 2, and ``source`` says how many did. Give both
    ``prompt_lengths`` (at most ``max_len - 1``) and ``output_lengths`` to draw them separately
    instead (a file of requests gives its prompt or output column to each, so one
    ``request_id,prompt_tokens,output_tokens`` CSV serves both): a sum above ``max_len`` is clipped to it by shortening the output, and counted in
    ``num_clipped`` (``max_model_len`` is then ``max_len``).
    """
    check_positive_int("num_requests", num_requests)
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ConfigError(f"rate: must be a positive number of requests per step, got {rate!r}")
    check_positive_int("n", n)
    if not isinstance(max_len, int) or max_len < 2:
        raise ConfigError(f"max_len: must be an integer >= 2, got {max_len!r}")
    if (prompt_lengths is None) != (output_lengths is None):
        raise ConfigError("prompt_lengths/output_lengths: give both or neither")
    if prompt_lengths is None:
        if not 0.0 <= prompt_fraction < 1.0:
            raise ConfigError(f"prompt_fraction: must lie in [0, 1), got {prompt_fraction!r}")
        drawn = sample_lengths(lengths, num_requests, seed, max_len)
        length = np.maximum(drawn, 2)  # a request has a prompt token and an output token
        clipped = {}
        prompt = np.clip(np.rint(length * prompt_fraction).astype(np.int64), 1, length - 1)
        output = length - prompt
        raised = int((drawn < 2).sum())
        source = (f"poisson(rate={rate:g}/step), {lengths}, prompt_fraction={prompt_fraction:g}"
                  + (f", {raised:,} length(s) of 1 raised to 2" if raised else ""))
    else:
        prompt = sample_lengths(prompt_lengths, num_requests, seed, max_len - 1,
                                option="prompt_lengths", limit="max_len - 1", part="prompt")
        drawn = sample_lengths(output_lengths, num_requests, seed + 1, max_len - 1,
                               option="output_lengths", limit="max_len - 1", part="output")
        output = np.minimum(drawn, max_len - prompt)  # >= 1: prompt <= max_len - 1
        clipped = {"max_model_len": max_len, "num_clipped": int((output != drawn).sum())}
        source = f"poisson(rate={rate:g}/step), prompt {prompt_lengths}, output {output_lengths}"
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, num_requests)
    arrival = np.floor(np.cumsum(gaps)).astype(np.int64)
    return Workload(arrival, prompt, output, np.full(num_requests, n, dtype=np.int64),
                    source=source + (f", n={n}" if n > 1 else ""), **clipped)


def open_text(path):
    """A text handle on ``path``, gunzipped if it ends in ``.gz``; a leading byte order mark
    (files saved by Excel or PowerShell) is dropped."""
    path = str(path)
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")


def _pick(columns, names, path, what, required=True):
    for name in names:
        if name in columns:
            return name
    if required:
        raise ConfigError(f"trace: {path} has no {what} column (one of {', '.join(names)})")
    return None


def read_trace(path: str, max_len: int | None = None, steps_per_unit: float = 1.0) -> Workload:
    """A workload from a CSV (with header) or JSONL trace file; see the module docstring.

    ``steps_per_unit`` converts the arrival column to steps (e.g. 50 for timestamps in seconds
    at 50 decode steps per second); arrivals are floored after scaling.
    """
    if not (isinstance(steps_per_unit, (int, float)) and math.isfinite(steps_per_unit)
            and steps_per_unit > 0):
        raise ConfigError(f"steps_per_unit: must be a positive number, got {steps_per_unit!r}")
    try:
        with open_text(path) as f:
            text = f.read()
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise ConfigError(f"trace: cannot read {path}: {e}") from e
    # (line number in the file, line) of the non-blank lines: errors name the file's lines
    numbered = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not numbered:
        raise ConfigError(f"trace: {path} is empty")
    if numbered[0][1].lstrip().startswith("{"):
        rows, linenos = [], []
        for lineno, line in numbered:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"trace: {path} line {lineno}: invalid JSON ({e})") from e
            if not isinstance(row, dict):
                raise ConfigError(f"trace: {path} line {lineno}: expected a JSON object")
            rows.append(row)
            linenos.append(lineno)
        columns = set().union(*rows)
    else:
        reader = csv.DictReader(line for _, line in numbered)
        header = reader.fieldnames or []
        columns = set(header)
        rows, linenos = [], []
        for row in reader:  # reader.line_num: the row's last line (a quoted field may span lines)
            rows.append(row)
            linenos.append(numbered[reader.line_num - 1][0])
        if not rows:
            raise ConfigError(f"trace: {path} has a header but no requests")
    arrival_col = _pick(columns, ARRIVAL_COLUMNS, path, "arrival")
    prompt_col = _pick(columns, PROMPT_COLUMNS, path, "prompt length")
    output_col = _pick(columns, OUTPUT_COLUMNS, path, "output length")
    n_col = _pick(columns, ("n",), path, "n", required=False)
    values = {"arrival": [], "prompt_len": [], "output_len": [], "n": []}
    for lineno, row in zip(linenos, rows):
        if None in row:  # csv.DictReader's key for fields beyond the header
            raise ConfigError(f"trace: {path} line {lineno}: more fields than the header's "
                              f"{len(header)} ({', '.join(header)})")
        for key, col in (("arrival", arrival_col), ("prompt_len", prompt_col),
                         ("output_len", output_col), ("n", n_col)):
            if col is None:
                raw = 1
            elif row.get(col) is None:
                raise ConfigError(f"trace: {path} line {lineno}: missing {col}")
            else:
                raw = row[col]
            if isinstance(raw, bool):  # JSON true is not the number 1
                raise ConfigError(f"trace: {path} line {lineno}: {col} is not a number: "
                                  f"{raw!r}")
            try:
                number = float(raw)
            except (TypeError, ValueError):
                raise ConfigError(f"trace: {path} line {lineno}: {col} is not a number: "
                                  f"{raw!r}") from None
            top = MAX_SAMPLES if key == "n" else MAX_TRACE_VALUE
            if not (0 if key == "arrival" else 1) <= number <= top:
                raise ConfigError(f"trace: {path} line {lineno}: {col} out of range: {raw!r}"
                                  + (f" (1..{MAX_SAMPLES})" if key == "n" else ""))
            if key != "arrival" and number != int(number):
                raise ConfigError(f"trace: {path} line {lineno}: {col} must be an integer: "
                                  f"{raw!r}")
            if key == "arrival":
                number *= steps_per_unit
                if number > MAX_TRACE_VALUE:
                    raise ConfigError(f"trace: {path} line {lineno}: {col} x steps_per_unit "
                                      f"out of range: {raw!r}")
            values[key].append(int(math.floor(number)))
    workload = Workload(**{k: np.asarray(v, dtype=np.int64) for k, v in values.items()},
                        source=f"trace {path}")
    if max_len is not None and int(workload.length.max()) > max_len:
        raise ConfigError(f"trace: {path} holds a request of {int(workload.length.max())} "
                          f"tokens, above max_len={max_len}")
    return workload
