"""Lengths and trace files as users have them: documented column names, a prompt+output CSV
taken as it is, clear errors otherwise, and a length above --max-len that names the flag."""

from __future__ import annotations

import pytest

from pagebench.cli import main
from pagebench.errors import ConfigError
from pagebench.sim.columns import LENGTHS_FILE_HELP, OUTPUT_COLUMNS, PROMPT_COLUMNS
from pagebench.sim.trace import poisson_workload
from pagebench.sim.workloads import read_lengths_file, read_requests_file, sample_lengths


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_prompt_output_csv_gives_their_sum_and_each_part(tmp_path):
    path = write(tmp_path / "mine.csv",
                 "request_id,prompt_tokens,output_tokens\nr1,100,20\nr2,7,3\n")
    assert read_lengths_file(path) == [120, 10]
    assert read_lengths_file(path, part="prompt") == [100, 7]
    assert read_lengths_file(path, part="output") == [20, 3]
    assert read_requests_file(path) == ([120, 10], [100, 7], [20, 3])


def test_a_length_column_wins_over_the_parts(tmp_path):
    path = write(tmp_path / "l.csv", "prompt_len,output_len,length\n3,4,9\n")
    assert read_lengths_file(path) == [9]


def test_jsonl_requests_and_a_byte_order_mark(tmp_path):
    path = write(tmp_path / "r.jsonl", '{"input_tokens": 5, "completion_tokens": 2}\n')
    assert read_lengths_file(path) == [7]
    bom = write(tmp_path / "bom.csv", "\ufeffprompt_tokens,output_tokens\n4,4\n")
    assert read_lengths_file(bom) == [8]


@pytest.mark.parametrize("text, words", [
    ("id,foo\n1,2\n", "has none of the length columns"),
    ("request_id,prompt_tokens\n1,2\n", "no output one"),
    ("prompt_tokens,output_tokens\n1.5,2\n", "not a list of integer lengths"),
    ("prompt_tokens,output_tokens\n0,2\n", "below 1"),
    ("prompt_tokens,output_tokens\n", "header but no requests"),
])
def test_bad_files_say_what_is_wrong(tmp_path, text, words):
    path = write(tmp_path / "bad.csv", text)
    with pytest.raises(ConfigError, match=words):
        read_lengths_file(path, "--lengths")


def test_the_error_lists_the_accepted_columns_and_the_files_own(tmp_path):
    path = write(tmp_path / "bad.csv", "id,foo\n1,2\n")
    with pytest.raises(ConfigError) as e:
        read_lengths_file(path, "--lengths")
    for name in (*PROMPT_COLUMNS, *OUTPUT_COLUMNS, "id, foo"):
        assert name in str(e.value)


def test_a_length_above_max_len_suggests_the_flag(tmp_path):
    path = write(tmp_path / "long.csv", "prompt_tokens,output_tokens\n5000,100\n")
    with pytest.raises(ConfigError, match="pass --max-len 8192 or more"):
        sample_lengths(path, 1, max_len=4096, option="--lengths", limit="--max-len")
    with pytest.raises(ConfigError) as e:
        sample_lengths(path, 1, max_len=4096)  # a library call names no flag
    assert "pass" not in str(e.value)


def test_one_requests_csv_serves_prompt_and_output_lengths(tmp_path):
    path = write(tmp_path / "mine.csv", "prompt_tokens,output_tokens\n10,3\n20,5\n")
    w = poisson_workload(2, 1.0, prompt_lengths=path, output_lengths=path, max_len=64)
    assert sorted(zip(w.prompt_len.tolist(), w.output_len.tolist())) == [(10, 3), (20, 5)]


def test_cli_takes_a_requests_csv_and_names_the_flag(tmp_path, capsys):
    path = write(tmp_path / "mine.csv", "request_id,prompt_tokens,output_tokens\n1,5000,96\n")
    assert main(["simulate", "--lengths", path]) == 2
    assert "pass --max-len 8192 or more" in capsys.readouterr().err
    assert main(["simulate", "--lengths", path, "--max-len", "8192"]) == 0
    assert "1 sequences" in capsys.readouterr().out


def test_help_documents_the_columns(capsys):
    assert main(["simulate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "prompt_tokens" in text and "output_tokens" in text
    assert "prompt_tokens" in LENGTHS_FILE_HELP


def test_dynamic_takes_a_requests_file_prompt_and_output_as_they_are(tmp_path, capsys):
    import json

    path = write(tmp_path / "mine.csv", "request_id,prompt_tokens,output_tokens\n"
                 "a,100,10\nb,300,30\n")
    assert main(["simulate", "--dynamic", "--lengths", path, "--json"]) == 0
    workload = json.loads(capsys.readouterr().out)["workload"]
    assert (workload["mean_prompt_len"], workload["mean_output_len"]) == (200, 20)
    assert main(["simulate", "--dynamic", "--lengths", path, "--prompt-fraction", "0.5"]) == 2
    assert "gives each request's prompt and output" in capsys.readouterr().err
    lengths_only = write(tmp_path / "l.csv", "length\n100\n300\n")  # split by the fraction
    assert main(["simulate", "--dynamic", "--lengths", lengths_only, "--json"]) == 0
    workload = json.loads(capsys.readouterr().out)["workload"]
    assert workload["mean_prompt_len"] == 60  # 0.3 of each
