"""Input checks shared by every backend: run before anything is launched.

Each failed check raises ``ValueError`` whose message starts with the offending argument's name.
Shape, dtype and device checks run on every call and cost only host time. The value checks
(sequence lengths, the block indices a sequence will read, slots) read a few scalars back from
the device, a sync on a GPU, so there they run once per unchanged set of tensors
(``validate="cached"``, the default: ``value_checks.CheckedValues`` says what "unchanged"
means) or on every call (``validate="always"``). On the CPU, where reading a value back costs
nothing, they run on every call. While a CUDA graph is being captured they are skipped (a
capture cannot synchronise).
"""

from __future__ import annotations

from numbers import Integral

import torch

from pagebench.config import dtype_name
from pagebench.kernels.quant import FP8_DTYPES, as_float, in_float32_range, is_number
from pagebench.kernels.value_checks import CheckedValues

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# a paged cache is q's dtype, or fp8 with per-head scales (pagebench.kernels.quant)
CACHE_DTYPES = FLOAT_DTYPES + FP8_DTYPES
INDEX_DTYPES = (torch.int32, torch.int64)
VALIDATE_MODES = ("cached", "always")
CHECKED = CheckedValues()  # the value checks that passed, for validate="cached"


def _fail(name: str, message: str):
    raise ValueError(f"{name}: {message}")


