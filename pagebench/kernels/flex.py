"""FlexAttention as a paged peer: flex_attention over the whole physical cache, with a block mask
built from the block tables (each sequence may read only its own pages, the last one partly).

The KV block of the mask equals the page size, so pages must be multiples of 16 tokens. The
cache is viewed as one "batch" of ``num_blocks * block_size`` tokens shared by every sequence
(``[1, H_kv, N, D]``); each sequence's block mask lists its physical pages, in logical order:
full pages need no mask function, the partial last page masks slots at or beyond the length.
On CUDA flex_attention is compiled (its eager form is a dense reference, not a kernel).
"""

from __future__ import annotations

import functools
import warnings

import torch


def flex_available() -> bool:
    try:
        # flex_attention is imported only to probe that this torch has it (hence the F401 noqa)
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return hasattr(BlockMask, "from_kv_blocks")


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    import torch._dynamo.config as dynamo_config
    for knob in ("recompile_limit", "cache_size_limit"):  # one compile per shape: allow many
        if hasattr(dynamo_config, knob):
            setattr(dynamo_config, knob, max(getattr(dynamo_config, knob), 512))
    return torch.compile(flex_attention, dynamic=False)


def flex_block_mask(block_tables, seq_lens, num_blocks: int, block_size: int):
    """BlockMask over the physical cache for one query token per sequence."""
    from torch.nn.attention.flex_attention import BlockMask

    num_seqs, max_blocks = block_tables.shape
    lens = seq_lens.to(torch.int32)
    # the index tensors span every physical page (flex sizes its dense form by their width)
    tables = torch.zeros(num_seqs, max(num_blocks, max_blocks), dtype=torch.int32,
                         device=block_tables.device)
    tables[:, :max_blocks] = block_tables
    used = torch.arange(tables.shape[1], device=tables.device)[None, :] < max_blocks
    tables = torch.where(used & (tables >= 0) & (tables < num_blocks), tables, 0)
    full = (lens // block_size).view(num_seqs, 1, 1)  # pages read whole
    partial_page = torch.clamp(lens // block_size, max=max_blocks - 1).to(torch.int64)
    has_partial = (lens % block_size != 0).to(torch.int32).view(num_seqs, 1, 1)
    partial_indices = torch.zeros_like(tables)
    partial_indices[:, 0] = tables.gather(1, partial_page[:, None])[:, 0]
    # physical page -> logical page of each sequence (-1: not its page), for the mask function
    logical = torch.full((num_seqs, num_blocks), -1, dtype=torch.int32, device=tables.device)
    pages = torch.arange(max_blocks, dtype=torch.int32, device=tables.device).expand(num_seqs, -1)
    needed = (lens + block_size - 1) // block_size
    in_use = pages < needed[:, None]
    _refuse_repeated_pages(block_tables, in_use)
    rows = torch.arange(num_seqs, device=tables.device)[:, None].expand(-1, max_blocks)
    logical[rows[in_use], tables[:, :max_blocks][in_use].long()] = pages[in_use]

    def mask_mod(b, h, q_idx, kv_idx):
        page = logical[b, kv_idx // block_size]
        return (page >= 0) & (page * block_size + kv_idx % block_size < lens[b])

    return BlockMask.from_kv_blocks(
        has_partial, partial_indices[:, None, None, :], full, tables[:, None, None, :],
        BLOCK_SIZE=(128, block_size), mask_mod=mask_mod,  # q block: a multiple of 16
        seq_lengths=(1, num_blocks * block_size))


def _refuse_repeated_pages(block_tables, in_use) -> None:
    """The mask maps each physical page to one logical page of a sequence, so a table that
    lists a page twice in one sequence cannot be expressed: a ValueError, not a wrong answer
    (one read of its values, as the mask's construction is host work anyway)."""
    # unused entries become distinct negatives, so only repeats among used ones compare equal
    cols = torch.arange(block_tables.shape[1], device=block_tables.device)
    ids = torch.where(in_use, block_tables.to(torch.int64), -1 - cols).sort(dim=1).values
    repeated = (ids[:, 1:] == ids[:, :-1]).any(dim=1)
    if bool(repeated.any()):
        s = int(repeated.nonzero()[0, 0])
        raise ValueError(f"block_tables: sequence {s} lists a block more than once; the flex "
                         f"backend reads each physical page once per sequence")


def flex_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, *, block_mask=None):
    """Paged decode through FlexAttention; ``block_mask`` may be built once (flex_block_mask)."""
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    num_seqs, q_heads, _ = q.shape
    if block_mask is None:
        block_mask = flex_block_mask(block_tables, seq_lens, num_blocks, block_size)
    # [1, H_kv, num_blocks * block_size, D]: a view, no copy
    k = k_cache.reshape(1, num_blocks * block_size, kv_heads, head_dim).transpose(1, 2)
    v = v_cache.reshape(1, num_blocks * block_size, kv_heads, head_dim).transpose(1, 2)
    k = k.expand(num_seqs, -1, -1, -1)
    v = v.expand(num_seqs, -1, -1, -1)
    flex = _compiled_flex() if q.is_cuda else _eager_flex()
    # KV tile no larger than a page (flex's decode path clamps it so; its general path needs it)
    options = {"BLOCK_N": min(block_size, 64)} if q.is_cuda else None
    out = flex(q.view(num_seqs, q_heads, 1, head_dim), k, v, block_mask=block_mask,
               scale=scale, enable_gqa=q_heads != kv_heads, kernel_options=options)
    return out.view(num_seqs, q_heads, head_dim)


def prepare_flex_decode(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """``flex_paged_decode`` on these inputs as a no-argument call, the block mask built once
    (the registry's ``prepare`` hook: building it is host work a timing loop must not pay)."""
    mask = flex_block_mask(block_tables, seq_lens, k_cache.shape[0], k_cache.shape[1])
    return lambda: flex_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale,
                                     block_mask=mask)


def _eager_flex():
    """The uncompiled form (CPU tests): a dense reference implementation; its warning is silenced."""
    from torch.nn.attention.flex_attention import flex_attention

    def run(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return flex_attention(*args, **kwargs)
    return run
