"""Kernel inputs, one module for tests, property tests, sweeps, asv suites and scripts.

``make_paged_inputs`` is the one builder of paged caches: any lengths, block tables in a
``TABLE_LAYOUTS`` layout, and optionally every slot and table entry a kernel must not read
poisoned (the tests' inputs). ``paged_case``, ``prefill_case`` and ``contiguous_case`` are the
timed cases of the sweeps and benchmarks (``batch`` sequences of one length, nothing spare,
nothing poisoned); ``quantized_inputs`` turns any paged input into an fp8 one with its scales.
Random values are drawn on the target device from one generator seeded with ``seed``.
Also here: the tolerances and ``relative_error`` the tests compare with, the memory layouts a
caller's tensor may have (``with_layout``), and the block-table layouts (``layout_tables``,
``aged_tables``, ``adjacent_fraction``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from pagebench.config import ceil_div
from pagebench.kernels.quant import fp8_max, quantize

TABLE_LAYOUTS = ("contiguous", "shuffled", "aged")


@dataclass
class PagedInputs:
    q: torch.Tensor  # decode [num_seqs, num_q_heads, head_dim]; prefill [total_query_tokens, ...]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    k_scale: torch.Tensor | None = None  # fp8 caches: float32 [num_kv_heads]
    v_scale: torch.Tensor | None = None
    query_start_loc: torch.Tensor | None = None  # prefill: int32 [num_seqs + 1], q's offsets

    def args(self):
        """The positional arguments of ``paged_decode`` (of ``paged_prefill`` when the input
        has ``query_start_loc``)."""
        tensors = (self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens)
        return tensors if self.query_start_loc is None else (*tensors, self.query_start_loc)

    def scales(self) -> dict:
        """``k_scale``/``v_scale`` keywords for an fp8 cache, else nothing."""
        if self.k_scale is None:
            return {}
        return {"k_scale": self.k_scale, "v_scale": self.v_scale}


@dataclass
class ContiguousInputs:
    q: torch.Tensor  # [num_seqs, num_q_heads, head_dim]
    k: torch.Tensor  # [num_seqs, max_len, num_kv_heads, head_dim]
    v: torch.Tensor
    seq_lens: torch.Tensor  # int32 [num_seqs]

    def args(self):
        """The positional arguments of ``contiguous_decode``."""
        return self.q, self.k, self.v, self.seq_lens


def make_paged_inputs(seq_lens, num_q_heads: int, num_kv_heads: int, head_dim: int,
                      block_size: int, dtype=torch.float32, device="cpu", *, seed: int = 0,
                      layout: str = "shuffled", extra_blocks: int = 2, extra_table_cols: int = 1,
                      poison: bool = True, poison_value: float = float("nan")) -> PagedInputs:
    """Random q/K/V with each sequence's blocks placed by ``layout``: ``shuffled`` (anywhere
    in the cache), ``contiguous`` (in order, sequence after sequence) or ``aged`` (as
    ``aged_tables`` hands them out: equal lengths only; the pool's other requests' blocks are
    its spare blocks, in place of ``extra_blocks``). The cache holds ``extra_blocks`` spare
    blocks and each table ``extra_table_cols`` unused entries.

    With ``poison``, every cache slot and table entry a sequence must not read is poisoned:
    slots past each length and the spare blocks hold ``poison_value`` (NaN; a large finite
    value for backends that are not NaN-safe), and table entries past each sequence's last
    block point at a poisoned block or hold an out-of-range index.
    """
    lens = [int(n) for n in seq_lens]
    needed = [ceil_div(n, block_size) for n in lens]
    max_blocks = max(needed, default=0) + extra_table_cols
    gen = torch.Generator(device=device).manual_seed(seed)
    if layout == "aged":
        if len(set(lens)) != 1:
            raise ValueError(f"layout: 'aged' tables need sequences of one length, got {lens}")
        aged, num_blocks = aged_tables(len(lens), lens[0], block_size, seed=seed)
    elif layout in ("contiguous", "shuffled"):
        num_blocks = sum(needed) + extra_blocks
    else:
        raise ValueError(f"layout: unknown {layout!r} (use one of {', '.join(TABLE_LAYOUTS)})")
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    # order: the blocks the sequences take, one after another, then the spare ones
    if layout == "shuffled":
        order = torch.randperm(num_blocks, generator=gen, device=device).cpu()
    elif layout == "contiguous":
        order = torch.arange(num_blocks)
    else:
        taken = aged.flatten().to(torch.int64)
        unused = torch.ones(num_blocks, dtype=torch.bool)
        unused[taken] = False
        order = torch.cat([taken, torch.nonzero(unused).flatten()])
    tables = torch.zeros(len(lens), max_blocks, dtype=torch.int32)
    spare = order[sum(needed):]
    start = 0
    for s, (n, nb) in enumerate(zip(lens, needed)):
        mine = order[start:start + nb]
        start += nb
        tables[s, :nb] = mine
        if poison:
            tail = n - (nb - 1) * block_size  # tokens used in the last block
            k_cache[int(mine[-1]), tail:] = poison_value
            v_cache[int(mine[-1]), tail:] = poison_value
            for j in range(nb, max_blocks):  # unused entries: a poisoned block or garbage
                if len(spare) and j % 2 == 0:
                    tables[s, j] = int(spare[j % len(spare)])
                else:
                    tables[s, j] = num_blocks + 1000 * (j + 1) if j % 4 == 1 else -7
    if poison and len(spare):
        k_cache[spare.to(device)] = poison_value
        v_cache[spare.to(device)] = poison_value
    q = torch.randn(len(lens), num_q_heads, head_dim, generator=gen, device=device, dtype=dtype)
    return PagedInputs(q, k_cache, v_cache, tables.to(device),
                       torch.tensor(lens, dtype=torch.int32, device=device))


def paged_case(batch: int, context: int, shape, block_size: int, dtype, device, seed: int = 0,
               layout: str = "shuffled") -> PagedInputs:
    """A timed decode case: ``batch`` sequences of ``context`` tokens, attention ``shape``
    (num_q_heads, num_kv_heads, head_dim), tables in ``layout``, no spare block or table
    entry, nothing poisoned."""
    return make_paged_inputs([context] * batch, *shape, block_size, dtype, device, seed=seed,
                             layout=layout, extra_blocks=0, extra_table_cols=0, poison=False)


def prefill_case(batch: int, query_len: int, cached: int, shape, block_size: int, dtype, device,
                 seed: int = 0) -> PagedInputs:
    """A timed prefill case: ``batch`` sequences, each with ``cached`` tokens before a chunk of
    ``query_len`` new ones (already in the cache); q packs the chunks, ``query_start_loc`` is
    set."""
    case = paged_case(batch, cached + query_len, shape, block_size, dtype, device, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    q = torch.randn(batch * query_len, shape[0], shape[2], device=device, dtype=dtype,
                    generator=gen)
    starts = torch.arange(batch + 1, dtype=torch.int32, device=device) * query_len
    return dataclasses.replace(case, q=q, query_start_loc=starts)


def contiguous_case(batch: int, context: int, shape, dtype, device,
                    seed: int = 0) -> ContiguousInputs:
    """A timed contiguous decode case: ``batch`` sequences of ``context`` tokens each."""
    num_q, num_kv, head_dim = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    k = torch.randn(batch, context, num_kv, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(batch, context, num_kv, head_dim, device=device, dtype=dtype, generator=gen)
    q = torch.randn(batch, num_q, head_dim, device=device, dtype=dtype, generator=gen)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return ContiguousInputs(q, k, v, lens)


def quantized_inputs(inp: PagedInputs, cache_dtype, *, seed: int = 0,
                     spread: float = 16.0, one_scale: bool = False) -> PagedInputs:
    """``inp`` with its caches quantised to fp8 ``cache_dtype``. Each KV head's values are
    first multiplied by its own magnitude (log-uniform within ``spread``x of 1, so a kernel
    that applied another head's scale would be far off), then stored with a per-head scale
    that maps the head's largest finite value to the format's largest. Poisoned slots stay NaN
    (or their large finite value, saturated). Returns new tensors; ``inp`` is unchanged. The
    unquantised caches with the same per-head magnitudes are ``unquantized_caches``.
    ``one_scale``: every head stored with the largest head's scale (K's and V's own), as
    kernels that take one scale per cache (FlashInfer) need."""
    k_real, v_real, k_amax, v_amax = _scaled_real_caches(inp, seed, spread)
    if one_scale:
        k_amax, v_amax = (a.max().expand_as(a).contiguous() for a in (k_amax, v_amax))
    k_scale, v_scale = k_amax / fp8_max(cache_dtype), v_amax / fp8_max(cache_dtype)
    return dataclasses.replace(inp, k_cache=quantize(k_real, k_scale, cache_dtype),
                               v_cache=quantize(v_real, v_scale, cache_dtype), k_scale=k_scale,
                               v_scale=v_scale)


def unquantized_caches(inp: PagedInputs, *, seed: int = 0, spread: float = 16.0):
    """The (k, v) caches that ``quantized_inputs`` with the same ``seed`` quantises, in the
    input's dtype: what an fp8 result is compared with to measure the quantisation error."""
    k_real, v_real, _, _ = _scaled_real_caches(inp, seed, spread)
    return k_real.to(inp.k_cache.dtype), v_real.to(inp.v_cache.dtype)


def _scaled_real_caches(inp: PagedInputs, seed: int, spread: float):
    kv_heads = inp.k_cache.shape[2]
    gen = torch.Generator().manual_seed(seed)
    device = inp.k_cache.device
    out = []
    for cache in (inp.k_cache, inp.v_cache):
        magnitude = spread ** (2 * torch.rand(kv_heads, generator=gen) - 1)
        real = cache.to(torch.float32) * magnitude.to(device)[:, None]
        finite = torch.where(torch.isfinite(real), real.abs(), 0.0)
        out.append(real)
        out.append(finite.amax(dim=(0, 1, 3)).clamp_min(1e-6))
    k_real, k_amax, v_real, v_amax = out
    return k_real, v_real, k_amax, v_amax  # amax: each head's largest finite magnitude


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



def spare_block(tables: torch.Tensor, lengths, block_size: int, num_blocks: int) -> int:
    """A block no sequence reads (``make_paged_inputs`` poisons it with NaN): junk for a
    table's ``with_layout``."""
    used = {int(b) for s, n in enumerate(lengths)
            for b in tables[s, :ceil_div(n, block_size)].tolist()}
    return min(set(range(num_blocks)) - used)

# ---- block-table layouts (what the timed kernel reads) -----------------------------------

AGED_BACKGROUND = 0.25  # other requests' share of the pool, relative to the measured ones


def layout_tables(layout: str, batch: int, context: int, block_size: int, *, seed: int = 0):
    """Block tables int32 ``[batch, ceil(context / block_size)]`` of a layout, and the pool
    size (``num_blocks``) they index:

    - ``contiguous``: sequence s owns blocks ``s * n .. s * n + n - 1`` in order (``arange``
      tables, as SGLang's and FlashAttention's benchmarks use);
    - ``shuffled``: every block of the pool anywhere, a random permutation;
    - ``aged``: the tables a block manager hands out after serving traffic (``aged_tables``).
    """
    case = paged_case(batch, context, (1, 1, 1), block_size, torch.float32, "cpu", seed, layout)
    return case.block_tables, case.k_cache.shape[0]


def aged_tables(batch: int, context: int, block_size: int, *, seed: int = 0,
                background: float = AGED_BACKGROUND):
    """Tables from ``engine.BlockManager`` after it has served a trace with churn.

    The pool holds the ``batch`` measured sequences plus ``background`` as much again for other
    requests (prompt lengths log-normal, median ~400 tokens, each living 1/16 to 1/2 of the
    measured sequences' growth, in decode steps, so the pool turns over a few times).
    First the other requests alone churn through the pool (allocate, free) until its free
    queue is in a served order; then the measured sequences start from one token and grow in
    lockstep, one token each per decode step (``append_token``), while other requests finish
    and arrive between steps, and the oldest are evicted when the measured ones need their
    blocks. Returns (tables int32 ``[batch, ceil(context / block_size)]``, num_blocks).
    """
    import heapq
    import random
    from collections import OrderedDict

    from pagebench.engine.block_manager import BlockManager

    rng = random.Random(seed)
    per_seq = ceil_div(context, block_size)
    num_blocks = batch * per_seq + max(1, int(batch * per_seq * background))
    bm = BlockManager(num_blocks, block_size)
    others: OrderedDict[int, None] = OrderedDict()  # live background requests, oldest first
    ends: list[tuple[int, int]] = []  # (step it finishes, request)
    ids = iter(range(-1, -(1 << 62), -1))  # negative: never a measured sequence's id
    life = (max(16, context // 16), max(32, context // 2))

    def arrive(step: int, free_to_keep: int) -> None:
        while True:
            tokens = max(1, min(int(rng.lognormvariate(6.0, 0.8)), 8192))
            if bm.num_free_blocks - bm.blocks_needed(tokens) < free_to_keep:
                return
            name = next(ids)
            bm.allocate(name, [0] * tokens)
            others[name] = None
            heapq.heappush(ends, (step + rng.randint(*life), name))

    def finish(step: int) -> None:
        while ends and ends[0][0] <= step:
            name = heapq.heappop(ends)[1]
            if name in others:  # else evicted already
                bm.free(name)
                del others[name]

    def evict_until(free_blocks: int) -> None:
        while bm.num_free_blocks < free_blocks:
            name = others.popitem(last=False)[0]
            bm.free(name)

    warmup = 2 * life[1]
    for step in range(0, warmup, max(1, warmup // 64)):  # other traffic alone: a served pool
        finish(step)
        arrive(step, num_blocks // 10)
    step = warmup
    evict_until(batch)
    for s in range(batch):
        bm.allocate(s, [0])
    for length in range(1, context):
        if length % block_size == 0:  # each measured sequence takes a block this step
            evict_until(batch)
        for s in range(batch):
            bm.append_token(s, 0)
        step += 1
        finish(step)
        # newcomers take only what the measured sequences will not need
        arrive(step, batch * (per_seq - bm.blocks_needed(length + 1)))
    tables = torch.tensor([bm.block_table(s) for s in range(batch)], dtype=torch.int32)
    return tables, num_blocks


def adjacent_fraction(tables: torch.Tensor) -> float:
    """Fraction of neighbouring table entries that are neighbouring blocks (b, b + 1): 1.0 for
    contiguous tables, about 0 for shuffled ones."""
    if tables.shape[1] < 2:
        return float("nan")
    t = tables.to(torch.int64)
    return float(((t[:, 1:] - t[:, :-1]) == 1).double().mean())
