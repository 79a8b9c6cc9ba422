"""Static fragmentation: how much reserved KV memory holds tokens, per allocator.

For a set of final sequence lengths, each allocator reserves some number of token slots:
``naive`` reserves ``max_len``, ``pow2`` the next power of two (at most ``max_len``),
``oracle`` exactly the length, ``paged`` ``ceil(len / block_size) * block_size``.
Utilisation = tokens stored / slots reserved.
"""

from __future__ import annotations

import numpy as np

from pagebench.config import ceil_div
from pagebench.defaults import BLOCK_SIZES
from pagebench.errors import ConfigError
from pagebench.sim.columns import STATIC_LEGEND, legend_lines


def reserved_slots(allocator: str, lengths: np.ndarray, max_len: int,
                   block_size: int | None = None) -> np.ndarray:
    """Slots each sequence reserves under ``allocator`` (vectorised over ``lengths``)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if allocator == "naive":
        return np.full_like(lengths, max_len)
    if allocator == "pow2":
        pow2 = np.left_shift(1, np.ceil(np.log2(np.maximum(lengths, 1))).astype(np.int64))
        pow2 = np.where(pow2 < lengths, pow2 * 2, pow2)  # guard float rounding
        return np.minimum(pow2, max_len)
    if allocator == "oracle":
        return lengths.copy()
    if allocator == "paged":
        if not block_size or block_size < 1:
            raise ConfigError(f"block_size: paged needs a positive block size, got {block_size!r}")
        return ceil_div(lengths, block_size) * block_size
    raise ConfigError(f"allocator: unknown {allocator!r}; use naive, pow2, oracle or paged")


def static_fragmentation(lengths, max_len: int, block_sizes=BLOCK_SIZES) -> dict:
    """Utilisation of every allocator on ``lengths``; the JSON shape of ``pagebench simulate``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or lengths.size == 0:
        raise ConfigError("lengths: need a non-empty 1-D list of lengths")
    if lengths.min() < 1 or lengths.max() > max_len:
        raise ConfigError(f"lengths: every length must lie in 1..max_len={max_len}")
    block_sizes = [int(b) for b in block_sizes]
    if any(not 1 <= b <= 2**62 for b in block_sizes):
        raise ConfigError(f"block_sizes: must lie in 1..2**62, got {block_sizes}")
    if max_len > 2**62:
        raise ConfigError(f"max_len: at most 2**62 (int64 slot counts), got {max_len:,}")
    n = int(lengths.size)
    # a sequence reserves at most max_len + block_size slots: sum in int64 when n of them
    # cannot overflow it, else as Python ints (2,000 lengths of 10**16 tokens wrap int64)
    exact = np.int64 if n * (max_len + max(block_sizes, default=0)) < 2**63 else object
    tokens = int(lengths.sum(dtype=exact))
    rows = []
    plans = [("naive", None), ("pow2", None), ("oracle", None)] + [("paged", b) for b in block_sizes]
    for allocator, bs in plans:
        slots = int(reserved_slots(allocator, lengths, max_len, bs).sum(dtype=exact))
        rows.append({
            "allocator": allocator, "block_size": bs, "allocated_slots": slots,
            "utilisation": tokens / slots, "wasted_slots_per_seq": (slots - tokens) / n,
        })
    return {"num_seqs": n, "max_len": int(max_len), "tokens_stored": tokens, "results": rows}


def format_static_table(result: dict) -> str:
    lines = [f"{result['num_seqs']:,} sequences, max_len {result['max_len']:,}, "
             f"tokens stored {result['tokens_stored']:,}", "",
             f"{'allocator':<18}{'allocated slots':>17}{'utilisation':>13}{'waste/seq':>11}"]
    for row in result["results"]:
        name = row["allocator"] + (f" (block={row['block_size']})" if row["block_size"] else "")
        lines.append(f"{name:<18}{row['allocated_slots']:>17,}{row['utilisation']:>12.1%}"
                     f"{row['wasted_slots_per_seq']:>11.1f}")
    return "\n".join(lines + ["", "columns:", *legend_lines(STATIC_LEGEND)])


def utilisation_rows(workload: str, num_seqs: int, seed: int, max_len: int,
                     block_sizes=BLOCK_SIZES) -> list[dict]:
    """:func:`static_fragmentation` on ``num_seqs`` lengths drawn from ``workload``: one row per
    allocator (paged: per block size), with the workload's parameters on every row."""
    from pagebench.sim.workloads import sample_lengths

    res = static_fragmentation(sample_lengths(workload, num_seqs, seed, max_len), max_len,
                               block_sizes)
    return [dict(**r, workload=workload, num_seqs=res["num_seqs"], max_len=res["max_len"],
                 tokens_stored=res["tokens_stored"], seed=seed) for r in res["results"]]


def max_len_rows(workload: str, num_seqs: int, seed: int, max_lens,
                 block_sizes=(16, 128)) -> list[dict]:
    """Utilisation as ``max_model_len`` grows (lengths drawn again, clipped to each): naive
    reservation falls in proportion, paged does not move. ``label`` names each run."""
    rows = []
    for max_len in max_lens:
        for r in utilisation_rows(workload, num_seqs, seed, max_len, block_sizes):
            label = r["allocator"] if r["block_size"] is None else f"paged {r['block_size']}"
            rows.append(dict(max_len=max_len, label=label, **{k: r[k] for k in (
                "allocator", "block_size", "utilisation", "wasted_slots_per_seq", "workload",
                "num_seqs", "seed")}))
    return rows
