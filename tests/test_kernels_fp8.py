"""fp8 KV caches: the public API's scale checks, write_kv's quantisation, capabilities."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from pagebench.kernels import (available_backends, get_backend, paged_decode, paged_prefill,
                               register_backend, resolve, unregister_backend, write_kv)
from pagebench.measure.kernel_cases import make_paged_inputs, quantized_inputs, relative_error
from pagebench.kernels.quant import (calibrated_scales, check_kv_scales, dequantize,
                                     kv_dtype_from_name, quantize)
from pagebench.kernels.reference import reference_decode, reference_prefill

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _fp8_case(cache_dtype=E4M3, dtype=torch.float32):
    inp = make_paged_inputs([3, 9], 4, 2, 16, 4, dtype, poison=False)
    return quantized_inputs(inp, cache_dtype, seed=1)


def test_backends_list_their_cache_dtypes():
    caps = available_backends()
    assert {"float8_e4m3fn", "float8_e5m2"} <= set(caps["torch"]["cache_dtypes"])
    assert "float8_e4m3fn" not in caps["sdpa"]["cache_dtypes"]
    assert resolve("decode", "auto", "cpu", torch.bfloat16, 16, 64, E5M2).name in (
        "torch", "triton")


def test_a_backend_without_fp8_is_refused_and_never_auto_picked():
    register_backend("unquantised-only", decode=lambda *a, **k: None, priority=1000)
    try:
        assert "float8_e4m3fn" not in available_backends()["unquantised-only"]["cache_dtypes"]
        with pytest.raises(ValueError, match="backend: 'unquantised-only' does not support.*"
                           "cache float8_e4m3fn"):
            resolve("decode", "unquantised-only", "cpu", torch.float32, 16, 64, E4M3)
        assert resolve("decode", "auto", "cpu", torch.float32, 16, 64, E4M3).name != \
            "unquantised-only"
        inp = _fp8_case()
        with pytest.raises(ValueError, match="backend: 'unquantised-only'"):
            paged_decode(*inp.args(), backend="unquantised-only", **inp.scales())
    finally:
        unregister_backend("unquantised-only")


@pytest.mark.skipif("triton" not in available_backends(), reason="triton not installed")
@pytest.mark.parametrize("capability,reads_e4m3", [((8, 0), False), ((8, 6), False),
                                                   ((8, 9), True), ((9, 0), True)])
def test_triton_reads_e4m3_only_on_gpus_it_compiles_e4m3_for(monkeypatch, capability,
                                                             reads_e4m3):
    """Triton compiles e4m3 for compute capability 8.9+ only (tests/test_kernels_compile.py
    compiles what the registry accepts per architecture): elsewhere "auto" takes the torch
    backend, and asking for Triton is a ValueError, not a compiler error mid-call."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    triton, gpu = get_backend("triton"), torch.device("cuda", 0)
    for op in ("decode", "prefill"):
        assert triton.supports(op, gpu, torch.bfloat16, cache_dtype=E4M3) is reads_e4m3
        assert triton.supports(op, gpu, torch.bfloat16, cache_dtype=E5M2)
        picked = resolve(op, "auto", gpu, torch.bfloat16, 16, 128, E4M3)
        assert picked.name == ("triton" if reads_e4m3 else "torch")
    assert ("float8_e4m3fn" in triton.capabilities(gpu)["cache_dtypes"]) is reads_e4m3
    assert "float8_e4m3fn" in triton.capabilities()["cache_dtypes"]  # some device reads it
    if not reads_e4m3:
        with pytest.raises(ValueError, match="backend: 'triton' does not support"):
            resolve("decode", "triton", gpu, torch.bfloat16, 16, 128, E4M3)


@pytest.mark.parametrize("cache_dtype", [E4M3, E5M2])
def test_scales_as_numbers_or_tensors_give_the_same_result(cache_dtype):
    inp = _fp8_case(cache_dtype)
    k = float(inp.k_scale[0])
    uniform = dict(k_scale=torch.full((2,), k), v_scale=torch.full((2,), k))
    a = paged_decode(*inp.args(), backend="torch", k_scale=k, v_scale=k)
    b = paged_decode(*inp.args(), backend="torch", **uniform)
    c = paged_decode(*inp.args(), backend="torch", k_scale=torch.tensor(k), v_scale=k)
    assert torch.equal(a, b) and torch.equal(a, c)
    ref = reference_decode(*inp.args(), k_scale=k, v_scale=k)
    assert relative_error(a, ref) < 1e-5


