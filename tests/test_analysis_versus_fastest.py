"""Kernel tables that compare every backend with the fastest at a point, and the batch-1
verdict per kernel family with the repeats' spread (pagebench.analysis.derive)."""

from __future__ import annotations

import pandas as pd
import pytest

from pagebench.analysis import derive


def row(backend, time_us, *, batch=8, context=4096, block_size=16, lengths="uniform",
        q20=None, q80=None, commit="abc", read_gbps=4000.0):
    kernel, layout = backend.rsplit("-", 1)
    return dict(device="cuda", device_name="NVIDIA H100 80GB HBM3", machine="H100",
                dtype="bfloat16", kv_dtype="bfloat16", model_shape="llama-3-8b", batch=batch,
                context=context, block_size=None if layout == "contiguous" else block_size,
                backend=backend, kernel=kernel, layout=layout, cuda_graphs=True,
                time_us=time_us, q20_us=q20 or time_us, q80_us=q80 or time_us,
                gbps=1000.0 / time_us * 1000, read_gbps=read_gbps, lengths=lengths,
                commit=commit)


def test_relative_time_is_one_for_the_fastest_and_the_ratio_for_the_others():
    df = pd.DataFrame([row("triton-paged", 30.0), row("flashinfer-paged", 20.0),
                       row("sdpa-contiguous", 25.0), row("triton-paged", 8.0, batch=1),
                       row("sdpa-contiguous", 10.0, batch=1)])
    out = derive.relative_to_fastest(df, ["batch"])
    got = {(r.batch, r.backend): (round(r.relative_time, 3), r.fastest) for r in out.itertuples()}
    assert got == {(8, "triton-paged"): (1.5, "flashinfer-paged"),
                   (8, "flashinfer-paged"): (1.0, "flashinfer-paged"),
                   (8, "sdpa-contiguous"): (1.25, "flashinfer-paged"),
                   (1, "triton-paged"): (1.0, "triton-paged"),
                   (1, "sdpa-contiguous"): (1.25, "triton-paged")}


def test_versus_fastest_keeps_ragged_and_uniform_points_apart_and_one_commit():
    df = pd.DataFrame([
        row("triton-paged", 30.0), row("flashinfer-paged", 20.0),
        row("triton-paged", 50.0, lengths="lognormal:0,0.8"),
        row("flashinfer-paged", 60.0, lengths="lognormal:0,0.8"),
        row("triton-paged", 5.0, commit="old"),  # an older commit: never compared
        row("triton-paged", 40.0, block_size=1), row("flashinfer-paged", 80.0, block_size=1)])
    df["commit"] = df["commit"].map({"abc": "b" * 7, "old": "a" * 7})
    out = derive.versus_fastest(df)
    assert set(out["commit"]) == {"b" * 7} and len(out) == 6
    uniform = out[out["lengths"] == "uniform"]
    assert set(uniform["fastest"]) == {"flashinfer-paged"}
    assert uniform.set_index(["backend", "block_size"])["relative_time"].round(2).to_dict() == {
        ("flashinfer-paged", 16): 1.0, ("triton-paged", 16): 1.5, ("triton-paged", 1): 2.0,
        ("flashinfer-paged", 1): 4.0}
    ragged = out[out["lengths"] != "uniform"]
    assert set(ragged["fastest"]) == {"triton-paged"}
    assert ragged["read_fraction"].round(3).tolist() == [round(1e6 / 50 / 4000, 3),
                                                          round(1e6 / 60 / 4000, 3)]


def test_a_point_with_one_kernel_is_left_out():
    df = pd.DataFrame([row("triton-paged", 30.0), row("triton-paged", 20.0, block_size=1)])
    assert derive.versus_fastest(df).empty


def test_kernel_rows_leave_ragged_batches_to_their_own_table():
    df = pd.DataFrame([row("triton-paged", 30.0), row("triton-paged", 9.0, lengths="trace:x")])
    assert derive.kernel_rows(df)["time_us"].tolist() == [30.0]


@pytest.mark.parametrize("paged, contiguous, verdict", [
    ((10.5, 10.4, 10.6), (10.0, 9.9, 10.1), "slower"),
    ((10.1, 9.8, 10.4), (10.0, 9.7, 10.3), "within noise"),
    ((9.0, 8.9, 9.1), (10.0, 9.9, 10.1), "faster")])
