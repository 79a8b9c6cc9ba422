"""Sequence-length distributions, given as a spec string.

- ``lognormal:MU,SIGMA``: ``max(1, min(max_len, int(r.lognormvariate(MU, SIGMA))))`` with
  ``r = random.Random(seed)``: the article's draw, so its figures reproduce exactly (a draw
  beyond ``max_len`` is ``max_len``, one below 1 token is 1);
- ``uniform:A,B``: ``r.randint(A, B)`` (integers, both ends included, ``1 <= A <= B <=
  max_len``);
- ``fixed:N``: an integer ``1 <= N <= max_len``;
- a path: one length per line, or a CSV / JSONL file with a ``length`` column, each length
  used as it is (``1..max_len``).
Nothing but the lognormal draw is clipped: a length or bound above ``max_len`` is an error
naming the spec, not a silent change of the data.
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


def _numbers(spec: str, args: str, count: int, option: str) -> list[float]:
    try:
        values = [float(a) for a in args.split(",")]
    except ValueError:
        values = []
    if len(values) != count:
        raise ConfigError(f"{option}: {spec!r} needs {count} comma-separated numbers")
    if not all(map(math.isfinite, values)):
        raise ConfigError(f"{option}: {spec!r} holds a number that is not finite")
    return values


def _integers(spec: str, args: str, count: int, option: str) -> list[int]:
    """``count`` comma-separated integers (``uniform:1.5,3`` is refused, not truncated)."""
    _numbers(spec, args, count, option)  # the count and finiteness messages
    try:
        return [int(a.strip()) for a in args.split(",")]
    except ValueError:
        raise ConfigError(f"{option}: {spec!r} needs integers (token counts)") from None


def _lognormal(r: random.Random, mu: float, sigma: float, max_len: int) -> int:
    """``max(1, min(max_len, int(r.lognormvariate(mu, sigma))))``, also when the draw
    overflows a float (``lognormal:1000,1``): the stream of draws is the same either way."""
    try:
        value = r.lognormvariate(mu, sigma)
    except OverflowError:
        value = math.inf
    return max(1, int(min(value, max_len)))


LENGTH_DISTRIBUTIONS = ("lognormal", "uniform", "fixed")  # KIND:ARGS specs; anything else: a file


def lengths_file(spec: str) -> bool:
    """Whether ``sample_lengths`` reads ``spec`` as a file of lengths (not a distribution)."""
    return str(spec).partition(":")[0] not in LENGTH_DISTRIBUTIONS and os.path.exists(spec)


def _looks_like_spec(spec: str) -> bool:
    """``KIND:ARGS`` with a bare word for KIND (``gauss:1,2``), not a path."""
    kind, sep, _ = str(spec).partition(":")
    return bool(sep) and kind.isidentifier()


def check_lengths(spec: str, max_len: int, option: str = "lengths",
                  limit: str = "max_len") -> tuple[str, list]:
    """``spec`` parsed and checked against ``max_len``: ``(kind, values)`` (a file's kind is
    ``"file"``, its values its lengths). ConfigError naming ``option`` (and ``limit``, the
    name of ``max_len``) for a malformed spec, a missing file, or a fixed length, uniform
    bound or file length above ``max_len``."""
    kind, _, args = str(spec).partition(":")
    above = None
    if kind == "lognormal":
        mu, sigma = values = _numbers(spec, args, 2, option)
        if sigma < 0:
            raise ConfigError(f"{option}: sigma must be >= 0 in {spec!r}")
    elif kind == "uniform":
        a, b = values = _integers(spec, args, 2, option)
        if not 1 <= a <= b:
            raise ConfigError(f"{option}: need 1 <= A <= B in {spec!r}")
        above = b if b > max_len else None
    elif kind == "fixed":
        (n,) = values = _integers(spec, args, 1, option)
        if n < 1:
            raise ConfigError(f"{option}: fixed length must be >= 1 in {spec!r}")
        above = n if n > max_len else None
    elif lengths_file(spec):
        kind, values = "file", read_lengths_file(spec, option)
        count = sum(v > max_len for v in values)
        if count:
            raise ConfigError(f"{option}: {spec} holds {count:,} length(s) above {limit} = "
                              f"{max_len:,}, the longest {max(values):,} (a file's lengths are "
                              "used as they are, not clipped)")
    elif not str(spec).strip():
        raise ConfigError(f"{option}: empty spec; use lognormal:MU,SIGMA, uniform:A,B, "
                          "fixed:N or a file of lengths")
    elif _looks_like_spec(spec):
        raise ConfigError(f"{option}: unknown spec {spec!r}; use lognormal:MU,SIGMA, "
                          "uniform:A,B, fixed:N or a file of lengths")
    else:
        raise ConfigError(f"{option}: {spec} not found (neither a file of lengths nor "
                          "lognormal:MU,SIGMA, uniform:A,B or fixed:N)")
    if above is not None:
        raise ConfigError(f"{option}: {spec} gives lengths up to {above:,}, above {limit} = "
                          f"{max_len:,} (lengths are used as given, not clipped)")
    return kind, values


def sample_lengths(spec: str, num_seqs: int, seed: int = 0, max_len: int = 4096, *,
                   option: str = "lengths", limit: str = "max_len") -> np.ndarray:
    """``num_seqs`` lengths (int64) drawn from ``spec`` (checked by :func:`check_lengths`,
    whose errors name ``option`` and ``limit``); a file gives its lengths in order, cycled if
    it holds fewer than ``num_seqs``."""
    check_positive_int("num_seqs", num_seqs)
    check_positive_int("max_len", max_len)
    kind, params = check_lengths(spec, max_len, option, limit)
    r = random.Random(seed)
    if kind == "lognormal":
        mu, sigma = params
        values = [_lognormal(r, mu, sigma, max_len) for _ in range(num_seqs)]
    elif kind == "uniform":
        values = [r.randint(*params) for _ in range(num_seqs)]
    elif kind == "fixed":
        values = params * num_seqs
    else:
        values = [params[i % len(params)] for i in range(num_seqs)]
    return np.asarray(values, dtype=np.int64)  # every value in 1..max_len, checked above


def read_lengths_file(path: str, option: str = "lengths") -> list[int]:
    """Lengths from a text file (one per line), a CSV or a JSONL file with a length column;
    errors name ``option``."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"{option}: cannot read {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{option}: {path} is not text ({e.reason})") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ConfigError(f"{option}: {path} holds no lengths")
    try:
        if lines[0].lstrip().startswith("{"):
            rows = [json.loads(ln) for ln in lines]
            col = next((c for c in LENGTH_COLUMNS if c in rows[0]), None)
            if col is None:
                raise ConfigError(f"{option}: {path} has no column among {LENGTH_COLUMNS}")
            values = [_json_length(row[col]) for row in rows]
        elif "," in lines[0] or not lines[0].strip().lstrip("-").isdigit():
            reader = csv.DictReader(lines)
            col = next((c for c in LENGTH_COLUMNS if c in (reader.fieldnames or [])), None)
            if col is None:
                raise ConfigError(f"{option}: {path} has no column among {LENGTH_COLUMNS}")
            values = [int(row[col]) for row in reader]
        else:
            values = [int(ln) for ln in lines]
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        raise ConfigError(f"{option}: {path}: not a list of integer lengths ({e})") from e
    if any(v < 1 for v in values):
        raise ConfigError(f"{option}: {path} holds a length below 1")
    return values


def _json_length(value) -> int:
    """A JSON length: an integer (``1.5`` is refused, not truncated to 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not an integer")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{value!r} is not an integer")
    return int(value)
