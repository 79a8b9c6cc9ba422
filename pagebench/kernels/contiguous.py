"""Triton decode on a contiguous cache: the paged kernel through an identity block table.

A contiguous cache ``[num_seqs, max_len, H, D]`` is a paged cache with one block of ``max_len``
tokens per sequence, so the same kernel reads it with ``block_tables[s] = [s]``; comparing this
with the paged run isolates what the block table itself costs. (SDPA, the other contiguous
baseline, lives in ``reference.py``.)
"""

from __future__ import annotations

import torch

from pagebench.kernels.reference import identity_tables
from pagebench.kernels.triton_decode import triton_paged_decode


def _as_paged(k, seq_lens, tables=None):
    """The identity block tables and the lengths (``None``: every sequence fills max_len)
    under which the paged kernel reads the contiguous cache ``k``."""
    num_seqs, max_len = k.shape[:2]
    if seq_lens is None:
        seq_lens = torch.full((num_seqs,), max_len, dtype=torch.int32, device=k.device)
    if tables is None:
        tables = identity_tables(num_seqs, k.device)
    return tables, seq_lens


def triton_contiguous_decode(q, k, v, seq_lens, scale, *, tables=None, launch=None):
    """``seq_lens=None`` means every sequence fills max_len; ``tables`` may be passed in
    (``identity_tables``) so that timing loops allocate nothing; ``launch`` as
    ``triton_paged_decode``'s."""
    tables, seq_lens = _as_paged(k, seq_lens, tables)
    return triton_paged_decode(q, k, v, tables, seq_lens, scale, launch=launch)


def prepare_triton_contiguous(q, k, v, seq_lens, scale):
    """``triton_contiguous_decode`` on these inputs as a no-argument call, with the identity
    tables and the lengths built once (the registry's ``prepare`` hook)."""
    tables, seq_lens = _as_paged(k, seq_lens)
    return lambda: triton_contiguous_decode(q, k, v, seq_lens, scale, tables=tables)