def _tensor(name: str, x, ndim: int, dtypes=None):
    if not isinstance(x, torch.Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        _fail(name, f"expected {ndim} dimensions, got shape {tuple(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        names = ", ".join(dtype_name(d) for d in dtypes)
        _fail(name, f"dtype {dtype_name(x.dtype)} not supported (use one of {names})")


def _same_device(ref_name: str, ref: torch.Tensor, **others: torch.Tensor):
    for name, x in others.items():
        if x.device != ref.device:
            _fail(name, f"is on {x.device} but {ref_name} is on {ref.device}")


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def check_validate(validate) -> None:
    if not isinstance(validate, str) or validate not in VALIDATE_MODES:
        _fail("validate", f"expected one of {VALIDATE_MODES}, got {validate!r}")


def _check_values(validate: str, device: torch.device, check, tensors: tuple, params: tuple):
    """``check(*tensors, *params)`` now, or its remembered result (validate="cached" off the
    CPU) while the tensors are unchanged."""
    if validate == "always" or device.type == "cpu":
        return check(*tensors, *params)
    return CHECKED.run(check, tensors, params)


def check_scale(scale, head_dim: int) -> float:
    """The softmax scale as a float: ``head_dim ** -0.5`` for None, else a real number (not a
    bool or a string, which float() would take) that float32 holds."""
    if scale is None:
        return head_dim ** -0.5
    if not is_number(scale):
        _fail("scale", f"expected a number or None, got {scale!r}")
    value = as_float(scale)
    if not in_float32_range(value):
        _fail("scale", f"must be a positive number that float32 holds (the kernels compute in "
              f"float32), got {value:.6g}")
    return value


def check_cache_pair(k_cache, v_cache) -> tuple[int, int, int, int]:
    """A paged K/V cache pair: 4-d, the same shape and dtype, every dimension >= 1; returns
    (num_blocks, block_size, kv_heads, head_dim)."""
    _tensor("k_cache", k_cache, 4, CACHE_DTYPES)
    _tensor("v_cache", v_cache, 4, CACHE_DTYPES)
    if v_cache.shape != k_cache.shape:
        _fail("v_cache", f"shape {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}")
    if v_cache.dtype != k_cache.dtype:
        _fail("v_cache", f"dtype {v_cache.dtype} differs from k_cache's dtype {k_cache.dtype}")
    if min(k_cache.shape) < 1:
        _fail("k_cache", f"every dimension must be >= 1, got shape {tuple(k_cache.shape)}")
    return tuple(k_cache.shape)


def check_cache(q, k_cache, v_cache) -> tuple[int, int, int, int, int]:
    """q's last two dims against a paged cache; returns (num_blocks, block_size, kv_heads, q_heads, head_dim)."""
    num_blocks, block_size, kv_heads, head_dim = check_cache_pair(k_cache, v_cache)
    _check_q_against_kv(q, kv_heads, head_dim, k_cache=k_cache, v_cache=v_cache)
    return num_blocks, block_size, kv_heads, q.shape[-2], head_dim


def _check_q_against_kv(q, kv_heads: int, head_dim: int, **kv: torch.Tensor):
    """q's head_dim and GQA group against the K/V tensors; their dtype and inner layout."""
    q_heads = q.shape[-2]
    if q.shape[-1] != head_dim:
        _fail("q", f"head_dim {q.shape[-1]} differs from {next(iter(kv))}'s head_dim {head_dim}")
    if q_heads < 1 or q_heads % kv_heads:
        _fail("q", f"num_q_heads {q_heads} is not a positive multiple of num_kv_heads {kv_heads}")
    for name, x in kv.items():
        if x.dtype != q.dtype and x.dtype not in FP8_DTYPES:
            _fail(name, f"dtype {x.dtype} differs from q's dtype {q.dtype}")
        if x.stride(-1) != 1:
            _fail(name, "the last dimension (head_dim) must be contiguous")


def check_tables(block_tables, seq_lens, num_seqs: int, num_blocks: int, block_size: int,
                 device: torch.device, validate: str = "cached") -> None:
    _tensor("block_tables", block_tables, 2, INDEX_DTYPES)
    _tensor("seq_lens", seq_lens, 1, INDEX_DTYPES)
    if block_tables.shape[0] != num_seqs:
        _fail("block_tables", f"has {block_tables.shape[0]} rows but there are {num_seqs} sequences")
    if seq_lens.shape[0] != num_seqs:
        _fail("seq_lens", f"has {seq_lens.shape[0]} entries but there are {num_seqs} sequences")
    if block_tables.device != device:
        _fail("block_tables", f"is on {block_tables.device} but q is on {device}")
    if seq_lens.device != device:
        _fail("seq_lens", f"is on {seq_lens.device} but q is on {device}")
    if num_seqs == 0 or _capturing(device):
        return
    _check_values(validate, device, _check_table_values, (block_tables, seq_lens),
                  (num_blocks, block_size))


def _check_table_values(block_tables, seq_lens, num_blocks: int, block_size: int) -> None:
    device = seq_lens.device
    max_blocks = block_tables.shape[1]
    # One device->host read for all value checks.
    lens = seq_lens.to(torch.int64)
    needed = (lens + block_size - 1) // block_size  # blocks each sequence reads
    used = torch.arange(max_blocks, device=device)[None, :] < needed[:, None]
    table = block_tables.to(torch.int64)
    big = torch.iinfo(torch.int64).max
    stats = torch.stack([
        lens.min(), lens.max(),
        torch.where(used, table, big).min() if max_blocks else lens.new_tensor(0),
        torch.where(used, table, -1).max() if max_blocks else lens.new_tensor(-1),
    ]).tolist()
    min_len, max_len, min_block, max_block = stats
    if min_len < 1:
        _fail("seq_lens", f"every sequence length must be >= 1, got {min_len}")
    if max_len > max_blocks * block_size:
        _fail("seq_lens", f"length {max_len} exceeds what block_tables maps "
              f"({max_blocks} blocks x block_size {block_size} = {max_blocks * block_size} tokens)")
    if min_block < 0 or max_block >= num_blocks:
        bad = min_block if min_block < 0 else max_block
        _fail("block_tables", f"block index {bad} outside the cache's {num_blocks} blocks "
              f"(valid: 0..{num_blocks - 1})")


def check_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, validate="cached"):
    """Validate paged-decode arguments; returns the resolved scale."""
    check_validate(validate)
    _tensor("q", q, 3, FLOAT_DTYPES)
    _, block_size, _, _, head_dim = check_cache(q, k_cache, v_cache)
    _same_device("q", q, k_cache=k_cache, v_cache=v_cache)
    check_tables(block_tables, seq_lens, q.shape[0], k_cache.shape[0], block_size, q.device,
                 validate)
    return check_scale(scale, head_dim)


def check_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                  validate="cached"):
    """Validate paged-prefill arguments; returns the resolved scale."""
    check_validate(validate)
    _tensor("q", q, 3, FLOAT_DTYPES)
    _, block_size, _, _, head_dim = check_cache(q, k_cache, v_cache)
    _same_device("q", q, k_cache=k_cache, v_cache=v_cache)
    _tensor("query_start_loc", query_start_loc, 1, INDEX_DTYPES)
    num_seqs = query_start_loc.shape[0] - 1
    if num_seqs < 0:
        _fail("query_start_loc", "is empty: it needs num_seqs + 1 entries, the first 0")
    if isinstance(seq_lens, torch.Tensor) and seq_lens.dim() == 1 and seq_lens.shape[0] != num_seqs:
        _fail("query_start_loc", f"has {num_seqs + 1} entries for the {seq_lens.shape[0]} "
              f"sequences of seq_lens (it needs num_seqs + 1 = {seq_lens.shape[0] + 1})")
    if query_start_loc.device != q.device:
        _fail("query_start_loc", f"is on {query_start_loc.device} but q is on {q.device}")
    check_tables(block_tables, seq_lens, num_seqs, k_cache.shape[0], block_size, q.device,
                 validate)
    if not _capturing(q.device):
        _check_values(validate, q.device, _check_query_values, (query_start_loc, seq_lens),
                      (q.shape[0],))
    return check_scale(scale, head_dim)


