"""A user's workload for `pagebench recommend` and `pagebench report --lengths/--trace`: a
lengths or requests file, a trace, or the article's lengths, as one record of per-request
lengths (and their prompt / output split where the source gives it) with a name that says
where they came from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pagebench import defaults
from pagebench.errors import ConfigError


@dataclass(frozen=True)
class UserWorkload:
    name: str  # what the lengths are: file or trace, how many requests
    lengths: np.ndarray  # int64, one final length per request
    prompts: np.ndarray | None = None  # the split, where the source gives it
    outputs: np.ndarray | None = None

    @property
    def prompt_share(self) -> float | None:
        """Prompt tokens / all tokens (None: the source gives lengths only)."""
        if self.prompts is None or self.outputs is None:
            return None
        return float(self.prompts.sum() / (self.prompts.sum() + self.outputs.sum()))

    def max_model_len(self, given: int | None = None) -> int:
        """``given``, else the smallest power of two, at least the reference max_model_len,
        that holds the longest request."""
        if given is not None:
            return given
        longest = int(self.lengths.max())
        return max(defaults.REFERENCE_MAX_LEN, 1 << (longest - 1).bit_length())


def load(lengths: str | None = None, trace: str | None = None,
         max_len: int | None = None) -> UserWorkload:
    """The workload of ``--lengths FILE`` or ``--trace NAME|FILE`` (errors name the option; a
    request above ``max_len`` is refused with the value to pass), else the article's lengths."""
    if lengths is not None and trace is not None:
        raise ConfigError("--lengths, --trace: give one workload, not both")
    if trace is not None:
        from pagebench.sim.real_traces import load_workload

        w = load_workload(trace, max_model_len=max_len)
        clipped = (f", {w.num_clipped:,} clipped to {w.max_model_len:,} tokens"
                   if w.num_clipped else "")
        return UserWorkload(f"trace {trace} ({w.num_requests:,} requests{clipped})", w.length,
                            w.prompt_len, w.output_len)
    if lengths is not None:
        from pagebench.sim.workloads import read_requests_file, suggest

        if not Path(lengths).is_file():
            raise ConfigError(f"--lengths: {lengths} not found (a CSV, JSONL or text file of "
                              "lengths)")
        total, prompts, outputs = read_requests_file(lengths, "--lengths")
        if total is None:
            raise ConfigError(f"--lengths: {lengths} gives only a prompt or an output column; "
                              "a sequence length needs both (or a length column)")
        arr = [None if v is None else np.asarray(v, dtype=np.int64)
               for v in (total, prompts, outputs)]
        if max_len is not None and arr[0].max() > max_len:
            raise ConfigError(f"--lengths: {lengths} holds {int((arr[0] > max_len).sum()):,} "
                              f"request(s) above --max-len = {max_len:,}, the longest "
                              f"{int(arr[0].max()):,}" + suggest("--max-len", int(arr[0].max())))
        return UserWorkload(f"{lengths} ({arr[0].size:,} requests)", *arr)
    from pagebench.sim.workloads import sample_lengths

    drawn = sample_lengths(defaults.REFERENCE_LENGTHS, defaults.REFERENCE_NUM_SEQS,
                           defaults.REFERENCE_SEED, defaults.REFERENCE_MAX_LEN)
    return UserWorkload(f"default workload {defaults.REFERENCE_LENGTHS} ({drawn.size:,} "
                        f"draws, seed {defaults.REFERENCE_SEED})", drawn)
