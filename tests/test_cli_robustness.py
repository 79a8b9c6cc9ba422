"""The command line given bad input, by command: each case is one line on stderr and exit
status 2 (or a correct answer), never a traceback, a silent wrong answer or an ignored option.
(The reproductions of issue 12 and of later reviews, grouped by the command they exercise.)"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from synthetic_report import synthetic_results

from pagebench.measure import regression_gate
from pagebench.cli import main, options
from pagebench.analysis import analyse
from pagebench.report import build
from pagebench.results import DataError, Results, read_table
from pagebench.sim.static import static_fragmentation

REPO = Path(__file__).resolve().parents[1]


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(argv, *needles):
    code, _, err = run(argv)
    assert code == 2, (argv, code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "trace_1e300.csv").write_text("arrival,prompt_len,output_len\n0,1e300,5\n")
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_attention_heads": 0, "num_key_value_heads": 0, "hidden_size": 64,
         "num_hidden_layers": 2, "vocab_size": 10}))
    (tmp_path / "huge_request.csv").write_text(
        "arrival,prompt_len,output_len\n0,10,1000000000\n")
    return tmp_path


# ---- every command: devices, allocation failures, outputs, ignored options, error wording -------
TRACE = str(REPO / "examples" / "trace.csv")


DYNAMIC = ["simulate", "--dynamic", "--trace", TRACE, "--budget-tokens", "16384",
           "--block-sizes", "16"]


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="needs a machine without a GPU")
def test_cuda_on_a_cpu_machine_is_refused():
    assert_one_line_error(["engine-bench", "cow", "--device", "cuda"], "--device")
    assert_one_line_error(["bench", "--device", "cuda"], "--device")


def test_unknown_devices_are_refused():
    assert_one_line_error(["engine-bench", "cow", "--device", "gpu"], "--device")


@pytest.mark.parametrize("argv, needle", [
    (["simulate", "--block-sizes", "99999999999999999999"], "--block-sizes"),
    (["simulate", "--max-len", "99999999999999999999"], "--max-len"),
    (["simulate", "--dynamic", "--budget-tokens", "99999999999999999999"], "--budget-tokens"),
    (["capacity", "--max-model-len", "99999999999999999999"], "--max-model-len"),
    (["capacity", "--block-size", "99999999999999999999"], "--block-size"),
    (["bench", "--contexts", "99999999999999999999", "--batches", "1"], "--contexts"),
    (["engine-bench", "throughput", "--prompt-len", "99999999999999999999"], "--prompt-len"),
    (["bench-compare", "--base", "HEAD", "--repeat", "99999999999999999999"], "--repeat"),
])
def test_huge_integers_are_usage_errors(argv, needle):
    assert_one_line_error(argv, needle)


CPU_ALLOC_FAILED = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                    "allocate memory: you tried to allocate 411238400000 bytes. Error code 12 "
                    "(Cannot allocate memory)")


SMALL_THROUGHPUT = ["engine-bench", "throughput", "--batch-sizes", "2", "--prompt-len", "8",
                    "--max-tokens", "1", "--block-sizes", "16"]


def refuse_to_allocate(error):
    def engine(*args, **kwargs):
        raise error

    return engine


@pytest.mark.parametrize("error, needles", [
    (RuntimeError(CPU_ALLOC_FAILED), ("this machine", "411.2 GB")),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total "
                            "capacity of 139.81 GiB of which 1.2 GiB is free."),
     ("the GPU", "20.00 GiB"))])
def test_an_allocation_failure_is_one_line_naming_the_run(monkeypatch, error, needles):
    from pagebench.measure import engine_bench

    monkeypatch.setattr(engine_bench, "LLMEngine", refuse_to_allocate(error))
    line = assert_one_line_error(SMALL_THROUGHPUT, "not enough memory", "the throughput run",
                                 "--batch-sizes 2", "--block-sizes 16", *needles)
    assert "Traceback" not in line and "enforce fail" not in line


def test_an_allocation_failure_in_any_command_is_one_line(monkeypatch):
    from pagebench.measure import kernel_sweep

    monkeypatch.setattr(kernel_sweep, "run_sweep", refuse_to_allocate(RuntimeError(CPU_ALLOC_FAILED)))
    assert_one_line_error(["bench", "--contexts", "16", "--batches", "1"],
                          "pagebench bench: error: not enough memory", "a tensor", "411.2 GB")


def test_another_runtime_error_is_still_a_bug(monkeypatch):
    from pagebench.measure import engine_bench

    monkeypatch.setattr(engine_bench, "LLMEngine", refuse_to_allocate(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run(SMALL_THROUGHPUT)


@pytest.mark.parametrize("command", [
    ["simulate"], ["capacity"], ["bench", "--contexts", "16", "--batches", "1"],
    ["engine-bench", "cow"], ["report", "--quick"],
])
def test_out_under_an_existing_file_is_refused_before_any_work(files, command):
    assert_one_line_error(command + ["--out", str(files / "a_file" / "x.csv")],
                          "--out", "is a file")


@pytest.mark.parametrize("name", ["same.csv", "same.json"])
def test_two_outputs_naming_one_file_are_refused(tmp_path, name):
    """D3: the timeline was written, reported, then overwritten by the summary."""
    path = tmp_path / name
    line = assert_one_line_error(DYNAMIC + ["--timeline", str(path), "--out",
                                            str(tmp_path / "." / name)],
                                 "--out, --timeline", "both name", "own file")
    assert "would overwrite" in line and not path.exists()


@pytest.mark.parametrize("argv", [
    ["engine-bench", "breakdown", "--profile-out", "{0}", "--out", "{0}"],
    ["tp-bench", "sweep-wall", "--rows-out", "{0}", "--out", "{0}"],
])
def test_every_pair_of_outputs_is_checked(tmp_path, argv):
    path = str(tmp_path / "x.csv")
    assert_one_line_error([a.format(path) for a in argv], "both name")
    assert not os.path.exists(path)


@pytest.mark.parametrize("value, needle", [("", "empty file name"), ("-", "not stdout")])
@pytest.mark.parametrize("option", ["--out", "--timeline"])
def test_empty_and_dash_outputs_are_refused_before_any_work(tmp_path, monkeypatch, option,
                                                            value, needle):
    """M3 and R4: --out '' ran the whole simulation and then named a temporary file; --out -
    created a file named '-'; --timeline '' was ignored."""
    from pagebench.sim import dynamic

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dynamic, "run_dynamic", refuse_to_allocate(AssertionError("ran")))
    assert_one_line_error(DYNAMIC + [option, value], f"{option}: ", needle)
    assert list(tmp_path.iterdir()) == []


def test_an_output_where_no_file_can_be_made_is_refused_before_any_work(monkeypatch):
    from pagebench.sim import static

    monkeypatch.setattr(static, "static_fragmentation", refuse_to_allocate(AssertionError("ran")))
    assert_one_line_error(["simulate", "--out", "/proc/nope/x.csv"], "--out", "cannot create",
                          "/proc/nope/x.csv")


def test_output_to_a_closed_pipe_is_silent():
    proc = subprocess.Popen([sys.executable, "-m", "pagebench", "simulate", "--num-seqs", "50"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # closed before the command writes: its first write meets EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == ""


@pytest.mark.parametrize("argv, needles", [
    (["simulate", "--dynamic", "--cow", "--n", "2", "--allocators", "naive",
      "--num-requests", "10"], ("--cow", "--allocators naive", "paged")),
    (["simulate", "--dynamic", "--trace", "mooncake-conv", "--prefix-caching", "--allocators",
      "naive,oracle"], ("--prefix-caching", "paged")),
    (["simulate", "--dynamic", "--block-sizes", "8", "--allocators", "naive"],
     ("--block-sizes", "paged")),
    (["simulate", "--dynamic", "--cow", "--num-requests", "10"], ("--cow", "one sample")),
    (["simulate", "--dynamic", "--timeline-every", "2"], ("--timeline-every", "--timeline")),
    (["simulate", "--dynamic", "--trace", TRACE, "--lengths", "fixed:5"],
     ("--lengths", "not with --trace")),
    (["capacity", "--kv-cache-bytes", "1GiB", "--gpu-memory", "8GiB"],
     ("--gpu-memory", "--kv-cache-bytes")),
    (["capacity", "--kv-cache-bytes", "1GiB", "--weights-bytes", "1GB"],
     ("--weights-bytes", "--kv-cache-bytes")),
    (["engine-bench", "cow", "--model", str(REPO), "--preset", "llama-3-70b"],
     ("--model, --preset", "give one")),
    (["bench-compare", "--base-json", "{0}", "--head-json", "{0}", "--base", "main"],
     ("--base", "not with --base-json")),
    (["bench-compare", "--base-json", "{0}", "--head-json", "{0}", "-k", "x", "--confirm", "2"],
     ("--confirm, -k", "run nothing")),
    (["bench-compare", "--base-json", "{0}", "--head-json", "{0}", "--repeat", "3"],
     ("--repeat", "run nothing")),
    (["simulate", "--dynamic", "--trace", TRACE, "--seed", "1"], ("--seed", "not with --trace")),
    (["bench", "--list-backends", "--out", "x.csv"], ("--out", "--list-backends")),
])
def test_options_that_would_be_ignored_are_refused(tmp_path, monkeypatch, argv, needles):
    """R4 (and R2's --list-backends --out, which wrote nothing and exited 0)."""
    monkeypatch.chdir(tmp_path)
    bench = str(REPO / "reports" / "data" / "cpu" / "pytest-benchmark.json")
    assert_one_line_error([a.format(bench) for a in argv], *needles)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, needles", [
    (["simulate", "--dynamic", "--rate", "1e-9", "--num-requests", "10"],
     ("--rate/--num-requests:", "steps")),
    (["simulate", "--dynamic", "--trace", TRACE, "--step-ms", "50"],
     ("--step-ms:", "use --steps-per-unit")),
    (["simulate", "--dynamic", "--trace", TRACE, "--budget-tokens", "10"],
     ("error: --budget-tokens: 10 slots",)),
    (["simulate", "--dynamic", "--prompt-fraction", "1"],
     ("argument --prompt-fraction", "< 1", "'1'")),
    (["engine-bench", "cow", "--prompt-len", "-5"], ("--prompt-len", "'-5'")),
    (["simulate", "--dynamic", "--prefix-caching", "--trace", "mooncake-conv", "--cow"],
     ("--prefix-caching, --cow",)),
    (["simulate", "--lengths", "nonexistent.txt"], ("--lengths: nonexistent.txt not found",)),
    (["simulate", "--lengths", "gauss:1,2"], ("--lengths: unknown spec",)),
    (["capacity", "--model", "nonexistent.json"], ("--model: nonexistent.json not found",)),
    (["engine-bench", "cow", "--model", "/nonexistent/model"], ("--model", "not found")),
    (["simulate", "--block-sizes", "16,16"], ("--block-sizes", "16 given twice")),
    (["bench", "--batches", "1,1", "--contexts", "16"], ("--batches", "given twice")),
    (["claims", "--json"], ("pagebench claims: error: unrecognized arguments: --json",)),
])
def test_errors_name_the_option_that_caused_them(argv, needles):
    """M2, M4, M5 and R2's "pagebench: error" for a subcommand's unknown option."""
    line = assert_one_line_error(argv, *needles)
    assert "steps_per_unit" not in line and "budget_tokens" not in line
    assert "got ''" not in line


