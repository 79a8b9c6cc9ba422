"""Every subcommand, given hostile argv, exits 0 or 2 (bench-compare also 1, its "regression"
status): no traceback, and an error is one line.

Run in-process (``main(argv)``, stderr captured) so that an example costs milliseconds. Values
are drawn to be either invalid (huge, negative, zero, fractional, non-finite, garbage, missing
files, paths under a file) or small and valid. ``simulate`` and ``capacity`` run for real (with
the memory this process may use pinned low, so that a large valid request is refused by its
estimate rather than run); the commands that time kernels, run the engine, build the report or
check out commits have their measurement replaced by a stub returning one row, so what is tested
is everything the command line does around it: parsing, validation, output files and tables.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagebench.cli import main, options
from pagebench.defaults import REFERENCE_LENGTHS

# the files the examples name; created by the `stubs` fixture and removed after the module
TMP = Path(tempfile.gettempdir()) / f"pagebench-cli-property-{os.getpid()}"
A_FILE = TMP / "a_file"
TRACE = TMP / "trace.csv"
LENGTHS = TMP / "lengths.txt"
BENCH_JSON = TMP / "bench.json"
FILES = {A_FILE: "x\n",
         TRACE: "arrival,prompt_len,output_len\n0,8,8\n1,4,12\n3,16,4\n",
         LENGTHS: "10\n200\n30\n",
         BENCH_JSON: '{"benchmarks": [{"name": "a", "stats": {"median": 0.01, "min": 0.009, '
                     '"mean": 0.011}}]}'}

HUGE = ["99999999999999999999", "2147483648", "1e300", "1" + "0" * 40]
BAD_NUMBERS = ["-1", "0", "1.5", "nan", "inf", "-inf", "", "x", "1,,", " ", "0x10", "١"]
INPUT_PATHS = [str(TMP / "missing.csv"), str(A_FILE / "under"), str(TMP), "/dev/null"]
OUTPUT_PATHS = [str(A_FILE / "x.csv"), str(TMP) + "/", str(TMP / "new" / "out.csv"),
                str(TMP / "out.json"), "/proc/nope/x.csv"]


def ints(low: int, high: int):
    return st.one_of(st.integers(low, high).map(str), st.sampled_from(HUGE + BAD_NUMBERS))


def floats(low: float, high: float):
    return st.one_of(st.floats(low, high).map(repr), st.sampled_from(HUGE + BAD_NUMBERS))


def int_lists(low: int, high: int):
    good = st.lists(st.integers(low, high), min_size=1, max_size=3).map(
        lambda v: ",".join(map(str, v)))
    return st.one_of(good, st.sampled_from(HUGE + BAD_NUMBERS + ["1,-2", "8,99999999999999"]))


def specs():
    return st.one_of(
        st.sampled_from([REFERENCE_LENGTHS, "lognormal:1000,1", "lognormal:1,-1",
                         "lognormal:nan,1", "uniform:1,50", "uniform:5,1", "uniform:1,1e300",
                         "fixed:7", "fixed:0", "fixed:1e300", "zipf:1", "lognormal:", ":",
                         str(LENGTHS), str(TRACE), str(A_FILE / "under")]),
        st.text(max_size=8))


def choose(*values):
    return st.sampled_from(list(values))


FLAG = None  # an option without a value
# command -> (leading words, {option: strategy of its value or FLAG})
COMMANDS = {
    "simulate": ([], {
        "--lengths": specs(), "--num-seqs": ints(1, 300), "--seed": ints(0, 5),
        "--max-len": ints(2, 5000), "--block-sizes": int_lists(1, 300), "--json": FLAG,
        "--out": st.sampled_from(OUTPUT_PATHS)}),
    "simulate --dynamic": (["simulate", "--dynamic", "--num-requests", "30"], {
        "--trace": st.sampled_from(INPUT_PATHS + [str(TRACE)]), "--lengths": specs(),
        "--steps-per-unit": floats(0.1, 5), "--rate": floats(0.1, 5),
        "--prompt-fraction": floats(0, 0.9), "--budget-tokens": ints(1, 50_000),
        "--allocators": choose("naive,paged", "paged", "buddy", ",", "oracle,pow2"),
        "--n": ints(1, 4), "--cow": FLAG, "--max-num-seqs": ints(1, 64),
        "--timeline-every": ints(1, 10), "--timeline": st.sampled_from(OUTPUT_PATHS),
        "--block-sizes": int_lists(1, 64), "--max-len": ints(2, 5000), "--json": FLAG,
        "--out": st.sampled_from(OUTPUT_PATHS)}),
    "capacity": ([], {
        "--model": choose("qwen2.5-0.5b", "llama-3-70b", "gpt-9", str(A_FILE), str(TMP),
                          str(TMP / "missing.json")),
        "--dtype": choose("bfloat16", "fp8", "float64", "int3"),
        "--gpu-memory": choose("16GiB", "80GB", "1e300GiB", "-4GB", "12 potatoes", "0"),
        "--gpu-memory-utilization": floats(0.01, 1), "--max-model-len": ints(1, 100_000),
        "--block-size": ints(1, 4096), "--weights-bytes": choose("1GB", "-1", "1e40", "x"),
        "--overhead-bytes": choose("0", "1GiB", "huge"), "--kv-cache-bytes": choose(
            "4GiB", "0", "1", "nan"),
        "--lengths": specs(), "--num-seqs": ints(1, 300), "--seed": ints(0, 5),
        "--article": FLAG, "--json": FLAG, "--out": st.sampled_from(OUTPUT_PATHS)}),
    "bench": ([], {
        "--device": choose("cpu", "cuda", "tpu"), "--quick": FLAG,
        "--shape": choose("x=32/8/128", "x=3/2/64", "x=0/1/1", "bad", "x=1/1/99999999"),
        "--batches": int_lists(1, 8), "--contexts": int_lists(1, 4096),
        "--block-sizes": int_lists(1, 256), "--dtype": choose("float32", "bfloat16", "int8"),
        "--backends": choose("torch", "sdpa", "flex", "nope", ","), "--repeat": ints(1, 5),
        "--prefill": FLAG, "--json": FLAG, "--out": st.sampled_from(OUTPUT_PATHS),
        "--layouts": choose("shuffled", "contiguous,aged", "nope", ","),
        "--kv-dtype": choose("fp8_e4m3", "fp8_e5m2", "int3", "")}),
    "engine-bench": (["engine-bench"], {
        "": choose("throughput", "cow", "prefix", "pool", "compare", "trace", "equality",
                   "breakdown", "equal-memory", "nope"),
        "--modes": choose("graphs", "eager,graphs_uncompiled", "fast", ","),
        "--dtype": choose("float32", "bfloat16", "int8"),
        "--trace": st.sampled_from(["mooncake-conv", "nope"] + INPUT_PATHS),
        "--num-requests": ints(1, 8), "--max-model-len": ints(2, 512),
        "--max-output-len": ints(1, 16), "--step-ms": floats(0.1, 50), "--seed": ints(0, 3),
        "--device": choose("cpu", "cuda", "gpu"), "--batch-sizes": int_lists(1, 8),
        "--block-sizes": int_lists(1, 64), "--prompt-len": ints(1, 64),
        "--max-tokens": ints(1, 16), "--kernel": choose("auto", "torch", "nope"),
        "--threads": ints(1, 4), "--json": FLAG, "--out": st.sampled_from(OUTPUT_PATHS)}),
    "tp-bench": (["tp-bench"], {
        "": choose("equality", "capacity", "throughput", "allreduce", "attention",
                   "sweep-wall", "nope"),
        "--device": choose("cpu", "cuda", "gpu"), "--preset": choose("llama-3-8b", "gpt-9"),
        "--kernel": choose("auto", "torch", "nope"),
        "--kv-memory": choose("2MiB", "0", "-1GB", "12 potatoes", "1e300GiB"),
        "--batch-sizes": int_lists(1, 8), "--prompt-len": ints(1, 64),
        "--max-tokens": ints(1, 16), "--context": ints(1, 4096), "--repeat": ints(1, 5),
        "--gpus": int_lists(1, 2), "--bench-args": choose("--device cpu", "--out x.csv", "'"),
        "--rows-out": st.sampled_from(OUTPUT_PATHS), "--json": FLAG,
        "--out": st.sampled_from(OUTPUT_PATHS)}),
    "report": (["report", "--no-progress"], {
        "--quick": FLAG, "--device": choose("cpu", "tpu"),
        "--results": st.sampled_from(INPUT_PATHS), "--data-dir": st.sampled_from(INPUT_PATHS),
        "--out": st.sampled_from(OUTPUT_PATHS + [str(TMP / "site" / "index.html")])}),
    "bench-compare": (["bench-compare"], {
        "--base": choose("HEAD", "no-such-rev", "-x", ""), "--head": choose("HEAD", ".", "zz"),
        "--threshold": floats(0.01, 1), "--repeat": ints(1, 3), "--confirm": ints(0, 2),
        "--stat": choose("min", "median", "p99"), "--max-time": floats(0.01, 1),
        "--base-json": st.sampled_from(INPUT_PATHS + [str(BENCH_JSON)]),
        "--head-json": st.sampled_from(INPUT_PATHS + [str(BENCH_JSON)]),
        "--json": FLAG, "--out": st.sampled_from(OUTPUT_PATHS)}),
}


@st.composite
def argvs(draw):
    name = draw(st.sampled_from(sorted(COMMANDS)))
    lead, opts = COMMANDS[name]
    argv = list(lead) or [name]
    chosen = draw(st.lists(st.sampled_from(sorted(opts)), max_size=5, unique=True))
    for option in chosen:
        value = opts[option]
        argv += ([option] if option else []) + ([] if value is FLAG else [draw(value)])
    return argv


# ---- stubs for the commands whose real work takes seconds to minutes ------------------------
def fake_sweep(*args, **kwargs):
    import pandas as pd

    from pagebench.measure.kernel_sweep import COLUMNS

    return pd.DataFrame([{c: 1 for c in COLUMNS} | {"backend": "torch-paged", "block_size": 16.0}])


def fake_prefill_sweep(*args, **kwargs):
    import pandas as pd

    from pagebench.measure.prefill_sweep import PREFILL_COLUMNS

    return pd.DataFrame([{c: 1 for c in PREFILL_COLUMNS}])


class FakeModel:
    class config:  # stands in for a transformers config (hence the lower-case name)
        vocab_size = 32


def fake_rows(*args, **kwargs):
    return [{"experiment": "fake", "tokens_per_s": 1.5, "time_s": 0.1, "peak_blocks": 3}]


def fake_build_report(out, **kwargs):
    """Writes nothing: without --out the page is the checkout's reports/index.html, and a stub
    page left there made the next `make report` refuse to replace it."""
    from pagebench.results import Results

    return Path(out), Results()


def fake_bench_compare(repo, base, head, **kwargs):
    from pagebench.measure.regression_gate import Change, resolve_rev

    resolve_rev(Path(repo), base)  # the git errors a user can cause, without running anything
    return [Change("a", 0.01, 0.011)], base, head


@pytest.fixture(scope="module", autouse=True)
def stubs():
    TMP.mkdir(exist_ok=True)
    for path, text in FILES.items():
        path.write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("pagebench.measure.kernel_sweep.run_sweep", fake_sweep)
        mp.setattr("pagebench.measure.prefill_sweep.run_prefill_sweep", fake_prefill_sweep)
        mp.setattr("pagebench.cli.engine._model", lambda args, device: FakeModel())
        for fn in ("throughput_vs_batch", "cow_comparison", "prefix_cache_comparison",
                   "pool_size_sweep", "compare_with_transformers", "greedy_equality",
                   "equal_memory_comparison"):
            mp.setattr(f"pagebench.measure.engine_bench.{fn}", fake_rows)
        mp.setattr("pagebench.measure.engine_bench.padded_reservation_bytes", lambda *args: 1)
        mp.setattr("pagebench.measure.step_profile.step_breakdown",
                   lambda *args, **kwargs: fake_rows()[0])
        mp.setattr("pagebench.measure.trace_replay.replay_trace",
                   lambda *args, **kwargs: fake_rows()[0])
        mp.setattr("pagebench.cli.parallel.measure", fake_rows)
        mp.setattr("pagebench.measure.distributed.sweep_wall", lambda *args: (fake_rows(), fake_rows()))
        mp.setattr("pagebench.suite.build_report", fake_build_report)
        mp.setattr("pagebench.measure.regression_gate.bench_compare", fake_bench_compare)
        # large valid requests are refused by their memory estimate instead of run
        mp.setattr(options, "available_memory_bytes", lambda: 20 * 10**6)
        yield
    shutil.rmtree(TMP, ignore_errors=True)


@given(argvs())
def test_hostile_argv_exits_0_or_2_with_one_line_errors(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)  # an unexpected exception propagates: the test fails with it
    text = err.getvalue()
    allowed = (0, 1, 2) if argv[0] == "bench-compare" else (0, 2)  # the gate's 1: regression
    assert code in allowed, (argv, code, text)
    assert "Traceback" not in text
    if code == 2:
        assert len(text.strip().splitlines()) == 1, (argv, text)
        assert text.startswith("pagebench"), text
