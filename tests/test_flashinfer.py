"""The FlashInfer backend's host side, on the CPU with plain torch (FlashInfer not needed): the
block table -> indptr / indices / last_page_len conversion, the plan cache, the fp8 refusals;
and the ragged lengths and the unmasked SDPA prefill baseline the sweeps time it against."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from pagebench.kernels import flashinfer as fi
from pagebench.kernels import registry
from pagebench.measure.kernel_cases import make_paged_inputs
from pagebench.kernels.ragged import batch_lengths, check_lengths_spec


def layout_by_loop(tables, lens, block_size):
    """The CSR layout written out one sequence at a time (what the vectorised one must equal)."""
    indptr, indices, last = [0], [], []
    for row, n in zip(tables.tolist(), lens.tolist()):
        pages = math.ceil(n / block_size)
        indices += row[:pages]
        indptr.append(indptr[-1] + pages)
        last.append(n - (pages - 1) * block_size)
    return indptr, indices, last


@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_the_layout_lists_each_sequences_pages_in_order_and_its_last_pages_fill(
        block_size, index_dtype):
    lens = [1, block_size, block_size + 1, 5 * block_size - 1, 7]
    inp = make_paged_inputs(lens, 4, 2, 8, block_size, extra_table_cols=3, seed=block_size)
    tables = inp.block_tables.to(index_dtype)
    kv = fi.paged_kv_layout(tables, inp.seq_lens, block_size)
    indptr, indices, last = layout_by_loop(tables, inp.seq_lens, block_size)
    assert kv.indptr.tolist() == indptr
    assert kv.indices.tolist() == indices  # the poisoned entries past each sequence: left out
    assert kv.last_page_len.tolist() == last
    assert all(1 <= n <= block_size for n in last)
    assert {kv.indptr.dtype, kv.indices.dtype, kv.last_page_len.dtype} == {torch.int32}


def test_the_layout_reads_a_strided_table_as_its_values():
    inp = make_paged_inputs([9, 30, 4], 2, 1, 4, 4, seed=1)
    wide = torch.full((3, 2 * inp.block_tables.shape[1]), -5, dtype=torch.int32)
    wide[:, ::2] = inp.block_tables
    strided = wide[:, ::2]
    assert not strided.is_contiguous()
    a = fi.paged_kv_layout(strided, inp.seq_lens, 4)
    b = fi.paged_kv_layout(inp.block_tables, inp.seq_lens, 4)
    assert a.indices.tolist() == b.indices.tolist() and a.indptr.tolist() == b.indptr.tolist()


def test_query_indptr_is_query_start_loc_as_contiguous_int32():
    qo = fi.query_indptr(torch.tensor([0, 3, 4, 4, 9, 0])[:5])
    assert qo.tolist() == [0, 3, 4, 4, 9] and qo.dtype == torch.int32 and qo.is_contiguous()


def test_equal_per_head_scales_become_flashinfers_scalars():
    k, v = torch.full((8,), 0.25), torch.full((8,), 2.0)
    assert fi.scalar_scales(k, v) == (0.25, 2.0)


@pytest.mark.parametrize("which", ["k_scale", "v_scale"])
def test_differing_per_head_scales_are_refused_naming_the_scale(which):
    scales = {"k_scale": torch.full((4,), 0.5), "v_scale": torch.full((4,), 0.5)}
    scales[which][2] = 0.75
    with pytest.raises(ValueError, match=f"^{which}: FlashInfer takes one scale"):
        fi.scalar_scales(scales["k_scale"], scales["v_scale"])


def test_the_decode_refuses_differing_scales_before_building_anything(monkeypatch):
    built = []
    monkeypatch.setattr(fi, "_workspace", lambda device: built.append(device))
    inp = make_paged_inputs([5, 9], 4, 2, 8, 4, poison=False)
    k_scale = torch.tensor([0.5, 0.25])
    before = len(fi.PLANS)
    with pytest.raises(ValueError, match="^k_scale:"):
        fi.decode(inp.q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, 0.3,
                  k_scale, torch.ones(2))
    assert built == [] and len(fi.PLANS) == before  # no workspace, no plan recorded


@pytest.fixture
def planned(monkeypatch):
    """Stand-ins for FlashInfer's planning: count the plans made and what they were for."""
    calls = []

    def fake_plan_decode(block_tables, seq_lens, k_scale, v_scale, **kw):
        calls.append(("decode", kw["tensor_cores"], fi.paged_kv_layout(
            block_tables, seq_lens, kw["block_size"]).indices.tolist()))
        return fi.Plan(None, lambda: None, None, None, 0.0)

    def fake_plan_prefill(block_tables, seq_lens, query_start_loc, k_scale, v_scale, **kw):
        calls.append(("prefill", query_start_loc.tolist()))
        return fi.Plan(None, lambda: None, None, None, 0.0)

    monkeypatch.setattr(fi, "plan_decode", fake_plan_decode)
    monkeypatch.setattr(fi, "plan_prefill", fake_plan_prefill)
    monkeypatch.setattr(fi, "PLANS", fi.CheckedValues(fi.PLAN_CACHE_ENTRIES))
    return calls


def decode_plan(inp, tensor_cores=False):
    return fi._decode_plan(inp.block_tables, inp.seq_lens, None, None, tensor_cores, inp.q,
                           inp.k_cache, 0.5)


