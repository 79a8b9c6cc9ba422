"""The engine's report-facing measurements and `pagebench engine-bench` (tiny sizes)."""

import io
import os
import contextlib

import pandas as pd
import pytest

pytest.importorskip("transformers")

from pagebench.cli import main
from pagebench.measure import engine_bench
from pagebench.kernels import available_backends


@pytest.fixture(scope="module")
def model():
    return engine_bench.tiny_model(hidden_size=64, intermediate_size=128)


def test_cow_comparison_shares_blocks(model):
    rows = {r["variant"]: r for r in engine_bench.cow_comparison(model, prompt_len=128, max_tokens=8)}
    shared, separate, one = rows["n=4 shared"], rows["4 separate requests"], rows["n=1"]
    assert shared["num_generated_tokens"] == separate["num_generated_tokens"] == 32
    assert shared["peak_blocks"] < 1.5 * one["peak_blocks"] < separate["peak_blocks"]
    assert {"device", "torch_version", "commit", "tokens_per_s"} <= set(shared)


def test_prefix_cache_comparison(model):
    off, on = engine_bench.prefix_cache_comparison(model, system_len=64, num_requests=6,
                                            suffix_len=(4, 12), max_tokens=4)
    assert not off["enable_prefix_caching"] and on["enable_prefix_caching"]
    assert off["prefix_cache_hit_rate"] == 0 < on["prefix_cache_hit_rate"]
    assert on["num_computed_prompt_tokens"] < off["num_computed_prompt_tokens"]


def test_pool_size_sweep_has_a_cliff(model):
    rows = engine_bench.pool_size_sweep(model, pool_fractions=(0.3, 1.0), num_requests=8,
                                 prompt_len=(8, 24), max_tokens=16)
    small, full = rows
    assert full["num_preemptions"] == 0 < small["num_preemptions"]
    assert small["peak_blocks"] <= small["num_blocks"] < full["num_blocks"]


def test_throughput_rows_are_tidy(model):
    rows = engine_bench.throughput_vs_batch(model, batch_sizes=(1, 3), block_sizes=(8,),
                                     prompt_len=8, max_tokens=4, kernel="torch")
    df = pd.DataFrame(rows)
    assert list(df.batch) == [1, 3] and (df.tokens_per_s > 0).all()
    assert (df.max_batch == df.batch).all() and (df.kernel == "torch").all()
    auto = engine_bench.throughput_vs_batch(model, (1,), (8,), 4, max_tokens=2)[0]
    assert auto["kernel"] in available_backends(), auto["kernel"]  # resolved, not "auto"


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
    code, table, err = run_cli("engine-bench", "compare", "--batch-sizes", "2", "--prompt-len",
                               "4", "--max-tokens", "2", "--kernel", "torch", "--methods",
                               "engine", "--out", str(path))
    assert code == 0, err
    assert pd.read_csv(path).method.tolist() == ["engine"]
    # a column no row has (compare keeps no peak blocks) is not printed as a column of "-"
    assert "tokens/s" in table and "peak blocks" not in table


def test_cli_bad_argument_is_one_line():
    code, _, err = run_cli("engine-bench", "throughput", "--batch-sizes", "0,x")
    assert code == 2 and "expected" in err and len(err.strip().splitlines()) == 1


# ---- the runbook's experiments (scripts/h200_engine.sh), at CPU sizes -------------------------

def validated(name, rows):
    from pagebench.results import DATASETS

    return DATASETS[name].validate(pd.DataFrame(rows), "test")


def test_greedy_equality_rows(model):
    prompts = engine_bench.random_prompts(3, 1, 12, model.config.vocab_size, seed=3)
    rows = validated("engine", engine_bench.greedy_equality(model, prompts, 3, block_sizes=(4, 16),
                                                     kernel="torch"))
    # on a CPU no engine captures graphs or compiles: no "graphs vs eager" row (it would
    # compare the eager steps with themselves)
    assert len(rows) == 4 and (rows.experiment == engine_bench.GREEDY_EQUALITY).all()
    assert rows.check.tolist() == ["engine vs model.generate"] * 4
    assert rows.enable_prefix_caching.tolist() == [False, True] * 2
    assert (rows.prompts_equal == 3).all() and (rows.token_agreement == 1.0).all()


