"""The asv configuration and suites: the config parses, every benchmark is discoverable with
consistent parameters, the committed results name benchmarks that exist, and the cheap
deterministic tracks give the values their subsystems define."""

from __future__ import annotations

import importlib
import inspect
import json
import pathlib
import sys

import pytest

from pagebench.results.history import read_asv_conf

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUITES = ("attention", "engine", "block_manager", "simulate", "memory")


def load_conf() -> dict:
    return read_asv_conf(ROOT)


@pytest.fixture(scope="module")
def suites():
    sys.path.insert(0, str(ROOT))
    try:
        yield {name: importlib.import_module(f"benchmarks.{name}") for name in SUITES}
    finally:
        sys.path.remove(str(ROOT))


def benchmark_methods(module):
    for cls_name, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != module.__name__:
            continue
        for name, _ in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith(("time_", "track_", "mem_", "peakmem_")):
                yield cls_name, cls, name


def test_conf_builds_offline_with_cpu_torch():
    conf = load_conf()
    assert conf["environment_type"] == "virtualenv" and conf["repo"] == "."
    assert (ROOT / conf["benchmark_dir"]).is_dir() and conf["results_dir"] == "asv_results"
    assert conf["matrix"]["req"]["torch"] == "==2.13.0"
    assert all("--no-index" in cmd for cmd in conf["build_command"] + conf["install_command"])


def test_every_benchmark_has_consistent_params(suites):
    found = 0
    for module in suites.values():
        for cls_name, cls, name in benchmark_methods(module):
            found += 1
            params = getattr(cls, "params", [])
            names = getattr(cls, "param_names", [])
            assert len(params) == len(names), f"{cls_name}: params and param_names differ"
            assert all(isinstance(p, list) and p for p in params), f"{cls_name}: empty params"
            if name.startswith("track_"):
                assert getattr(cls, name).unit, f"{cls_name}.{name}: track_* needs a unit"
            signature = inspect.signature(getattr(cls, name))
            cached = hasattr(cls, "setup_cache")
            assert len(signature.parameters) == 1 + cached + len(params), f"{cls_name}.{name}"
    assert found >= 20


def test_gpu_cases_are_tracks_and_skip_without_cuda(suites):
    import torch

    attention = suites["attention"]
    gpu_classes = [c for n, c, _ in benchmark_methods(attention) if n.endswith("Cuda")]
    assert gpu_classes and all(
        not m.startswith("time_") for c in gpu_classes for m in vars(c) if callable(vars(c)[m]))
    if not torch.cuda.is_available():
        with pytest.raises(NotImplementedError, match="CUDA"):
            attention.Batch1Cuda().setup("llama-3-8b", 4096, "triton-paged")


def test_cases_that_do_not_apply_skip_in_setup_not_in_the_measured_call(suites):
    """asv shows a case whose ``setup`` raises NotImplementedError as n/a; the same exception
    raised by the measured method is a failure, and `asv run` exits non-zero."""
    import ast
    import textwrap

    raising = []
    for module in suites.values():
        for cls_name, cls, name in benchmark_methods(module):
            tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(cls, name))))
            if any(isinstance(node, ast.Raise) for node in ast.walk(tree)):
                raising.append(f"{cls_name}.{name}")
    assert not raising


def test_prefix_hit_rates_are_n_a_for_contiguous_allocators(suites):
    cases = suites["memory"].RealTracePrefixCache()
    results = {"naive": {}, "paged-16": {"prefix_cache_hit_rate": 0.25}}
    with pytest.raises(NotImplementedError, match="paged feature"):
        cases.setup(results, "naive")
    cases.setup(results, "paged-16")
    assert cases.track_prefix_hit_rate_pct(results, "paged-16") == 25.0


def test_committed_results_name_existing_benchmarks(suites):
    known = {f"{module.__name__.split('.', 1)[1]}.{cls_name}.{name}"
             for module in suites.values() for cls_name, _, name in benchmark_methods(module)}
    files = [p for p in (ROOT / "asv_results").glob("*/*.json") if p.name != "machine.json"]
    assert files, "no committed asv results"
    machines = {p.parent.name for p in files}
    assert {"h200"} <= machines and len(machines) >= 2
    for path in files:
        doc = json.loads(path.read_text())
        stale = set(doc["results"]) - known
        # renamed benchmarks keep their old results; most must still exist
        assert len(stale) < len(doc["results"]) / 2 + 1, f"{path.name}: {sorted(stale)[:3]}"


def test_memory_tracks_match_the_static_simulator(suites):
    memory = suites["memory"]
    bench = memory.StaticUtilisation()
    cache = bench.setup_cache()
    assert set(cache) == set(memory.ALLOCATORS)
    # the article's figures (issue: naive 8.9 %, oracle 100 %, paged 16 98.0 %)
    assert round(bench.track_utilisation(cache, "naive"), 1) == 8.9
    assert bench.track_utilisation(cache, "oracle") == pytest.approx(100.0)
    assert round(bench.track_utilisation(cache, "paged-16"), 1) == 98.0


def test_block_manager_cases_leave_the_manager_as_they_found_it(suites):
    bm_suite = suites["block_manager"]
    case = bm_suite.PrefixHit()
    case.setup(16, 512)
    used = case.bm.num_used_blocks
    for _ in range(3):
        case.time_prefix_hit_allocate_free(16, 512)
    assert case.bm.num_used_blocks == used
    fork = bm_suite.ForkCopyOnWrite()
    fork.setup(16, 8)
    free = fork.bm.num_free_blocks
    fork.time_fork_append_free(16, 8)
    assert fork.bm.num_free_blocks == free


def test_engine_prefill_with_caching_hits_only_the_shared_prompt(suites):
    """Each timed call's last quarters are new: the same 8 prompts every call made the unique
    part hit too (0.94 of the prompt tokens cached, not the 0.75 shared)."""
    case = suites["engine"].Prefill()
    case.setup(64, True)
    for _ in range(2):
        case.time_prefill(64, True)
        stats = case.engine.stats
        assert stats.prefix_cache_hit_rate == 0.75
        assert stats.num_computed_prompt_tokens == 8 * 16
