"""Launch grids of the Triton kernels (``pagebench bench --tune [--prefill]``), CUDA only.

Every launch configuration is timed through a CUDA graph (kernel time, no Python launch cost),
bf16, blocks of 16, one row per measurement; a configuration that fails to compile or launch
is recorded in ``skipped`` instead. The decode grid crosses (tile_n, num_warps, num_stages) with
the number of KV splits at each point, beside SDPA (both GQA layouts), Flex at short batch-1
contexts, and the split count the model picks (``heuristic=True``): the data behind
``triton_decode``'s defaults (docs/kernels.md). The prefill grid crosses ``PrefillLaunch``'s
fields (rows, tile_n, num_warps, num_stages, one or two walks, block ids ahead, register cap,
lazy rescale) at the prefill sweep's points, beside the launch ``prefill_launch`` picks
(``chosen=True``).
"""

from __future__ import annotations

import dataclasses

import torch

from pagebench.defaults import BLOCK_SIZE, SHAPES
from pagebench.measure.kernel_cases import contiguous_case, paged_case, prefill_case
from pagebench.measure.prefill_sweep import FULL_PREFILL_POINTS
from pagebench.measure.kernel_sweep import kv_bytes
from pagebench.measure.timing import measure

DECODE_CONFIGS = [(64, 4, 2), (64, 4, 3), (64, 8, 2), (128, 4, 2), (128, 8, 3), (32, 4, 2)]
DECODE_SPLITS = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 32, 48, 64, 128]
DECODE_POINTS = {
    "llama-3-8b": [(1, 1024), (1, 4096), (1, 16384), (1, 65536), (2, 4096), (4, 4096),
                   (8, 4096), (16, 4096), (32, 4096), (64, 4096), (128, 4096), (256, 4096)],
    "qwen2.5-0.5b": [(1, 1024), (1, 65536), (8, 4096), (16, 4096), (32, 4096), (64, 4096),
                     (256, 4096)],
}
# prefill_launch's choices and their neighbours, as triton_prefill.PrefillLaunch's keywords
PREFILL_CONFIGS = [dict(rows=64, tile_n=64, num_warps=4, num_stages=2),
                   dict(rows=64, tile_n=64, num_warps=4, num_stages=2, one_loop=True),
                   dict(rows=64, tile_n=64, num_warps=4, num_stages=3, one_loop=True,
                        table_ahead=True),
                   dict(rows=64, tile_n=64, num_warps=4, num_stages=3, one_loop=True,
                        table_ahead=True, maxnreg=255),
                   dict(rows=64, tile_n=32, num_warps=4, num_stages=2, one_loop=True,
                        maxnreg=128),
                   dict(rows=64, tile_n=32, num_warps=4, num_stages=3, one_loop=True,
                        table_ahead=True, maxnreg=168),
                   dict(rows=64, tile_n=32, num_warps=4, num_stages=3, one_loop=True,
                        table_ahead=True, maxnreg=168, lazy_rescale=True),
                   dict(rows=128, tile_n=64, num_warps=4, num_stages=3),
                   dict(rows=128, tile_n=64, num_warps=8, num_stages=2, maxnreg=128),
                   dict(rows=128, tile_n=32, num_warps=8, num_stages=2, maxnreg=128),
                   dict(rows=128, tile_n=64, num_warps=8, num_stages=2, one_loop=True,
                        maxnreg=128)]


def _require_cuda(device: str) -> None:
    if torch.device(device).type != "cuda":
        raise ValueError(f"--device: the launch grids time CUDA graphs; got {device!r}")


def _timer(device: str, rows: list, skipped: list, repeat: int, warmup: int):
    """A function that times ``fn`` into a row of ``rows`` (returned), or records a failure."""
    def timed(fn, base: dict, nbytes: int | None = None, **info):
        try:
            t = measure(fn, device=device, warmup=warmup, repeat=repeat, cuda_graph=True)
        except Exception as e:  # noqa: BLE001 (a configuration that cannot launch is a result)
            skipped.append((*base.values(), *info.values(), f"{type(e).__name__}: {e}"[:160]))
            torch.cuda.synchronize()
            return None
        row = {**base, **info, "time_us": t.median_us}
        if nbytes is not None:
            row["gbps"] = nbytes / t.median_us / 1e3
        rows.append(row)
        return row
    return timed