# ---- simulate: lengths, traces, budgets ---------------------------------------------------------
def test_huge_fixed_lengths_are_refused_and_the_library_sums_exactly():
    assert_one_line_error(["simulate", "--lengths", "fixed:10000000000000000",
                           "--max-len", "10000000000000000"], "--max-len")
    result = static_fragmentation([10**16] * 2000, 10**16, [1, 16])
    assert result["tokens_stored"] == 2 * 10**19  # an int64 sum wraps to a negative number
    assert all(r["allocated_slots"] == 2 * 10**19 for r in result["results"][:3])


def test_lognormal_overflow_is_clipped_to_max_len():
    code, out, _ = run(["simulate", "--lengths", "lognormal:1000,1", "--num-seqs", "10",
                        "--json"])
    assert code == 0 and json.loads(out)["tokens_stored"] == 10 * 4096
    code, out, _ = run(["simulate", "--dynamic", "--lengths", "lognormal:1000,1",
                        "--num-requests", "10", "--budget-tokens", "100000", "--json"])
    assert code == 0 and json.loads(out)["workload"]["max_length"] == 4096


def test_lengths_are_used_as_given_or_refused(tmp_path, capsys):
    """R1: a file's 10,000 became 4,096 silently; fixed:5000 too; fixed:1.5 became 1."""
    big = tmp_path / "big.txt"
    big.write_text("100\n10000\n")
    for command, limit in (("simulate", "--max-len"), ("capacity", "--max-model-len")):
        assert_one_line_error([command, "--lengths", str(big)], "--lengths", limit, "10,000",
                              "not clipped")
        code, out, _ = run([command, "--lengths", str(big), limit, "16384", "--json"])
        assert code == 0
    assert json.loads(out)["mean_length"] == 5050
    assert_one_line_error(["simulate", "--lengths", "fixed:5000"], "--lengths", "--max-len",
                          "5,000")
    assert_one_line_error(["simulate", "--lengths", "uniform:1,5000"], "--lengths", "--max-len")
    for spec in ("fixed:1.5", "uniform:1.5,3.5", "fixed:1e3"):
        assert_one_line_error(["simulate", "--lengths", spec], "--lengths", "integers")
    (tmp_path / "half.jsonl").write_text('{"length": 1.5}\n')
    assert_one_line_error(["simulate", "--lengths", str(tmp_path / "half.jsonl")], "--lengths",
                          "not a list of integer lengths")


