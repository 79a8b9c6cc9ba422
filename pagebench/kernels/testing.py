"""Inputs for tests and benchmarks: paged caches with scattered block tables and poisoned slots."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagebench.config import ceil_div


@dataclass
class PagedInputs:
    q: torch.Tensor  # [num_seqs, num_q_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens: torch.Tensor  # int32 [num_seqs]

    def args(self):
        return self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens


def make_paged_inputs(seq_lens, num_q_heads: int, num_kv_heads: int, head_dim: int,
                      block_size: int, dtype=torch.float32, device="cpu", *, seed: int = 0,
                      extra_blocks: int = 2, extra_table_cols: int = 1, poison: bool = True,
                      shuffle: bool = True, poison_value: float = float("nan")) -> PagedInputs:
    """Random q/K/V; each sequence's blocks are scattered over the cache (``shuffle``).

    With ``poison``, every cache slot and table entry a sequence must not read is poisoned:
    slots past each length and the ``extra_blocks`` spare blocks hold ``poison_value`` (NaN; a
    large finite value for backends that are not NaN-safe), and table entries past each
    sequence's last block point at a poisoned block or hold an out-of-range index.
    """
    gen = torch.Generator().manual_seed(seed)
    lens = [int(n) for n in seq_lens]
    needed = [ceil_div(n, block_size) for n in lens]
    max_blocks = max(needed, default=0) + extra_table_cols
    num_blocks = sum(needed) + extra_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    order = torch.randperm(num_blocks, generator=gen) if shuffle else torch.arange(num_blocks)
    tables = torch.zeros(len(lens), max_blocks, dtype=torch.int32)
    nan = poison_value
    spare = order[sum(needed):]
    start = 0
    for s, (n, nb) in enumerate(zip(lens, needed)):
        mine = order[start:start + nb]
        start += nb
        tables[s, :nb] = mine
        if poison:
            tail = n - (nb - 1) * block_size  # tokens used in the last block
            k_cache[mine[-1], tail:] = nan
            v_cache[mine[-1], tail:] = nan
            for j in range(nb, max_blocks):  # unused entries: a NaN block or garbage
                if len(spare) and j % 2 == 0:
                    tables[s, j] = int(spare[j % len(spare)])
                else:
                    tables[s, j] = num_blocks + 1000 * (j + 1) if j % 4 == 1 else -7
    if poison and len(spare):
        k_cache[spare] = nan
        v_cache[spare] = nan
    q = torch.randn(len(lens), num_q_heads, head_dim, generator=gen).to(dtype)
    return PagedInputs(q.to(device), k_cache.to(device), v_cache.to(device), tables.to(device),
                       torch.tensor(lens, dtype=torch.int32, device=device))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if out has any NaN)."""
    diff = out.detach().to("cpu", torch.float64) - ref.detach().to("cpu", torch.float64)
    return float(diff.norm() / ref.detach().to("cpu", torch.float64).norm().clamp_min(1e-30))


TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 2e-2}


# Memory layouts a caller's tensor may have, each holding the same values: the kernels must
# read every one that validation accepts.
LAYOUTS = ("contiguous", "offset", "padded", "strided", "transposed")


def with_layout(x: torch.Tensor, layout: str, junk=0) -> torch.Tensor:
    """A view of a copy of ``x`` equal to ``x`` in ``layout``, with ``junk`` in the memory
    around it: ``offset`` starts one row into its storage; ``padded`` leaves a gap after each
    row (dimension 1 twice as wide underneath); ``strided`` takes every other element of the
    last dimension; ``transposed`` is column-major (the dimensions' order reversed in memory).
    A 1-D tensor has no rows: there ``padded`` and ``transposed`` are ``strided``."""
    if layout == "contiguous":
        return x.clone()
    if layout == "offset":
        return torch.cat([torch.full_like(x[:1], junk), x])[1:]
    if layout == "padded" and x.dim() >= 2:
        wide = torch.full((x.shape[0], 2 * x.shape[1], *x.shape[2:]), junk, dtype=x.dtype,
                          device=x.device)
        wide[:, :x.shape[1]] = x
        return wide[:, :x.shape[1]]
    if layout == "transposed" and x.dim() >= 2:
        order = tuple(reversed(range(x.dim())))
        return x.permute(order).contiguous().permute(order)
    if layout in ("strided", "padded", "transposed"):
        wide = torch.full((*x.shape[:-1], 2 * x.shape[-1]), junk, dtype=x.dtype, device=x.device)
        wide[..., ::2] = x
        return wide[..., ::2]
    raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
