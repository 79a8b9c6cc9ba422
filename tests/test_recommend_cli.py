"""`pagebench recommend`: the table and its legend, --json, --html, the fp8 verdict with and
without a kv_accuracy dataset, serving data, a backend constraint, and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pagebench.analysis.advice import KV_ACCURACY_COLUMNS
from pagebench.cli import main
from pagebench.cli.recommend import COLUMNS

REPO = Path(__file__).resolve().parents[1]
H200 = REPO / "reports" / "data" / "h200"
EXAMPLE = str(REPO / "examples" / "my_requests.csv")


@pytest.fixture
def device(tmp_path):
    """One GPU's data as committed: the engine's and the fp8 kernels' rows."""
    d = tmp_path / "gpu"
    d.mkdir()
    for name in ("engine_throughput_vs_batch.csv", "kernels_fp8.csv"):
        shutil.copy(H200 / name, d / name)
    return d


def accuracy_csv(directory, perplexity: float, top1: float):
    rows = [",".join(KV_ACCURACY_COLUMNS) + ",device,commit",
            "tiny,bfloat16,float32,16,10.0,10.0,1.0,4096,cuda:0,abc1234",
            f"tiny,fp8_e4m3,bfloat16,16,{perplexity},10.0,{top1},4096,cuda:0,abc1234"]
    (directory / "kv_accuracy.csv").write_text("\n".join(rows) + "\n")