def test_lognormal_lengths_follow_the_documented_formula(capsys):
    """R1: max(1, min(max_len, int(lognormvariate))): lognormal:-5,0.1 stores 1 token each."""
    code, out, _ = run(["simulate", "--lengths", "lognormal:-5,0.1", "--num-seqs", "7",
                        "--json"])
    assert code == 0 and json.loads(out)["tokens_stored"] == 7
    usage = (REPO / "docs" / "usage.md").read_text()
    assert "max(1, min(max_len, int(random.Random(seed).lognormvariate(MU, SIGMA))))" in usage


def test_separately_drawn_lengths_are_checked_and_their_clipping_counted():
    assert_one_line_error(["simulate", "--dynamic", "--prompt-lengths", "fixed:3",
                           "--output-lengths", "fixed:5000"], "--output-lengths", "--max-len")
    assert_one_line_error(["simulate", "--dynamic", "--prompt-lengths", "fixed:3",
                           "--output-lengths", "bogus"], "--output-lengths: bogus not found")
    assert_one_line_error(["simulate", "--dynamic", "--prompt-lengths", "fixed:3",
                           "--output-lengths", "fixed:3", "--lengths", "fixed:9"],
                          "--lengths: not with --prompt-lengths")
    code, out, _ = run(["simulate", "--dynamic", "--prompt-lengths", "fixed:3000",
                        "--output-lengths", "fixed:3000", "--num-requests", "20",
                        "--budget-tokens", "100000", "--json"])
    workload = json.loads(out)["workload"]
    assert code == 0 and (workload["num_clipped"], workload["max_model_len"]) == (20, 4096)
    code, table, _ = run(["simulate", "--dynamic", "--prompt-lengths", "fixed:3000",
                          "--output-lengths", "fixed:3000", "--num-requests", "20",
                          "--budget-tokens", "100000"])
    assert "20 clipped to max_model_len 4,096" in table


