"""Wall-clock serving: the add_request/step loop's timestamps, the vLLM-defined metrics on a
hand-computed schedule, goodput, and arrival-rate scaling."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pagebench.engine.sampling import RequestOutput, SamplingParams
from pagebench.errors import ConfigError
from pagebench.measure.serving import ServingRequest, arrival_times, run_serving
from pagebench.sim.latency import RequestTiming, serving_metrics

STEP_S = 0.1


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class ScriptedEngine:
    """Every queued request gains one token per step of ``STEP_S`` seconds (its first in the
    step after it is added), as the real engine does when every prompt fits one step."""

    def __init__(self, clock):
        self.clock, self.live, self.ids = clock, {}, 0

    def check_requests(self, prompts, params):
        return prompts, [params]

    def add_request(self, prompt, params):
        self.ids += 1
        self.live[self.ids] = [params.max_tokens, 0]
        return self.ids

    @property
    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        from pagebench.engine.engine import StepOutput

        self.clock.now += STEP_S
        out = StepOutput({}, [], list(self.live))
        for rid, state in list(self.live.items()):
            state[1] += 1
            out.new_tokens[rid] = [7]
            if state[1] == state[0]:
                del self.live[rid]
                out.finished.append(RequestOutput(rid, [1], []))
        self.step_records.append(len(self.step_records))
        return out

    def begin_stats(self):
        self.step_records = []

    def end_stats(self):
        return None

    def abort_all(self):
        self.live.clear()


def scripted_run():
    clock = FakeClock()
    requests = [ServingRequest(1.0, [1], SamplingParams(max_tokens=1)),  # given out of order
                ServingRequest(0.0, [1], SamplingParams(max_tokens=3)),
                ServingRequest(0.05, [1], SamplingParams(max_tokens=2))]
    return run_serving(ScriptedEngine(clock), requests, clock=clock, sleep=clock.sleep)


def test_loop_records_the_hand_computed_schedule():
    run = scripted_run()
    late, first, second = run.requests
    # r0 alone in [0, .1]; r1 (arrived .05) joins at .1; both run to .3; idle until r2 at 1.0
    assert first.token_s == pytest.approx([0.1, 0.2, 0.3])
    assert second.first_scheduled_s == pytest.approx(0.1)
    assert second.token_s == pytest.approx([0.2, 0.3])
    assert late.first_scheduled_s == pytest.approx(1.0) and late.token_s == pytest.approx([1.1])
    assert run.duration_s == pytest.approx(1.1)
    assert len(run.steps) == 4  # no step while idle


def test_metrics_match_vllm_definitions_by_hand():
    run = scripted_run()
    m = serving_metrics(run.requests, run.duration_s)
    # TTFT .1 (r0), .15 (r1: first token .2, arrived .05), .1 (r2)
    assert m["ttft_p50_ms"] == pytest.approx(100)
    assert m["ttft_mean_ms"] == pytest.approx(350 / 3)
    # TPOT over requests with > 1 token: r0 (.3 - .1) / 2, r1 (.25 - .15) / 1
    assert m["tpot_mean_ms"] == pytest.approx(100) and m["tpot_p99_ms"] == pytest.approx(100)
    assert m["itl_mean_ms"] == pytest.approx(100)  # gaps .1, .1 (r0), .1 (r1)
    assert m["e2el_p50_ms"] == pytest.approx(250)  # .3, .25, .1
    assert m["queue_mean_ms"] == pytest.approx(50 / 3)  # 0, .05, 0
    assert m["request_throughput"] == pytest.approx(3 / 1.1)
    assert m["output_throughput"] == pytest.approx(6 / 1.1)


def test_goodput_counts_requests_meeting_every_slo():
    run = scripted_run()
    assert serving_metrics(run.requests, 1.1)["goodput"] == pytest.approx(3 / 1.1)  # no SLO
    by_ttft = serving_metrics(run.requests, 1.1, slo_ttft_s=0.12)
    assert by_ttft["num_good_requests"] == 2  # r1's TTFT .15 misses
    # TPOT <= 50 ms: r0 and r1 (100 ms) miss; r2 has one token (TPOT 0, as vLLM counts it)
    both = serving_metrics(run.requests, 1.1, slo_ttft_s=0.12, slo_tpot_s=0.05)
    assert both["num_good_requests"] == 1 and both["goodput"] == pytest.approx(1 / 1.1)


def test_metrics_refuse_unfinished_requests():
    with pytest.raises(ConfigError, match="finished"):
        serving_metrics([RequestTiming(0.0, 4, 0.0, [0.1], None)], 1.0)


def test_rate_scaling():
    trace = [5.0, 6.0, 7.0, 9.0]  # 3 gaps over 4 s: 0.75 requests/s
    assert arrival_times(trace).tolist() == [0, 1, 2, 4]
    assert arrival_times(trace, time_scale=2).tolist() == [0, 0.5, 1, 2]
    scaled = arrival_times(trace, rate=3.0)
    assert scaled.tolist() == pytest.approx([0, 0.25, 0.5, 1.0])  # 3 gaps in 1 s
    assert arrival_times(trace, rate=math.inf).tolist() == [0, 0, 0, 0]
    poisson = arrival_times(np.zeros(2001), rate=4.0, poisson=True, seed=3)
    assert poisson[0] == 0 and np.all(np.diff(poisson) >= 0)
    assert 2000 / poisson[-1] == pytest.approx(4.0, rel=0.1)
    assert np.array_equal(poisson, arrival_times(np.zeros(2001), rate=4.0, poisson=True, seed=3))
    for bad in (0, -1.0, "2"):
        with pytest.raises(ConfigError, match="request_rate"):
            arrival_times(trace, rate=bad)
    with pytest.raises(ConfigError, match="time_scale"):
        arrival_times(trace, time_scale=0)


def test_real_engine_timestamps_are_monotone():
    from pagebench.measure.engine_bench import tiny_model
    from pagebench.engine.engine import LLMEngine

    engine = LLMEngine(tiny_model(), block_size=16, num_blocks=64, max_num_batched_tokens=32)
    lengths = (40, 12, 70, 5)
    requests = [ServingRequest(0.002 * i, list(range(1, n + 1)),
                               SamplingParams(max_tokens=4 + i, ignore_eos=True))
                for i, n in enumerate(lengths)]
    run = run_serving(engine, requests)
    for i, t in enumerate(run.requests):
        assert t.num_output == 4 + i
        times = [t.arrival_s, t.first_scheduled_s, *t.token_s]
        assert times == sorted(times) and t.finish_s == t.token_s[-1]
    starts = [s.start_s for s in run.steps]
    assert all(a.end_s <= b.start_s for a, b in zip(run.steps, run.steps[1:]))
    assert starts == sorted(starts) and len(run.steps) == len(run.stats.steps)
    assert run.stats.num_generated_tokens == sum(4 + i for i in range(4))
    with pytest.raises(ConfigError, match="empty prompt"):
        run_serving(engine, requests + [ServingRequest(0.0, [], SamplingParams())])
    assert not engine.has_unfinished_requests