def decode_launch_grid(device: str = "cuda", repeat: int = 15, skipped: list | None = None,
                       points: dict | None = None) -> list[dict]:
    """Rows of the decode grid (``DECODE_POINTS`` unless ``points``: shape name -> (batch,
    context) list)."""
    _require_cuda(device)
    rows: list[dict] = []
    timed = _timer(device, rows, [] if skipped is None else skipped, repeat, warmup=3)
    for shape_name, shape_points in (points or DECODE_POINTS).items():
        for batch, context in shape_points:
            _decode_point(timed, device, shape_name, batch, context)
            torch.cuda.empty_cache()  # this point's tensors are gone with its frame
    return rows


def _decode_point(timed, device: str, shape_name: str, batch: int, context: int) -> None:
    from pagebench.kernels import reference, triton_decode
    from pagebench.kernels.flex import prepare_flex_decode

    shape = SHAPES[shape_name]
    scale = shape[2] ** -0.5
    nbytes = kv_bytes(batch, context, shape[1], shape[2], torch.bfloat16)
    base = {"model_shape": shape_name, "batch": batch, "context": context}
    q, k, v, _ = contiguous_case(batch, context, shape, torch.bfloat16, device, seed=4).args()
    for mode in ("gqa", "groups"):
        timed(lambda: reference.sdpa_contiguous_decode(q, k, v, None, scale, mode),
              base, nbytes, backend=f"sdpa-{mode}")
    q = k = v = None  # the contiguous cache is not needed beside the paged one
    case = paged_case(batch, context, shape, BLOCK_SIZE, torch.bfloat16, device, seed=4).args()
    if batch == 1 and context <= 4096:
        timed(prepare_flex_decode(*case, scale), base, nbytes, backend="flex")
    chosen = triton_decode.decode_plan(*case, scale).num_splits
    timed(lambda: triton_decode.triton_paged_decode(*case, scale), base, nbytes,
          backend="triton", num_splits=chosen, heuristic=True)
    for tile_n, warps, stages in DECODE_CONFIGS:
        for splits in DECODE_SPLITS:
            if splits > max(1, context // tile_n):
                continue
            options = dict(num_splits=splits, tile_n=tile_n, num_warps=warps, num_stages=stages)
            launch = triton_decode.DecodeLaunch(**options)
            row = timed(lambda: triton_decode.triton_paged_decode(*case, scale, launch=launch),
                        base, nbytes, backend="triton", **options,
                        programs=batch * shape[1] * splits)
            plan = triton_decode.decode_plan(*case, scale, launch)
            kernel = next(iter(plan.split.compiled.values()), (None,))[0]
            if row is not None and kernel is not None:  # registers, shared memory
                row.update(n_regs=kernel.n_regs, shared=kernel.metadata.shared)


def prefill_launch_grid(device: str = "cuda", repeat: int = 10, skipped: list | None = None,
                        points=FULL_PREFILL_POINTS) -> list[dict]:
    """Rows of the prefill grid: Llama-3-8B shape, each (batch, query_len, cached) point."""
    from pagebench.kernels.triton_prefill import PrefillLaunch, triton_paged_prefill

    _require_cuda(device)
    shape = SHAPES["llama-3-8b"]
    scale = shape[2] ** -0.5
    rows: list[dict] = []
    timed = _timer(device, rows, [] if skipped is None else skipped, repeat, warmup=2)
    for batch, query_len, cached in points:
        case = prefill_case(batch, query_len, cached, shape, BLOCK_SIZE, torch.bfloat16,
                            device, seed=3).args()
        base = {"batch": batch, "query_len": query_len, "cached": cached}
        timed(lambda: triton_paged_prefill(*case, scale), base, chosen=True)
        for config in PREFILL_CONFIGS:
            launch = PrefillLaunch(**config)
            timed(lambda: triton_paged_prefill(*case, scale, launch=launch), base,
                  **dataclasses.asdict(launch))
        case = None  # free this point's cache before the next is built
    return rows