def test_bad_trace_values_and_configs_are_one_line(files):
    assert_one_line_error(["simulate", "--dynamic", "--trace", str(files / "trace_1e300.csv")],
                          "prompt_len out of range")
    assert_one_line_error(["capacity", "--model", str(files / "config.json")],
                          "num_attention_heads")


def test_unbounded_simulations_are_refused_with_an_estimate(files, monkeypatch):
    monkeypatch.setattr(options, "available_memory_bytes", lambda: 16 * 10**9)
    assert_one_line_error(["simulate", "--num-seqs", "1000000000"], "--num-seqs",
                          "needs about 100.0 GB", "16.0 GB available")
    assert_one_line_error(["simulate", "--dynamic", "--trace", str(files / "huge_request.csv"),
                           "--max-len", "2000000000"], "1,000,000,000 steps", "needs about")


@pytest.mark.parametrize("argv", [
    ["simulate", "--dynamic", "--prefix-caching", "--num-requests", "100", "--allocators",
     "paged"],
    ["simulate", "--dynamic", "--trace", "azure-code", "--prefix-caching"],
    ["simulate", "--dynamic", "--trace", TRACE, "--prefix-caching"],
])
def test_prefix_caching_without_hash_ids_is_refused(argv):
    """M1: a 0.0% hit rate was reported as if measured."""
    assert_one_line_error(argv, "--prefix-caching", "hash_ids")


