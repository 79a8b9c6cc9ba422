"""The regression gate (`pagebench bench-compare`): comparison logic on synthetic results, and
end to end on a temporary git repository whose second commit is artificially slowed."""

from __future__ import annotations

import io
import json
import shutil
import subprocess

import pytest

from pagebench.measure.regression_gate import bench_compare, compare, regressions, run_suite, timings
from pagebench.cli import main
from pagebench.errors import ConfigError


def doc(**medians_ms) -> dict:
    """A minimal pytest-benchmark JSON document."""
    return {"machine_info": {}, "benchmarks": [
        {"name": n, "fullname": f"bench/test.py::{n}",
         "stats": {"min": ms / 1e3 * 0.9, "median": ms / 1e3, "mean": ms / 1e3}}
        for n, ms in medians_ms.items()]}


def test_compare_flags_only_changes_beyond_threshold():
    base = timings(doc(a=10, b=10, c=10, gone=1), "median")
    head = timings(doc(a=10.9, b=11.2, c=5, new=1), "median")
    changes = {c.name.split("::")[1]: c for c in compare(base, head)}
    status = {n: c.status(0.10) for n, c in changes.items()}
    assert status == {"a": "same", "b": "slower", "c": "faster", "gone": "missing", "new": "new"}
    assert [c.name for c in regressions(list(changes.values()), 0.10)] == ["bench/test.py::b"]
    assert changes["b"].ratio == pytest.approx(1.12)
    # a looser threshold lets the 12% slowdown pass
    assert regressions(list(changes.values()), 0.15) == []


def test_timings_rejects_other_json():
    with pytest.raises(ConfigError, match="pytest-benchmark"):
        timings({"results": []})
    with pytest.raises(ConfigError, match="stat"):
        timings(doc(a=1), "p99")


