"""Issue 45's hostile inputs, run as written: each was a silent wrong answer, a replaced file, a
NaN or a traceback; each is now a clear one-line refusal (exit status 2 on the command line), a
warning naming what was skipped, or the right answer."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch

from pagebench import suite
from pagebench.measure import regression_gate
from pagebench.cli import main, options
from pagebench.kernels import available_backends
from pagebench.report import build, outputs


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def refused(argv, *needles) -> str:
    """``argv`` exits 2 with one line on stderr holding every needle; that line."""
    code, _, err = run(argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (argv, code, err)
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def bench_json(tmp_path: Path, name: str = "bench.json", **stats) -> Path:
    """A pytest-benchmark JSON document: benchmark name -> its stats."""
    path = tmp_path / name
    path.write_text(json.dumps({"benchmarks": [
        {"name": n, "fullname": f"b.py::{n}", "stats": s} for n, s in stats.items()]}))
    return path


# ---- outputs: only a regular file (or nothing) is replaced ---------------------------------
def special_files(tmp_path: Path) -> dict[str, Path]:
    """A FIFO and a symbolic link (to a file of the user's), made in ``tmp_path``."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "users_file.csv"
    target.write_text("the user's data\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    return {"FIFO": fifo, "symbolic link": link}


def unchanged(path: Path, kind: str) -> bool:
    mode = os.lstat(path).st_mode
    return stat.S_ISFIFO(mode) if kind == "FIFO" else stat.S_ISLNK(mode)


CAPACITY = ["capacity", "--out"]
TIMELINE = ["simulate", "--dynamic", "--num-requests", "5", "--timeline"]
CLAIMS = ["claims", "--csv"]
GATE = ["bench-compare", "--base-json", "BENCH", "--head-json", "BENCH", "--out"]


# (the timeline was written into the FIFO, which blocks once the pipe is full: only a link here)
@pytest.mark.parametrize("argv, kind", [
    (CAPACITY, "FIFO"), (CAPACITY, "symbolic link"), (TIMELINE, "symbolic link"),
    (CLAIMS, "FIFO"), (CLAIMS, "symbolic link"), (GATE, "FIFO"), (GATE, "symbolic link"),
], ids=["capacity-fifo", "capacity-link", "timeline-link", "claims-fifo", "claims-link",
        "gate-fifo", "gate-link"])
def test_an_output_that_is_a_fifo_or_a_link_is_refused_and_kept(tmp_path, argv, kind):
    """#45 item 1: ``os.replace`` over a FIFO, device or link replaced it with a file."""
    path = special_files(tmp_path)[kind]
    argv = [bench_json(tmp_path, a={"min": 0.01}) if a == "BENCH" else a for a in argv]
    # a reader held open, so that a command writing into the FIFO does not block forever
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK) if kind == "FIFO" else None
    try:
        refused(argv + [path], argv[-1], str(path), kind.split()[-1])
        assert reader is None or os.read(reader, 1 << 16) == b""  # nothing written into it
    finally:
        if reader is not None:
            os.close(reader)
    assert unchanged(path, kind)
    assert (tmp_path / "users_file.csv").read_text() == "the user's data\n"


def test_a_device_as_output_is_refused_before_anything_is_written():
    """#45 item 1: as root, ``capacity --out /dev/null`` replaced the machine's /dev/null. The
    checks are called directly: they write nothing, so /dev/null is safe even if they fail."""
    with pytest.raises(ValueError, match="--out: /dev/null is a device"):
        options.check_output_file("--out", "/dev/null")
    with pytest.raises(ValueError, match="--timeline: /dev/null is a device"):
        options.check_outputs_are_not_inputs(argparse.Namespace(timeline="/dev/null"))


def test_report_out_at_a_link_to_a_report_page_is_refused_and_the_link_kept(tmp_path,
                                                                           monkeypatch):
    """#45 item 3: the link was replaced by the new page."""
    monkeypatch.setattr(suite, "build_report", lambda *a, **k: pytest.fail("the report ran"))
    page = tmp_path / "real" / "index.html"
    page.parent.mkdir()
    page.write_text(f"<!DOCTYPE html>\n<head>\n{outputs.GENERATOR_META}\n</head>\n")
    assert outputs.is_report_page(page)
    link = tmp_path / "index.html"
    link.symlink_to(page)
    refused(["report", "--quick", "--no-progress", "--out", link], "--out", "symbolic link")
    with pytest.raises(ValueError, match="is a symbolic link, not a pagebench report page"):
        build.check_report_output(link)
    assert link.is_symlink() and outputs.is_report_page(page)


# ---- bench-compare --------------------------------------------------------------------------
def gate(tmp_path, base: dict, head: dict, *extra):
    return ["bench-compare", "--base-json", bench_json(tmp_path, "base.json", **base),
            "--head-json", bench_json(tmp_path, "head.json", **head), *extra]


def test_the_gate_refuses_a_boolean_statistic(tmp_path):
    """#45 item 8: JSON ``true`` was read as 1 s, a false "1000x slower" and exit 1."""
    refused(gate(tmp_path, {"a": {"min": 0.001}}, {"a": {"min": True}}),
            "b.py::a", "true is not a number of seconds")


def test_the_dirty_tree_refusal_names_whole_file_names(tmp_path):
    """#45 item 11: ``line[3:]`` on the stripped porcelain output cut the first letter off
    the first file ("akefile")."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t",
                                                  "commit", "-q", "-m", "one"]):
        if args[0] == "add":
            (repo / "Makefile").write_text("all:\n")
            (repo / "work.py").write_text("x = 1\n")
        subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True)
    (repo / "Makefile").write_text("all: x\n")  # " M Makefile": a leading space
    (repo / "work.py").write_text("x = 2\n")
    assert regression_gate.working_tree_changes(repo) == ["Makefile", "work.py"]
    refused(["bench-compare", "--repo", repo, "--base", "HEAD", "--head", "HEAD"],
            "(Makefile, work.py)")


def test_the_gate_prints_control_characters_in_names_escaped(tmp_path):
    """#45 also: a benchmark name from the JSON was printed raw, terminal escapes included."""
    name = "evil\x1b[2J\rname"
    code, out, _ = run(gate(tmp_path, {name: {"min": 0.001}}, {name: {"min": 0.01}}))
    assert code == 1 and "\x1b" not in out and "\r" not in out
    assert out.count("evil\\x1b[2J\\rname") == 2  # the table and the list of regressions


def test_out_dir_that_takes_no_files_is_refused_before_any_run(tmp_path, monkeypatch):
    """#45 also: ``--out-dir /proc/self`` ran the base benchmarks, then failed."""
    monkeypatch.setattr(regression_gate, "run_suite",
                        lambda *a, **k: pytest.fail("a benchmark ran"))
    refused(["bench-compare", "--base", "HEAD", "--head", "HEAD", "--out-dir", "/proc/self"],
            "--out-dir", "/proc/self", "cannot create")
    (tmp_path / "file").write_text("")
    refused(["bench-compare", "--base", "HEAD", "--head", "HEAD", "--out-dir",
             tmp_path / "file"], "--out-dir", "not a directory")


# ---- the engine's configuration -------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    from pagebench.measure.engine_bench import tiny_model

    return tiny_model(num_hidden_layers=1)


def test_numpy_integers_are_accepted_wherever_an_int_is(model):
    """#45 item 9: a numpy ``block_size`` or ``max_num_batched_tokens`` was accepted, then every
    ``generate`` failed ("num_new: expected an integer >= 0, got np.int64(3)"); numpy
    ``arrival_steps`` were refused while numpy prompt ids were accepted."""
    from pagebench.engine import LLMEngine, SamplingParams
    from pagebench.measure.trace_replay import generate_at_steps

    np = pytest.importorskip("numpy")
    engine = LLMEngine(model, block_size=np.int64(4), num_blocks=np.int32(64),
                       max_num_batched_tokens=np.int64(3), max_num_seqs=np.int16(4),
                       max_model_len=np.int64(64), kernel="torch")
    prompts = [[1, 2, 3, 4, 5], [6, 7]]
    got, _ = generate_at_steps(engine, prompts, [SamplingParams(max_tokens=3)] * 2,
                               np.array([0, 2]))
    plain = LLMEngine(model, block_size=4, num_blocks=64, max_num_batched_tokens=3,
                      max_num_seqs=4, max_model_len=64, kernel="torch")
    want, _ = generate_at_steps(plain, prompts, [SamplingParams(max_tokens=3)] * 2, [0, 2])
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert type(engine.block_size) is int and type(engine.scheduler.max_num_batched_tokens) is int
    assert type(engine.block_manager.block_size) is int and type(engine.num_blocks) is int


@pytest.mark.parametrize("arrivals, needle", [
    ([0, -1], "arrival_steps[1]: must be an integer >= 0"),
    ([0, True], "arrival_steps[1]: must be an integer >= 0"),
    ([0.0, 1], "arrival_steps[0]: must be an integer >= 0"),
])
def test_arrival_steps_that_are_not_integers_are_refused_naming_the_one(model, arrivals,
                                                                        needle):
    from pagebench.engine import LLMEngine, SamplingParams
    from pagebench.measure.trace_replay import generate_at_steps
    from pagebench.errors import ConfigError

    engine = LLMEngine(model, block_size=4, num_blocks=64, kernel="torch")
    with pytest.raises(ConfigError) as e:
        generate_at_steps(engine, [[1, 2], [3]], [SamplingParams()] * 2, arrivals)
    assert needle in str(e.value)


@pytest.mark.parametrize("config, option", [
    ({"kv_cache_memory": 1e300}, "kv_cache_memory"),
    ({"kv_cache_memory": "1e15"}, "kv_cache_memory"),
    ({"num_blocks": 2**63}, "num_blocks"),
])
def test_a_pool_no_machine_holds_is_a_config_error(model, config, option):
    """#45 item 10: these raised OverflowError ("1e300", 2**63) or MemoryError ("1e15")."""
    from pagebench.engine import LLMEngine
    from pagebench.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^{option}: a pool of .* bytes"):
        LLMEngine(model, block_size=16, kernel="torch", **config)


# ---- fp8 KV caches: scales and the Triton decode --------------------------------------------
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def test_calibration_ignores_nan_and_infinities_in_a_sample():
    """#45 item 6: one NaN or inf made its head fall back to scale 1 (121x too small in the
    probe, so values above 2 saturated)."""
    from pagebench.kernels.quant import calibrated_scales

    sample = torch.randn(32, 2, 8, generator=torch.Generator().manual_seed(0)) * 100
    clean = calibrated_scales(sample, E4M3)
    dirty = sample.clone()
    dirty[3, 0, 1], dirty[7, 1, 2] = float("nan"), float("inf")
    dirty[9, 1, 0] = -float("inf")
    expected = sample.clone()
    expected[3, 0, 1] = expected[7, 1, 2] = expected[9, 1, 0] = 0.0
    assert torch.equal(calibrated_scales(dirty, E4M3), calibrated_scales(expected, E4M3))
    assert torch.allclose(calibrated_scales(dirty, E4M3), clean, rtol=0.2)


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_calibration_of_extreme_samples_gives_scales_the_kernels_accept(dtype):
    """#45 item 6: an all-tiny sample underflowed its scale to 0, which ``check_kv_scales``
    refuses; the scale is clamped to the range it accepts (the smallest, or the largest)."""
    from pagebench.kernels.quant import calibrated_scales, check_kv_scales

    sample = torch.full((4, 2, 8), 1e-44)
    sample[:, 1] = 3e38
    scales = calibrated_scales(sample, dtype)
    cache = torch.zeros(1, 4, 2, 8).to(dtype)
    k, v = check_kv_scales(cache, scales, scales)
    assert torch.equal(k, scales)
    from pagebench.kernels.quant import scale_range

    assert scales.tolist() == [pytest.approx(v) for v in scale_range(dtype)]


def fp8_decode_case(cache_dtype, q_magnitude: float, k_scale: float):
    from pagebench.measure.kernel_cases import make_paged_inputs

    inp = make_paged_inputs([5, 9], 4, 2, 16, 4, torch.bfloat16, poison=False)
    gen = torch.Generator().manual_seed(3)
    k_cache = (torch.rand(inp.k_cache.shape, generator=gen) * 2 - 1).to(cache_dtype)
    v_cache = torch.randn(inp.v_cache.shape, generator=gen).to(cache_dtype)
    q = (inp.q.float() * q_magnitude).to(torch.bfloat16)
    return (q, k_cache, v_cache, inp.block_tables, inp.seq_lens), {"k_scale": k_scale,
                                                                   "v_scale": 1.0}


triton_only = pytest.mark.skipif("triton" not in available_backends(),
                                 reason="triton not installed")


def both_backends(args, scales):
    from pagebench.kernels import paged_decode

    return {b: paged_decode(*args, backend=b, **scales) for b in ("torch", "triton")}


@triton_only
def test_triton_fp8_decode_of_a_tiny_bf16_q_is_finite_and_matches_torch():
    """#45 item 4: a bf16 q with every value below ~2^-113 overflowed ``rows_to_f16``'s
    ``exp2(-shift)`` in float32: NaN from Triton, finite from torch."""
    from pagebench.measure.kernel_cases import relative_error

    args, scales = fp8_decode_case(E5M2, 2.0 ** -120, 1.0)
    assert args[0].abs().max() < 2.0 ** -113
    out = both_backends(args, scales)
    assert torch.isfinite(out["torch"]).all() and torch.isfinite(out["triton"]).all()
    assert relative_error(out["triton"], out["torch"]) < 1e-2


@triton_only
def test_backends_agree_on_the_largest_accepted_scale_and_refuse_a_larger_one():
    """#45 item 7: a scale whose product with a stored value exceeds float32 was accepted,
    and the torch backend returned NaN (Triton was finite). Such a scale is now refused by
    both (their shared validation); at the largest one accepted both are finite and agree."""
    from pagebench.kernels import paged_decode
    from pagebench.measure.kernel_cases import relative_error

    overflowing = torch.finfo(torch.float32).max / torch.finfo(E5M2).max * 1.01
    args, scales = fp8_decode_case(E5M2, 1e-36, overflowing)
    args[1][0, 0, 0, 0] = torch.finfo(E5M2).max  # stored value x scale: beyond float32
    for too_large in (overflowing, torch.full((2,), overflowing)):
        for backend in ("torch", "triton"):
            with pytest.raises(ValueError, match="k_scale: every scale must be at most|"
                               "k_scale: must be at most"):
                paged_decode(*args, backend=backend, **{**scales, "k_scale": too_large})
    from pagebench.kernels.quant import scale_range

    out = both_backends(args, {**scales, "k_scale": scale_range(E5M2)[1]})
    assert torch.isfinite(out["torch"]).all() and torch.isfinite(out["triton"]).all()
    assert relative_error(out["triton"], out["torch"]) < 1e-2


# ---- reading results ------------------------------------------------------------------------
POOL = "num_blocks,num_preemptions,tokens_per_s,recomputed_tokens,block_size\n"


def test_a_deeply_nested_json_is_skipped_by_name_and_the_rest_read(tmp_path):
    """#45 item 2: ``[`` x 100,000 raised RecursionError out of the reader: every later file
    of its directory, or every benchmark history, silently disappeared from the report."""
    from pagebench.results import Results
    from pagebench.results.history import load_benchmark_json
    from pagebench.results.read import load_data_dir

    machine = tmp_path / "results" / "m1"
    machine.mkdir(parents=True)
    nested = machine / "engine_pool_a.json"
    nested.write_text("[" * 100_000)
    (machine / "engine_pool_b.csv").write_text(POOL + "64,0,10.5,0,16\n")
    results = Results()
    load_data_dir(results, tmp_path / "results")
    assert len(results.get("engine_pool")) == 1
    assert any(str(nested) in w and "nested too deeply" in w for w in results.warnings)

    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "0001_deep.json").write_text('{"a":' * 100_000)
    (bench / "0002_good.json").write_text(json.dumps({
        "machine_info": {"machine": "x86_64"}, "commit_info": {"id": "abc"},
        "benchmarks": [{"name": "t", "fullname": "b.py::t", "stats": {"median": 0.001}}]}))
    history = Results()
    load_benchmark_json(history, sorted(bench.iterdir()))
    assert history.get("pytest_benchmark")["benchmark"].tolist() == ["b.py::t"]
    assert any("0001_deep.json" in w for w in history.warnings)


