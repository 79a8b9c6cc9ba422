"""Ragged batches for the kernel sweeps: a batch's lengths drawn from a distribution or a trace.

A lengths spec gives the *shape* of a batch's lengths; the sweep's ``context`` gives their
mean, so a ragged point reads about the bytes of the uniform point beside it:

- ``uniform``: every sequence ``context`` tokens (the sweeps' default);
- ``lognormal:MU,SIGMA``: lognormal draws (parsed as ``pagebench.sim.workloads`` does; ``MU``
  only moves the draws, which are rescaled; ``SIGMA`` sets the spread);
- ``trace:NAME``: prompt + output lengths of requests of a shipped trace (``azure-conv``,
  ``azure-code``, ``mooncake-conv``), sampled with the seed.

The draws are rescaled to mean ``context`` and clipped to ``1..max_len`` (default 8 x
``context``, so a point's longest sequence is bounded), a few times over, so that the clipped
batch keeps the mean (within rounding, where ``max_len`` allows).
"""

from __future__ import annotations

import numpy as np

LENGTH_SPECS = ("uniform", "lognormal:MU,SIGMA", "trace:NAME")
MAX_LEN_FACTOR = 8  # a ragged point's longest sequence, as a multiple of its mean


def check_lengths_spec(spec: str, option: str = "--lengths") -> str:
    """``spec`` if it is one of ``LENGTH_SPECS``'s forms, else a ValueError naming ``option``."""
    kind, sep, args = str(spec).partition(":")
    if spec == "uniform":
        return spec
    if kind == "lognormal" and sep:
        from pagebench.sim.workloads import check_lengths

        check_lengths(spec, 1, option)
        return spec
    if kind == "trace" and sep:
        from pagebench.sim.real_traces import NAMED_TRACES

        if args in NAMED_TRACES:
            return spec
        raise ValueError(f"{option}: unknown trace {args!r} (shipped: "
                         f"{', '.join(sorted(NAMED_TRACES))})")
    raise ValueError(f"{option}: expected uniform, lognormal:MU,SIGMA or trace:NAME, got {spec!r}")


def batch_lengths(spec: str, batch: int, context: int, seed: int = 0,
                  max_len: int | None = None) -> list[int]:
    """``batch`` lengths of shape ``spec``, in ``1..max_len``, with mean ``context``."""
    check_lengths_spec(spec)
    if spec == "uniform":
        return [int(context)] * batch
    max_len = max_len or MAX_LEN_FACTOR * context
    kind, _, args = spec.partition(":")
    if kind == "lognormal":
        from pagebench.sim.workloads import check_lengths

        _, (mu, sigma) = check_lengths(spec, 1)
        raw = np.random.default_rng(seed).lognormal(mu, sigma, batch)
    else:
        from pagebench.sim.real_traces import read_timed_trace

        trace = read_timed_trace(args)
        pick = np.random.default_rng(seed).choice(trace.num_requests, size=batch)
        raw = (trace.prompt_len[pick] + trace.output_len[pick]).astype(np.float64)
    lens = raw
    for _ in range(8):  # rescale, clip, and again: the clipped draws' share moves to the rest
        lens = np.clip(lens * (context / lens.mean()), 1, max_len)
    return [int(n) for n in np.rint(lens)]