def test_cli_on_json_files_lists_regressions_and_exits_1(tmp_path, capsys):
    (tmp_path / "base.json").write_text(json.dumps(doc(fast=10, slow=10)))
    (tmp_path / "head.json").write_text(json.dumps(doc(fast=10, slow=13)))
    argv = ["bench-compare", "--base-json", str(tmp_path / "base.json"),
            "--head-json", str(tmp_path / "head.json"), "--stat", "median", "--threshold", "0.1"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "1 benchmark(s) more than 10% slower" in out and "bench/test.py::slow: 1.30x" in out
    assert main(argv + ["--threshold", "0.5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["regressions"] == [] and len(report["changes"]) == 2


def test_a_benchmark_missing_on_head_fails_unless_allowed(tmp_path, capsys):
    """A benchmark that ran on base but not on head (a module that no longer imports skips its
    benchmarks) used to be "missing", not judged, and the gate exited 0."""
    (tmp_path / "base.json").write_text(json.dumps(doc(kept=10, gone=10)))
    (tmp_path / "head.json").write_text(json.dumps(doc(kept=10, added=5)))
    argv = ["bench-compare", "--base-json", str(tmp_path / "base.json"),
            "--head-json", str(tmp_path / "head.json")]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "1 benchmark(s) ran on base but not on head" in out and "bench/test.py::gone" in out
    assert "1 benchmark(s) new on head: not judged" in out
    assert main(argv + ["--allow-missing", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["missing"] == ["bench/test.py::gone"] and report["passed"]
    (tmp_path / "head.json").write_text(json.dumps(doc(kept=10, gone=10, added=5)))
    assert main(argv) == 0  # a new benchmark alone does not fail


def test_duplicate_names_and_thresholds_that_are_not_fractions_are_refused(tmp_path, capsys):
    twice = doc(a=1)
    twice["benchmarks"] *= 2  # the second used to replace the first silently
    with pytest.raises(ConfigError, match="appears twice"):
        timings(twice)
    (tmp_path / "b.json").write_text(json.dumps(doc(a=1)))
    assert main(["bench-compare", "--base-json", str(tmp_path / "b.json"), "--head-json",
                 str(tmp_path / "b.json"), "--threshold", "5"]) == 2  # 5 meant as 5%
    assert "--threshold" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="threshold"):
        bench_compare(tmp_path, "HEAD~1", "HEAD", threshold=5)


def test_bad_settings_are_refused_before_running(tmp_path):
    for kwargs, arg in (({"threshold": 0}, "threshold"), ({"repeat": 0}, "repeat"),
                        ({"confirm": -1}, "confirm"), ({"stat": "p99"}, "stat")):
        with pytest.raises(ConfigError, match=arg):
            bench_compare(tmp_path, "HEAD~1", "HEAD", **kwargs)


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert main(["bench-compare", "--base-json", str(tmp_path / "nope.json"),
                 "--head-json", str(tmp_path / "nope.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["bench-compare"]) == 2
    assert "--base" in capsys.readouterr().err
    assert main(["bench-compare", "--base", "HEAD", "--threshold", "-1"]) == 2
    assert "threshold" in capsys.readouterr().err


THREADS = ("import os\n\nimport torch\n\n\ndef test_bench_threads(benchmark):\n"
           "    benchmark(int)\n"
           "    benchmark.extra_info.update(torch=torch.get_num_threads(),\n"
           "                                omp=os.environ.get('OMP_NUM_THREADS'))\n")


@pytest.mark.slow
def test_the_benchmark_process_runs_on_one_thread(tmp_path, monkeypatch):
    """The process clock sums every thread's CPU time: a matmul on two threads halved its wall
    time and read 1.24x slower. Both commits run torch (and BLAS) on one thread, whatever
    OMP_NUM_THREADS the caller has."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "test_bench_threads.py").write_text(THREADS)
    result = run_suite(tmp_path, tmp_path / "bench", tmp_path / "out.json", select=None,
                       marks=None, max_time=0.01)
    assert result["benchmarks"][0]["extra_info"] == {"torch": 1, "omp": "1"}


# ---- end to end on a temporary repository ---------------------------------------------------
# CPU-bound bodies: the gate times CPU time, which a sleep does not use
WORK = "def spin(n):\n    return sum(range(n))\n\n\ndef step():\n    return spin({iterations})\n"
# test_bench_unchanged does the same ~1 ms of work in both commits
BENCH = ("import work\n\n\ndef test_bench_step(benchmark):\n"
         "    benchmark(work.step)\n\n\ndef test_bench_unchanged(benchmark):\n"
         "    benchmark(work.spin, 50_000)\n")


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def slowed_repo(tmp_path_factory):
    """Commit 1: step() sums 50,000 numbers. Commit 2: the same step, slowed 8x to 400,000.
    The margins are wide on purpose: on a shared VM the CPU time of an unchanged ~1 ms
    benchmark was seen 1.75x apart between two runs (a vCPU descheduled counts as CPU time)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path_factory.mktemp("repo")
    git(repo, "init", "-q")
    (repo / "bench").mkdir()
    (repo / "bench" / "test_bench_work.py").write_text(BENCH)
    commits = []
    for iterations in (50_000, 400_000):
        (repo / "work.py").write_text(WORK.format(iterations=iterations))
        git(repo, "add", ".")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m",
            f"{iterations}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    return repo, commits


@pytest.mark.slow
def test_gate_catches_the_slowed_commit(slowed_repo):
    repo, (fast, slow) = slowed_repo
    log = io.StringIO()
    changes, base, head = bench_compare(repo, fast, slow, bench_dir="bench", repeat=1,
                                        confirm=1, max_time=0.1, stat="min", log=log,
                                        threshold=2.0)
    assert (base, head) == (fast, slow)
    slower = regressions(changes, 2.0)  # 8x slower; the unchanged one stays within 3x
    assert [c.name for c in slower] == ["bench/test_bench_work.py::test_bench_step"]
    assert slower[0].ratio > 3
    # the suspect was confirmed by one more alternating run of its test function only
    assert "confirm 1/1 (1 suspect), head" in log.getvalue()
    # the worktrees are gone afterwards
    assert git(repo, "worktree", "list").count("\n") == 0


@pytest.mark.slow
def test_gate_passes_when_head_is_faster_and_cli_exit_codes(slowed_repo, capsys):
    repo, (fast, slow) = slowed_repo
    assert main(["bench-compare", "--repo", str(repo), "--base", slow, "--head", fast,
                 "--bench-dir", "bench", "--repeat", "1", "--max-time", "0.1",
                 "--threshold", "2"]) == 0
    assert "no benchmark more than 200% slower" in capsys.readouterr().out
    assert main(["bench-compare", "--repo", str(repo), "--base", "no-such-rev",
                 "--bench-dir", "bench"]) == 2
    assert "unknown revision 'no-such-rev'" in capsys.readouterr().err