def run_json(capsys, *args) -> dict:
    assert main(["recommend", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_table_names_its_data_and_explains_every_column(device, capsys):
    assert main(["recommend", "--lengths", EXAMPLE, "--device-data", str(device)]) == 0
    out = capsys.readouterr().out
    assert "my_requests.csv (500 requests)" in out
    assert ("engine decode tokens/s at batch 256, the measured batch nearest the 980 sequences "
            "that fit (NVIDIA H200, commit c46d36d") in out
    for _, header, _, meaning in COLUMNS:
        assert header in out and meaning in " ".join(out.split())
    assert "fit fp8_e4m3" in out and "no serving data" in out
    assert "fp8 KV cache: not decided: accuracy is not measured" in out
    assert "missing: accuracy (dataset kv_accuracy" in out


def test_json_answers_each_question(device, capsys):
    doc = run_json(capsys, "--lengths", EXAMPLE, "--device-data", str(device))
    assert doc["workload"]["num_requests"] == 500
    assert 0 < doc["workload"]["prompt_share"] < 1  # prompt + output both read
    best = doc["block_size"]["best"]
    assert best in doc["block_size"]["tied"]
    row = next(r for r in doc["table"] if r["block_size"] == best)
    assert row["verdict"] == "best"
    assert row["fit_fp8_e4m3"] >= 2 * row["fit_auto"] - 1  # one byte against two
    assert doc["capacity"]["at_best_block"] == {"auto": row["fit_auto"],
                                                 "fp8_e4m3": row["fit_fp8_e4m3"]}
    assert doc["latency_bound_rate"]["requests_per_s"] is None


def test_fp8_verdict_weighs_measured_accuracy(device, capsys):
    accuracy_csv(device, perplexity=10.02, top1=0.995)
    good = run_json(capsys, "--lengths", EXAMPLE, "--device-data", str(device))["fp8"]
    assert good["verdict"].startswith("worth it") and not good["missing"]
    assert any(e.startswith("accuracy: perplexity +0.20%") for e in good["evidence"])
    # this workload is mostly prompt, where fp8 prefill is slower: worth it for memory
    assert good["verdict"].startswith("worth it where memory binds")
    assert "for speed alone, not shown" in good["verdict"]
    accuracy_csv(device, perplexity=11.0, top1=0.90)
    bad = run_json(capsys, "--lengths", EXAMPLE, "--device-data", str(device))["fp8"]
    assert bad["verdict"].startswith("not worth it: accuracy")


def test_a_decode_heavy_workload_gets_fp8_for_speed_too(device, tmp_path, capsys):
    accuracy_csv(device, perplexity=10.0, top1=1.0)
    path = tmp_path / "chat.csv"
    path.write_text("prompt_tokens,output_tokens\n" + "100,2000\n" * 20)
    fp8 = run_json(capsys, "--lengths", str(path), "--device-data", str(device))["fp8"]
    assert fp8["verdict"].startswith("worth it for this workload")
    assert fp8["numbers"]["attention_time_ratio"] < 1


def test_serving_data_gives_the_latency_bound_rate(device, capsys):
    # the serving helper's columns: rate asked, latency percentiles, the KV dtype
    (device / "serve_bench.csv").write_text(
        "request_rate,kv_cache_dtype,ttft_p99_ms,tpot_p99_ms,tpot_p50_ms,device,commit\n"
        "1,auto,900,20,10,cuda:0,abc\n4,auto,900,45,20,cuda:0,abc\n8,auto,900,90,30,cuda:0,abc\n"
        "16,fp8_e4m3,900,40,20,cuda:0,abc\ninf,auto,900,10,5,cuda:0,abc\n")
    rate = run_json(capsys, "--device-data", str(device))["latency_bound_rate"]
    assert rate["requests_per_s"] == 4  # not fp8's 16, not the all-at-once row
    assert "tpot_p99_ms ≤ 50 ms" in rate["data"] and "KV cache auto" in rate["data"]
    rate = run_json(capsys, "--device-data", str(device), "--latency-slo-ms", "5")
    assert rate["latency_bound_rate"]["data"].startswith("no measured rate meets")


def test_a_backend_constraint_excludes_block_sizes(device, capsys):
    doc = run_json(capsys, "--trace", "azure-conv", "--multiple-of", "16",
                   "--device-data", str(device))
    assert doc["block_size"]["best"] % 16 == 0
    excluded = {r["block_size"] for r in doc["table"] if r["verdict"] == "excluded"}
    assert excluded == {1, 8} and doc["block_size"]["excluded"] == [1, 8]
    flex = run_json(capsys, "--trace", "azure-conv", "--backend", "flex",
                    "--device-data", str(device))["block_size"]
    assert flex["excluded"] == [1, 8] and flex["constraint"].startswith("backend flex: multiples")


def test_html_page_is_self_contained(device, tmp_path, capsys):
    page = tmp_path / "advice.html"
    assert main(["recommend", "--trace", "mooncake-conv", "--device-data", str(device),
                 "--html", str(page)]) == 0
    text = page.read_text()
    assert "data:image/png;base64," in text and "<script" not in text
    assert "mooncake-conv" in text and "fp8 KV cache" in text


@pytest.mark.parametrize("args, words", [
    (["--lengths", "nope.csv"], "--lengths: nope.csv not found"),
    (["--lengths", EXAMPLE, "--max-len", "1024"], "pass --max-len 8192 or more"),
    (["--kv-dtype", "int4"], "--kv-dtype: 'int4' is not one of auto, fp8_e4m3"),
    (["--device-data", "/nonexistent-dir"], "--device-data: /nonexistent-dir not found"),
    (["--lengths", EXAMPLE, "--trace", "azure-code"], "not allowed with argument"),
    (["--multiple-of", "3", "--block-sizes", "8,16"], "--multiple-of: no block size of "
     "--block-sizes is allowed (--multiple-of 3: multiples of 3 only)"),
    (["--backend", "flex", "--block-sizes", "1,8"], "--backend: no block size"),
    (["--backend", "nope"], "nope"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, capsys):
    assert main(["recommend", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_without_device_data_memory_decides_and_says_so(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    doc = run_json(capsys, "--device-data", str(empty))
    assert doc["block_size"]["basis"].startswith("no speed data: memory alone decides")
    assert "decode speed (kernels_fp8 decode rows)" in doc["fp8"]["missing"][0]
