import json
import random

import numpy as np
import pytest

from pagebench.cli import main
from pagebench.defaults import BLOCK_SIZES, REFERENCE_LENGTHS, REFERENCE_MAX_LEN
from pagebench.errors import ConfigError
from pagebench.sim.static import reserved_slots, static_fragmentation
from pagebench.sim.workloads import read_lengths_file, sample_lengths

ARTICLE = ["simulate", "--lengths", REFERENCE_LENGTHS, "--num-seqs", "2000", "--seed", "0",
           "--max-len", str(REFERENCE_MAX_LEN), "--block-sizes", ",".join(map(str, BLOCK_SIZES))]


def by_name(result):
    return {(r["allocator"], r["block_size"]): r for r in result["results"]}


def test_article_figures_reproduce(capsys):
    assert main([*ARTICLE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = by_name(out)
    assert out["tokens_stored"] == 730_840
    assert round(rows[("naive", None)]["utilisation"] * 100, 1) == 8.9
    assert round(rows[("oracle", None)]["utilisation"] * 100, 1) == 100.0
    sweep = [round(rows[("paged", b)]["utilisation"] * 100, 1) for b in (1, 8, 16, 32, 128)]
    assert sweep == [100.0, 99.0, 98.0, 96.0, 85.3]
    assert round(rows[("paged", 16)]["wasted_slots_per_seq"], 1) == 7.4


def test_naive_collapses_with_max_len_while_paged_stays():
    lengths4 = sample_lengths(REFERENCE_LENGTHS, 2000, 0, 4096)
    lengths32 = sample_lengths(REFERENCE_LENGTHS, 2000, 0, 32768)
    r4, r32 = by_name(static_fragmentation(lengths4, 4096)), by_name(
        static_fragmentation(lengths32, 32768))
    assert round(r32[("naive", None)]["utilisation"] * 100, 1) == 1.1
    assert r4[("paged", 16)]["utilisation"] == pytest.approx(r32[("paged", 16)]["utilisation"])


def test_draw_matches_the_stdlib_formula():
    r = random.Random(3)
    expected = [min(512, int(r.lognormvariate(5.0, 1.2))) for _ in range(50)]
    assert sample_lengths("lognormal:5.0,1.2", 50, 3, 512).tolist() == [max(1, x) for x in expected]


def test_reserved_slots_per_allocator():
    lengths = np.array([1, 5, 16, 17, 100])
    assert reserved_slots("naive", lengths, 128).tolist() == [128] * 5
    assert reserved_slots("pow2", lengths, 64).tolist() == [1, 8, 16, 32, 64]
    assert reserved_slots("oracle", lengths, 128).tolist() == [1, 5, 16, 17, 100]
    assert reserved_slots("paged", lengths, 128, 16).tolist() == [16, 16, 16, 32, 112]
    waste = reserved_slots("paged", lengths, 128, 16) - lengths
    assert waste.max() <= 15


def test_table_output_and_lengths_file(tmp_path, capsys):
    path = tmp_path / "lengths.csv"
    path.write_text("id,length\na,10\nb,300\n")
    assert read_lengths_file(str(path)) == [10, 300]
    (tmp_path / "l.jsonl").write_text('{"length": 7}\n{"length": 9}\n')
    assert read_lengths_file(str(tmp_path / "l.jsonl")) == [7, 9]
    (tmp_path / "l.txt").write_text("4\n5\n")
    assert main(["simulate", "--lengths", str(tmp_path / "l.txt"), "--num-seqs", "4"]) == 0
    out = capsys.readouterr().out
    assert "paged (block=16)" in out and "tokens stored 18" in out


def test_a_lengths_file_is_used_as_it_is_unless_num_seqs_is_given(tmp_path, capsys):
    """A 3-line file is 3 sequences (it was cycled to the default 2,000); --num-seqs, given,
    repeats or cuts the file's lengths, as its --help says."""
    path = str(tmp_path / "l.txt")
    (tmp_path / "l.txt").write_text("10\n300\n17\n")
    for extra, count, tokens in (([], 3, 327), (["--num-seqs", "5"], 5, 327 + 310),
                                 (["--num-seqs", "2"], 2, 310)):
        assert main(["simulate", "--lengths", path, "--json", *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        assert (out["num_seqs"], out["tokens_stored"]) == (count, tokens), extra
    assert main(["capacity", "--lengths", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_seqs"] == 3
    assert main(["simulate", "--lengths", REFERENCE_LENGTHS, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_seqs"] == 2000  # a distribution: default
    # --dynamic: one request per length in the file (it was cycled to 20,000), or --num-requests
    for extra, count, tokens in (([], 3, 327), (["--num-requests", "4"], 4, 337)):
        assert main(["simulate", "--dynamic", "--lengths", path, "--json", *extra]) == 0
        workload = json.loads(capsys.readouterr().out)["workload"]
        assert (workload["num_requests"], workload["mean_length"] * count) == (count, tokens)


@pytest.mark.parametrize("spec", ["lognormal:1", "gauss:1,2", "uniform:5,2", "fixed:0",
                                  "/no/such/file"])
def test_bad_specs_are_clear_errors(spec, capsys):
    assert main(["simulate", "--lengths", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pagebench simulate: error: --lengths:")


def test_bad_lengths_rejected():
    with pytest.raises(ConfigError):
        static_fragmentation([0, 5], 16)
    with pytest.raises(ConfigError):
        static_fragmentation([5], 16, block_sizes=[0])
