"""Sequence-length distributions, given as a spec string.

- ``lognormal:MU,SIGMA``: ``max(1, min(max_len, int(r.lognormvariate(MU, SIGMA))))`` with
  ``r = random.Random(seed)``: the article's draw, so its figures reproduce exactly (a draw
  beyond ``max_len`` is ``max_len``, one below 1 token is 1);
- ``uniform:A,B``: ``r.randint(A, B)`` (integers, both ends included, ``1 <= A <= B <=
  max_len``);
- ``fixed:N``: an integer ``1 <= N <= max_len``;
- a path: one length per line, or a CSV / JSONL file of requests, each length used as it is
  (``1..max_len``). Its columns (:data:`LENGTH_COLUMNS`, :data:`PROMPT_COLUMNS`,
  :data:`OUTPUT_COLUMNS`, first match wins) give a sequence's length either directly or as
  prompt + output, so a file of requests (``request_id,prompt_tokens,output_tokens``) is read
  as it is; ``part`` picks the prompt or the output column instead (``--prompt-lengths``).
Nothing but the lognormal draw is clipped: a length or bound above ``max_len`` is an error
naming the spec and the flag that would admit it, not a silent change of the data.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random

import numpy as np

from pagebench.errors import ConfigError, check_positive_int
from pagebench.sim.columns import LENGTH_COLUMNS, OUTPUT_COLUMNS, PROMPT_COLUMNS

PARTS = ("length", "prompt", "output")  # what a file's row gives: its whole length or a part


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
                  limit: str = "max_len", part: str = "length") -> tuple[str, list]:
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
        kind, values = "file", read_lengths_file(spec, option, part)
        count = sum(v > max_len for v in values)
        if count:
            raise ConfigError(f"{option}: {spec} holds {count:,} length(s) above {limit} = "
                              f"{max_len:,}, the longest {max(values):,} (a file's lengths are "
                              f"used as they are, not clipped){suggest(limit, max(values))}")
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
                          f"{max_len:,} (lengths are used as given, not clipped)"
                          f"{suggest(limit, above)}")
    return kind, values


def suggest(limit: str, longest: int) -> str:
    """``"; pass --max-len 8192 or more"`` where ``limit`` is a command-line flag (``--max-len``,
    or ``--max-len - 1`` for a prompt or output, which leaves a token for the other)."""
    flag, _, minus = limit.partition(" - ")
    if not flag.startswith("--"):
        return ""
    need = longest + (int(minus) if minus.strip().isdigit() else 0)
    return f"; pass {flag} {1 << (need - 1).bit_length()} or more"


def sample_lengths(spec: str, num_seqs: int, seed: int = 0, max_len: int = 4096, *,
                   option: str = "lengths", limit: str = "max_len",
                   part: str = "length") -> np.ndarray:
    """``num_seqs`` lengths (int64) drawn from ``spec`` (checked by :func:`check_lengths`,
    whose errors name ``option`` and ``limit``); a file gives its lengths (or its ``part`` of
    them, see :func:`read_lengths_file`) in order, cycled if it holds fewer than ``num_seqs``."""
    check_positive_int("num_seqs", num_seqs)
    check_positive_int("max_len", max_len)
    kind, params = check_lengths(spec, max_len, option, limit, part)
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


def read_lengths_file(path: str, option: str = "lengths", part: str = "length") -> list[int]:
    """Lengths from a text file (one per line), or a CSV (with a header) or JSONL file of
    requests; errors name ``option``. ``part="length"``: a length column, else prompt + output;
    ``"prompt"`` / ``"output"``: that column, or a file's only lengths where it names no
    prompt or output (see the module docstring for the column names)."""
    lengths, prompts, outputs = read_requests_file(path, option)
    chosen = {"length": lengths, "prompt": prompts, "output": outputs}[part]
    if chosen is None and prompts is None and outputs is None:
        chosen = lengths  # a plain list of lengths serves any part
    if chosen is None:
        have = "prompt" if prompts is not None else "output"
        names = {"prompt": PROMPT_COLUMNS, "output": OUTPUT_COLUMNS}
        if part == "length":
            part = "output" if have == "prompt" else "prompt"
            why = f", so no sequence length (or give a length column: {', '.join(LENGTH_COLUMNS)})"
        else:
            why = ""
        raise ConfigError(f"{option}: {path} has a {have} column but no {part} one "
                          f"({', '.join(names[part])}){why}")
    return [int(v) for v in chosen]


def read_requests_file(path: str, option: str = "lengths") -> tuple[list | None, list | None,
                                                                    list | None]:
    """``(lengths, prompts, outputs)`` of a lengths or requests file (see
    :func:`read_lengths_file`): lengths from a length column, else prompt + output where both
    are present (else None); prompts and outputs None where the file has no such column."""
    try:
        with open(path, encoding="utf-8-sig") as f:
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
            if not all(isinstance(r, dict) for r in rows):
                raise ValueError("every line must be a JSON object")
            columns = list(rows[0])
        elif "," in lines[0] or not lines[0].strip().lstrip("-").isdigit():
            reader = csv.DictReader(lines)
            columns = [c.strip() for c in reader.fieldnames or []]
            reader.fieldnames = columns
            rows = list(reader)
        else:
            values = [int(ln) for ln in lines]
            _check_positive(values, path, option)
            return values, None, None
        found = {what: next((c for c in names if c in columns), None) for what, names in (
            ("length", LENGTH_COLUMNS), ("prompt", PROMPT_COLUMNS), ("output", OUTPUT_COLUMNS))}
        if not rows:
            raise ConfigError(f"{option}: {path} has a header but no requests")
        parts = {what: None if col is None else [_json_length(row.get(col)) for row in rows]
                 for what, col in found.items()}
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{option}: {path}: not a list of integer lengths ({e})") from e
    if all(v is None for v in parts.values()):
        raise ConfigError(
            f"{option}: {path} has none of the length columns: a length ("
            f"{', '.join(LENGTH_COLUMNS)}), or a prompt ({', '.join(PROMPT_COLUMNS)}) and an "
            f"output ({', '.join(OUTPUT_COLUMNS)}); its columns: {', '.join(columns)}")
    for values in parts.values():
        if values is not None:
            _check_positive(values, path, option)
    lengths = parts["length"]
    if lengths is None and parts["prompt"] is not None and parts["output"] is not None:
        lengths = [p + o for p, o in zip(parts["prompt"], parts["output"])]
    return lengths, parts["prompt"], parts["output"]


def _check_positive(values, path, option) -> None:
    if any(v < 1 for v in values):
        raise ConfigError(f"{option}: {path} holds a length below 1")


def _json_length(value) -> int:
    """A length from a JSON value or CSV cell: an integer (``1.5`` is refused, not truncated
    to 1; ``"12.0"`` is 12)."""
    if isinstance(value, str):
        value = float(value) if value.strip() and not value.strip().lstrip("-").isdigit() \
            else int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not an integer")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{value!r} is not an integer")
    return int(value)