def test_agreement_counts_tokens_before_the_first_difference():
    assert engine_bench.agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]]) == (1, 4 / 6)
    assert engine_bench.agreement([[7]], [[8]]) == (0, 0.0)
    with pytest.raises(ValueError):
        engine_bench.agreement([[1]], [[1], [2]])  # one output per prompt or nothing is compared


def test_step_breakdown_row(model):
    from pagebench.measure.step_profile import step_breakdown

    table = []
    prompts = engine_bench.random_prompts(2, 4, 12, model.config.vocab_size)
    row = validated("engine", [step_breakdown(model, prompts, max_tokens=5, kernel="torch",
                                              mode="eager", profile_table=table)]).iloc[0]
    assert row.experiment == "step_breakdown" and row.batch == 2 and row.decode_steps == 4
    assert row.decode_step_wall_ms > 0 and row.gpu_busy_ms == 0  # no device kernels on a CPU
    assert row.host_ms == row.decode_step_wall_ms and pd.isna(row.graph_replay_ms)
    assert "decode_step" in table[0]


def test_modes_and_bandwidth_reach_the_rows(model):
    rows = validated("engine_batch", engine_bench.throughput_vs_batch(
        model, (2,), (8,), prompt_len=(4, 8), max_tokens=3, kernel="torch", mode="eager",
        copy_bandwidth=1e9))
    row = rows.iloc[0]
    assert row["mode"] == "eager" and row.prompt_len_min == 4 and row.prompt_len_max == 8
    # the prompts it drew (seeded by the batch size), not the middle of the range
    drawn = engine_bench.random_prompts(2, 4, 8, model.config.vocab_size, seed=2)
    assert row.prompt_len == sum(map(len, drawn)) / 2
    expected = row.decode_bytes_per_step / (row.decode_step_ms / 1e3) / 1e9
    assert row.copy_bandwidth_bytes_per_s == 1e9 and row.bandwidth_fraction == expected
    assert "mode" not in engine_bench.throughput_vs_batch(model, (1,), (8,), 4, max_tokens=2)[0]
    with pytest.raises(ValueError, match="mode"):
        engine_bench.throughput_vs_batch(model, (1,), (8,), 4, max_tokens=2, mode="fast")


def test_padded_reservation_bytes(model):
    from pagebench.config import KVGeometry

    per_token = KVGeometry.from_config(model.config, dtype=model.dtype).bytes_per_token
    assert engine_bench.padded_reservation_bytes(model, 3, 10) == 30 * per_token


def test_cli_runbook_experiments_write_their_datasets(tmp_path):
    small = ["--prompt-len", "2-8", "--max-tokens", "2", "--kernel", "torch"]
    runs = {
        "engine": ["equality", "--num-requests", "2", "--block-sizes", "16", "--dtype",
                   "bfloat16", "--seed", "5", "--threads", "2"],
        "engine_batch": ["throughput", "--batch-sizes", "2", "--block-sizes", "8", "--modes",
                         "eager,graphs_uncompiled", "--bandwidth"],
        "engine_compare": ["compare", "--batch-sizes", "1,2", "--methods", "engine"],
        "engine_equal_memory": ["equal-memory", "--batch-sizes", "2", "--num-requests", "3"],
    }
    frames = {}
    for name, argv in runs.items():
        path = tmp_path / f"{name}.csv"
        code, out, err = run_cli("engine-bench", *argv, *small, "--out", str(path))
        assert code == 0, err
        frames[name] = validated(name, pd.read_csv(path))
        if name == "engine_batch":  # --bandwidth's figures in the printed table, not only --json
            assert "decode bytes/step" in out and "of copy bw" in out
    # the two checks against model.generate (no graph row on a CPU: greedy_equality)
    assert frames["engine"].dtype.eq("bfloat16").all() and len(frames["engine"]) == 2
    assert frames["engine"].torch_threads.eq(2).all()  # --threads reaches the measurement
    assert frames["engine_batch"]["mode"].tolist() == ["eager", "graphs_uncompiled"]
    assert frames["engine_batch"].bandwidth_fraction.gt(0).all()
    assert frames["engine_compare"].batch.tolist() == [1, 2]  # one comparison per batch size
    memory = frames["engine_equal_memory"].set_index("method")
    assert memory.kv_bytes.nunique() == 1 and memory.concurrent_seqs["padded_generate"] == 2
    # the control: the same engine capped at padded generate's batch; three repeats each
    assert set(memory.index) == {"engine", "engine_contiguous_batch", "padded_generate"}
    assert memory.max_num_seqs["engine_contiguous_batch"] == 2
    assert memory.concurrent_seqs["engine_contiguous_batch"] <= 2
    assert memory.repeats.eq(3).all()
    assert (memory.tokens_per_s_min <= memory.tokens_per_s).all()
    assert (memory.tokens_per_s <= memory.tokens_per_s_max).all()
    assert frames["engine_compare"].repeats.eq(3).all()  # compare's default


