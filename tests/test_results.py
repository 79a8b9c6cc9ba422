"""pagebench.results: one schema per dataset, that writers' rows meet and readers enforce."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest

from pagebench import suite
from pagebench.measure import engine_bench
from pagebench.measure.prefill_sweep import PREFILL_COLUMNS, run_prefill_sweep
from pagebench.measure.kernel_sweep import COLUMNS, run_sweep
from pagebench.results import DATASETS, DataError, Results, classify, commits, load_data_dir
from pagebench.results.collect import collect, default_data_dir
from pagebench.results.datasets import ENGINE_COW, FILE_KINDS, KERNELS
from pagebench.results.read import data_files
from pagebench.results.schema import Column, Schema

ROOT = Path(__file__).resolve().parents[1]
TINY_SHAPE = {"t": (4, 2, 16)}


def validated(name: str, rows) -> pd.DataFrame:
    """``rows`` checked against ``name``'s schema (raises DataError naming the column)."""
    return DATASETS[name].validate(pd.DataFrame(rows), "writer")


# ---- writers -----------------------------------------------------------------------------

def test_kernel_sweeps_write_their_schemas():
    decode = validated("kernels", run_sweep("cpu", quick=True, shapes=TINY_SHAPE,
                                            points=[(2, 32)], block_sizes=(8,), repeat=1))
    assert set(decode["layout"]) == {"paged", "contiguous"}
    assert (decode["backend"] == decode["kernel"] + "-" + decode["layout"]).all()
    assert decode.loc[decode["layout"] == "contiguous", "block_size"].isna().all()
    assert (decode.loc[decode["layout"] == "paged", "block_size"] == 8).all()
    prefill = validated("kernels_prefill", run_prefill_sweep(
        "cpu", shapes=TINY_SHAPE, points=[(1, 3, 5)], block_size=4, repeat=1,
        include=["torch"]))
    paged, bar = prefill[prefill["layout"] == "paged"], prefill[prefill["layout"] != "paged"]
    assert (paged["backend"] == paged["kernel"] + "-paged").all() and len(paged)
    assert bar["backend"].eq("sdpa-contiguous").all() and bar["kernel"].isna().all()
    assert bar["block_size"].isna().all()
    # every column the sweeps write is declared, so its type is checked when read back
    assert set(COLUMNS) <= set(KERNELS.names)
    assert set(PREFILL_COLUMNS) <= set(DATASETS["kernels_prefill"].names)


ENGINE_WRITERS = {  # dataset -> a call of pagebench.measure.engine_bench sized for a CI second
    "engine_batch": lambda m: engine_bench.throughput_vs_batch(m, batch_sizes=(1, 2), block_sizes=(4,),
                                                        prompt_len=8, max_tokens=2),
    "engine_cow": lambda m: engine_bench.cow_comparison(m, prompt_len=8, max_tokens=2, n=2,
                                                 block_size=4),
    "engine_prefix": lambda m: engine_bench.prefix_cache_comparison(
        m, system_len=8, num_requests=2, suffix_len=(1, 4), max_tokens=2, block_size=4),
    "engine_pool": lambda m: engine_bench.pool_size_sweep(m, pool_fractions=(0.5, 1.0),
                                                   num_requests=2, prompt_len=(4, 8),
                                                   max_tokens=2, block_size=4),
    "engine_compare": lambda m: engine_bench.compare_with_transformers(
        m, engine_bench.random_prompts(2, 4, 8, m.config.vocab_size), max_tokens=2, repeat=1,
        methods=("engine", "padded_generate"), block_size=4),
    "fp8_engine": lambda m: engine_bench.fp8_comparison(
        m, engine_bench.random_prompts(2, 4, 8, m.config.vocab_size), max_tokens=2,
        kv_cache_memory="256KiB", block_size=4),
    "engine_equal_memory": lambda m: engine_bench.equal_memory_comparison(
        m, 64 * 1024, engine_bench.random_prompts(4, 4, 8, m.config.vocab_size), max_tokens=2,
        block_size=4),
}


@pytest.fixture(scope="module")
def tiny():
    return engine_bench.tiny_model()


@pytest.mark.parametrize("name", sorted(ENGINE_WRITERS))
def test_engine_bench_writes_its_schema(name, tiny):
    frame = validated(name, ENGINE_WRITERS[name](tiny))
    assert (frame["experiment"] == name).all()  # the experiment is the dataset's name


