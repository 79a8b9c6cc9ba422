"""Host cost of the Triton decode wrapper: the Python that runs before the kernel launches
(the cached plan's lookup, allocations), with the Triton launch stubbed out.

On a GPU without a CUDA graph this is paid on every call, per layer. CI runs it once as a check
(``--benchmark-disable``); ``make bench`` times it.
"""

from __future__ import annotations

import pytest
import torch

triton_decode = pytest.importorskip("pagebench.kernels.triton_decode")


class _NoLaunch:
    """Stands in for a Triton kernel: records the grid, launches nothing."""

    def __init__(self, kernel):
        self.grids = []
        self.arg_names = kernel.arg_names

    def __getitem__(self, grid):
        self.grids.append(grid)
        return lambda *args, **kwargs: None


@pytest.mark.parametrize("num_splits", [None, 1], ids=["split_choice", "one_split"])
def test_triton_wrapper_host_cost(benchmark, monkeypatch, num_splits):
    from pagebench.measure.kernel_cases import make_paged_inputs

    split = _NoLaunch(triton_decode._decode_split_kernel)
    combine = _NoLaunch(triton_decode._combine_kernel)
    monkeypatch.setattr(triton_decode, "_PLANS", {})  # plans hold the kernels they launch
    monkeypatch.setattr(triton_decode, "_decode_split_kernel", split)
    monkeypatch.setattr(triton_decode, "_combine_kernel", combine)
    inp = make_paged_inputs([4000], 32, 8, 128, 16, dtype=torch.bfloat16, seed=0)
    args = (*inp.args(), 128 ** -0.5)
    launch = triton_decode.DecodeLaunch(num_splits=num_splits)
    out = benchmark(lambda: triton_decode.triton_paged_decode(*args, launch=launch))
    assert out.shape == inp.q.shape
    # Llama shape, one 4000-token sequence (batch 1 takes the uniform grid: sequence x KV head
    # x split): split (the model's choice on the CPU's pretend slots: 2 splits, merged by the
    # split kernel itself; a GPU's 32 splits take the combine kernel), or one split
    seqs, heads, splits = split.grids[-1]
    assert seqs == 1 and heads == 8 and not combine.grids
    assert (splits > 1) == (num_splits is None)
    benchmark.extra_info.update(shape="32/8x128", batch=1, context=4000)