@pytest.mark.parametrize("value", [2**70, 2**63, -(2**63) - 1])
def test_an_integer_beyond_int64_in_a_csv_is_named_not_wrapped(tmp_path, value):
    """#45 item 5: ``block_size`` 2**70 became -9223372036854775808, with no warning."""
    from pagebench.results import Results
    from pagebench.results.read import load_data_dir

    machine = tmp_path / "m1"
    machine.mkdir()
    (machine / "engine_pool_a.csv").write_text(POOL + f"64,0,10.5,0,{value}\n")
    (machine / "engine_pool_b.csv").write_text(POOL + "32,1,9.5,4,16\n")
    results = Results()
    load_data_dir(results, tmp_path)
    assert results.get("engine_pool")["block_size"].tolist() == [16]
    assert any("engine_pool_a.csv" in w and "block_size" in w and str(value) in w
               and "64-bit" in w for w in results.warnings), results.warnings


# ---- options named as given, shapes refused before running ----------------------------------
def test_an_unknown_kv_dtype_names_kv_dtype():
    """#45 also: ``capacity --kv-dtype bool`` named ``--dtype``."""
    line = refused(["capacity", "--kv-dtype", "bool"], "--kv-dtype: unknown dtype 'bool'")
    assert " --dtype" not in line


@triton_only
def test_fp8_bench_refuses_a_head_dim_triton_does_not_take_before_running(monkeypatch):
    """#45 also: ``bench --fp8 --shape t=4/2/300`` ran although Triton declares head dims up
    to 256."""
    from pagebench.measure import fp8_sweep

    monkeypatch.setattr(fp8_sweep, "paged_case", lambda *a, **k: pytest.fail("a point ran"))
    refused(["bench", "--fp8", "--device", "cpu", "--shape", "t=4/2/300"],
            "--shape: Triton's decode does not take t (head dim 300)", "head dims")
