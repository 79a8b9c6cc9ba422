"""Engine replay of a real trace: synthesised tokens share exactly what hash_ids share, and
the engine's prefix-cache hit rate agrees with the simulator's on the same sample."""

from __future__ import annotations

import numpy as np
import pytest

from pagebench.cli import main
from pagebench.engine.bench import tiny_model
from pagebench.engine.trace_replay import replay_trace, synthesise_prompts
from pagebench.sim.trace import Workload


def test_synthesised_prompts_share_exactly_the_leading_spans():
    w = Workload(np.zeros(4, np.int64), np.array([1100, 700, 1100, 300]), np.ones(4, np.int64),
                 np.ones(4, np.int64), hash_ids=(np.array([5, 6, 7]), np.array([5, 6]),
                                                 np.array([5, 9, 7]), np.array([8])))
    a, b, c, d = synthesise_prompts(w, vocab_size=1024)
    assert [len(p) for p in (a, b, c, d)] == [1100, 700, 1100, 300]
    assert a[:700] == b and a[:512] == c[:512]
    assert a[512:1024] != c[512:1024] and a[:300] != d  # span 1 differs; d's first span too
    assert a[1024:] == c[1024:]  # same id at the same position: same tokens (its prefix differs)
    assert max(max(p) for p in (a, b, c, d)) < 1024
    alone = Workload(np.zeros(2, np.int64), np.array([600, 600]), np.ones(2, np.int64),
                     np.ones(2, np.int64))
    x, y = synthesise_prompts(alone, vocab_size=1024)
    assert x[:16] != y[:16]  # no hash_ids: nothing shared


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_engine_and_simulator_hit_rates_agree_on_a_sample(model):
    row = replay_trace(model, "mooncake-conv", 16, max_model_len=768, max_output_len=8,
                       step_ms=1000, seed=1)
    assert row["num_requests"] == 16 and row["num_prompt_tokens"] > 16 * 500
    assert row["sim_prefix_cache_hit_rate"] > 0.2  # the sample shares its system prompt
    assert row["engine_prefix_cache_hit_rate"] == pytest.approx(row["sim_prefix_cache_hit_rate"],
                                                                abs=0.03)
    assert row["engine_num_preemptions"] == 0 and row["tokens_per_s"] > 0


def test_engine_bench_trace_cli(capsys, model, monkeypatch):
    from pagebench.engine import bench

    monkeypatch.setattr(bench, "tiny_model", lambda **kw: model)
    assert main(["engine-bench", "trace", "--trace", "azure-code", "--num-requests", "4",
                 "--max-model-len", "256", "--max-output-len", "4", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "engine_prefix_cache_hit_rate" in out.splitlines()[0]
    assert out.splitlines()[1].count(",") == out.splitlines()[0].count(",")