# ---- bench: kernel sweeps -----------------------------------------------------------------------
def test_a_huge_kernel_sweep_is_refused_with_its_size_before_allocating():
    line = assert_one_line_error(["bench", "--contexts", "100000000", "--batches", "1"],
                                 "--contexts", "needs about")
    assert "TB" in line


def test_launch_grids_are_cuda_only():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert_one_line_error(["bench", "--tune"], "--tune", "CUDA only")
    assert_one_line_error(["bench", "--tune", "--prefill"], "--tune", "CUDA only")


def test_a_sweep_that_measures_nothing_is_an_error():
    assert_one_line_error(["bench", "--backends", "flex", "--block-sizes", "8"], "--backends")


def test_cuda_graphs_only_on_the_cpu_says_it_times_eagerly(monkeypatch):
    """R4: every row said "CUDA graph: no" without a word (the runbooks' CPU dry runs pass
    --cuda-graphs only as they are, so it is a warning, not an error)."""
    from pagebench.measure import kernel_sweep

    monkeypatch.setattr(kernel_sweep, "run_sweep", refuse_to_allocate(MemoryError("stop here")))
    code, _, err = run(["bench", "--cuda-graphs", "only", "--contexts", "16", "--batches", "1"])
    assert code == 2 and "warning: --cuda-graphs only" in err and "eagerly" in err


def test_bench_rows_write_counts_as_integers(tmp_path):
    """M10: block_size came out as 16.0 (pandas makes a column with a missing value float)."""
    import csv

    path = tmp_path / "k.csv"
    code, out, err = run(["bench", "--shape", "t=4/2/16", "--batches", "1", "--contexts", "32",
                          "--block-sizes", "16", "--repeat", "1", "--out", str(path), "--json"])
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert {r["block_size"] for r in rows} == {None, 16}
    assert all(type(r["block_size"]) is int for r in rows if r["block_size"] is not None)
    with open(path) as f:
        written = {r["block_size"] for r in csv.DictReader(f)}
    assert written == {"", "16"}


# ---- engine-bench -------------------------------------------------------------------------------
def test_an_engine_run_too_large_is_refused_before_its_prompts_are_drawn(monkeypatch):
    from pagebench.measure import engine_bench

    monkeypatch.setattr(options, "available_memory_bytes", lambda: 16 * 10**9)
    monkeypatch.setattr(engine_bench, "random_prompts", refuse_to_allocate(AssertionError("drawn")))
    assert_one_line_error(["engine-bench", "throughput", "--batch-sizes", "100000",
                           "--prompt-len", "4000", "--max-tokens", "1", "--block-sizes", "16"],
                          "--batch-sizes", "100,000 requests of up to 4,001 tokens",
                          "needs about 411.2 GB", "16.0 GB available")
    assert_one_line_error(["engine-bench", "equality", "--num-requests", "100000",
                           "--prompt-len", "100000"], "--num-requests", "needs about")
    assert_one_line_error(["engine-bench", "fp8", "--kv-cache-memory", "1TB"],
                          "--kv-cache-memory", "needs about 1.0 TB")


