"""Engine replay of a real trace: synthesised tokens share exactly what hash_ids share, and
the engine's prefix-cache hit rate agrees with the simulator's on the same sample."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pagebench.cli import main
from pagebench.measure.engine_bench import tiny_model
from pagebench.measure.trace_replay import replay_trace, synthesise_prompts
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
    from pagebench.measure import engine_bench

    monkeypatch.setattr(engine_bench, "tiny_model", lambda **kw: model)
    argv = ["engine-bench", "trace", "--trace", "azure-code", "--num-requests", "4",
            "--max-model-len", "256", "--max-output-len", "4", "--device", "cpu"]
    assert main(argv + ["--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert {"engine_prefix_cache_hit_rate", "sim_prefix_cache_hit_rate",
            "engine_peak_blocks", "tokens_per_s", "elapsed_s"} <= row.keys()
    assert main(argv) == 0
    table, _, legend = capsys.readouterr().out.partition("\ncolumns:\n")
    assert table.count("peak blocks") == 1 and "time (s)" in table
    assert legend.count("peak blocks") == 1  # each column explained once
    assert " - " not in table.splitlines()[2] + " "  # every cell filled


def test_generate_at_steps_honours_arrival_steps_and_per_prompt_lengths(model):
    from pagebench.engine.engine import LLMEngine
    from pagebench.engine.sampling import SamplingParams
    from pagebench.measure.trace_replay import generate_at_steps
    from pagebench.errors import ConfigError

    engine = LLMEngine(model, block_size=16, num_blocks=64)
    prompts = [list(range(20)), list(range(5, 30))]
    params = [SamplingParams(max_tokens=3, ignore_eos=True),
              SamplingParams(max_tokens=5, ignore_eos=True)]
    out, idle = generate_at_steps(engine, prompts, params, [0, 50])
    assert [len(o.outputs[0].token_ids) for o in out] == [3, 5]
    # request 0 runs steps 0..2 alone; the engine then idles to step 50 for request 1
    assert idle == 47
    assert max(s.batch_size for s in engine.stats.steps) == 1
    assert len(engine.stats.steps) == 3 + 5
    together = engine.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in together] == [o.outputs[0].token_ids for o in out]
    assert generate_at_steps(engine, prompts, params, [0, 0])[1] == 0
    for bad, message in (([0], "arrival_steps"), ([0, -1], "arrival_steps"),
                         ([0, 1.5], "arrival_steps")):
        with pytest.raises(ConfigError, match=message):
            generate_at_steps(engine, prompts, params, bad)
        assert not engine.has_unfinished_requests
    with pytest.raises(ConfigError, match="sampling_params: 3 for 2 prompts"):
        engine.generate(prompts, params + params[:1])


def test_engine_and_simulator_agree_under_memory_pressure(model):
    """A pool of 120 blocks for requests of up to 1,024 tokens arriving 200 trace seconds per
    step (so they overlap): both preempt, and the hit rates still agree within a few points
    (on this sample they are equal)."""
    row = replay_trace(model, "mooncake-conv", 16, max_model_len=1024, max_output_len=32,
                       step_ms=200_000, num_blocks=120, seed=0)
    assert row["engine_num_preemptions"] + row["sim_num_preemptions"] > 0
    assert row["engine_prefix_cache_hit_rate"] == pytest.approx(row["sim_prefix_cache_hit_rate"],
                                                                abs=0.03)