def test_copy_on_write_rows_name_n():
    rows = validated("engine_cow", engine_bench.cow_comparison(prompt_len=8, max_tokens=2, n=3,
                                                        block_size=4))
    assert rows["variant"].tolist() == ["n=1", "n=3 shared", "3 separate requests"]
    assert rows["n"].tolist()[:2] == [1, 3] and pd.isna(rows["n"].iloc[2])


@pytest.mark.parametrize("sweep", ["static_memory", "block_waste", "capacity",
                                   "dynamic_memory"])
def test_simulator_datasets_meet_their_schemas(sweep):
    results = Results()
    getattr(suite, sweep)(results, quick=True)
    assert results.frames and not results.warnings


# (module, its schema's name there, a call of the writer that builds rows through it)
WRITERS = [
    ("pagebench.measure.kernel_sweep", "KERNELS",
     lambda m: m.run_sweep("cpu", shapes=TINY_SHAPE, points=[(1, 8)], block_sizes=(4,),
                           include=["torch"], repeat=1)),
    ("pagebench.measure.prefill_sweep", "KERNELS_PREFILL",
     lambda m: m.run_prefill_sweep("cpu", shapes=TINY_SHAPE, points=[(1, 3, 5)], block_size=4,
                                   include=["torch"], repeat=1)),
    ("pagebench.measure.fp8_sweep", "KERNELS_FP8",
     lambda m: m.run_fp8_sweep("cpu", shape=("t", (4, 2, 16)), points=[(1, 8)],
                               block_sizes=(4,), prefill_points=[])),
    ("pagebench.measure.memory", "MEMORY_STATIC",
     lambda m: m.utilisation_rows("uniform:8,64", 20, 0, 64, (16,))),
    ("pagebench.measure.memory", "MEMORY_MAX_LEN",
     lambda m: m.max_len_rows("uniform:8,64", 20, 0, (64,))),
    ("pagebench.measure.tail_waste", "BLOCK_WASTE", lambda m: m.tail_waste_rows([5, 17], (4,))),
    ("pagebench.measure.memory", "KV_GEOMETRY", lambda m: m.geometry_rows()),
    ("pagebench.measure.memory", "CAPACITY", lambda m: m.planner_case_rows()),
    ("pagebench.measure.memory", "CAPACITY_ARTICLE", lambda m: m.article_capacity()),
    ("pagebench.measure.memory", "MEMORY_DYNAMIC_SUMMARY", lambda m: m.reference_run(
        num_requests=40)),
    ("pagebench.measure.memory", "MEMORY_DYNAMIC_TIMELINE", lambda m: m.reference_run(
        num_requests=40)),
    *[("pagebench.measure.real_traces", f"REAL_TRACES_{kind}",
       lambda m: m.study_traces(40, names=("mooncake-conv",), prefix_budget_multiples=()))
      for kind in ("STATIC", "DYNAMIC", "TIMELINE", "PREFIX")],
]


@pytest.mark.parametrize("module, name, write", WRITERS,
                         ids=[f"{m.rsplit('.', 1)[1]}-{n}" for m, n, _ in WRITERS])
def test_a_writer_that_drops_a_column_fails_at_the_writer(module, name, write, monkeypatch):
    import importlib

    mod = importlib.import_module(module)
    schema = getattr(mod, name)
    stricter = Schema(schema.name, schema.meaning,
                      schema.columns + (Column("never_written", "int", "a column no one writes"),))
    monkeypatch.setattr(mod, name, stricter)
    with pytest.raises(ValueError, match=f"{schema.name} (row|table): missing never_written"):
        write(mod)


def test_real_trace_frames_meet_their_schemas():
    from pagebench.sim.real_traces import study_traces

    frames = study_traces(40, names=("mooncake-conv",), prefix_budget_multiples=(1.0,))
    for kind, frame in frames.items():
        assert len(validated(f"real_traces_{kind}", frame)), kind


def test_table_names_the_required_columns_left_out():
    table = {"step": [0], "allocator": ["paged"], "block_size": [16], "token_state": [3]}
    assert DATASETS["memory_dynamic_timeline"].table(table) is table
    with pytest.raises(ValueError, match="memory_dynamic_timeline table: missing token_state"):
        DATASETS["memory_dynamic_timeline"].table({k: table[k] for k in list(table)[:3]})