def test_options_an_experiment_would_ignore_are_refused():
    for experiment in ("cow", "prefix", "pool"):
        for flag, value in (("--kernel", "torch"), ("--block-sizes", "8"),
                            ("--batch-sizes", "2")):
            assert_one_line_error(["engine-bench", experiment, flag, value], flag,
                                  f"not used by engine-bench {experiment}")
    for experiment in ("prefix", "pool"):
        assert_one_line_error(["engine-bench", experiment, "--prompt-len", "8"], "--prompt-len")
    assert_one_line_error(["engine-bench", "cow", "--repeat", "2"], "--repeat",
                          "not used by engine-bench cow")
    assert_one_line_error(["engine-bench", "throughput", "--methods", "engine"], "--methods")


def test_compare_methods_must_be_known_before_any_work():
    assert_one_line_error(["engine-bench", "compare", "--methods", "engine,bogus"], "--methods",
                          "unknown bogus")
    assert_one_line_error(["engine-bench", "compare", "--methods", ","], "--methods")


# ---- bench-compare: the regression gate ---------------------------------------------------------
def bench_doc(**stats) -> dict:
    return {"benchmarks": [{"name": n, "fullname": f"b.py::{n}", "stats": s}
                           for n, s in stats.items()]}


@pytest.mark.parametrize("head, needle", [
    ({"benchmarks": []}, "no benchmarks"),
    (bench_doc(other={"median": 0.01}), "no benchmark is in both"),
    (bench_doc(a=None), "no median"),
    (bench_doc(a={"median": float("nan")}), "not a positive time"),
    (bench_doc(a={"median": "fast"}), "no median"),
    ({"benchmarks": [1, 2]}, "has no name"),
])
def test_the_gate_refuses_results_it_cannot_judge(tmp_path, head, needle):
    (tmp_path / "base.json").write_text(json.dumps(bench_doc(a={"median": 0.01})))
    (tmp_path / "head.json").write_text(json.dumps(head))
    assert_one_line_error(["bench-compare", "--base-json", str(tmp_path / "base.json"),
                           "--head-json", str(tmp_path / "head.json"), "--stat", "median"],
                          needle)


def test_the_gate_refuses_malformed_json(tmp_path):
    (tmp_path / "bad.json").write_bytes(b"\xff{not json")
    assert_one_line_error(["bench-compare", "--base-json", str(tmp_path / "bad.json"),
                           "--head-json", str(tmp_path / "bad.json")], "not JSON")


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def tiny_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "work.py").write_text("x = 1\n")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return repo


def test_the_gate_refuses_head_when_the_working_tree_has_changes(tiny_repo):
    (tiny_repo / "work.py").write_text("x = 2\n")
    assert_one_line_error(["bench-compare", "--repo", str(tiny_repo), "--base", "HEAD",
                           "--head", "HEAD"], "uncommitted changes", "--head .")


