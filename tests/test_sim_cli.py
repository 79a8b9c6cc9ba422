import csv
import json

import pytest

from pagebench.cli import main

DYNAMIC_FIELDS = {"allocator", "block_size", "token_state_fraction",
                  "external_fragmentation_fraction", "internal_fragmentation_fraction",
                  "reserved_unused_fraction", "refused_with_enough_free", "num_preemptions",
                  "mean_concurrency", "tokens_per_step"}


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_capacity_json_schema_and_article_numbers(capsys):
    out = run_json(capsys, ["capacity", "--model", "qwen2.5-0.5b", "--gpu-memory", "16GB",
                            "--gpu-memory-utilization", "0.9", "--max-model-len", "4096",
                            "--block-size", "16", "--weights-bytes", "1GB",
                            "--overhead-bytes", "1GB", "--json"])
    assert {"bytes_per_token", "bytes_per_block", "num_blocks", "cacheable_tokens",
            "max_concurrency_naive", "max_concurrency_paged"} <= out.keys()
    assert (out["bytes_per_token"], out["bytes_per_block"]) == (12_288, 196_608)
    assert out["max_concurrency_naive"] == 246
    assert run_json(capsys, ["capacity", "--article", "--json"]) == out


def test_capacity_text_and_default_weight_estimate(capsys):
    assert main(["capacity"]) == 0
    text = capsys.readouterr().out
    assert "estimated: 494,032,768 parameters x 2 bytes" in text
    assert "cacheable tokens" in text and "paged / naive" in text


def test_capacity_kv_dtype_fp8_doubles_the_blocks(capsys):
    args = ["capacity", "--article", "--json"]
    bf16, fp8 = run_json(capsys, args), run_json(capsys, args + ["--kv-dtype", "fp8_e4m3"])
    assert fp8["num_blocks"] in (2 * bf16["num_blocks"], 2 * bf16["num_blocks"] + 1)
    assert fp8["max_concurrency_naive"] in (2 * bf16["max_concurrency_naive"],
                                            2 * bf16["max_concurrency_naive"] + 1)
    assert main(args + ["--kv-dtype", "fp4"]) == 2


def test_capacity_article_with_another_model_estimates_its_weights(capsys):
    """--article --model X kept the article's 1 GB of weights, labelled "[given]"."""
    article = run_json(capsys, ["capacity", "--article", "--json"])
    fp32 = run_json(capsys, ["capacity", "--article", "--dtype", "float32", "--json"])
    assert article["weights_bytes"] == 10**9
    assert fp32["weights_bytes"] == 494_032_768 * 4  # estimated for the dtype given
    assert main(["capacity", "--article", "--model", "llama-3-8b"]) == 2  # 16 GB of weights
    assert "leaves no room" in capsys.readouterr().err


def test_capacity_article_named_again_keeps_its_weights(capsys):
    """--article --dtype bf16 (its dtype by another name) or --model Qwen2.5-0.5B (its model)
    re-estimated the weights as 0.99 GB: 63,130 blocks, not the article's 63,069."""
    article = run_json(capsys, ["capacity", "--article", "--json"])
    for extra in (["--dtype", "bf16"], ["--dtype", "float16"], ["--model", "Qwen2.5-0.5B"],
                  ["--model", "qwen2.5-0.5b-instruct"]):
        out = run_json(capsys, ["capacity", "--article", "--json", *extra])
        assert (out["weights_bytes"], out["num_blocks"]) == (10**9, article["num_blocks"])


