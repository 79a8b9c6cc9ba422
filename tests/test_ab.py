"""`pagebench ab` (pagebench.measure.ab): variants files, the reference check that keeps a wrong
variant untimed, the rows' provenance, and reproduction commands that rerun one row."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shlex
from pathlib import Path

import pandas as pd
import pytest
import torch

from pagebench.cli import main
from pagebench.errors import ConfigError
from pagebench.kernels import register_backend, unregister_backend
from pagebench.measure.ab import CHECK_ROWS, evenly_spaced
from pagebench.kernels.reference import torch_paged_decode
from pagebench.measure.ab_variants import LAUNCH_KERNELS, Variant, launch_fields, read_variants

REPO = Path(__file__).resolve().parents[1]
TINY = ["--heads", "4/2", "--head-dim", "16", "--context", "40", "--block-size", "8",
        "--repeat", "1", "--rounds", "2"]
TOML = """
[[variant]]
name = "torch"
backend = "torch"

[[variant]]
name = "triton-2-splits"
backend = "triton"
launch = { num_splits = 2, tile_n = 16 }
"""


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["ab", *argv])
    return code, out.getvalue(), err.getvalue()


def rows_in(folder) -> pd.DataFrame:
    """The rows of the one run written to ``folder``."""
    (path,) = folder.glob("*.csv")
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


@pytest.fixture
def variants_file(tmp_path):
    path = tmp_path / "variants.toml"
    path.write_text(TOML)
    return path


@pytest.fixture
def zeros_backend():
    """A registered backend whose decode and prefill return zeros: wrong at every point."""
    def zeros(q, *args, **scales):
        return torch.zeros_like(q)

    register_backend("zeros-test", decode=zeros, prefill=zeros)
    yield "zeros-test"
    unregister_backend("zeros-test")


def test_toml_and_json_files_give_the_same_variants(tmp_path, variants_file):
    records = [{"name": "torch", "backend": "torch"},
               {"name": "triton-2-splits", "backend": "triton",
                "launch": {"num_splits": 2, "tile_n": 16}}]
    json_path = tmp_path / "variants.json"
    json_path.write_text(json.dumps({"variant": records}))
    from_toml = read_variants(str(variants_file), "decode")
    assert from_toml == read_variants(str(json_path), "decode")
    assert from_toml == [Variant("torch", "torch"),
                         Variant("triton-2-splits", "triton", {"num_splits": 2, "tile_n": 16})]
    assert read_variants(str(variants_file), "decode", ["triton-2-splits"]) == from_toml[1:]


def test_the_command_line_offers_every_routine():
    from pagebench.cli.ab import ROUTINES
    from pagebench.measure.ab_variants import ROUTINE_OPS

    assert ROUTINES == tuple(ROUTINE_OPS)


def test_launch_fields_are_the_kernels_keywords():
    assert {"num_splits", "tile_n", "num_warps"} <= set(launch_fields("triton", "decode"))
    assert "rows" in launch_fields("triton", "prefill")
    assert launch_fields("torch", "decode") == ()


@pytest.mark.parametrize(("text", "expected"), [
    ('[[variant]]\nname = "a"\nbackend = "nope"\n', "unknown backend 'nope'"),
    ('[[variant]]\nname = "a"\nbackend = "triton"\nlaunch = { splits = 2 }\n',
     "unknown launch field(s) splits for triton decode"),
    ('[[variant]]\nname = "a"\nbackend = "torch"\nlaunch = { num_splits = 2 }\n',
     "takes no launch fields"),
    ('[[variant]]\nname = "a"\nbackend = "sdpa"\n', "has no decode kernel"),
    ('[[variant]]\nname = "a"\nbackend = "torch"\ncolour = 1\n', "unknown key(s) colour"),
    ('[[variant]]\nname = "a b"\nbackend = "torch"\n', "name must be letters"),
    ('[[variant]]\nname = "a"\nbackend = "torch"\n[[variant]]\nname = "a"\nbackend = "torch"\n',
     "two variants are named 'a'"),
    ('[[variant]\nname = "a"\n', "bad TOML"),
    ('[variants]\n', "expected a 'variant' list"),
])
def test_a_bad_variants_file_is_one_line_and_exit_2(tmp_path, text, expected):
    path = tmp_path / "v.toml"
    path.write_text(text)
    out_dir = tmp_path / "out"
    code, out, err = run_cli("--variants", str(path), "--out-dir", str(out_dir), *TINY)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and expected in err, err
    assert err.startswith(f"pagebench ab: error: --variants: {path}")
    assert not out_dir.exists()  # nothing ran, nothing written


@pytest.mark.parametrize(("argv", "expected"), [
    (["--backends", "torch,nope"], "--backends: nope: unknown backend 'nope'"),
    (["--backends", "torch", "--only", "torch"], "--only: selects variants of a --variants"),
    (["--backends", "torch", "--query-len", "4"], "--query-len: prefill and mixed only"),
    (["--backends", "torch", "--decodes", "2"], "--decodes: --routine mixed only"),
    (["--backends", "torch", "--heads", "4/3"], "--heads: need 1 <= KV <= Q"),
    (["--backends", "torch", "--kv-dtype", "fp4"], "--kv-dtype: unknown 'fp4'"),
    (["--backends", "torch", "--lengths", "zipf:2"], "--lengths: expected uniform"),
    (["--backends", "sdpa"], "sdpa-contiguous is its contiguous decode"),
    (["--routine", "prefill", "--backends", "sdpa-contiguous"],
     "a contiguous layout is a decode baseline"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, argv, expected):
    code, _, err = run_cli(*argv, "--out-dir", str(tmp_path / "out"))
    assert code == 2 and err.count("\n") == 1 and expected in err, err


def test_only_an_unknown_name_is_refused(variants_file):
    with pytest.raises(ConfigError, match="--only: .* has no variant 'nope'"):
        read_variants(str(variants_file), "decode", ["nope"])


def test_a_tracked_folder_of_the_checkout_is_refused():
    tracked = REPO / "pagebench" / "ab_out"
    code, _, err = run_cli("--backends", "torch", "--out-dir", str(tracked), *TINY)
    assert code == 2 and f"--out-dir: {tracked} is inside the checkout" in err
    assert not tracked.exists()


def test_the_default_folder_is_an_ignored_one_of_the_checkout():
    from pagebench.cli.ab import DEFAULT_OUT_DIR, check_out_dir

    check_out_dir(str(REPO / DEFAULT_OUT_DIR))  # git-ignored: accepted
    with pytest.raises(ValueError, match="not git-ignored"):
        check_out_dir(str(REPO / "docs" / "ab_out"))


def test_json_prints_the_rows_and_name_names_the_files(tmp_path):
    code, out, err = run_cli("--backends", "torch", "--json", "--name", "mine",
                             "--out-dir", str(tmp_path), *TINY)
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["variant"] == "torch" and row["check"] == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.csv", "mine.json"]
    code, _, err = run_cli("--backends", "torch", "--name", "../up", "--out-dir",
                           str(tmp_path), *TINY)
    assert code == 2 and "--name: a file name without folders" in err


def test_the_points_measured_before_a_failure_are_written(tmp_path, monkeypatch):
    from pagebench.measure import ab

    def build_or_fail(setup, point):
        if point.batch == 2:
            raise MemoryError("the second point does not fit")
        return real_build(setup, point)

    real_build = ab.build_case
    monkeypatch.setattr(ab, "build_case", build_or_fail)
    code, _, err = run_cli("--backends", "torch", "--batch", "1,2", "--out-dir", str(tmp_path),
                           *TINY)
    assert code == 2 and "not enough memory: the second point does not fit" in err
    assert list(rows_in(tmp_path).batch) == [1]


def test_a_wrong_variant_is_caught_and_not_timed(tmp_path, zeros_backend):
    code, out, err = run_cli("--backends", f"torch,{zeros_backend}", "--batch", "3",
                             "--out-dir", str(tmp_path), *TINY)
    assert code == 1, err  # the run completes; its status says a variant was wrong
    assert f"{zeros_backend} (batch 3, context 40: wrong)" in err
    rows = rows_in(tmp_path).set_index("variant")
    good, bad = rows.loc["torch"], rows.loc[zeros_backend]
    assert good.check == "ok" and good.rel_error < good.tolerance and good.time_us > 0
    assert bad.check == "wrong" and bad.rel_error == pytest.approx(1.0)
    assert pd.isna(bad.time_us) and pd.isna(bad.ratio) and "not timed" in bad.message
    assert "wrong" in out  # the printed table says so too


def test_a_variant_that_raises_is_an_error_row(tmp_path, variants_file):
    bad = tmp_path / "bad.toml"
    bad.write_text(TOML.replace("num_splits = 2", "kv_per_program = 3"))
    code, _, _ = run_cli("--variants", str(bad), "--out-dir", str(tmp_path / "out"), *TINY)
    rows = rows_in(tmp_path / "out").set_index("variant")
    assert code == 1
    assert rows.loc["triton-2-splits", "check"] == "error"
    assert rows.loc["triton-2-splits", "message"].startswith("ValueError: kv_per_program")
    assert rows.loc["torch", "check"] == "ok"


def test_rows_carry_the_command_commit_and_environment(tmp_path, variants_file):
    code, out, err = run_cli("--variants", str(variants_file), "--batch", "1,2",
                             "--out-dir", str(tmp_path), *TINY)
    assert code == 0, err
    rows = rows_in(tmp_path)
    assert len(rows) == 4 and set(rows.check) == {"ok"}
    assert list(rows.variant) == ["torch", "triton-2-splits"] * 2
    assert (rows.baseline == "torch").all() and (rows.note.str.startswith("CPU wall")).all()
    for column in ("commit", "torch_version", "device_name", "pagebench_version"):
        assert rows[column].notna().all() and (rows[column] != "").all(), column
    assert (rows.dirty == rows.commit.str.endswith("-dirty")).all()
    assert rows.loc[0, "ratio"] == 1.0 and pd.isna(rows.loc[0, "faster"])
    assert set(rows.faster.dropna()) <= {"holds", "does not hold", "within noise"}
    assert len(rows.command.unique()) == 4
    for _, row in rows.iterrows():
        argv = shlex.split(row.command)
        assert argv[:2] == ["pagebench", "ab"]
        assert argv[argv.index("--only") + 1] == row.variant
        assert argv[argv.index("--batch") + 1] == str(row.batch)
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["rows"][1]["launch"] == json.dumps({"num_splits": 2, "tile_n": 16},
                                                  sort_keys=True)
    assert [v["name"] for v in doc["variants"]] == ["torch", "triton-2-splits"]


def test_a_reproduction_command_reruns_its_point_alone(tmp_path, variants_file):
    first = tmp_path / "first"
    code, _, err = run_cli("--variants", str(variants_file), "--batch", "1,2",
                           "--lengths", "lognormal:4,0.5", "--out-dir", str(first), *TINY)
    assert code == 0, err
    row = rows_in(first).iloc[3]  # batch 2, the launch variant
    again = tmp_path / "again"
    argv = shlex.split(row.command.replace(str(first), str(again)))
    code, _, err = run_cli(*argv[2:])
    assert code == 0, err
    rerun = rows_in(again)
    assert len(rerun) == 1
    same = ["variant", "batch", "context", "lengths", "block_size", "tokens", "rel_error",
            "launch"]
    assert rerun.loc[0, same].tolist() == row[same].tolist()  # the same tensors, the same output
    assert rerun.loc[0, "command"] == row.command.replace(str(first), str(again))


def test_mixed_puts_chunks_and_decodes_in_one_call(tmp_path, variants_file):
    code, _, err = run_cli("--routine", "mixed", "--variants", str(variants_file), "--only",
                           "torch", "--batch", "2", "--query-len", "8", "--decodes", "3",
                           "--out-dir", str(tmp_path), *TINY)
    assert code == 0, err
    row = rows_in(tmp_path).iloc[0]
    assert row.query_tokens == 2 * 8 + 3 and row.decodes == 3 and row.tokens == 5 * 40
    assert row.check == "ok" and row.checked_seqs == 5 and row.checked_rows == 2 * 8 + 3


def test_prefill_checks_whole_sequences_by_default(tmp_path, zeros_backend):
    code, _, _ = run_cli("--routine", "prefill", "--backends", f"torch,{zeros_backend}",
                         "--batch", "2", "--out-dir", str(tmp_path), *TINY)
    rows = rows_in(tmp_path).set_index("variant")
    assert code == 1
    assert rows.loc["torch", "query_tokens"] == 80 and rows.loc["torch", "check"] == "ok"
    assert rows.loc[zeros_backend, "check"] == "wrong"


def test_a_contiguous_baseline_reads_the_same_values(tmp_path):
    code, _, err = run_cli("--backends", "sdpa-contiguous,torch", "--batch", "3",
                           "--lengths", "lognormal:4,0.6", "--out-dir", str(tmp_path), *TINY)
    assert code == 0, err
    rows = rows_in(tmp_path).set_index("variant")
    assert list(rows.layout) == ["contiguous", "paged"]
    # the same ragged tensors: both within the float32 tolerance of one reference
    assert (rows.check == "ok").all() and (rows.rel_error < rows.tolerance).all()
    assert "--backends sdpa-contiguous " in rows.loc["sdpa-contiguous", "command"]
    assert rows.loc["torch", "baseline"] == "sdpa-contiguous"


@pytest.fixture
def own_kernel(tmp_path):
    """A variants file that imports a Python file registering backend "copy-test" (the torch
    decode under another name, as a modified copy of a kernel would be)."""
    (tmp_path / "my_decode.py").write_text(
        "from pagebench.kernels import register_backend\n"
        "from pagebench.kernels.reference import torch_paged_decode\n"
        "register_backend('copy-test', decode=torch_paged_decode)\n")
    path = tmp_path / "own.toml"
    path.write_text('import = ["my_decode.py"]\n'
                    '[[variant]]\nname = "torch"\nbackend = "torch"\n'
                    '[[variant]]\nname = "mine"\nbackend = "copy-test"\n')
    yield path
    from pagebench.kernels import registered_backends

    if "copy-test" in registered_backends():
        unregister_backend("copy-test")


def test_an_imported_kernel_is_a_variant(tmp_path, own_kernel):
    code, _, err = run_cli("--variants", str(own_kernel), "--out-dir", str(tmp_path / "out"),
                           *TINY)
    assert code == 0, err
    rows = rows_in(tmp_path / "out")
    assert list(rows.variant) == ["torch", "mine"] and (rows.check == "ok").all()
    # the same file again (a reproduction command in this process) registers nothing twice
    assert read_variants(str(own_kernel), "decode")[1] == Variant("mine", "copy-test")


def test_an_import_that_fails_is_one_line(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('half written')\n")
    path = tmp_path / "v.toml"
    path.write_text('import = ["broken.py"]\n' + TOML)
    code, _, err = run_cli("--variants", str(path), "--out-dir", str(tmp_path / "out"), *TINY)
    assert code == 2
    assert err == (f"pagebench ab: error: --variants: {path}: import broken.py: RuntimeError: "
                   "half written\n")


@dataclasses.dataclass(frozen=True)
class ToyLaunch:
    tile: int = 16


LAUNCHES: list = []  # the launch records the toy kernel was called with


def toy_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, *, launch=ToyLaunch()):
    LAUNCHES.append(launch)
    return torch_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale)


def test_a_launch_dataclass_is_built_from_the_fields(tmp_path, monkeypatch):
    """Where a dataclass declares a kernel's launch, a variant's fields become one record."""
    monkeypatch.setitem(LAUNCH_KERNELS, ("toy-test", "decode"),
                        (__name__, "toy_decode", "ToyLaunch"))
    register_backend("toy-test", decode=toy_decode)
    try:
        assert launch_fields("toy-test", "decode") == ("tile",)
        path = tmp_path / "v.toml"
        path.write_text('[[variant]]\nname = "toy"\nbackend = "toy-test"\n'
                        'launch = { tile = 4 }\n')
        LAUNCHES.clear()
        code, _, err = run_cli("--variants", str(path), "--out-dir", str(tmp_path), *TINY)
        assert code == 0, err
        assert set(LAUNCHES) == {ToyLaunch(4)} and rows_in(tmp_path).check[0] == "ok"
        path.write_text(path.read_text().replace("tile", "tiles"))
        with pytest.raises(ConfigError, match="unknown launch field.*tiles.*takes tile"):
            read_variants(str(path), "decode")
    finally:
        unregister_backend("toy-test")


def test_checked_rows_span_the_batch():
    assert evenly_spaced(3, 8) == [0, 1, 2]
    many = evenly_spaced(100, 8)
    assert len(many) == 8 and many[0] == 0 and many[-1] == 99 and many == sorted(set(many))


def test_a_long_chunk_is_checked_on_a_few_rows(tmp_path, zeros_backend):
    """The reference takes a few rows of a long chunk, each at its own position: a correct
    kernel passes, a wrong one is still caught."""
    code, _, _ = run_cli("--routine", "prefill", "--backends", f"torch,{zeros_backend}",
                         "--batch", "2", "--query-len", "60", "--out-dir", str(tmp_path),
                         *TINY, "--context", "100")  # the last --context counts
    rows = rows_in(tmp_path).set_index("variant")
    assert code == 1 and rows.loc["torch", "checked_rows"] == 2 * CHECK_ROWS < 2 * 60
    assert rows.loc["torch", "check"] == "ok" and rows.loc[zeros_backend, "check"] == "wrong"
