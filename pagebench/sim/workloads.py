"""Sequence-length distributions, given as a spec string.

- ``lognormal:MU,SIGMA``: ``min(max_len, int(r.lognormvariate(MU, SIGMA)))`` with
  ``r = random.Random(seed)``: the article's draw, so its figures reproduce exactly;
- ``uniform:A,B``: ``r.randint(A, B)`` (both ends included);
- ``fixed:N``;
- a path: one length per line, or a CSV / JSONL file with a ``length`` column.
Every length is clipped to ``[1, max_len]``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random

import numpy as np

from pagebench.errors import ConfigError, check_positive_int

LENGTH_COLUMNS = ("length", "len", "num_tokens", "seq_len")


def _numbers(spec: str, args: str, count: int) -> list[float]:
    try:
        values = [float(a) for a in args.split(",")]
    except ValueError:
        values = []
    if len(values) != count:
        raise ConfigError(f"lengths: {spec!r} needs {count} comma-separated numbers")
    if not all(map(math.isfinite, values)):
        raise ConfigError(f"lengths: {spec!r} holds a number that is not finite")
    return values


def _lognormal(r: random.Random, mu: float, sigma: float, max_len: int) -> int:
    """``min(max_len, int(r.lognormvariate(mu, sigma)))``, also when the draw overflows a float
    (``lognormal:1000,1``): the stream of draws is the same either way."""
    try:
        value = r.lognormvariate(mu, sigma)
    except OverflowError:
        value = math.inf
    return int(min(value, max_len))


LENGTH_DISTRIBUTIONS = ("lognormal", "uniform", "fixed")  # KIND:ARGS specs; anything else: a file


def lengths_file(spec: str) -> bool:
    """Whether ``sample_lengths`` reads ``spec`` as a file of lengths (not a distribution)."""
    return str(spec).partition(":")[0] not in LENGTH_DISTRIBUTIONS and os.path.exists(spec)


def sample_lengths(spec: str, num_seqs: int, seed: int = 0, max_len: int = 4096) -> np.ndarray:
    """``num_seqs`` lengths (int64) drawn from ``spec``; a file gives its lengths in order,
    cycled if it holds fewer than ``num_seqs``."""
    check_positive_int("num_seqs", num_seqs)
    check_positive_int("max_len", max_len)
    kind, _, args = str(spec).partition(":")
    r = random.Random(seed)
    if kind == "lognormal":
        mu, sigma = _numbers(spec, args, 2)
        if sigma < 0:
            raise ConfigError(f"lengths: sigma must be >= 0 in {spec!r}")
        values = [_lognormal(r, mu, sigma, max_len) for _ in range(num_seqs)]
    elif kind == "uniform":
        a, b = (int(x) for x in _numbers(spec, args, 2))
        if not 1 <= a <= b:
            raise ConfigError(f"lengths: need 1 <= A <= B in {spec!r}")
        values = [r.randint(a, b) for _ in range(num_seqs)]
    elif kind == "fixed":
        (n,) = _numbers(spec, args, 1)
        if n < 1:
            raise ConfigError(f"lengths: fixed length must be >= 1 in {spec!r}")
        values = [int(n)] * num_seqs
    elif lengths_file(spec):
        data = read_lengths_file(spec)
        values = [data[i % len(data)] for i in range(num_seqs)]
    else:
        raise ConfigError(f"lengths: unknown spec {spec!r}; use lognormal:MU,SIGMA, "
                          "uniform:A,B, fixed:N or a file of lengths")
    # clipped as Python ints: a length beyond int64 (``fixed:1e300``) is clipped, not wrapped
    return np.asarray([min(max(int(v), 1), max_len) for v in values], dtype=np.int64)


def read_lengths_file(path: str) -> list[int]:
    """Lengths from a text file (one per line), a CSV or a JSONL file with a length column."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"lengths: cannot read {path}: {e}") from e
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ConfigError(f"lengths: {path} holds no lengths")
    try:
        if lines[0].lstrip().startswith("{"):
            rows = [json.loads(ln) for ln in lines]
            col = next((c for c in LENGTH_COLUMNS if c in rows[0]), None)
            if col is None:
                raise ConfigError(f"lengths: {path} has no column among {LENGTH_COLUMNS}")
            values = [int(row[col]) for row in rows]
        elif "," in lines[0] or not lines[0].strip().lstrip("-").isdigit():
            reader = csv.DictReader(lines)
            col = next((c for c in LENGTH_COLUMNS if c in (reader.fieldnames or [])), None)
            if col is None:
                raise ConfigError(f"lengths: {path} has no column among {LENGTH_COLUMNS}")
            values = [int(row[col]) for row in reader]
        else:
            values = [int(ln) for ln in lines]
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        raise ConfigError(f"lengths: {path}: not a list of integer lengths ({e})") from e
    if any(v < 1 for v in values):
        raise ConfigError(f"lengths: {path} holds a length below 1")
    return values