def test_a_killed_runs_temp_dir_and_worktree_are_removed_by_the_next(tiny_repo, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / (regression_gate.TEMP_PREFIX + "stale")
    stale.mkdir()
    (stale / "pid").write_text(str(dead.pid))
    git(tiny_repo, "worktree", "add", "--detach", "--quiet", str(stale / "wt"), "HEAD")
    live = tmp_path / (regression_gate.TEMP_PREFIX + "live")
    live.mkdir()
    (live / "pid").write_text(str(os.getpid()))
    assert regression_gate.remove_stale_temp_dirs(tiny_repo, str(tmp_path)) == [stale]
    assert not stale.exists() and live.exists()
    assert "wt" not in git(tiny_repo, "worktree", "list")


def test_checkouts_leave_nothing_behind(tiny_repo, monkeypatch, tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    with pytest.raises(KeyboardInterrupt):
        with regression_gate.TerminationAsInterrupt(), regression_gate.Checkouts(tiny_repo) as c:
            c.get(git(tiny_repo, "rev-parse", "HEAD"))
            c.scratch("results")
            os.kill(os.getpid(), signal.SIGTERM)  # `kill` of a running gate
    assert list(scratch.iterdir()) == []
    assert git(tiny_repo, "worktree", "list").count("\n") == 0
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_bench_compare_out_follows_the_file_name(tmp_path):
    """R3: --out cmp.csv held a JSON document."""
    bench = str(REPO / "reports" / "data" / "cpu" / "pytest-benchmark.json")
    argv = ["bench-compare", "--base-json", bench, "--head-json", bench]
    code, _, err = run(argv + ["--out", str(tmp_path / "cmp.csv")])
    assert code == 0 and "wrote" in err
    text = (tmp_path / "cmp.csv").read_text()
    assert text.startswith("name,base_s,head_s,ratio,status\n")
    code, out, _ = run(argv + ["--out", str(tmp_path / "cmp.json"), "--json"])
    assert code == 0 and (tmp_path / "cmp.json").read_text() == out


# ---- report: its inputs and outputs -------------------------------------------------------------
@pytest.mark.parametrize("option", ["--results", "--data-dir"])
def test_report_input_directories_must_exist(option):
    assert_one_line_error(["report", "--quick", option, "/nonexistent"], option, "not found")


def test_a_truncated_csv_is_named_and_skipped(tmp_path):
    good = "backend,time_us\nsdpa,17.52\ntorch,20.1\n"
    (tmp_path / "cut.csv").write_text(good[:-4])  # "20.1\n" became "2"
    with pytest.raises(DataError, match="does not end with a newline"):
        read_table(tmp_path / "cut.csv")
    (tmp_path / "short.csv").write_text("backend,time_us\nsdpa\n")
    with pytest.raises(DataError, match="line 2 has 1 fields, the header 2"):
        read_table(tmp_path / "short.csv")
    (tmp_path / "ok.csv").write_text(good)
    assert list(read_table(tmp_path / "ok.csv").time_us) == [17.52, 20.1]


def analysed(results: Results) -> Results:
    analyse(results)
    return results


@pytest.mark.slow
def test_the_data_directory_is_replaced_whole(tmp_path, monkeypatch):
    out = tmp_path / "index.html"
    build.write_report(analysed(synthetic_results()), out, env={"device": "cpu"}, options={})
    data = tmp_path / "index_data"
    before = {p.name: p.read_text() for p in data.iterdir()}

    def write_half(frames, data_dir):
        (data_dir / "claims.csv").write_text("half")
        raise KeyboardInterrupt  # killed between two CSVs

    monkeypatch.setattr(build.render, "write_datasets", write_half)
    with pytest.raises(KeyboardInterrupt):
        build.write_report(analysed(Results()), out, env={"device": "cpu"}, options={})
    assert {p.name: p.read_text() for p in data.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html", "index_data"]


def test_report_out_with_a_trailing_slash_is_a_directory(tmp_path):
    out = build.write_report(analysed(Results()), f"{tmp_path}/site/", env={"device": "cpu"},
                             options={})
    assert out == tmp_path / "site" / "index.html" and out.is_file()


@pytest.mark.parametrize("output", ["--out", "--timeline"])
def test_an_output_that_is_also_an_input_is_refused_and_the_input_kept(tmp_path, capsys, output):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival,prompt_len,output_len\n0,10,5\n1,20,5\n")
    before = trace.read_text()
    code = main(["simulate", "--dynamic", "--trace", str(trace), "--budget-tokens", "4096",
                 "--block-sizes", "16", output, str(tmp_path / "." / "trace.csv")])
    err = capsys.readouterr().err
    assert code == 2 and f"{output}: " in err and "is also the input --trace" in err
    assert len(err.strip().splitlines()) == 1 and trace.read_text() == before


def test_an_output_over_the_config_of_a_model_folder_is_refused(tmp_path, capsys):
    """``capacity --model DIR --out DIR/config.json`` replaced the model's config with the
    plan (the file form was refused, the folder form was not)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_attention_heads": 4, "num_key_value_heads": 2,
                                  "hidden_size": 64, "num_hidden_layers": 2,
                                  "intermediate_size": 128, "vocab_size": 100}))
    before = config.read_text()
    assert main(["capacity", "--model", str(tmp_path), "--out", str(config)]) == 2
    assert "is also the input --model" in capsys.readouterr().err
    assert config.read_text() == before