def _check_query_values(query_start_loc, seq_lens, total: int) -> None:
    """The offsets start at 0, never decrease, end at q's token count, and no sequence has
    more queries than tokens."""
    num_seqs = seq_lens.shape[0]  # one read back: the offsets, then the lengths
    values = torch.cat([query_start_loc.to(torch.int64), seq_lens.to(torch.int64)]).tolist()
    starts, lens = values[:num_seqs + 1], values[num_seqs + 1:]
    first, last = starts[0], starts[-1]
    if first != 0:
        _fail("query_start_loc", f"must start at 0, got {first}")
    for s, sl in enumerate(lens):
        ql = starts[s + 1] - starts[s]
        if ql < 0:
            _fail("query_start_loc", f"decreases at sequence {s} ({starts[s]} then "
                  f"{starts[s + 1]})")
        if ql > sl:
            _fail("query_start_loc", f"sequence {s}: query length {ql} exceeds its "
                  f"seq_len ({sl})")
    if last != total:
        _fail("query_start_loc", f"ends at {last} but q has {total} query tokens")


def check_contiguous(q, k, v, seq_lens, scale, validate="cached"):
    """Validate contiguous-decode arguments; returns (scale, all_full) where all_full says
    every sequence uses the whole max_len (so no mask is needed)."""
    check_validate(validate)
    _tensor("q", q, 3, FLOAT_DTYPES)
    _tensor("k", k, 4, FLOAT_DTYPES)
    _tensor("v", v, 4, FLOAT_DTYPES)
    if v.shape != k.shape:
        _fail("v", f"shape {tuple(v.shape)} differs from k {tuple(k.shape)}")
    num_seqs, max_len, kv_heads, head_dim = k.shape
    if num_seqs != q.shape[0]:
        _fail("k", f"has {num_seqs} sequences but q has {q.shape[0]}")
    if kv_heads < 1 or head_dim < 1:
        _fail("k", f"num_kv_heads and head_dim must be >= 1, got shape {tuple(k.shape)}")
    _check_q_against_kv(q, kv_heads, head_dim, k=k, v=v)
    _same_device("q", q, k=k, v=v)
    _tensor("seq_lens", seq_lens, 1, INDEX_DTYPES)
    if seq_lens.shape[0] != num_seqs:
        _fail("seq_lens", f"has {seq_lens.shape[0]} entries but there are {num_seqs} sequences")
    if seq_lens.device != q.device:
        _fail("seq_lens", f"is on {seq_lens.device} but q is on {q.device}")
    all_full = False
    if num_seqs and not _capturing(q.device):
        all_full = _check_values(validate, q.device, _check_contiguous_values, (seq_lens,),
                                 (max_len,))
    return check_scale(scale, head_dim), all_full


def _check_contiguous_values(seq_lens, max_len: int) -> bool:
    """Whether every sequence fills max_len."""
    lo, hi = torch.stack([seq_lens.min(), seq_lens.max()]).tolist()
    if lo < 1:
        _fail("seq_lens", f"every sequence length must be >= 1, got {lo}")
    if hi > max_len:
        _fail("seq_lens", f"length {hi} exceeds the cache's max_len {max_len}")
    return lo == max_len


def element_span(t: torch.Tensor) -> int:
    """One past the largest element offset a strided tensor reaches (0 if it is empty)."""
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0


