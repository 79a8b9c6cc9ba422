"""The engine's report-facing measurements and `pagebench engine-bench` (tiny sizes)."""

import io
import os
import contextlib

import pandas as pd
import pytest

pytest.importorskip("transformers")

from pagebench.cli import main
from pagebench.engine import bench


@pytest.fixture(scope="module")
def model():
    return bench.tiny_model(hidden_size=64, intermediate_size=128)


def test_cow_comparison_shares_blocks(model):
    rows = {r["variant"]: r for r in bench.cow_comparison(model, prompt_len=128, max_tokens=8)}
    shared, separate, one = rows["n=4 shared"], rows["4 separate requests"], rows["n=1"]
    assert shared["num_generated_tokens"] == separate["num_generated_tokens"] == 32
    assert shared["peak_blocks"] < 1.5 * one["peak_blocks"] < separate["peak_blocks"]
    assert {"device", "torch_version", "commit", "tokens_per_s"} <= set(shared)


def test_prefix_cache_comparison(model):
    off, on = bench.prefix_cache_comparison(model, system_len=64, num_requests=6,
                                            suffix_len=(4, 12), max_tokens=4)
    assert not off["enable_prefix_caching"] and on["enable_prefix_caching"]
    assert off["prefix_cache_hit_rate"] == 0 < on["prefix_cache_hit_rate"]
    assert on["num_computed_prompt_tokens"] < off["num_computed_prompt_tokens"]


def test_pool_size_sweep_has_a_cliff(model):
    rows = bench.pool_size_sweep(model, pool_fractions=(0.3, 1.0), num_requests=8,
                                 prompt_len=(8, 24), max_tokens=16)
    small, full = rows
    assert full["num_preemptions"] == 0 < small["num_preemptions"]
    assert small["peak_blocks"] <= small["num_blocks"] < full["num_blocks"]


def test_throughput_rows_are_tidy(model):
    rows = bench.throughput_vs_batch(model, batch_sizes=(1, 3), block_sizes=(8,),
                                     prompt_len=8, max_tokens=4, kernel="torch")
    df = pd.DataFrame(rows)
    assert list(df.batch) == [1, 3] and (df.tokens_per_s > 0).all()
    assert (df.max_batch == df.batch).all()


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_cli_writes_csv(tmp_path):
    path = tmp_path / "t.csv"
    code, _, err = run_cli("engine-bench", "throughput", "--batch-sizes", "2",
                           "--block-sizes", "16", "--prompt-len", "8", "--max-tokens", "3",
                           "--kernel", "torch", "--out", str(path))
    assert code == 0, err
    df = pd.read_csv(path)
    assert len(df) == 1 and df.block_size[0] == 16 and df.tokens_per_s[0] > 0


def test_cli_repeat_and_methods_reach_the_measurement(tmp_path):
    path = tmp_path / "t.csv"
    code, _, err = run_cli("engine-bench", "throughput", "--batch-sizes", "2",
                           "--block-sizes", "16", "--prompt-len", "8", "--max-tokens", "2",
                           "--kernel", "torch", "--repeat", "2", "--out", str(path))
    assert code == 0, err
    row = pd.read_csv(path).iloc[0]
    assert row.repeats == 2 and row.cpu_count == os.cpu_count()
    code, _, err = run_cli("engine-bench", "compare", "--batch-sizes", "2", "--prompt-len", "4",
                           "--max-tokens", "2", "--kernel", "torch", "--methods", "engine",
                           "--out", str(path))
    assert code == 0, err
    assert pd.read_csv(path).method.tolist() == ["engine"]


def test_cli_bad_argument_is_one_line():
    code, _, err = run_cli("engine-bench", "throughput", "--batch-sizes", "0,x")
    assert code == 2 and "expected" in err and len(err.strip().splitlines()) == 1


def test_greedy_agreement_counts_tokens_up_to_the_first_difference():
    assert bench.greedy_agreement([[1, 2, 3], [4, 5]], [[1, 9, 3], [4, 5]]) == 3 / 5
    assert bench.greedy_agreement([[1]], [[1]]) == 1.0


def test_cli_fp8_compares_a_bf16_and_an_fp8_pool_in_the_same_memory(tmp_path):
    path = tmp_path / "fp8_engine.csv"
    code, out, err = run_cli("engine-bench", "fp8", "--num-requests", "3", "--prompt-len", "4",
                             "--max-tokens", "3", "--kv-cache-memory", "1MiB", "--out", str(path))
    assert code == 0, err
    row = pd.read_csv(path).iloc[0]
    assert row["dtype"] == "bfloat16" and row["experiment"] == "fp8_engine"
    assert row.blocks_fp8 == 2 * row.blocks_bf16 and row.blocks_ratio == 2.0
    assert 0 <= row.greedy_agreement <= 1 and row.num_prompts == 3 and row.max_tokens == 3
    assert "greedy agreement" in out
    code, _, err = run_cli("engine-bench", "fp8", "--kv-cache-memory", "lots")
    assert code == 2 and "--kv-cache-memory: bytes: cannot parse 'lots'" in err
