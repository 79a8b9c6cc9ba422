"""`pagebench serve` on localhost: the OpenAI-compatible endpoint, streamed and not, its
/metrics, and serve-bench --endpoint measuring it beside the same requests in process (loopback
only, a handful of requests, every call bounded by a timeout)."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import pytest
from aiohttp import web

from pagebench.measure.engine_bench import tiny_model
from pagebench.engine.engine import LLMEngine
from pagebench.engine.sampling import SamplingParams
from pagebench.engine.serve import make_app
from pagebench.measure.endpoint import parse_prometheus, serve_endpoint
from pagebench.measure.serve_bench import trace_requests
from pagebench.measure.serving import run_serving
from pagebench.sim.latency import serving_metrics

TIMEOUT_S = 60


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def server(model):
    """A pagebench server on 127.0.0.1 (a free port) in a thread of its own: its URL."""
    engine = LLMEngine(model, block_size=16, num_blocks=256, enable_prefix_caching=True)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(make_app(engine, "tiny"))
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(TIMEOUT_S)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(TIMEOUT_S)


async def post(url, body):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as s:
        async with s.post(f"{url}/v1/completions", json=body) as resp:
            return resp.status, await resp.json()


async def get_text(url):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as s:
        async with s.get(url) as resp:
            return await resp.text()


def test_completions_equal_the_engine_and_bad_requests_are_400(server, model):
    prompts = [list(range(5, 40)), list(range(100, 110))]
    status, body = asyncio.run(post(server, dict(prompt=prompts, max_tokens=5,
                                                 temperature=0, ignore_eos=True)))
    assert status == 200
    engine = LLMEngine(model, block_size=16, num_blocks=256)
    want = engine.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True))
    assert [c["token_ids"] for c in body["choices"]] == [w.outputs[0].token_ids for w in want]
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
    assert body["usage"] == dict(prompt_tokens=45, completion_tokens=10, total_tokens=55)
    for bad, field in ((dict(prompt="hello"), "prompt"), (dict(prompt=[]), "prompt"),
                       (dict(prompt=[1, 2], n=2), "n"), (dict(prompt=[1], max_tokens=0),
                                                         "max_tokens"),
                       (dict(prompt=[10**9]), "token ids")):
        status, body = asyncio.run(post(server, bad))
        assert status == 400 and field in body["error"]["message"]


def test_http_and_in_process_measure_the_same_run(server, model):
    requests = trace_requests("mooncake-conv", 6, model.config.vocab_size, max_model_len=512,
                              max_output_len=4, seed=1).at_rate(8.0)
    http = serve_endpoint(server, requests, "tiny")
    engine = LLMEngine(model, block_size=16, num_blocks=256, enable_prefix_caching=True)
    local = run_serving(engine, requests)
    # the same tokens, one streamed chunk each, timed in order
    assert [len(t) for t in http.token_ids] == [t.num_output for t in local.requests]
    for t in http.requests:
        assert t.arrival_s <= t.token_s[0] and t.token_s == sorted(t.token_s)
        assert t.finish_s >= t.token_s[-1]
    both = [serving_metrics(run.requests, run.duration_s) for run in (http, local)]
    assert both[0]["num_output_tokens"] == both[1]["num_output_tokens"] > 0
    # /metrics: the server counted the run's tokens and found the trace's shared prefixes
    assert http.server is not None and "prefix_cache_hits_total" in http.server
    metrics = parse_prometheus(asyncio.run(get_text(f"{server}/metrics")))
    assert metrics["generation_tokens_total"] >= both[0]["num_output_tokens"]
    assert metrics["num_requests_running"] == 0


def test_parse_prometheus_reads_vllm_and_pagebench_names():
    text = ('# HELP vllm:kv_cache_usage_perc usage\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
            'vllm:num_preemptions_total{engine="0"} 3\n'
            'vllm:num_preemptions_total{engine="1"} 2\n'
            'pagebench:prefix_cache_hits_total{model_name="tiny"} 7.0\n'
            'process_cpu_seconds_total 12\n')
    assert parse_prometheus(text) == dict(kv_cache_usage_perc=0.25, num_preemptions_total=5.0,
                                          prefix_cache_hits_total=7.0)