def test_seed_is_refused_where_a_lengths_file_draws_nothing(tmp_path, capsys):
    """As --seed with --trace: static simulate and capacity took a --lengths FILE in order and
    ignored the seed; simulate --dynamic --lengths FILE still draws arrivals with it."""
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("100\n200\n300\n")
    for argv in (["simulate", "--lengths", str(lengths)],
                 ["capacity", "--lengths", str(lengths)]):
        assert main(argv + ["--seed", "1"]) == 2
        assert "--seed: not with --lengths FILE" in capsys.readouterr().err
        assert main(argv + ["--json"]) == 0
        capsys.readouterr()
    dynamic = ["simulate", "--dynamic", "--lengths", str(lengths), "--rate", "0.01",
               "--budget-tokens", "4096", "--block-sizes", "16", "--json"]
    runs = {seed: run_json(capsys, dynamic + ["--seed", seed]) for seed in ("0", "1")}
    assert runs["0"]["workload"]["num_requests"] == 3 and runs["0"] != runs["1"]
    assert run_json(capsys, dynamic) == runs["0"]  # default seed 0


@pytest.mark.parametrize("field, value", [("num_local_experts", 8), ("n_routed_experts", 64)])
def test_capacity_refuses_to_estimate_the_weights_of_experts(tmp_path, capsys, field, value):
    """Mixtral-8x7B's weights were estimated as one expert's model: 14.5 GB, not 93 GB."""
    config = {"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 32000,
              field: value}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["capacity", "--model", str(tmp_path)]) == 2
    assert "mixture-of-experts" in capsys.readouterr().err
    assert main(["capacity", "--model", str(tmp_path), "--weights-bytes", "93GB",
                 "--gpu-memory", "141GB"]) == 0  # given weights: the KV arithmetic holds