def test_a_schema_writer_does_not_import_pandas():
    import subprocess
    import sys

    code = ("import sys, pagebench.sim.static, pagebench.sim.dynamic, pagebench.results; "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


# ---- readers -----------------------------------------------------------------------------

def test_committed_data_loads_without_warnings():
    results = Results()
    load_data_dir(results, ROOT / "reports" / "data")
    assert results.warnings == []
    loaded = {name for name, _ in data_files(ROOT / "reports" / "data")}
    assert loaded == set(results.frames) and {"kernels", "engine_batch"} <= loaded


def test_a_file_missing_a_required_column_is_named_and_not_used(tmp_path):
    (tmp_path / "h200").mkdir()
    pd.DataFrame({"variant": ["n=1", "n=4 shared"], "n": [1, 4]}).to_csv(
        tmp_path / "h200" / "engine_cow.csv", index=False)
    results = Results()
    load_data_dir(results, tmp_path)
    assert results.get("engine_cow") is None
    assert results.warnings == [f"engine_cow: {tmp_path / 'h200' / 'engine_cow.csv'}: missing "
                                "column(s) peak_blocks; not used"]


def test_collect_runs_the_steps_passed_in_then_reads_committed_data(tmp_path, capsys):
    """Each step runs guarded (a failure is a warning naming it) and timed; the data directory
    given is read after them; nothing measures unless a step is passed."""
    (tmp_path / "h200").mkdir()
    pd.DataFrame([{"n": 1, "variant": "n=1", "peak_blocks": 3}]).to_csv(
        tmp_path / "h200" / "engine_cow.csv", index=False)
    seen = []

    def static(results, device, quick):
        seen.append((device, quick))
        suite.block_waste(results, quick=True)

    def broken(results, **_):
        raise RuntimeError("no GPU")

    results = collect(device="cpu", quick=True, steps=[("waste", static), ("broken", broken)],
                      data_dir=tmp_path, progress=True)
    assert seen == [("cpu", True)]
    assert {"block_waste", "engine_cow"} <= set(results.frames)
    assert results.warnings == ["broken: failed (RuntimeError: no GPU)"]
    assert list(results.timings_s) == ["waste", "broken",
                                       "reading committed data and benchmark results"]
    assert "report [2/3] broken ..." in capsys.readouterr().err
    assert default_data_dir().parts[-2:] == ("reports", "data")


def committed(tmp_path) -> Path:
    """A committed data directory: one engine_cow row and the CPU pytest-benchmark JSON."""
    data = tmp_path / "data"
    (data / "cpu").mkdir(parents=True)
    pd.DataFrame([{"n": 1, "variant": "n=1", "peak_blocks": 3}]).to_csv(
        data / "cpu" / "engine_cow.csv", index=False)
    (data / "cpu" / "pytest-benchmark.json").write_text(
        (ROOT / "reports" / "data" / "cpu" / "pytest-benchmark.json").read_text())
    return data


def test_a_file_reached_twice_is_read_once(tmp_path):
    """The README's old example, --results reports/data/cpu, doubled every committed CPU row:
    a --results directory inside (or equal to) the committed data adds nothing, with a
    warning; one that holds it, or a link to it, reads each file once."""
    data = committed(tmp_path)
    once = collect(quick=True, data_dir=data, progress=False)
    benchmarks = len(once.get("pytest_benchmark"))
    assert len(once.get("engine_cow")) == 1 and once.warnings == []
    (tmp_path / "link").symlink_to(data / "cpu")
    for extra in (data / "cpu", data, tmp_path / "link"):
        results = collect(quick=True, data_dir=data, results_dirs=[extra], progress=False)
        assert len(results.get("engine_cow")) == 1, extra
        assert len(results.get("pytest_benchmark")) == benchmarks, extra
        assert results.warnings == [f"results: {extra} is inside the committed data directory "
                                    f"{data}, which is read already; it adds nothing (give a "
                                    "directory of your own results)"]
    # a directory above the committed data, reaching its files directly and through the link
    results = collect(quick=True, data_dir=data, results_dirs=[tmp_path], progress=False)
    assert len(results.get("engine_cow")) == 1 and results.warnings == []
    assert len(results.get("pytest_benchmark")) == benchmarks
    mine = tmp_path / "my_runs"
    mine.mkdir()
    (mine / "engine_cow.csv").write_text("n,variant,peak_blocks\n4,n=4 shared,5\n")
    results = collect(quick=True, data_dir=data, results_dirs=[mine], progress=False)
    assert sorted(results.get("engine_cow")["n"]) == [1, 4] and results.warnings == []


@pytest.mark.slow
def test_the_reports_own_data_is_never_read_back(tmp_path):
    """`pagebench report --results X --out X/` writes X/index_data/*.csv: the next run reads
    its results, not the tables the last one wrote."""
    from synthetic_report import synthetic_results

    from pagebench.analysis import analyse
    from pagebench.report import write_report

    data = committed(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "engine_cow.csv").write_text("n,variant,peak_blocks\n4,n=4 shared,5\n")
    written = synthetic_results()
    analyse(written)
    write_report(written, f"{site}/", env={"device": "cpu"}, options={})
    assert (site / "index_data" / "kernels.csv").is_file()
    own = (f"data: {site / 'index_data'} is a report's own output (its tables as CSV), not "
           "results; not read back")
    for extra in (site, site / "index_data"):
        results = collect(quick=True, data_dir=data, results_dirs=[extra], progress=False)
        assert "kernels" not in results.frames, extra
        expected = [4] if extra == site else []
        assert sorted(results.get("engine_cow")["n"]) == [1, *expected]
        assert results.warnings == [own]
    # being swapped in by an interrupted run, or the page not (yet) there but given to exclude
    (site / "index_data").rename(site / ".index_data.x1y2.new")
    results = collect(quick=True, data_dir=data, results_dirs=[site], progress=False)
    assert "kernels" not in results.frames
    (site / ".index_data.x1y2.new").rename(site / "index_data")
    (site / "index.html").unlink()
    results = collect(quick=True, data_dir=data, results_dirs=[site], progress=False,
                      exclude=[site / "index_data"])
    assert "kernels" not in results.frames and len(results.get("engine_cow")) == 2


def test_validate_coerces_types_and_names_bad_values():
    frame = KERNELS.validate(pd.DataFrame({
        "device": ["cuda"], "dtype": ["bfloat16"], "model_shape": ["m"], "batch": ["2"],
        "context": [64.0], "block_size": [None], "backend": ["sdpa-contiguous"],
        "kernel": ["sdpa"], "layout": ["contiguous"], "cuda_graphs": ["True"],
        "time_us": ["1.5"], "extra": ["kept"]}), "f.csv")
    assert frame["batch"].tolist() == [2] and frame["context"].dtype == "int64"
    assert frame["block_size"].isna().all() and frame["cuda_graphs"].tolist() == [True]
    assert frame["time_us"].tolist() == [1.5] and frame["extra"].tolist() == ["kept"]
    with pytest.raises(DataError, match=r"kernels: f.csv: column batch: 'two' is not a number"):
        KERNELS.validate(frame.assign(batch=["two"]), "f.csv")
    with pytest.raises(DataError, match="column block_size: 1.5 is not an integer"):
        KERNELS.validate(frame.assign(block_size=[1.5]), "f.csv")
    with pytest.raises(DataError, match="column cuda_graphs: 'maybe' is not a boolean"):
        KERNELS.validate(frame.assign(cuda_graphs=["maybe"]), "f.csv")


def test_validate_warns_of_gaps_bad_times_and_duplicates():
    row = {"device": "cuda", "dtype": "bfloat16", "model_shape": "m", "batch": 1,
           "context": 64, "block_size": None, "backend": "sdpa-contiguous", "kernel": "sdpa",
           "layout": "contiguous", "cuda_graphs": True}
    times = [1.5, 1.5, float("nan"), -5.0, float("inf"), 2.0]
    frame = pd.DataFrame([{**row, "time_us": t, "context": 64 * (i + 1)}
                          for i, t in enumerate(times)])
    frame = pd.concat([frame, frame.tail(1)], ignore_index=True)  # the last row twice
    warnings = []
    out = KERNELS.validate(frame, "f.csv", warnings.append)
    assert len(out) == len(times)
    assert warnings == ["kernels: f.csv: column time_us: 1 empty value(s) in a required "
                        "column; column time_us: 2 negative or infinite time(s); 1 exact "
                        "duplicate rows dropped"]
    # an empty block_size (a contiguous row) is a value, not a gap; clean rows: no warning
    KERNELS.validate(frame.head(2), "f.csv", warnings.append)
    assert len(warnings) == 1
    results = Results()
    results.add("kernels", frame, "f.csv")
    assert results.warnings == warnings and len(results.get("kernels")) == len(times)


def test_row_names_the_required_fields_left_out():
    assert ENGINE_COW.row(variant="n=1", n=1, peak_blocks=3, note="x")["note"] == "x"
    with pytest.raises(ValueError, match="engine_cow row: missing n, peak_blocks"):
        ENGINE_COW.row(variant="n=1")


def test_a_schema_refuses_unknown_types_and_repeated_columns():
    with pytest.raises(ValueError, match="dtype: 'text'"):
        Column("a", "text", "?")
    with pytest.raises(ValueError, match="names a twice"):
        Schema("s", "?", (Column("a", "str", "?"), Column("a", "int", "?")))


def test_every_file_kind_names_a_dataset_with_a_schema():
    assert {name for _, name in FILE_KINDS if name} <= set(DATASETS)
    assert classify("reports/data/h200/kernels_smoke.csv") is None
    assert classify("kernels_tuning.csv") is None and classify("notes.csv") is None
    with pytest.raises(ValueError, match="'kernel' is not a dataset"):
        Results().add("kernel", pd.DataFrame({"a": [1]}), "x")


# ---- commit order ------------------------------------------------------------------------

def test_newest_first_orders_by_time_dirty_before_its_base_undated_last():
    measured = {"aaaa": 1.0, "bbbb": 2.0, "cccc": 3.0, "cccc-dirty": 3.0}
    got = commits.newest_first(["aaaa", "cccc-dirty", "", "bbbb", "zzzz", "cccc", "aaaa"],
                               measured)
    assert got == ["cccc-dirty", "cccc", "bbbb", "aaaa", "zzzz", ""]


def test_rows_timestamps_order_commits_without_git(monkeypatch):
    """A commit is as new as its newest row; a commit of rows without a timestamp comes after
    every dated one, and git is never run (a subprocess call would fail the test)."""
    def no_subprocess(*args, **kwargs):
        raise AssertionError("results asked git")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    rows = pd.DataFrame({
        "commit": ["aaaa", "bbbb", "bbbb", "oldd", "cccc"],
        "timestamp": ["1970-01-01T00:00:05+00:00", "1970-01-01T00:00:40+00:00", None, None,
                      "1970-01-01T00:00:25+00:00"]})
    measured = commits.measured_at(rows)
    assert measured == {"aaaa": 5.0, "bbbb": 40.0, "cccc": 25.0}
    assert commits.newest_first(rows["commit"], measured) == ["bbbb", "cccc", "aaaa", "oldd"]
    assert commits.measured_at(rows.drop(columns="timestamp")) == {}


def test_committed_rows_with_a_commit_carry_a_timestamp():
    """What orders the committed data's commits: every CSV row naming a commit has a time."""
    missing = []
    for path in sorted((ROOT / "reports" / "data").rglob("*.csv")):
        rows = pd.read_csv(path, dtype=str, keep_default_na=False)
        if "commit" not in rows.columns:
            continue
        if "timestamp" not in rows.columns:
            missing.append(f"{path.relative_to(ROOT)}: no timestamp column")
            continue
        bad = rows[(rows["commit"] != "") & (rows["timestamp"] == "")]
        missing += [f"{path.relative_to(ROOT)}: {len(bad)} rows"] if len(bad) else []
    assert not missing, missing


def test_measured_rows_carry_the_utc_start_of_their_run():
    from datetime import datetime, timezone

    from pagebench.measure.timing import ENVIRONMENT_COLUMNS, environment

    before = datetime.now(timezone.utc).replace(microsecond=0)
    stamp = datetime.fromisoformat(environment("cpu")["timestamp"])
    assert "timestamp" in ENVIRONMENT_COLUMNS and "timestamp" in DATASETS["kernels"].names
    assert stamp.utcoffset().total_seconds() == 0
    assert before <= stamp <= datetime.now(timezone.utc)