def test_batch1_family_says_slower_only_beyond_the_repeats_spread(paged, contiguous, verdict):
    (tp, p20, p80), (tc, c20, c80) = paged, contiguous
    df = pd.DataFrame([row("triton-paged", tp, batch=1, q20=p20, q80=p80),
                       row("triton-contiguous", tc, batch=1, q20=c20, q80=c80),
                       row("sdpa-contiguous", tc / 2, batch=1)])
    out = derive.family_batch1(df)
    assert out["family"].tolist() == ["triton"]  # no FlashInfer rows: no FlashInfer family
    r = out.iloc[0]
    assert r["contiguous_backend"] == "triton-contiguous"  # its own twin, not the faster SDPA
    assert r["paging"] == verdict
    assert r["ratio_low"] == pytest.approx(p20 / c80) and r["ratio_high"] == pytest.approx(
        p80 / c20)


def test_the_flashinfer_family_is_judged_against_the_fastest_contiguous_kernel():
    df = pd.DataFrame([row("flashinfer-paged", 12.0, batch=1),
                       row("flashinfer-tc-paged", 11.0, batch=1),
                       row("triton-contiguous", 14.0, batch=1),
                       row("sdpa-contiguous", 10.0, batch=1)])
    r = derive.family_batch1(df).iloc[0]
    assert (r["family"], r["paged_backend"], r["contiguous_backend"]) == (
        "flashinfer", "flashinfer-tc-paged", "sdpa-contiguous")
    assert r["ratio"] == pytest.approx(1.1) and r["paging"] == "slower"


def test_prefill_versus_fastest_compares_within_a_point():
    base = dict(device="cuda", device_name="NVIDIA H100", machine="H100", dtype="bfloat16",
                model_shape="llama-3-8b", batch=1, query_len=512, cached=3584, commit="c",
                cuda_graphs=True)
    df = pd.DataFrame([dict(base, backend="triton-paged", time_us=100.0),
                       dict(base, backend="flashinfer-paged", time_us=80.0),
                       dict(base, backend="sdpa-contiguous", time_us=90.0),
                       dict(base, backend="sdpa-contiguous", time_us=70.0, cached=0)])
    out = derive.prefill_versus_fastest(df)
    assert len(out) == 3 and set(out["fastest"]) == {"flashinfer-paged"}
    assert out["relative_time"].round(3).tolist() == [1.0, 1.125, 1.25]


def test_the_batch1_claim_words_each_familys_verdicts_at_block_16():
    from pagebench.analysis.claims import family_verdicts

    df = pd.DataFrame([row("triton-paged", 10.5, batch=1, q20=10.4, q80=10.6),
                       row("triton-contiguous", 10.0, batch=1, q20=9.9, q80=10.1),
                       row("triton-paged", 10.0, batch=1, context=1024, q20=9.5, q80=10.5),
                       row("triton-contiguous", 10.0, batch=1, context=1024, q20=9.5, q80=10.5),
                       row("triton-paged", 30.0, batch=1, block_size=1)])
    text = family_verdicts(derive.family_batch1(df))
    assert text == "triton (H100): slower 1, within noise 1 of 2 (1.00–1.05×)"
    assert family_verdicts(pd.DataFrame()) == ""


def test_block_cost_is_judged_per_kernel_against_its_own_best_block():
    from pagebench.analysis.claims import block_cost_per_kernel_text

    df = pd.DataFrame([row("triton-paged", 12.0, block_size=1), row("triton-paged", 10.0),
                       row("flashinfer-paged", 20.0, block_size=1),
                       row("flashinfer-paged", 25.0),  # its best block is 1, not 16
                       row("triton-paged", 33.0, block_size=1, context=1024),
                       row("triton-paged", 30.0, context=1024)])
    out = derive.block_cost_per_kernel(df).set_index(["kernel", "block_size"])
    assert out.loc[("triton", 1), "relative_time"] == pytest.approx((1.2 + 1.1) / 2)
    assert out.loc[("triton", 1), ["relative_low", "relative_high"]].tolist() == pytest.approx(
        [1.1, 1.2])
    assert out.loc[("triton", 16), "relative_time"] == 1.0 and out.loc[("triton", 1), "cases"] == 2
    assert out.loc[("flashinfer", 16), "relative_time"] == pytest.approx(1.25)
    assert block_cost_per_kernel_text(derive.block_cost_per_kernel(df)) == (
        "flashinfer (H100): 1: 1.00×, 16: 1.25×; triton (H100): 1: 1.15×, 16: 1.00×")