def shares_memory(a, b) -> bool:
    """Whether the bytes ``a`` and ``b`` span overlap (from the first element to one past the
    last, strides included: conservative for interleaved views; a host-side check, no sync).
    Two views of one allocation that do not overlap, as the K and V halves of one tensor, do
    not share memory."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return (a0 < b0 + element_span(b) * b.element_size()
            and b0 < a0 + element_span(a) * a.element_size())


def check_writable(k_cache, v_cache) -> None:
    """Both caches can be written in place here: what torch would refuse only at the in-place
    store, with K already written; and they are two caches (writing V into memory that holds
    K would overwrite it)."""
    if shares_memory(k_cache, v_cache):
        _fail("v_cache", "shares memory with k_cache: K and V need caches of their own")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.requires_grad and torch.is_grad_enabled():
            _fail(name, "requires grad: write into it under torch.no_grad() (or detach it)")
        if x.is_inference() and not torch.is_inference_mode_enabled():
            _fail(name, "is an inference tensor: write into it inside torch.inference_mode()")


def check_write_kv(k_cache, v_cache, k, v, slot_mapping, validate="cached") -> bool:
    """Validate ``write_kv``'s arguments; returns whether every slot is >= 0 (no padding to
    skip; also True while a CUDA graph is captured, when nothing is read back)."""
    check_validate(validate)
    _tensor("k", k, 3, FLOAT_DTYPES)
    _tensor("v", v, 3, FLOAT_DTYPES)
    num_blocks, block_size, kv_heads, head_dim = check_cache_pair(k_cache, v_cache)
    _tensor("slot_mapping", slot_mapping, 1, INDEX_DTYPES)
    for name, x in (("k", k), ("v", v)):
        if tuple(x.shape[1:]) != (kv_heads, head_dim):
            _fail(name, f"shape {tuple(x.shape)} does not match [num_tokens, {kv_heads}, {head_dim}]")
        if x.shape[0] != slot_mapping.shape[0]:
            _fail(name, f"has {x.shape[0]} tokens but slot_mapping has {slot_mapping.shape[0]}")
        if x.dtype != k_cache.dtype and k_cache.dtype not in FP8_DTYPES:
            _fail(name, f"dtype {x.dtype} differs from the cache's dtype {k_cache.dtype}")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not x.is_contiguous():
            _fail(name, "must be contiguous")
    check_writable(k_cache, v_cache)
    _same_device("k_cache", k_cache, v_cache=v_cache, k=k, v=v, slot_mapping=slot_mapping)
    if slot_mapping.numel() == 0 or _capturing(k_cache.device):
        return True
    return _check_values(validate, k_cache.device, _check_slot_values, (slot_mapping,),
                         (num_blocks * block_size,))


def _check_slot_values(slot_mapping, num_slots: int) -> bool:
    """Whether every slot is >= 0 (no padding)."""
    slots = torch.sort(slot_mapping.to(torch.int64)).values
    repeated = (slots[1:] == slots[:-1]) & (slots[1:] >= 0)
    lo, hi, twice = torch.stack([slots[0], slots[-1], repeated.any().long()]).tolist()
    if lo < -1 or hi >= num_slots:
        bad = lo if lo < -1 else hi
        _fail("slot_mapping", f"slot {bad} outside the cache's {num_slots} slots "
              f"(valid: 0..{num_slots - 1}, or -1 to skip a token)")
    if twice:
        _fail("slot_mapping", "the same slot appears twice in one write")
    return lo >= 0


def check_copy_blocks(k_cache, v_cache, pairs) -> torch.Tensor:
    """Validate ``copy_blocks``'s arguments (the caches writable, as for ``write_kv``); returns
    pairs as an int64 tensor [n, 2] of (src, dst) on the cache's device."""
    _tensor("k_cache", k_cache, 4, CACHE_DTYPES)
    _tensor("v_cache", v_cache, 4, CACHE_DTYPES)
    if v_cache.shape != k_cache.shape:
        _fail("v_cache", f"shape {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}")
    _same_device("k_cache", k_cache, v_cache=v_cache)
    check_writable(k_cache, v_cache)
    if isinstance(pairs, torch.Tensor):
        if pairs.dtype == torch.bool or pairs.is_floating_point() or pairs.is_complex():
            _fail("pairs", f"block ids must be integers, got dtype {pairs.dtype}")
    else:
        try:
            pairs = [tuple(p) for p in pairs]
        except TypeError as e:
            _fail("pairs", f"expected (src, dst) integer pairs: {e}")
        for block in (b for p in pairs for b in p):
            # a float or a bool would silently become some other block's id
            if isinstance(block, bool) or not isinstance(block, Integral):
                _fail("pairs", f"block ids must be integers, got {block!r}")
    try:
        if isinstance(pairs, torch.Tensor):
            table = pairs.detach().to("cpu", torch.int64)
        else:
            table = torch.tensor(pairs, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError) as e:
        _fail("pairs", f"expected (src, dst) integer pairs: {e}")
    if table.numel() == 0:
        return table.reshape(0, 2).to(k_cache.device)
    if table.dim() != 2 or table.shape[1] != 2:
        _fail("pairs", f"expected (src, dst) pairs, got shape {tuple(table.shape)}")
    num_blocks = k_cache.shape[0]
    lo, hi = int(table.min()), int(table.max())
    if lo < 0 or hi >= num_blocks:
        bad = lo if lo < 0 else hi
        _fail("pairs", f"block {bad} outside the cache's {num_blocks} blocks")
    dst = table[:, 1]
    if dst.numel() != torch.unique(dst).numel():
        _fail("pairs", "the same destination block appears twice")
    if bool(torch.isin(dst, table[:, 0]).any()):
        _fail("pairs", "a block is both a source and a destination")
    return table.to(k_cache.device)
