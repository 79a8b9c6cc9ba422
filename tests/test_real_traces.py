"""Trace readers (Azure, Mooncake, shipped traces), replay in steps, clipping and the CLI."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from pagebench.cli import main
from pagebench.errors import ConfigError
from pagebench.sim.real_traces import (DATA_DIR, NAMED_TRACES, clip_lengths, load_workload,
                                       read_timed_trace, trace_format)

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def mooncake_line(t=0, p=600, o=5, ids=(1, 2)):
    return json.dumps({"timestamp": t, "input_length": p, "output_length": o,
                       "hash_ids": list(ids)}) + "\n"


def test_shipped_traces_are_small_and_attributed():
    sizes = sum((DATA_DIR / f).stat().st_size for f in NAMED_TRACES.values())
    assert sizes < 2_000_000
    readme = (DATA_DIR / "README.md").read_text()
    assert "CC-BY 4.0" in readme and "Apache" in readme and "Splitwise" in readme


@pytest.mark.parametrize("name, count, prompt_median, output_median", [
    ("azure-code", 8819, 1469, 13), ("azure-conv", 19366, 1020, 129),
    ("mooncake-conv", 12031, None, None)])
def test_named_traces_read_as_published(name, count, prompt_median, output_median):
    trace = read_timed_trace(name)
    assert trace.num_requests == count and trace.arrival_s.min() == 0.0
    assert 3400 < trace.duration_s < 3600  # about an hour each
    if prompt_median:
        assert np.median(trace.prompt_len) == prompt_median
        assert np.median(trace.output_len) == output_median
        assert trace.hash_ids is None
    else:
        assert trace.prompt_len.mean() == pytest.approx(12035, abs=1)
        assert all(len(h) == -(-p // 512) for h, p in zip(trace.hash_ids, trace.prompt_len))


def test_azure_file_replayed_in_steps(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(AZURE + "2023-11-16 18:17:03.9799600,100,10\n"
                    "2023-11-16 18:17:04.0399600,30,2\n2023-11-16 18:17:05.9799600,8000,500\n")
    assert trace_format(path) == "azure"
    w = load_workload(str(path), step_ms=20)
    assert w.arrival.tolist() == [0, 3, 100]  # 0.06 s / 20 ms, 2 s / 20 ms
    assert w.max_model_len == 16384 and w.num_clipped == 0  # 8,500 tokens and w.hash_ids is None
    clipped = load_workload(str(path), step_ms=10, max_model_len=1000)
    assert clipped.num_clipped == 1 and clipped.length.max() == 1000
    assert clipped.output_len.tolist() == [10, 2, 500]  # the prompt is cut, not the output
    d = clipped.describe()
    assert d["mean_prompt_len"] == pytest.approx(8130 / 3) and d["num_clipped"] == 1
    assert d["duration_s"] == pytest.approx(2.0)


def test_mooncake_gzip_file_and_clipping_keeps_leading_ids(tmp_path):
    path = tmp_path / "m.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(mooncake_line(0, 1500, 7, (1, 2, 3)) + mooncake_line(2500, 600, 9, (1, 4)))
    assert trace_format(path) == "mooncake"
    w = load_workload(str(path), step_ms=50, max_model_len=800)
    assert w.arrival.tolist() == [0, 50] and w.prompt_len.tolist() == [793, 600]
    assert [h.tolist() for h in w.hash_ids] == [[1, 2], [1, 4]] and w.num_clipped == 1


def test_clip_lengths():
    p, o, c = clip_lengths(np.array([10, 3, 9]), np.array([2, 20, 1]), 10)
    assert p.tolist() == [8, 1, 9] and o.tolist() == [2, 9, 1] and c.tolist() == [1, 1, 0]
    with pytest.raises(ConfigError, match="max_model_len"):
        clip_lengths(p, o, 1)


@pytest.mark.parametrize("text, message", [
    (AZURE + "2023-11-16 18:17:03.97,10,5\nnot a date,10,5\n", "line 3: TIMESTAMP is not a date"),
    (AZURE + "2023-11-16 18:17:03.97,ten,5\n", "line 2: ContextTokens is not a number"),
    (AZURE + "2023-11-16 18:17:03.97,10,0\n", "line 2: GeneratedTokens must be >= 1"),
    (AZURE + "2023-11-16 18:17:03.97,10\n", "line 2: expected 3 fields, got 2"),
    (AZURE + "2023-11-16 18:17:03.97,10.5,3\n", "line 2: ContextTokens must be an integer"),
    (AZURE, "no requests"),
])
def test_azure_malformed_rows(tmp_path, text, message):
    path = tmp_path / "bad_azure.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_workload(str(path))
    assert "bad_azure.csv" in str(err.value)


@pytest.mark.parametrize("text, message", [
    (mooncake_line() + "{oops\n", "line 2: invalid JSON"),
    (mooncake_line() + '{"timestamp": 1, "input_length": 5, "hash_ids": [1]}\n',
     "line 2: missing output_length"),
    (mooncake_line() + mooncake_line(ids=(1,)), "line 2: hash_ids has 1 ids for input_length 600"),
    (mooncake_line() + mooncake_line(t=-1), "line 2: timestamp must be a number of ms in 0"),
    (mooncake_line() + mooncake_line(ids=(1, "x")), "line 2: hash_ids must be a list"),
    (mooncake_line() + mooncake_line(o=0), "line 2: output_length must be >= 1"),
    (mooncake_line() + "[1, 2]\n", "line 2: expected a JSON object"),
])
def test_mooncake_malformed_rows(tmp_path, text, message):
    path = tmp_path / "bad_mooncake.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_workload(str(path))
    assert "bad_mooncake.jsonl" in str(err.value)


def test_step_schema_and_time_options_do_not_mix(tmp_path):
    steps = tmp_path / "s.csv"
    steps.write_text("arrival,prompt_len,output_len\n0,5,3\n4,2,2\n")
    assert trace_format(steps) == "steps"
    assert load_workload(str(steps), steps_per_unit=2).arrival.tolist() == [0, 8]
    with pytest.raises(ConfigError, match="step_ms: .* gives arrivals in steps"):
        load_workload(str(steps), step_ms=20)
    with pytest.raises(ConfigError, match="steps_per_unit: .* in seconds"):
        load_workload("azure-code", steps_per_unit=2)
    with pytest.raises(ConfigError, match="step_ms"):
        load_workload("azure-code", step_ms=0)
    with pytest.raises(ConfigError, match="cannot read"):
        load_workload("/nonexistent/trace.jsonl")


def test_simulate_cli_on_a_trace_with_prefix_caching(capsys, tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(mooncake_line(t * 100, 1100, 20, (1, 2, 3 + t)) for t in range(6)))
    assert main(["simulate", "--dynamic", "--trace", str(path), "--prefix-caching", "--json",
                 "--max-model-len", "1024", "--step-ms", "10", "--budget-tokens", "20000"]) == 0
    out = json.loads(capsys.readouterr().out)
    wl = out["workload"]
    assert wl["num_requests"] == 6 and wl["num_clipped"] == 6 and wl["mean_prompt_len"] == 1100
    assert wl["duration_s"] == pytest.approx(0.5) and wl["mean_output_len"] == 20
    paged = [r for r in out["results"] if r["allocator"] == "paged"][0]
    # clipped to 1004 prompt tokens; the first 1003 // 16 = 62 blocks of the later five hit
    assert paged["prefix_cache_hit_rate"] == pytest.approx(5 * 62 * 16 / (6 * 1004))
    assert paged["prefix_blocks_saved"] == 5 * 62
    naive = [r for r in out["results"] if r["allocator"] == "naive"][0]
    assert naive["prefix_cache_hit_rate"] is None


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--prefix-caching"], "--prefix-caching: only with --dynamic"),
    (["simulate", "--dynamic", "--step-ms", "5"], "--step-ms: only with --trace"),
    (["simulate", "--dynamic", "--prefix-caching", "--n", "2", "--cow"], "--prefix-caching"),
])
def test_simulate_cli_trace_option_errors(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_mooncake_unlimited_hit_rate_equals_leading_shared_ids():
    """The simulator with unlimited memory against plain arithmetic: each request hits the
    512-token spans whose whole id prefix an earlier request had (capped below the last prompt
    token). On the whole trace this is 37.4% (the README's figure); here its first 2,000
    requests keep the test fast."""
    from pagebench.sim.dynamic import simulate_allocator

    head = read_timed_trace("mooncake-conv").head(2000)
    assert head.num_requests == 2000 and head.arrival_s.max() == 669.0  # the first 11 minutes
    seen, hit = set(), 0
    for p, ids in zip(head.prompt_len.tolist(), head.hash_ids):
        ids = tuple(ids.tolist())
        k = 0
        while k < len(ids) and ids[:k + 1] in seen:
            k += 1
        hit += min(k * 512, (p - 1) // 16 * 16)
        seen.update(ids[:j + 1] for j in range(len(ids)))
    w = head.to_workload()
    row, _ = simulate_allocator(w, int(w.length.sum()), "paged", 16, max_len=w.max_model_len,
                                prefix_caching=True)
    assert row["prefix_cache_hit_rate"] == pytest.approx(hit / int(w.prompt_len.sum()), abs=1e-9)
    assert 0.25 < row["prefix_cache_hit_rate"] < 0.45


def test_simulate_table_reports_clipping_and_hit_rate(capsys, tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(mooncake_line(t * 100, 1100, 20, (1, 2, 3)) for t in range(3)))
    assert main(["simulate", "--dynamic", "--trace", str(path), "--prefix-caching",
                 "--max-model-len", "1024", "--budget-tokens", "20000"]) == 0
    out = capsys.readouterr().out
    assert "3 clipped to max_model_len 1,024" in out
    assert "paged-16          hit rate 65.9%" in out  # 2 x 62 blocks of 16 / (3 x 1,004)


@pytest.mark.parametrize("name, text, message", [
    ("huge.csv", AZURE + "2023-11-16 18:17:03,10,5\n2023-11-16 18:17:04,1e300,5\n",
     "line 3: ContextTokens"),
    ("huge.csv", AZURE + "2023-11-16 18:17:03,10,99999999999999999999999\n",
     "line 2: GeneratedTokens"),
    ("huge.jsonl", mooncake_line() + mooncake_line(p=10**300, ids=(1,)), "line 2: input_length"),
    ("huge.jsonl", mooncake_line() + mooncake_line(p=5, ids=(2**63,)), "line 2: hash_ids"),
    ("huge.jsonl", mooncake_line() + mooncake_line(t=1e300), "line 2: timestamp"),
    ("huge_steps.csv", "arrival,prompt_len,output_len\n0,5,3\n0,1e300,3\n", "line 3: prompt_len"),
    ("huge_steps.csv", "arrival,prompt_len,output_len\n1e300,5,3\n", "line 2: arrival"),
])
def test_huge_values_are_errors_naming_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_workload(str(path))
    assert name in str(err.value)


def test_step_schema_errors_count_blank_lines(tmp_path):
    path = tmp_path / "blank.csv"
    path.write_text("arrival,prompt_len,output_len\n0,3,4\n\n\n0,x,4\n")
    with pytest.raises(ConfigError, match="line 5: prompt_len"):
        load_workload(str(path))
    path = tmp_path / "blank.jsonl"
    path.write_text('{"arrival": 0, "prompt_len": 5, "output_len": 3}\n\n'
                    '{"arrival": 0, "prompt_len": 5, "output_len": 0}\n')
    with pytest.raises(ConfigError, match="line 3: output_len"):
        load_workload(str(path))


def test_step_schema_gzip_file(tmp_path):
    path = tmp_path / "s.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("arrival,prompt_len,output_len\n0,5,3\n4,2,2\n")
    assert load_workload(str(path)).prompt_len.tolist() == [5, 2]


def test_huge_max_model_len_clips_nothing_and_tiny_step_is_an_error(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(mooncake_line(0, 600, 5) + mooncake_line(3000, 20, 5, (1,)))
    w = load_workload(str(path), max_model_len=10**30)
    assert w.num_clipped == 0 and w.prompt_len.tolist() == [600, 20]
    with pytest.raises(ConfigError, match="step_ms"):
        load_workload(str(path), step_ms=1e-300)


@pytest.mark.parametrize("ids, message", [
    (([1], [1]), "request 0 has 1 hash_ids for a prompt of 1000 tokens"),
    (([[1, 2]], [[1, 2]]), "one-dimensional"),
    ((["a"], ["b"]), "integers"),
])
def test_workload_refuses_hash_ids_that_do_not_cover_the_prompt(ids, message):
    from pagebench.sim.trace import Workload

    with pytest.raises(ConfigError, match=f"hash_ids: .*{message}"):
        Workload([0, 1], [1000, 1000], [3, 3], [1, 1], hash_ids=ids)


@pytest.mark.parametrize("name, text", [
    ("bom.csv", AZURE.replace("\n", "\r\n") + "2023-11-16 18:17:03.97,10,5\r\n"),
    ("bom.jsonl", mooncake_line()),
    ("bom_steps.csv", "arrival,prompt_len,output_len\n0,3,4\n"),
])
def test_files_saved_with_a_byte_order_mark_read_alike(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_workload(str(path)).num_requests == 1


def test_workload_checks_hash_ids_against_their_own_request_when_sorting():
    from pagebench.sim.trace import Workload

    w = Workload([20, 0], [1, 513], [1, 1], [1, 1], hash_ids=([7], [0, 1]))
    assert w.prompt_len.tolist() == [513, 1] and [h.tolist() for h in w.hash_ids] == [[0, 1], [7]]