def test_capacity_refuses_latent_attention(tmp_path, capsys):
    """DeepSeek's MLA caches a 576-wide latent a token, not K and V per head: 7x off."""
    config = {"num_attention_heads": 16, "num_key_value_heads": 16, "hidden_size": 2048,
              "num_hidden_layers": 27, "intermediate_size": 10944, "vocab_size": 102400,
              "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["capacity", "--model", str(tmp_path), "--weights-bytes", "32GB"]) == 2
    assert "latent attention" in capsys.readouterr().err


def test_prompt_and_output_length_files_pair_line_by_line(tmp_path, capsys):
    """Each file was cycled on its own to 20,000 requests: a 3-line and a 2-line file
    paired (100, 10), (200, 20), (300, 10), ... without a word."""
    prompts, outputs = tmp_path / "p.txt", tmp_path / "o.txt"
    prompts.write_text("100\n200\n300\n")
    outputs.write_text("10\n20\n")
    argv = ["simulate", "--dynamic", "--prompt-lengths", str(prompts), "--output-lengths",
            str(outputs), "--budget-tokens", "4096", "--block-sizes", "16", "--json"]
    assert main(argv) == 2
    assert "hold 3 and 2 lengths" in capsys.readouterr().err
    outputs.write_text("10\n20\n30\n")
    out = run_json(capsys, argv)
    assert out["workload"]["num_requests"] == 3  # one request a line, as --lengths FILE
    from pagebench.sim.trace import poisson_workload

    w = poisson_workload(3, 1.0, prompt_lengths=str(prompts), output_lengths=str(outputs))
    assert list(zip(w.prompt_len.tolist(), w.output_len.tolist())) == [(100, 10), (200, 20),
                                                                        (300, 30)]


def test_capacity_bad_input_is_one_line_exit_2(capsys):
    assert main(["capacity", "--gpu-memory", "12 potatoes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pagebench capacity: error: --gpu-memory:") and "\n" not in err


def test_dynamic_json_schema(capsys, tmp_path):
    timeline = tmp_path / "tl.csv"
    out = run_json(capsys, ["simulate", "--dynamic", "--num-requests", "300", "--rate", "2",
                            "--budget-tokens", "30000", "--block-sizes", "16,64", "--json",
                            "--timeline", str(timeline), "--timeline-every", "5"])
    results = out["results"]
    assert [(r["allocator"], r["block_size"]) for r in results] == [
        ("naive", None), ("pow2", None), ("oracle", None), ("paged", 16), ("paged", 64)]
    for r in results:
        assert DYNAMIC_FIELDS <= r.keys()
        assert 0 <= r["token_state_fraction"] <= 1
    assert out["budget_tokens"] == 30000 and out["workload"]["num_requests"] == 300
    with open(timeline, newline="") as f:
        rows = list(csv.DictReader(f))
    assert {int(r["step"]) % 5 for r in rows} == {0}
    parts = ("token_state", "reserved_unused", "internal_frag", "external_frag", "free")
    assert all(sum(int(r[k]) for k in parts) == 30000 for r in rows)


def test_dynamic_table_from_a_trace(capsys, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"arrival": i, "prompt_len": 20, "output_len": 30,
                                           "n": 2}) for i in range(40)))
    assert main(["simulate", "--dynamic", "--trace", str(trace), "--budget-tokens", "5000",
                 "--allocators", "oracle,paged", "--cow"]) == 0
    text = capsys.readouterr().out
    assert "40 requests (trace" in text and "paged-16" in text
    assert not any(line.startswith("naive") for line in text.splitlines())  # not asked for


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--rate", "3"], "--rate: only with --dynamic"),
    (["simulate", "--dynamic", "--num-seqs", "10"], "--num-requests"),
    (["simulate", "--dynamic", "--budget-tokens", "100"], "--budget-tokens"),
    (["simulate", "--dynamic", "--allocators", "buddy"], "allocators"),
    (["simulate", "--dynamic", "--trace", "/nonexistent.csv"], "cannot read"),
    (["simulate", "--dynamic", "--trace", "x.csv", "--rate", "2"], "not with --trace"),
    (["simulate", "--dynamic", "--trace", "x.csv", "--seed", "1"],
     "--seed: not with --trace"),  # a trace draws nothing: the seed was ignored
    (["simulate", "--dynamic", "--steps-per-unit", "2"], "only with --trace"),
])
def test_dynamic_bad_input(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_static_simulate_unchanged(capsys):
    assert main(["simulate", "--num-seqs", "100", "--block-sizes", "16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("100 sequences, max_len 4,096") and lines[7:9] == ["", "columns:"]
    assert [ln.split()[0] for ln in lines[2:7]] == ["allocator", "naive", "pow2", "oracle", "paged"]
    assert [ln.split()[0] for ln in lines[9:]] == ["allocated", "utilisation", "waste/seq"]


def test_capacity_tensor_parallel_option(capsys):
    out = run_json(capsys, ["capacity", "--model", "llama-3-8b", "--kv-cache-bytes", "1GiB",
                            "--tensor-parallel-size", "2", "--json"])
    assert (out["tensor_parallel_size"], out["kv_heads_per_rank"]) == (2, 4)
    assert out["num_blocks"] == 2 * out["num_blocks_tp1"] == 2**30 // 2**20
    assert main(["capacity", "--model", "llama-3-8b", "--tensor-parallel-size", "3"]) != 0
    assert "--tensor-parallel-size: 3" in capsys.readouterr().err


def test_dynamic_table_names_refused_and_waiting_requests_apart(capsys):
    """A reservation scheme refuses requests whose whole reservation does not fit; paging
    makes them wait for a block: separate columns, each '-' where it does not apply, and a
    legend line for every column header."""
    from pagebench.sim.columns import DYNAMIC_LEGEND

    assert main(["simulate", "--dynamic", "--num-requests", "300",
                 "--allocators", "pow2,paged"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line.split() for line in lines if line.startswith("allocator"))
    first = lines[:lines.index("while requests wait (memory-bound steps):")]
    rows = {line.split()[0]: line.split() for line in first
            if line.startswith(("pow2 ", "paged-16 "))}
    refused, waited = header.index("refused"), header.index("waited")
    assert rows["pow2"][waited] == "-" and rows["pow2"][refused] != "-"
    assert rows["paged-16"][refused] == "-" and rows["paged-16"][waited] != "-"
    legend = {line.split()[0] for line in lines[lines.index("columns:") + 1:]}
    assert set(header[1:]) <= legend | {"of"} and {h for h, _ in DYNAMIC_LEGEND} <= legend | {
        "tok/step"}