def test_an_unchanged_table_is_planned_once(planned):
    inp = make_paged_inputs([5, 9, 2], 4, 2, 8, 4, poison=False)
    first = decode_plan(inp)
    assert decode_plan(inp) is first and decode_plan(inp) is first
    assert len(planned) == 1


def test_a_table_written_in_place_is_planned_again(planned):
    inp = make_paged_inputs([5, 9, 2], 4, 2, 8, 4, poison=False, extra_blocks=4)
    decode_plan(inp)
    inp.block_tables[1, 0] = next(b for b in range(inp.k_cache.shape[0])
                                  if b not in inp.block_tables.flatten().tolist())
    decode_plan(inp)
    assert len(planned) == 2 and planned[0][2] != planned[1][2]
    inp.seq_lens[0] = 9  # a longer sequence: one more page
    decode_plan(inp)
    assert len(planned) == 3 and len(planned[2][2]) == len(planned[1][2]) + 1


def test_each_variant_and_each_operation_has_its_own_plan(planned):
    inp = make_paged_inputs([5, 9], 4, 2, 8, 4, poison=False)
    decode_plan(inp, tensor_cores=False)
    decode_plan(inp, tensor_cores=True)
    starts = torch.tensor([0, 2, 5], dtype=torch.int32)
    for _ in range(2):
        fi._prefill_plan(inp.block_tables, inp.seq_lens, starts, None, None, inp.q, inp.k_cache,
                         0.5)
    assert [c[:2] for c in planned] == [("decode", False), ("decode", True),
                                        ("prefill", [0, 2, 5])]


def test_the_backends_are_registered_only_where_flashinfer_is_installed():
    installed = importlib.util.find_spec("flashinfer") is not None
    names = set(registry.registered_backends())
    assert ({"flashinfer", "flashinfer-tc"} <= names) == installed
    assert not ({"flashinfer", "flashinfer-tc"} & names) or installed


@pytest.mark.parametrize("spec", ["lognormal:0,0.8", "trace:azure-conv"])
def test_ragged_lengths_keep_the_points_mean_and_bounds(spec):
    lens = batch_lengths(spec, 64, 4096, seed=3)
    assert len(lens) == 64 and len(set(lens)) > 10
    assert abs(sum(lens) / 64 - 4096) < 0.02 * 4096
    assert min(lens) >= 1 and max(lens) <= 8 * 4096
    assert batch_lengths(spec, 64, 4096, seed=3) == lens  # seeded


def test_uniform_lengths_are_the_context():
    assert batch_lengths("uniform", 3, 100) == [100, 100, 100]


@pytest.mark.parametrize("spec, message", [
    ("gauss:1,2", "expected uniform, lognormal"), ("trace:nope", "unknown trace 'nope'"),
    ("lognormal:1", "needs 2 comma-separated numbers"), ("", "expected uniform")])
def test_bad_lengths_specs_are_refused_naming_the_option(spec, message):
    with pytest.raises(Exception, match=f"^--lengths: .*{message}"):
        check_lengths_spec(spec)


@pytest.mark.parametrize("shape", [(4, 2, 8), (4, 4, 8)])
def test_the_unmasked_sdpa_prefill_baseline_computes_what_the_masked_one_does(shape):
    from pagebench.measure.prefill_sweep import sdpa_causal

    plain = sdpa_causal(2, 5, 7, shape, torch.float32, "cpu", seed=1)()
    masked = sdpa_causal(2, 5, 7, shape, torch.float32, "cpu", seed=1, masked=True)()
    assert torch.allclose(plain, masked, atol=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "gauss:1"], "--lengths: expected uniform"),
    (["--prefill", "--lengths", "lognormal:0,1"], "--lengths: applies to the decode sweep")])
def test_bench_refuses_bad_lengths_in_one_line(argv, message, capsys):
    from pagebench.cli import main

    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_bench_times_each_lengths_spec_as_an_axis(tmp_path):
    import pandas as pd

    from pagebench.cli import main

    out = tmp_path / "kernels.csv"
    assert main(["bench", "--points", "4x64", "--block-sizes", "16", "--shape", "t=4/2/16",
                 "--repeat", "1", "--lengths", "uniform", "--lengths", "lognormal:0,0.8",
                 "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert sorted(set(df["lengths"])) == ["lognormal:0,0.8", "uniform"]
    tokens = {spec: g["kv_bytes"].iloc[0] // (2 * 2 * 16 * 4) for spec, g in df.groupby("lengths")}
    assert tokens["uniform"] == 4 * 64
    assert tokens["lognormal:0,0.8"] == sum(batch_lengths("lognormal:0,0.8", 4, 64, seed=4))


def test_the_cuda_core_decode_refuses_a_group_it_has_no_kernel_for(monkeypatch):
    built = []
    monkeypatch.setattr(fi, "_workspace", lambda device: built.append(device))
    inp = make_paged_inputs([5, 9], 28, 4, 8, 4, poison=False)  # Qwen2.5-7B's 7 per KV head
    with pytest.raises(ValueError, match=r"^q: FlashInfer's CUDA-core decode takes .* got 7 "
                                         r"\(28/4\); backend 'flashinfer-tc' takes any"):
        fi.decode(inp.q, inp.k_cache, inp.v_cache, inp.block_tables, inp.seq_lens, 0.3)
    assert built == []
    for group in fi.CUDA_CORE_GROUPS:
        fi.check_group(4 * group, 4, tensor_cores=False)  # no error
    fi.check_group(28, 4, tensor_cores=True)