def test_cli_breakdown_writes_rows_and_profile(tmp_path):
    path, profile = tmp_path / "b.csv", tmp_path / "p.txt"
    code, out, err = run_cli("engine-bench", "breakdown", "--batch-sizes", "1,2", "--prompt-len",
                             "3", "--max-tokens", "4", "--kernel", "torch", "--threads", "2",
                             "--out", str(path), "--profile-out", str(profile))
    assert code == 0, err
    rows = validated("engine", pd.read_csv(path))
    assert rows.batch.tolist() == [1, 2] and (rows.experiment == "step_breakdown").all()
    assert rows.torch_threads.eq(2).all()
    assert profile.read_text().count("=== batch") == 2 and "host (ms)" in out


@pytest.mark.parametrize("argv, message", [
    (["throughput", "--modes", "graphs,fast"], "--modes: unknown fast"),
    (["equal-memory", "--batch-sizes", "2,4"], "--batch-sizes: engine-bench equal-memory takes "
                                                "one value"),
    (["cow", "--prompt-len", "8-16"], "--prompt-len: engine-bench cow takes one value"),
    (["equality", "--repeat", "2"], "not used by engine-bench equality"),
    (["throughput", "--profile-out", "x.txt"], "--profile-out: not used"),
])
def test_cli_runbook_options_are_checked_before_any_work(argv, message):
    code, _, err = run_cli("engine-bench", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_prompt_len_range_is_parsed():
    import argparse

    from pagebench.cli.engine import length_range

    assert length_range("64") == (64, 64) and length_range("16-400") == (16, 400)
    for bad in ("400-16", "0-4", "a-b", "4-"):
        with pytest.raises(argparse.ArgumentTypeError):
            length_range(bad)


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


def test_fp8_comparison_frees_each_engine_when_it_is_dropped(monkeypatch):
    """Reference counting alone frees the first engine's runner (which holds the KV pool)
    before the second engine allocates: restoring the runner's ``execute`` leaves no cycle for
    a later collection."""
    import gc
    import weakref

    import torch

    runners, dead_at_release = [], []
    real = engine_bench.LLMEngine

    def tracked(*args, **kwargs):
        engine = real(*args, **kwargs)
        runners.append(weakref.ref(engine.runner))
        return engine

    monkeypatch.setattr(engine_bench, "LLMEngine", tracked)
    monkeypatch.setattr(engine_bench, "release_memory",
                        lambda device: dead_at_release.append([r() is None for r in runners]))
    model = engine_bench.tiny_model(dtype=torch.bfloat16, hidden_size=64, intermediate_size=128)
    prompts = engine_bench.random_prompts(2, 3, 5, model.config.vocab_size)
    gc.disable()
    try:
        engine_bench.fp8_comparison(model, prompts, max_tokens=2, kv_cache_memory="1MiB", logit_steps=2)
    finally:
        gc.enable()
    assert dead_at_release == [[True], [True, True]]


def test_blocks_for_all_holds_every_prompt_with_its_new_tokens():
    assert engine_bench.blocks_for_all([[0] * 5, [0] * 16], max_tokens=3, block_size=8) == 1 + 3
    assert engine_bench.blocks_for_all([], max_tokens=3, block_size=8) == 0