def test_numpy_scalars_are_numbers_as_scales():
    # audit finding 4: np.float64 (a float subclass) was taken, np.float32 refused
    inp = _fp8_case()
    k, v = float(inp.k_scale[0]), float(inp.v_scale[0])
    want = paged_decode(*inp.args(), backend="torch", k_scale=k, v_scale=v)
    for as_numpy in (np.float32, np.float64):
        out = paged_decode(*inp.args(), backend="torch", k_scale=as_numpy(k), v_scale=as_numpy(v))
        assert relative_error(out, want) < 1e-6  # np.float32 rounds the scale to float32 first


@pytest.mark.parametrize("kwargs, match", [
    ({}, "k_scale: required"),
    ({"k_scale": 1.0}, "v_scale: required"),
    ({"k_scale": 0.0, "v_scale": 1.0}, "k_scale: must be a positive number that float32"),
    ({"k_scale": 1.0, "v_scale": float("nan")}, "v_scale: must be a positive number"),
    # finite as Python numbers, 0 or inf in float32
    ({"k_scale": 1e39, "v_scale": 1.0}, "k_scale: must be a positive number that float32"),
    ({"k_scale": 1.0, "v_scale": 1e-46}, "v_scale: must be a positive number that float32"),
    ({"k_scale": 10**400, "v_scale": 1.0}, "k_scale: must be a positive number"),
    ({"k_scale": torch.ones(3), "v_scale": 1.0}, r"k_scale: expected shape \[num_kv_heads\]"),
    ({"k_scale": torch.ones(2, dtype=torch.float64), "v_scale": 1.0},
     "k_scale: expected a float32"),
    ({"k_scale": torch.tensor([1.0, -1.0]), "v_scale": 1.0}, "k_scale: every scale"),
    ({"k_scale": "1", "v_scale": 1.0}, "k_scale: expected a number"),
    ({"k_scale": 1.0, "v_scale": np.True_}, "v_scale: expected a number"),
])
def test_bad_scales_are_value_errors_naming_the_argument(kwargs, match):
    inp = _fp8_case()
    with pytest.raises(ValueError, match=match):
        paged_decode(*inp.args(), backend="torch", **kwargs)
    starts = torch.arange(3, dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        paged_prefill(*inp.args(), starts, backend="torch", **kwargs)


def test_scales_on_an_unquantised_cache_are_refused():
    inp = make_paged_inputs([3], 4, 2, 16, 4, poison=False)
    with pytest.raises(ValueError, match="k_scale: scales apply to fp8 caches only"):
        paged_decode(*inp.args(), k_scale=1.0, v_scale=1.0)


def test_mixed_cache_dtypes_are_refused():
    inp = _fp8_case()
    with pytest.raises(ValueError, match="v_cache: dtype"):
        paged_decode(inp.q, inp.k_cache, inp.v_cache.to(torch.float32), *inp.args()[3:],
                     **inp.scales())


@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_torch_backend_reads_fp8_beyond_fp16_range_with_an_fp16_q(op):
    # audit finding 5: the torch backend dequantised to q's dtype, so K of stored x scale
    # ~1e6 became inf in fp16 (NaN outputs) although the scores q.k are small
    gen = torch.Generator().manual_seed(0)
    k_cache = (torch.randn(2, 4, 1, 64, generator=gen) * 100).to(E4M3)  # x 1000: |K| ~ 1e5
    v_cache = torch.randn(2, 4, 1, 64, generator=gen).to(E4M3)
    q = (torch.randn(2, 2, 64, generator=gen) * 1e-6).half()
    args = (k_cache, v_cache, torch.tensor([[1, 0]], dtype=torch.int32),
            torch.tensor([7], dtype=torch.int32))
    scales = {"k_scale": 1000.0, "v_scale": 1.0}
    assert (k_cache.float() * 1000).abs().max() > torch.finfo(torch.float16).max
    if op == "decode":
        out = paged_decode(q[:1], *args, backend="torch", **scales)
        ref = reference_decode(q[:1], *args, **scales)
    else:
        starts = torch.tensor([0, 2], dtype=torch.int32)
        out = paged_prefill(q, *args, starts, backend="torch", **scales)
        ref = reference_prefill(q, *args, starts, **scales)
    assert out.dtype == torch.float16 and relative_error(out, ref) < 2e-3


def test_quantize_saturates_and_keeps_nan():
    for dtype in (E4M3, E5M2):
        big = torch.finfo(dtype).max
        x = torch.tensor([[[1e9, -1e9, float("inf"), float("nan"), 1.0]]])
        y = quantize(x, torch.ones(1), dtype).to(torch.float32)
        assert y[0, 0, :3].tolist() == [big, -big, big]
        assert torch.isnan(y[0, 0, 3]) and y[0, 0, 4] == 1.0


def test_write_kv_quantises_with_per_head_scales():
    cache = torch.zeros(3, 4, 2, 8, dtype=E4M3)
    v_cache = torch.zeros_like(cache)
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(5, 2, 8, generator=gen) * torch.tensor([1.0, 100.0])[:, None]
    v = torch.randn(5, 2, 8, generator=gen)
    k_scale = calibrated_scales(k, E4M3)
    v_scale = torch.tensor([0.01, 0.02])
    slots = torch.tensor([0, 5, 6, -1, 11])
    write_kv(cache, v_cache, k.to(torch.bfloat16), v, slots, k_scale=k_scale, v_scale=v_scale)
    flat_k = dequantize(cache.view(-1, 2, 8), k_scale, torch.float32)
    flat_v = dequantize(v_cache.view(-1, 2, 8), v_scale, torch.float32)
    keep = [0, 1, 2, 4]
    stored = torch.tensor([0, 5, 6, 11])
    assert relative_error(flat_k[stored], k[keep]) < 0.05
    assert relative_error(flat_v[stored], v[keep]) < 0.05
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[stored] = False
    assert not flat_k[untouched].any()
    with pytest.raises(ValueError, match="k_scale: required"):
        write_kv(cache, v_cache, k, v, slots)


def test_calibrated_scales_map_the_largest_value_inside_the_range():
    x = torch.tensor([[[3.0, -5.0], [0.0, 0.0]]])  # one token, heads 0 and 1
    s = calibrated_scales(x, E4M3, headroom=2.0)
    assert s[0] == pytest.approx(10.0 / 448) and s[1] == pytest.approx(2.0 / 448)
    check_kv_scales(torch.zeros(1, 1, 2, 2, dtype=E4M3), s, s)


def test_kv_dtype_names():
    assert kv_dtype_from_name("fp8_e4m3", torch.bfloat16) is E4M3
    assert kv_dtype_from_name("fp8_e5m2", torch.bfloat16) is E5M2
    assert kv_dtype_from_name("auto", torch.float16) is torch.float16
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_dtype_from_name("int4", torch.bfloat16)


def test_sweep_times_fp8_caches_with_their_bytes():
    from pagebench.measure.kernel_sweep import run_sweep

    df = run_sweep("cpu", quick=True, shapes={"t": (4, 2, 16)}, points=[(2, 32)],
                   block_sizes=(4,), include=["torch", "sdpa"], repeat=1, kv_dtype=E4M3)
    paged = df[df["layout"] == "paged"].iloc[0]
    base = df[df["layout"] == "contiguous"].iloc[0]
    assert paged["kv_dtype"] == "float8_e4m3fn" and base["kv_dtype"] == "float32"
    assert paged["kv_bytes"] * 4 == base["kv_bytes"]


def test_bench_cli_kv_dtype_errors_name_the_option(capsys):
    from pagebench.cli import main

    assert main(["bench", "--kv-dtype", "fp9"]) == 2
    assert "--kv-dtype: unknown 'fp9'" in capsys.readouterr().err
    assert main(["bench", "--prefill", "--kv-dtype", "fp9"]) == 2
    assert "--kv-dtype: unknown 'fp9'" in capsys.readouterr().err


def test_prefill_sweep_times_fp8_caches(tmp_path):
    from pagebench.cli import main
    from pagebench.measure.prefill_sweep import run_prefill_sweep

    df = run_prefill_sweep("cpu", shapes={"t": (4, 2, 16)}, points=[(2, 3, 5)], block_size=4,
                           include=["torch", "sdpa"], repeat=1, kv_dtype=E5M2)
    paged = df[df["layout"] == "paged"]
    assert list(paged.backend) == ["torch-paged"] and set(paged.kv_dtype) == {"float8_e5m2"}
    assert set(df[df["layout"] == "contiguous"].kv_dtype) == {"float32"}
    out = tmp_path / "p.csv"
    assert main(["bench", "--prefill", "--kv-dtype", "fp8_e4m3", "--shape", "t=4/2/16",
                 "--backends", "torch", "--repeat", "1", "--out", str(out)]) == 0
    rows = pd.read_csv(out)
    assert set(rows[rows.backend == "torch-paged"].kv_dtype) == {"float8_e4m3fn"}


# ---- the fp8 sweep (pagebench bench --fp8; dataset kernels_fp8) ----------------------------

def test_fp8_sweep_rows_meet_their_schema_with_errors_on_fp8_rows_only():
    from pagebench.measure.fp8_sweep import run_fp8_sweep
    from pagebench.results.datasets import KERNELS_FP8

    rows = KERNELS_FP8.validate(pd.DataFrame(run_fp8_sweep(
        "cpu", shape=("t", (4, 2, 16)), points=[(1, 20)], block_sizes=(4, 16),
        prefill_points=[(1, 5, 7)])), "run_fp8_sweep")
    decode = rows[rows["op"] == "decode"]
    # e4m3 at every block size; e5m2 and the larger tile at block 16 only
    assert sorted(decode.loc[decode["block_size"] == 4, "cache_dtype"]) == [
        "bfloat16", "float8_e4m3fn"]
    at16 = decode[decode["block_size"] == 16]
    assert sorted(zip(at16["cache_dtype"], at16["launch"])) == [
        ("bfloat16", "default"), ("float8_e4m3fn", "default"), ("float8_e4m3fn", "tile128x8"),
        ("float8_e5m2", "default")]
    assert (decode["kv_bytes"] == 2 * 20 * 2 * 16 * decode["cache_dtype"].map(
        {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1})).all()
    prefill = rows[rows["op"] == "prefill"]
    assert prefill[["query_len", "cached", "context"]].drop_duplicates().values.tolist() == [
        [5, 7, 12]]
    fp8 = rows["cache_dtype"] != "bfloat16"
    assert rows.loc[~fp8, "err_vs_bf16_cache"].isna().all()
    # the kernel matches float32 on the dequantised cache far closer than it matches bf16
    assert (rows.loc[fp8, "err_vs_dequantised"] < 0.02).all()
    assert (rows.loc[fp8, "err_vs_dequantised"] < rows.loc[fp8, "err_vs_bf16_cache"]).all()


def test_bench_cli_fp8_writes_its_dataset_and_refuses_other_modes(tmp_path, capsys):
    from pagebench.cli import main

    out = tmp_path / "kernels_fp8.csv"
    assert main(["bench", "--fp8", "--shape", "t=4/2/16", "--points", "1x16",
                 "--block-sizes", "8", "--out", str(out)]) == 0
    rows = pd.read_csv(out)
    assert set(rows["op"]) == {"decode", "prefill"} and set(rows["model_shape"]) == {"t"}
    assert (rows.loc[rows["op"] == "decode", "context"] == 16).all()
    capsys.readouterr()
    assert main(["bench", "--fp8", "--prefill"]) == 2
    assert "--fp8: times Triton decode and prefill" in capsys.readouterr().err
    assert main(["bench", "--fp8", "--shape", "a=4/2/16", "--shape", "b=4/2/16"]) == 2
    assert "--shape: --fp8 times one attention shape" in capsys.readouterr().err


@pytest.mark.parametrize("head_dims", [(16,), (64,)])
def test_fp8_sweep_times_the_other_fp8_kernels_on_what_they_take(monkeypatch, head_dims):
    """A kernel of ``OTHER_FP8_DECODE`` (on a GPU, cuda-fp8) is timed beside Triton's on the
    fp8 decodes its capabilities accept, with its errors, as its backend's rows; nowhere else."""
    from pagebench.measure import fp8_sweep
    from pagebench.kernels.reference import torch_paged_decode
    from pagebench.results.datasets import KERNELS_FP8

    register_backend("toy-fp8", decode=torch_paged_decode, devices=("cpu",),
                     cache_dtypes=(torch.float8_e4m3fn,), reads_own_dtype=False,
                     supports_head_dim=lambda d: d in head_dims)
    monkeypatch.setattr(fp8_sweep, "OTHER_FP8_DECODE", ("toy-fp8",))
    try:
        rows = KERNELS_FP8.validate(pd.DataFrame(fp8_sweep.run_fp8_sweep(
            "cpu", shape=("t", (4, 2, 16)), points=[(1, 20)], block_sizes=(4, 16),
            prefill_points=[])), "run_fp8_sweep")
    finally:
        unregister_backend("toy-fp8")
    toy = rows[rows["backend"] == "toy-fp8"]
    if 16 not in head_dims:
        assert toy.empty
        return
    assert sorted(toy["block_size"]) == [4, 16] and set(toy["cache_dtype"]) == {"float8_e4m3fn"}
    assert set(toy["launch"]) == {"default"} and (toy["err_vs_dequantised"] < 0.02).all()
